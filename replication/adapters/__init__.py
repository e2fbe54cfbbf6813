"""A ``Message`` to and from every outside form, one module each, all walking one table.

``fields.FIELDS`` says where each field lives in each form; ``sdk`` (``azure.servicebus``),
``functions`` (``azure.functions``), ``amqp`` (the bytes on the wire: the receive path's
fast decoder and the sender's encoder), ``spark/rows.py`` (rows of the ``servicebus`` Spark
source and sink) and ``capture`` (Capture's Avro records) convert. Nothing is imported
here: each form's module loads only what it needs (the SDKs, Spark, fastavro).
"""
