"""broker/core/stream.py's pieces on their own."""

from __future__ import annotations


def test_fail_replicated_nacks_each_waiting_publish_once():
    """A cluster leadership ending: every confirm a stream still waits for is nacked, once
    even when the publish reached two streams (they share one waiter)."""
    from collections import deque

    from roarmq.broker.core.stream import Stream

    class Conn:
        flushes = 0

        def flush(self):
            Conn.flushes += 1

    class Channel:
        def __init__(self):
            self.conn, self.nacked = Conn(), []

        def disk_failed(self, seq):
            self.nacked.append(seq)

    ch = Channel()
    shared = [2, ch, 7, None]  # publish 7 reached both streams
    a, b = Stream.__new__(Stream), Stream.__new__(Stream)
    a.waiters = deque([(1, shared, 5), (2, [1, ch, 8, None], 6)])
    b.waiters = deque([(1, shared, 5)])
    a.fail_replicated()
    b.fail_replicated()
    assert ch.nacked == [7, 8]
    assert not a.waiters and not b.waiters
    assert Conn.flushes == 1
