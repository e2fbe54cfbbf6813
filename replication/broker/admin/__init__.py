"""The Service Bus management REST API (ATOM/XML over HTTPS) on top of the broker.

``api.AdminApi(broker).handle`` is an ``httpapi.HttpApp``: what ``ServiceBusAdministrationClient``
(and the other SDKs' administration clients) call to create, read, update, list and delete
queues, topics, subscriptions and rules. ``properties`` knows the entity properties, their
defaults and limits; ``atom`` reads and writes the XML. Nothing is imported here, so
``server`` may use ``properties`` without an import cycle.
"""
