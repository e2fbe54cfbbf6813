"""The embedded broker's Event Hubs face: event hubs as partitioned logs on the same listener."""
