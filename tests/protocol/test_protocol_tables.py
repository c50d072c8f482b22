"""Field tables and arrays: every RabbitMQ type tag, Python mapping, typed decoding, errors."""

from __future__ import annotations

import struct
import sys
import time
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from hypothesis import given, settings
from pamqp import encode as pamqp_encode
from support.protocol_strategies import full_tables, full_values

from roarmq.protocol.errors import AMQPSyntaxError
from roarmq.protocol.tables import (
    MAX_NESTING,
    RECURSION_LIMIT,
    RawTimestamp,
    decode_array,
    decode_array_typed,
    decode_table,
    decode_table_typed,
    encode_array,
    encode_table,
    encode_value,
    timestamp_from_wire,
)


def table(*entries: bytes) -> bytes:
    payload = b"".join(entries)
    return struct.pack(">I", len(payload)) + payload


def entry(key: bytes, tag: bytes, value: bytes) -> bytes:
    return bytes([len(key)]) + key + tag + value


# One entry per type tag of RabbitMQ's errata, plus 'L' (read as int64, as RabbitMQ does).
TYPE_CASES = [
    (b"t", b"\x01", True),
    (b"t", b"\x00", False),
    (b"b", b"\xff", -1),
    (b"B", b"\xff", 255),
    (b"s", b"\x80\x00", -32768),
    (b"u", b"\xff\xff", 65535),
    (b"I", b"\xff\xff\xff\xfe", -2),
    (b"i", b"\xff\xff\xff\xfe", 4294967294),
    (b"l", b"\xff" * 8, -1),
    (b"L", b"\x00" * 7 + b"\x05", 5),
    (b"f", struct.pack(">f", 1.5), 1.5),
    (b"d", struct.pack(">d", 0.1), 0.1),
    (b"D", b"\x02\x00\x00\x30\x39", Decimal("123.45")),
    (b"D", b"\x00\xff\xff\xff\xff", Decimal(-1)),
    (b"S", b"\x00\x00\x00\x05caf\xc3\xa9", "café"),
    (b"S", b"\x00\x00\x00\x02\xff\xfe", b"\xff\xfe"),  # not UTF-8: bytes, as pamqp
    (b"x", b"\x00\x00\x00\x03\x00\x01\x02", b"\x00\x01\x02"),
    (b"A", b"\x00\x00\x00\x03b\x01V", [1, None]),
    (b"T", struct.pack(">Q", 1700000000), datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)),
    (b"F", table(entry(b"k", b"S", b"\x00\x00\x00\x01v")), {"k": "v"}),
    (b"V", b"", None),
]


@pytest.mark.parametrize("tag, raw, expected", TYPE_CASES, ids=lambda c: repr(c)[:20])
def test_every_type_tag_decodes(tag: bytes, raw: bytes, expected: object) -> None:
    data = table(entry(b"key", tag, raw))
    assert decode_table(data) == ({"key": expected}, len(data))
    typed, _ = decode_table_typed(data)
    assert typed["key"][0] == tag.decode()


@pytest.mark.parametrize(
    "value, encoded",
    [
        (True, b"t\x01"),
        (False, b"t\x00"),
        (0, b"b\x00"),
        (-128, b"b\x80"),
        (128, b"s\x00\x80"),
        (40000, b"u\x9c\x40"),
        (-40000, b"I\xff\xff\x63\xc0"),
        (2**31, b"i\x80\x00\x00\x00"),
        (2**32, b"l\x00\x00\x00\x01\x00\x00\x00\x00"),
        (1.5, b"d" + struct.pack(">d", 1.5)),  # pamqp: 'f' (float32, lossy)
        (Decimal("-1.25"), b"D\x02\xff\xff\xff\x83"),
        (Decimal("1E+2"), b"D\x00\x00\x00\x00\x64"),
        ("é", b"S\x00\x00\x00\x02\xc3\xa9"),
        (b"\x00", b"x\x00\x00\x00\x01\x00"),  # pamqp: unsupported
        (bytearray(b"\x00"), b"x\x00\x00\x00\x01\x00"),
        (None, b"V"),
        ([1, "a"], b"A\x00\x00\x00\x08b\x01S\x00\x00\x00\x01a"),
        ((1,), b"A\x00\x00\x00\x02b\x01"),  # pamqp: lists only
        ({"a": 1}, b"F\x00\x00\x00\x04\x01ab\x01"),
        (datetime(1970, 1, 1, 0, 0, 7), b"T" + struct.pack(">Q", 7)),  # naive means UTC
        (time.gmtime(7), b"T" + struct.pack(">Q", 7)),
    ],
    ids=repr,
)
def test_python_values_map_to_tags(value: object, encoded: bytes) -> None:
    assert encode_value(value) == encoded


@pytest.mark.parametrize(
    "value",
    [
        -(2**63),
        -(2**31) - 1,
        -(2**31),
        -32769,
        -32768,
        -129,
        -128,
        -1,
        0,
        127,
        128,
        255,
        256,
        32767,
        32768,
        65535,
        65536,
        2**31 - 1,
        2**31,
        2**32 - 1,
        2**32,
        2**63 - 1,
        True,
        "text",
        Decimal("3.14159"),
        Decimal(-7),
        None,
        datetime(2001, 2, 3, tzinfo=UTC),
        bytearray(b"ab"),
        [1, [2, {"z": 3}]],
        {"a": 2, "b": 1},
    ],
)
def test_tag_choice_equals_pamqp(value: object) -> None:
    assert encode_value(value) == pamqp_encode.encode_table_value(value)


@settings(max_examples=300, deadline=None)
@given(full_tables)
def test_table_round_trip(value: dict) -> None:
    data = encode_table(value)
    assert decode_table(data) == (value, len(data))
    assert decode_table(b"\xaa" + data + b"\xbb", 1) == (value, len(data) + 1)


@settings(max_examples=200, deadline=None)
@given(full_values)
def test_value_round_trip_inside_an_array(value: object) -> None:
    data = encode_array([value, value])
    assert decode_array(data) == ([value, value], len(data))


def test_insertion_order_is_kept_so_decoded_tables_re_encode_identically() -> None:
    data = encode_table({"z": 1, "a": 2})
    assert data == table(entry(b"z", b"b", b"\x01"), entry(b"a", b"b", b"\x02"))
    assert encode_table(decode_table(data)[0]) == data
    assert encode_table({}) == encode_table(None) == b"\x00\x00\x00\x00"


def test_typed_decoding_is_recursive() -> None:
    data = encode_table({"i": 1, "big": 70000, "n": {"x": True}, "arr": ["s", 2]})
    typed, _ = decode_table_typed(data)
    assert typed == {
        "i": ("b", 1),
        "big": ("I", 70000),
        "n": ("F", {"x": ("t", True)}),
        "arr": ("A", [("S", "s"), ("b", 2)]),
    }
    assert decode_array_typed(encode_array([1, "a"])) == ([("b", 1), ("S", "a")], 12)


def test_timestamps_beyond_datetime_range_stay_ints() -> None:
    assert timestamp_from_wire(0) == datetime(1970, 1, 1, tzinfo=UTC)
    assert timestamp_from_wire(2**64 - 1) == 2**64 - 1
    data = table(entry(b"t", b"T", b"\xff" * 8))
    assert decode_table(data)[0] == {"t": 2**64 - 1}


@pytest.mark.parametrize(
    "value, error, message",
    [
        ({"x": 2**63}, ValueError, "signed 64-bit"),
        ({"x": object()}, TypeError, "cannot encode object"),
        ({"k" * 256: 1}, ValueError, "longer than 255"),
        ({1: 1}, TypeError, "key must be str"),
        ({"x": Decimal("NaN")}, ValueError, "decimal"),
        ({"x": Decimal("1e-300")}, ValueError, "at most 255"),
        ({"x": Decimal(2**40)}, ValueError, "mantissa"),
        ({"x": datetime(1960, 1, 1)}, ValueError, "unsigned 64-bit"),
    ],
)
def test_encode_errors(value: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        encode_table(value)


@pytest.mark.parametrize(
    "data, message",
    [
        (b"\x00\x00", "length truncated"),
        (b"\x00\x00\x00\x09\x01k", "declares 9 bytes but only 2 remain"),
        (table(entry(b"k", b"Z", b"")), "unknown field value type 'Z'"),
        (table(entry(b"k", b"I", b"\x00\x00")), "truncated"),
        (table(entry(b"k", b"S", b"\x00\x00\x00\x09abc")), "overrun"),
        (table(b"\x05ab"), "truncated"),
        (table(entry(b"k", b"F", b"\x00\x00\x00\x10")), "overruns its container"),
        (table(entry(b"k", b"A", b"\x00\x00\x00\x10Z")), "overruns its container"),
        (table(entry(b"k", b"A", b"\x00\x00\x00\x01Z")), "unknown field value type"),
        (table(entry(b"k", b"A", b"\x00\x00\x00\x00")) + b"", None),
    ],
)
def test_decode_errors_are_syntax_errors(data: bytes, message: str | None) -> None:
    if message is None:  # a control: this one is valid
        assert decode_table(data)[0] == {"k": []}
        return
    with pytest.raises(AMQPSyntaxError, match=message) as info:
        decode_table(data)
    assert info.value.reply_code == 502


def nested_tables(depth: int) -> bytes:
    data = b"\x00\x00\x00\x00"
    for _ in range(depth):
        data = table(entry(b"k", b"F", data))
    return data


def nested_arrays(depth: int) -> bytes:
    value = b"b\x01"
    for _ in range(depth):
        value = b"A" + len(value).to_bytes(4, "big") + value
    return table(entry(b"k", value[:1], value[1:]))


@pytest.fixture
def deep_recursion():
    """The recursion limit a program that takes RabbitMQ's depths sets (the broker does)."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(max(before, RECURSION_LIMIT))
    yield
    sys.setrecursionlimit(before)


def test_nesting_beyond_the_recursion_limit_is_a_syntax_error_not_a_recursion_error() -> None:
    data = nested_tables(5000)
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)  # Python's default; an in-process broker may have raised it
    try:
        with pytest.raises(AMQPSyntaxError, match="nested deeper than"):
            decode_table(data)
        with pytest.raises(AMQPSyntaxError, match="nested deeper than"):
            decode_table_typed(data)
    finally:
        sys.setrecursionlimit(before)


def test_rabbitmq_depths_decode_and_reencode_exactly(deep_recursion) -> None:
    # RabbitMQ 3.10.8 takes 5,000-deep tables and 20,000-deep arrays.
    for data in (nested_tables(5000), nested_arrays(20000)):
        value, end = decode_table(data)
        assert end == len(data)
        assert encode_table(value) == data
        typed, _ = decode_table_typed(data)
        assert typed["k"][0] in "FA"


def test_nesting_beyond_max_nesting_is_a_syntax_error(deep_recursion) -> None:
    assert decode_table(nested_arrays(MAX_NESTING))[1] > 0
    for data in (nested_arrays(MAX_NESTING + 1), nested_tables(MAX_NESTING + 1)):
        with pytest.raises(AMQPSyntaxError, match=f"nested deeper than {MAX_NESTING}") as info:
            decode_table(data)
        assert info.value.reply_code == 502
        with pytest.raises(AMQPSyntaxError, match="nested deeper than"):
            decode_table_typed(data)


def test_timestamps_beyond_datetime_reencode_as_timestamps() -> None:
    data = table(entry(b"t", b"T", b"\xff" * 8))
    value, _ = decode_table(data)
    assert value["t"] == 2**64 - 1
    assert isinstance(value["t"], RawTimestamp)
    assert encode_table(value) == data
    assert encode_table(dict(value)) == data
