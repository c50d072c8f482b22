"""The AMQP 0-9-1 side of the broker: connections, channels, the session and flow state
machines, TLS. It may import core, routing, store and ops (tests/test_layers.py)."""
