"""broker/core/stream.py's pieces on their own: the header splice a delivery is built with."""

from __future__ import annotations

import datetime

import pytest

from roarmq.broker.core.stream import _with_offset
from roarmq.protocol.frames import ContentHeader
from roarmq.protocol.properties import BasicProperties
from roarmq.protocol.tables import Int64

PROPS = [
    BasicProperties(),
    BasicProperties(delivery_mode=2),
    BasicProperties(content_type="text/plain", delivery_mode=2, priority=3),
    BasicProperties(content_encoding="gzip", headers={"a": 1}),
    BasicProperties(
        content_type="application/json",
        content_encoding="utf-8",
        headers={"x-stream-filter-value": "emea", "n": [1, "two"], "t": {"deep": True}},
        delivery_mode=2,
        correlation_id="c",
        reply_to="r",
        expiration="6000",
        message_id="m",
        timestamp=datetime.datetime(2024, 1, 2, tzinfo=datetime.UTC),
        type="t",
        user_id="guest",
        app_id="app",
    ),
    BasicProperties(headers={}),
]


@pytest.mark.parametrize("props", PROPS)
@pytest.mark.parametrize("off", [0, 127, 200, 70_000, 2**40])
def test_splice_equals_a_decode_and_encode(props, off):
    raw = props.encode()
    spliced = _with_offset(raw, off)
    assert spliced is not None
    got = ContentHeader(60, 0, spliced).properties
    want = BasicProperties(**{k: getattr(props, k) for k in BasicProperties.__slots__})
    want.headers = {**(props.headers or {}), "x-stream-offset": Int64(off)}
    assert got == want
    assert list(got.headers)[-1] == "x-stream-offset"  # last, as the dict update put it
    # the same bytes as re-encoding the decoded properties with the header added as a
    # signed 64-bit field ('l', RabbitMQ's type for it, whatever the offset's size)
    assert spliced == want.encode()
    assert b"\x0fx-stream-offset" + b"l" + off.to_bytes(8, "big", signed=True) in spliced


def test_splice_declines_what_needs_a_decode():
    raw = BasicProperties(headers={"x-stream-offset": 5}).encode()
    assert _with_offset(raw, 9) is None
    assert _with_offset(b"", 9) is None


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
