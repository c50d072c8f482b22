"""The 14 basic properties and their 16-bit flag word."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from support.protocol_strategies import full_properties

from roarmq.protocol import spec
from roarmq.protocol.errors import AMQPSyntaxError
from roarmq.protocol.frames import ContentHeader
from roarmq.protocol.properties import BasicProperties


def test_fields_and_flag_order_follow_the_spec() -> None:
    assert tuple(name for name, _ in spec.BASIC_PROPERTIES) == BasicProperties.__slots__
    samples = {"headers": {}, "delivery_mode": 1, "priority": 1, "timestamp": 1}
    for bit, name in enumerate(BasicProperties.__slots__):
        props = BasicProperties(**{name: samples.get(name, "")})
        assert props.encode()[:2] == (0x8000 >> bit).to_bytes(2, "big"), name


def test_absent_is_none_and_empty_string_is_present() -> None:
    assert BasicProperties().encode() == b"\x00\x00"
    assert BasicProperties(content_type="").encode() == b"\x80\x00\x00"
    assert BasicProperties.decode(b"\x80\x00\x00").content_type == ""
    assert BasicProperties.decode(b"\x00\x00") == BasicProperties()


def test_a_typical_publish() -> None:
    props = BasicProperties(
        content_type="application/json",
        delivery_mode=2,
        headers={"x-tenant": "acme"},
        message_id="m-1",
        timestamp=datetime(2024, 5, 17, 12, 30, tzinfo=UTC),
    )
    raw = props.encode()
    assert raw[:2] == b"\xb0\xc0"  # content_type, headers, delivery_mode, message_id, timestamp
    assert BasicProperties.decode(raw) == props
    assert BasicProperties.decode(b"..." + raw, 3) == props
    assert repr(BasicProperties(priority=3)) == "BasicProperties(priority=3)"


def test_timestamp_accepts_int_struct_time_and_naive_datetime() -> None:
    expected = BasicProperties(timestamp=datetime(1970, 1, 1, 0, 1, tzinfo=UTC))
    for value in (60, time.gmtime(60), datetime(1970, 1, 1, 0, 1)):
        assert BasicProperties.decode(BasicProperties(timestamp=value).encode()) == expected


@settings(max_examples=300, deadline=None)
@given(full_properties)
def test_round_trip(props: BasicProperties) -> None:
    raw = props.encode()
    assert BasicProperties.decode(raw) == props
    assert BasicProperties.decode(memoryview(raw)) == props
    header = ContentHeader.from_properties(props, body_size=5)
    assert header.raw == raw and header.properties is props and header.body_size == 5


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"", "truncated"),
        (b"\x80", "truncated"),
        (b"\x80\x00\x05ab", "truncated"),
        (b"\x00\x00\x01", "1 unexpected bytes"),
        (b"\x10\x00", "truncated"),
        (b"\x20\x00\x00\x00\x00\x05\x01a", "basic property headers: "),
        (b"\x00\x02", "flag bit 1"),
        (b"\x00\x01\x00\x04", "continuation property flags"),
        (b"\x00\x01", "truncated"),
    ],
)
def test_malformed_properties(raw: bytes, message: str) -> None:
    with pytest.raises(AMQPSyntaxError, match=message) as info:
        BasicProperties.decode(raw)
    assert (info.value.reply_code, info.value.class_id) == (502, 60)


def test_continuation_word_without_properties_is_accepted() -> None:
    assert BasicProperties.decode(b"\x80\x01\x00\x00\x01x") == BasicProperties(content_type="x")


def test_lazy_properties_raise_the_protocol_error_on_access() -> None:
    header = ContentHeader(60, 0, b"\x80\x00\x09")
    with pytest.raises(AMQPSyntaxError):
        header.properties  # noqa: B018


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"content_type": "x" * 256}, ValueError),
        ({"delivery_mode": 256}, ValueError),
        ({"priority": -1}, ValueError),
        ({"message_id": 5}, TypeError),
        ({"timestamp": "yesterday"}, TypeError),
        ({"headers": {"x": object()}}, TypeError),
    ],
)
def test_encode_errors(kwargs: dict, error: type) -> None:
    with pytest.raises(error):
        BasicProperties(**kwargs).encode()
