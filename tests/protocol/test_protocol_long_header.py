"""protocol/properties.py's `with_long_header`: the header splice a stream delivery
(`x-stream-offset`) and a quorum queue's redelivery (`x-delivery-count`) are built with."""

from __future__ import annotations

import datetime

import pytest

from roarmq.protocol.frames import ContentHeader
from roarmq.protocol.properties import BasicProperties, with_long_header
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
    spliced = with_long_header(raw, "x-stream-offset", off)
    got = ContentHeader(60, 0, spliced).properties
    want = BasicProperties(**{k: getattr(props, k) for k in BasicProperties.__slots__})
    want.headers = {**(props.headers or {}), "x-stream-offset": Int64(off)}
    assert got == want
    assert list(got.headers)[-1] == "x-stream-offset"  # last, as the dict update put it
    # the same bytes as re-encoding the decoded properties with the header added as a
    # signed 64-bit field ('l', RabbitMQ's type for it, whatever the offset's size)
    assert spliced == want.encode()
    assert b"\x0fx-stream-offset" + b"l" + off.to_bytes(8, "big", signed=True) in spliced


@pytest.mark.parametrize("value", [5, "five", Int64(5)])
def test_a_header_already_there_takes_the_brokers_value(value):
    """A publisher's own x-delivery-count (of any type) is replaced, as RabbitMQ's quorum
    queue overwrites it: the table is decoded and encoded again, the rest kept."""
    props = BasicProperties(
        content_type="text/plain", headers={"a": 1, "x-delivery-count": value, "z": "last"}
    )
    spliced = with_long_header(props.encode(), "x-delivery-count", 3)
    got = ContentHeader(60, 0, spliced).properties
    assert got.content_type == "text/plain"
    assert got.headers == {"a": 1, "x-delivery-count": 3, "z": "last"}
    assert b"\x10x-delivery-countl" + (3).to_bytes(8, "big") in spliced


def test_the_name_only_inside_a_value_is_still_added():
    """The splice's quick scan finds the name inside another header's value: it decodes,
    and the header is added all the same."""
    props = BasicProperties(headers={"note": "x-delivery-count is ours"})
    got = ContentHeader(60, 0, with_long_header(props.encode(), "x-delivery-count", 1))
    assert got.properties.headers == {"note": "x-delivery-count is ours", "x-delivery-count": 1}
