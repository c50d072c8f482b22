"""A queue's length seen by a client, for tests that wait for messages to arrive."""

from __future__ import annotations

import pika


def ready(port: int, queue: str, host: str = "127.0.0.1") -> int:
    """The queue's ready messages (-1 while there is no such queue), on a connection of its
    own (a passive declare of a missing queue closes its channel)."""
    conn = pika.BlockingConnection(pika.ConnectionParameters(host, port))
    try:
        return conn.channel().queue_declare(queue, passive=True).method.message_count
    except pika.exceptions.ChannelClosedByBroker:
        return -1
    finally:
        conn.close()
