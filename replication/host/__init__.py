"""The local Functions host: ``python -m replication start`` stands in for ``func start``.

It reads ``local.settings.json``, starts the embedded broker for connections that point at
``localhost`` with ``UseDevelopmentEmulator=true``, discovers the functions of
``function_app.py`` and runs their Service Bus triggers with the Functions host's semantics.
"""
