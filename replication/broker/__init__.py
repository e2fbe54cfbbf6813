"""An embedded, Service Bus-compatible AMQP broker configured by the emulator's Config.json.

It lets the replication app and its tests run against real AMQP links without Azure or the
emulator's container pair; entities, limits and credentials come from the same Config.json
file the official Service Bus emulator reads (plus optional authorization rules).
"""
