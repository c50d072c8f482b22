"""Durable storage for RoarMQ messages.
`segments.SegmentLog` is the lowest layer: an append-only, CRC-checked segment log."""
