"""The codec's contract, after h11's fuzz rule: any input either parses or raises the protocol error.

Random bytes, well-framed random payloads and mutations of valid streams go
through the parser (in random chunks) and through every decoder; nothing but
a ``ProtocolError`` may escape, and lazily decoded properties obey the same rule.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.protocol_strategies import full_properties, full_tables, methods, raw_frame

from roarmq.protocol import spec
from roarmq.protocol.errors import ProtocolError, SoftError
from roarmq.protocol.frames import (
    PROTOCOL_HEADER,
    ContentMessage,
    FrameParser,
    encode_content,
    encode_method,
)
from roarmq.protocol.properties import BasicProperties
from roarmq.protocol.tables import (
    decode_array,
    decode_array_typed,
    decode_table,
    decode_table_typed,
    encode_array,
    encode_table,
)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ALL_METHODS = sorted(spec.METHODS.values(), key=lambda cls: cls.INDEX)


def feed_all(parser: FrameParser, chunks: list[bytes]) -> list[Any]:
    """Feed chunks; a soft error is survivable, so keep going after one."""
    events: list[Any] = []
    try:
        for chunk in chunks:
            while True:
                try:
                    events += parser.feed(chunk)
                    break
                except SoftError as exc:
                    events += exc.events
                    chunk = b""
    except ProtocolError as exc:
        events += exc.events
    for event in events:
        if isinstance(event, ContentMessage):
            try:
                event.header.properties  # noqa: B018
            except ProtocolError:
                pass
    return events


def chunked(data: bytes, sizes: list[int]) -> list[bytes]:
    chunks, pos = [], 0
    for size in sizes:
        chunks.append(data[pos : pos + size])
        pos += size
    chunks.append(data[pos:])
    return chunks


def parsers(expect_protocol_header: bool | None = None) -> st.SearchStrategy[FrameParser]:
    expect = st.booleans() if expect_protocol_header is None else st.just(expect_protocol_header)
    return st.builds(
        FrameParser,
        expect_protocol_header=expect,
        frame_max=st.sampled_from([0, 64, 4096, 131072]),
        max_body_size=st.sampled_from([None, 0, 10, 1000]),
    )


@FUZZ
@given(
    parser=parsers(), data=st.binary(max_size=600), sizes=st.lists(st.integers(1, 50), max_size=10)
)
def test_random_bytes(parser: FrameParser, data: bytes, sizes: list[int]) -> None:
    feed_all(parser, chunked(data, sizes))


frames = st.builds(
    raw_frame,
    kind=st.sampled_from([1, 1, 1, 2, 2, 3, 3, 8, 0, 4]),
    channel=st.integers(0, 3),
    payload=st.one_of(
        st.binary(max_size=80),
        st.builds(
            lambda i, rest: i.to_bytes(4, "big") + rest,
            st.sampled_from(sorted(spec.METHODS)),
            st.binary(max_size=80),
        ),
        st.builds(
            lambda h, rest: h + rest,
            st.sampled_from([b"\x00\x3c\x00\x00", b"\x00\x3c\x00\x01"]),
            st.binary(max_size=40),
        ),
    ),
    end=st.sampled_from([0xCE] * 9 + [0]),
)


@FUZZ
@given(
    expect_header=st.booleans(),
    data=st.data(),
    frames=st.lists(frames, max_size=12),
    sizes=st.lists(st.integers(1, 30), max_size=6),
)
def test_well_framed_random_payloads(
    expect_header: bool, data: st.DataObject, frames: list[bytes], sizes: list[int]
) -> None:
    parser = data.draw(parsers(expect_header))
    prefix = PROTOCOL_HEADER if expect_header else b""
    feed_all(parser, chunked(prefix + b"".join(frames), sizes))


@st.composite
def valid_streams(draw: st.DrawFn) -> bytes:
    parts = [PROTOCOL_HEADER]
    for _ in range(draw(st.integers(1, 4))):
        channel = draw(st.integers(0, 3))
        cls = draw(st.sampled_from(ALL_METHODS))
        method = draw(methods(cls))
        if not cls.HAS_CONTENT:
            parts.append(encode_method(channel, method))
        elif draw(st.booleans()):
            body = draw(st.binary(max_size=200))
            parts.append(encode_content(channel, method, draw(full_properties), body, 4096))
        else:  # small frames, so bodies span several
            body = draw(st.binary(max_size=200))
            small = spec.BasicPublish(exchange="x", routing_key="y")
            parts.append(encode_content(channel, small, BasicProperties(delivery_mode=2), body, 72))
    return b"".join(parts)


@st.composite
def mutated(draw: st.DrawFn, streams: st.SearchStrategy[bytes]) -> bytes:
    data = bytearray(draw(streams))
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        action = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        if action == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif action == "set":
            data[at] = draw(st.sampled_from([0, 1, 2, 3, 8, 0x7F, 0x80, 0xCE, 0xFF]))
        elif action == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif action == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        else:
            del data[at:]
    return bytes(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=mutated(valid_streams()),
    sizes=st.lists(st.integers(1, 40), max_size=6),
    frame_max=st.sampled_from([0, 4096]),
)
def test_mutated_valid_streams(data: bytes, sizes: list[int], frame_max: int) -> None:
    feed_all(FrameParser(frame_max=frame_max, max_body_size=150), chunked(data, sizes))


@FUZZ
@given(cls=st.sampled_from(ALL_METHODS), data=st.binary(max_size=120), offset=st.integers(0, 4))
def test_method_decoders(cls: type, data: bytes, offset: int) -> None:
    try:
        cls.decode(data, offset)
    except ProtocolError:
        pass


def one_byte_changed(raw: bytes) -> st.SearchStrategy[bytes]:
    return st.builds(
        lambda at, value: raw[:at] + bytes([value]) + raw[at + 1 :],
        st.integers(0, len(raw)),
        st.integers(0, 255),
    )


@FUZZ
@given(
    data=st.binary(max_size=200)
    | full_properties.map(BasicProperties.encode).flatmap(one_byte_changed)
)
def test_properties_decoder(data: bytes) -> None:
    try:
        props = BasicProperties.decode(data)
    except ProtocolError:
        return
    # What the decoder accepts the broker may have to re-encode (dead-lettering, BCC):
    # that must work, to bytes that decode and re-encode unchanged (bytes, not values,
    # are compared: a NaN header is not equal to itself).
    again = props.encode()
    assert BasicProperties.decode(again).encode() == again


@FUZZ
@given(data=st.binary(max_size=200) | full_tables.map(encode_table).flatmap(one_byte_changed))
def test_table_decoders(data: bytes) -> None:
    for decode in (decode_table, decode_table_typed, decode_array, decode_array_typed):
        try:
            decode(data)
        except ProtocolError:
            pass
    for decode, encode in ((decode_table, encode_table), (decode_array, encode_array)):
        try:
            value, _ = decode(data)
        except ProtocolError:
            continue
        again = encode(value)  # whatever was accepted re-encodes, to bytes that are stable
        assert encode(decode(again)[0]) == again
