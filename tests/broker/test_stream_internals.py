"""broker/stream.py's pieces on their own: the header splice a delivery is built with."""

from __future__ import annotations

import datetime

import pytest

from roarmq.broker.stream import _with_offset
from roarmq.protocol.frames import ContentHeader
from roarmq.protocol.properties import BasicProperties

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
    want.headers = {**(props.headers or {}), "x-stream-offset": off}
    assert got == want
    assert list(got.headers)[-1] == "x-stream-offset"  # last, as the dict update put it
    # the same bytes as re-encoding the decoded properties with the header added
    assert spliced == want.encode()


def test_splice_declines_what_needs_a_decode():
    raw = BasicProperties(headers={"x-stream-offset": 5}).encode()
    assert _with_offset(raw, 9) is None
    assert _with_offset(b"", 9) is None
