"""Every kind of record a message log holds, named by its first byte, in one place: no two
kinds may share a byte, and recovery must know every kind it can meet.

A single node's message log (store/messages.py) holds publishes, acks and deliveries; a
clustered vhost's replicated log (broker/cluster/) holds those and the rest. Recovery
stops at a kind it does not know (a newer node's log, or damage the CRC let through)
rather than skip what it cannot read: a store's `Durability.foreign_kinds` lists what
the store leaves to the log's other owners, and anything else stops it."""

from __future__ import annotations

#: A persistent message: its id, the queues it was routed to, exchange, key, header, body.
PUBLISH_TAG = b"P"
#: A queue acked a message (it leaves that queue).
ACK_TAG = b"A"
#: A queue delivered a message (redelivered after a crash).
DELIVERED_TAG = b"D"
#: A durable quorum queue took a stored message back after a delivery that counts: the
#: message's delivery count now and, when a delayed retry holds it, the time (ms since the
#: epoch) it is ready again (0: at once). Both survive restarts and failovers, as a quorum
#: queue's do in RabbitMQ (its Raft log keeps them).
RETURNED_TAG = b"R"
#: A persistent message a delayed exchange holds: its due time, then its publish record.
DELAYED_PUBLISH_TAG = b"W"
#: A persistent message that can expire (a TTL of its own or of a queue it reached): when
#: it entered its queues, then its publish record. Its TTL counts from then, across
#: restarts and failovers, as RabbitMQ's does.
EXPIRING_PUBLISH_TAG = b"T"
#: A clustered vhost's durable definitions (exchanges, queues, bindings), whole.
DEFINITIONS_TAG = b"J"
#: A stream's record in its vhost's replicated log.
STREAM_TAG = b"S"
#: The start of a checkpoint's copy of one stream.
STREAM_START_TAG = b"s"
#: A stream's stored consumer offsets (the stream protocol's store-offset), all of them.
STREAM_OFFSETS_TAG = b"O"
#: A leader's epoch begins at this offset.
EPOCH_TAG = b"E"
#: A checkpoint: everything below its base is copied above it.
CHECKPOINT_TAG = b"C"

#: A replicated log's copy on disk (replog/records.py) wraps each record of the
#: vhost's log in an envelope with its own kinds:
#: a record of the vhost's log (its generation, its offset, the record).
RECORD_ENVELOPE = b"r"
#: Records of an older generation above this offset are gone (a truncation).
TRUNCATION_ENVELOPE = b"t"
#: Every record of an older generation is gone; the log starts at this offset (a reset).
RESET_ENVELOPE = b"z"

#: Every kind by its name (the uniqueness test reads this).
TAGS = {
    name: value
    for name, value in dict(globals()).items()
    if name.endswith(("_TAG", "_ENVELOPE")) and isinstance(value, bytes)
}
