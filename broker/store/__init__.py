"""Durable storage: the segment log (the lowest layer: append-only, CRC-checked), persistent
messages over it, definitions in SQLite, the record tags. It may import ops and the message
class it rebuilds (tests/test_layers.py)."""
