"""FrameParser (chunking, content assembly, interleaving, limits) and the frame encoders."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.protocol_strategies import raw_frame

from roarmq.protocol import spec
from roarmq.protocol.errors import (
    FrameError,
    HardError,
    ProtocolHeaderMismatch,
    SoftError,
    UnexpectedFrame,
)
from roarmq.protocol.frames import (
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    ContentHeader,
    ContentMessage,
    FrameParser,
    Heartbeat,
    MethodFrame,
    ProtocolHeaderReceived,
    encode_ack,
    encode_content,
    encode_deliver,
    encode_heartbeat,
    encode_method,
)
from roarmq.protocol.properties import BasicProperties

PROPS = BasicProperties(content_type="text/plain", delivery_mode=2, headers={"k": "v"})
PUBLISH = spec.BasicPublish(exchange="amq.topic", routing_key="orders.eu.created")


def message(channel: int, body: bytes, method: spec.Method = PUBLISH) -> ContentMessage:
    return ContentMessage(
        channel, method, ContentHeader.from_properties(PROPS, body_size=len(body)), body
    )


def split_frames(data: bytes) -> list[bytes]:
    frames, pos = [], 0
    while pos < len(data):
        size = int.from_bytes(data[pos + 3 : pos + 7], "big")
        frames.append(data[pos : pos + size + 8])
        pos += size + 8
    return frames


def client_stream() -> tuple[bytes, list[object]]:
    """A realistic client->server stream: every frame kind, multi-frame bodies, two channels."""
    big = bytes(range(256)) * 40  # 10240 bytes: 3 body frames at frame_max 4096
    open_ = spec.ChannelOpen()
    ack = spec.BasicAck(delivery_tag=5, multiple=True)
    stream = b"".join(
        [
            PROTOCOL_HEADER,
            encode_method(
                0,
                spec.ConnectionStartOk(
                    client_properties={"product": "t"}, mechanism="PLAIN", response=b"\0u\0p"
                ),
            ),
            encode_method(1, open_),
            encode_content(1, PUBLISH, PROPS, b"small", 4096),
            HEARTBEAT_FRAME,
            encode_content(1, PUBLISH, PROPS, big, 4096),
            encode_content(2, PUBLISH, PROPS, b"", 4096),
            encode_method(2, ack),
        ]
    )
    events = [
        ProtocolHeaderReceived(0, 9, 1),
        MethodFrame(
            0,
            spec.ConnectionStartOk(
                client_properties={"product": "t"}, mechanism="PLAIN", response=b"\0u\0p"
            ),
        ),
        MethodFrame(1, open_),
        message(1, b"small"),
        Heartbeat(0),
        message(1, big),
        message(2, b""),
        MethodFrame(2, ack),
    ]
    return stream, events


def test_whole_stream_at_once() -> None:
    stream, events = client_stream()
    assert FrameParser(frame_max=4096).feed(stream) == events


def test_one_byte_at_a_time() -> None:
    stream, events = client_stream()
    parser = FrameParser(frame_max=4096)
    got: list[object] = []
    for i in range(len(stream)):
        got += parser.feed(stream[i : i + 1])
    assert got == events


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_random_chunk_sizes(data: st.DataObject) -> None:
    stream, events = client_stream()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=40)))
    parser = FrameParser(frame_max=4096)
    got: list[object] = []
    for start, stop in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        chunk = stream[start:stop]
        got += parser.feed(data.draw(st.sampled_from([bytes, bytearray, memoryview]))(chunk))
    assert got == events


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_interleaved_channels(data: st.DataObject) -> None:
    """Frames of different channels interleave freely; each channel's order is kept."""
    bodies = {ch: data.draw(st.binary(max_size=300)) for ch in (1, 2, 3)}
    per_channel = {
        ch: split_frames(encode_content(ch, PUBLISH, PROPS, body, 128))
        for ch, body in bodies.items()
    }
    order = data.draw(st.permutations([ch for ch, frames in per_channel.items() for _ in frames]))
    stream = b"".join(per_channel[ch].pop(0) for ch in order)
    parser = FrameParser(expect_protocol_header=False, frame_max=128)
    chunk = data.draw(st.integers(1, 64))
    got = [e for i in range(0, len(stream), chunk) for e in parser.feed(stream[i : i + chunk])]
    assert sorted(got, key=lambda e: e.channel) == [message(ch, bodies[ch]) for ch in (1, 2, 3)]


@pytest.mark.parametrize(
    "method",
    [
        spec.BasicPublish(exchange="e"),
        spec.BasicReturn(reply_code=312, reply_text="NO_ROUTE", exchange="e", routing_key="k"),
        spec.BasicDeliver(consumer_tag="c", delivery_tag=1, exchange="e", routing_key="k"),
        spec.BasicGetOk(delivery_tag=1, exchange="e", routing_key="k", message_count=3),
    ],
    ids=lambda m: m.NAME,
)
def test_every_content_method_assembles(method: spec.Method) -> None:
    data = encode_content(9, method, PROPS, b"payload", 131072)
    assert FrameParser(expect_protocol_header=False).feed(data) == [message(9, b"payload", method)]


def test_encode_content_splits_bodies_at_frame_max() -> None:
    body = bytes(1000)
    frames = split_frames(encode_content(1, PUBLISH, PROPS, body, 4096))
    assert [f[0] for f in frames] == [1, 2, 3]
    frames = split_frames(encode_content(1, PUBLISH, PROPS, bytes(10000), 4096))
    assert [f[0] for f in frames] == [1, 2, 3, 3, 3]
    assert [len(f) for f in frames[2:]] == [4096, 4096, 10000 - 2 * 4088 + 8]
    assert [f[0] for f in split_frames(encode_content(1, PUBLISH, PROPS, b"", 4096))] == [1, 2]
    # frame_max 0 means unlimited
    assert [f[0] for f in split_frames(encode_content(1, PUBLISH, PROPS, bytes(10**6), 0))] == [
        1,
        2,
        3,
    ]


def test_encode_content_with_a_content_header_forwards_raw_bytes() -> None:
    raw = b"\x80\x00\x03odd"  # whatever the publisher sent
    data = encode_content(1, PUBLISH, ContentHeader(60, 999, raw), b"xy", 4096)
    (event,) = FrameParser(expect_protocol_header=False).feed(data)
    assert event.header.raw == raw and event.header.body_size == 2  # body size from len(body)


@pytest.mark.parametrize("size", [0, 1, 64, 1024, 4088, 4089, 20000])
@pytest.mark.parametrize("redelivered", [False, True])
def test_encode_deliver_equals_the_generic_encoder(size: int, redelivered: bool) -> None:
    body = bytes(range(256)) * (size // 256) + bytes(size % 256)
    raw = PROPS.encode()
    fast = encode_deliver(7, "ctag", 2**64 - 1, redelivered, "amq.topic", "a.b", raw, body, 4096)
    method = spec.BasicDeliver(
        consumer_tag="ctag",
        delivery_tag=2**64 - 1,
        redelivered=redelivered,
        exchange="amq.topic",
        routing_key="a.b",
    )
    assert fast == encode_content(7, method, ContentHeader(60, size, raw), body, 4096)
    (event,) = FrameParser(expect_protocol_header=False, frame_max=4096).feed(fast)
    assert event == ContentMessage(7, method, ContentHeader(60, size, raw), body)


_NAMES = st.one_of(
    st.text(alphabet=st.characters(max_codepoint=127), max_size=260),
    st.text(max_size=90),  # non-ASCII (compiled: the general path)
    st.just("caf\udce9"),  # a lone surrogate, as surrogateescape decodes a bad octet
)


@settings(max_examples=300, deadline=None)
@given(
    channel=st.integers(0, 70000),
    tag=_NAMES,
    delivery_tag=st.one_of(st.integers(0, 2**64 - 1), st.integers(-5, 2**64 + 5)),
    redelivered=st.booleans(),
    exchange=_NAMES,
    key=_NAMES,
    raw=st.binary(max_size=40),
    size=st.integers(0, 300),
    frame_max=st.sampled_from([0, 4096, 131072]),  # 4096: the smallest a peer may set
)
def test_encode_deliver_matches_the_generic_encoder_or_refuses(
    channel: int,
    tag: str,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    key: str,
    raw: bytes,
    size: int,
    frame_max: int,
) -> None:
    """Whatever the arguments, encode_deliver (compiled: its C path for the common case) gives
    the generic encoder's bytes, or refuses what that cannot encode with ValueError."""
    body = bytes(range(256)) * (size // 256) + bytes(size % 256)
    args = (channel, tag, delivery_tag, redelivered, exchange, key, raw, body, frame_max)
    try:
        method = spec.BasicDeliver(
            consumer_tag=tag,
            delivery_tag=delivery_tag,
            redelivered=redelivered,
            exchange=exchange,
            routing_key=key,
        )
        expected = encode_content(channel, method, ContentHeader(60, size, raw), body, frame_max)
    except ValueError:
        with pytest.raises(ValueError):
            encode_deliver(*args)
        return
    assert encode_deliver(*args) == expected


@settings(max_examples=300, deadline=None)
@given(
    channel=st.integers(-3, 70000),
    delivery_tag=st.one_of(st.integers(0, 2**64 - 1), st.integers(-5, 2**64 + 5)),
    multiple=st.booleans(),
)
def test_encode_ack_matches_the_generic_encoder_or_refuses(
    channel: int, delivery_tag: int, multiple: bool
) -> None:
    """A publisher confirm framed by encode_ack is encode_method's frame, or a ValueError
    where that refuses too."""
    try:
        expected = encode_method(
            channel, spec.BasicAck(delivery_tag=delivery_tag, multiple=multiple)
        )
    except ValueError:
        with pytest.raises(ValueError):
            encode_ack(channel, delivery_tag, multiple)
        return
    assert encode_ack(channel, delivery_tag, multiple) == expected


@settings(max_examples=300, deadline=None)
@given(
    delivery_tag=st.sampled_from([0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63, 2**64 - 1])
    | st.integers(0, 2**64 - 1),
    bits=st.integers(0, 255),
    extra=st.sampled_from([b"", b"\x00", b"\x00" * 7]),
    cut=st.integers(0, 8),
)
def test_the_parser_reads_basic_ack_as_the_generated_decoder(
    delivery_tag: int, bits: int, extra: bytes, cut: int
) -> None:
    """basic.ack has its own path through the parser (once per message from a consumer):
    every 64-bit tag reads whole (the top bits too, compiled), the bit is the low one, and a
    payload of another length fails as the generated decoder fails."""
    args = delivery_tag.to_bytes(8, "big") + bytes((bits,))
    for payload in (args + extra, args[:cut]):
        frame = raw_frame(1, 3, (60).to_bytes(2, "big") + (80).to_bytes(2, "big") + payload)
        parser = FrameParser(expect_protocol_header=False)
        try:
            expected = spec.BasicAck.decode(payload)
        except Exception as exc:  # noqa: BLE001 - whatever it raises, the parser must too
            with pytest.raises(type(exc), match=re.escape(str(exc))):
                parser.feed(frame)
            continue
        (event,) = parser.feed(frame)
        assert event == MethodFrame(3, expected)
        assert type(event.method.delivery_tag) is int and type(event.method.multiple) is bool


def test_encoder_errors() -> None:
    with pytest.raises(ValueError):
        encode_method(70000, spec.ChannelOpen())
    with pytest.raises(ValueError):
        encode_deliver(1, "t" * 256, 1, False, "", "", b"\x00\x00", b"x", 4096)
    with pytest.raises(ValueError, match="does not fit"):
        encode_content(1, PUBLISH, BasicProperties(headers={"k": "v" * 5000}), b"x", 4096)
    with pytest.raises(TypeError):
        encode_content(1, PUBLISH, {"content_type": "x"}, b"x", 4096)  # type: ignore[arg-type]


def test_heartbeat() -> None:
    assert encode_heartbeat() == HEARTBEAT_FRAME == raw_frame(8, 0, b"")
    assert FrameParser(expect_protocol_header=False).feed(HEARTBEAT_FRAME * 2) == [Heartbeat(0)] * 2


def test_events_are_frozen() -> None:
    event = MethodFrame(1, spec.ChannelOpen())
    with pytest.raises(AttributeError):
        event.channel = 2  # type: ignore[misc]
    assert not hasattr(event, "__dict__")


# -- protocol header ----------------------------------------------------------------


def test_protocol_header_may_arrive_in_pieces() -> None:
    parser = FrameParser()
    assert parser.feed(b"AM") == []
    assert parser.feed(b"QP\x00\x00\x09") == []
    assert parser.feed(b"\x01" + HEARTBEAT_FRAME) == [ProtocolHeaderReceived(0, 9, 1), Heartbeat(0)]


@pytest.mark.parametrize(
    "data, hint",
    [
        (b"GET / HTTP/1.1\r\n", "HTTP"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01", "TLS"),
        (b"AMQP\x01\x01\x00\x09", "another AMQP version"),
        (b"AMQP\x00\x00\x09\x00", "another AMQP version"),
        (b"AMQP\x00\x01\x00\x00", "another AMQP version"),
        (b"amqp\x00\x00\x09\x01", None),
    ],
)
def test_protocol_header_mismatch(data: bytes, hint: str | None) -> None:
    with pytest.raises(ProtocolHeaderMismatch, match=hint) as info:
        FrameParser().feed(data)
    assert info.value.header == data[:8]
    assert isinstance(info.value, HardError)


def test_protocol_header_mismatch_is_decided_as_soon_as_a_byte_differs() -> None:
    parser = FrameParser()
    assert parser.feed(b"AMQ") == []
    with pytest.raises(ProtocolHeaderMismatch):
        parser.feed(b"X")
    with pytest.raises(ProtocolHeaderMismatch):
        FrameParser().feed(b"G")
    parser = FrameParser()
    assert parser.feed(b"AMQP\x00\x00") == []  # undecided until all 8 bytes are in
    with pytest.raises(ProtocolHeaderMismatch):
        parser.feed(b"\x09\x02")


def test_header_is_not_expected_by_a_client_side_parser() -> None:
    assert FrameParser(expect_protocol_header=False).feed(HEARTBEAT_FRAME) == [Heartbeat(0)]


# -- limits and error recovery ----------------------------------------------------------


def test_frame_max_is_enforced_from_the_header_alone() -> None:
    parser = FrameParser(expect_protocol_header=False, frame_max=4096)
    with pytest.raises(
        FrameError, match="4089-byte payload, larger than the negotiated frame_max 4096"
    ) as info:
        parser.feed(raw_frame(3, 1, bytes(4089))[:7])  # 7 bytes are enough to refuse it
    assert info.value.reply_code == 501
    assert FrameParser(expect_protocol_header=False, frame_max=4096).feed(
        encode_method(1, spec.ChannelOpen())
    ) == [MethodFrame(1, spec.ChannelOpen())]


@pytest.mark.parametrize("size", [0x7FFFFFFF, 0x80000000, 0xFFFFFFFF])
@pytest.mark.parametrize("frame_max", [0, 131072])
def test_a_size_with_its_top_bit_set_is_read_whole(size: int, frame_max: int) -> None:
    """Sizes are read as 32 unsigned bits (compiled, widened before the shift: a C int would
    turn 0x80000000 negative and slip past the frame_max check)."""
    parser = FrameParser(expect_protocol_header=False, frame_max=frame_max)
    head = bytes([3, 0, 1]) + size.to_bytes(4, "big")
    if frame_max:
        with pytest.raises(FrameError, match=f"{size}-byte payload"):
            parser.feed(head)
    else:  # no limit: the parser waits for the whole frame
        assert parser.feed(head + bytes(64)) == []


def test_frame_max_can_change_after_tune_and_zero_means_unlimited() -> None:
    big = encode_method(0, spec.ConnectionStartOk(response=bytes(10000)))
    parser = FrameParser(expect_protocol_header=False, frame_max=0)
    assert len(parser.feed(big)) == 1
    parser.frame_max = 4096
    with pytest.raises(FrameError):
        parser.feed(big)


def test_hard_error_kills_the_parser_and_carries_earlier_events() -> None:
    parser = FrameParser(expect_protocol_header=False)
    with pytest.raises(UnexpectedFrame) as info:
        parser.feed(HEARTBEAT_FRAME + raw_frame(3, 1, b"body") + HEARTBEAT_FRAME)
    assert info.value.events == [Heartbeat(0)]
    with pytest.raises(UnexpectedFrame) as again:
        parser.feed(HEARTBEAT_FRAME)
    assert again.value is info.value


def test_oversized_message_is_a_soft_error_and_its_body_is_skipped() -> None:
    parser = FrameParser(expect_protocol_header=False, frame_max=4096, max_body_size=5000)
    before = encode_method(1, spec.ChannelOpen())
    too_big = encode_content(2, PUBLISH, PROPS, bytes(6000), 4096)
    after = encode_content(3, PUBLISH, PROPS, b"ok", 4096)
    frames = split_frames(too_big)
    stream = before + b"".join(frames[:2]) + HEARTBEAT_FRAME + frames[2] + after + frames[3]
    with pytest.raises(SoftError) as info:
        parser.feed(stream)
    err = info.value
    assert (err.reply_code, err.channel, err.class_id, err.method_id) == (406, 2, 60, 40)
    assert err.text == "message size 6000 is larger than configured max size 5000"
    assert err.events == [MethodFrame(1, spec.ChannelOpen())]
    # The parser lives on: the buffered rest parses, and the body frames of channel 2 vanish.
    assert parser.feed(b"") == [Heartbeat(0), message(3, b"ok")]
    assert parser.feed(HEARTBEAT_FRAME) == [Heartbeat(0)]
    # A message within the limit still passes.
    assert parser.feed(encode_content(2, PUBLISH, PROPS, bytes(5000), 4096)) == [
        message(2, bytes(5000))
    ]


def test_dribbling_a_big_frame_costs_linear_time() -> None:
    """O(n) buffering: a 128 KiB frame fed a byte at a time takes well under a second
    (a quadratic buffer would copy ~8 GB and take minutes)."""
    frame = encode_content(1, PUBLISH, PROPS, bytes(131072 - 8), 131072)
    parser = FrameParser(expect_protocol_header=False)
    feed = parser.feed
    start = time.perf_counter()
    events = [e for i in range(len(frame)) for e in feed(frame[i : i + 1])]
    assert time.perf_counter() - start < 10
    assert events == [message(1, bytes(131072 - 8))]
