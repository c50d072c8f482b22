"""The generated method classes: metadata, defaults, and encode/decode round trips."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.protocol_strategies import methods

from roarmq.protocol import spec
from roarmq.protocol.errors import AMQPSyntaxError
from roarmq.protocol.frames import FrameParser, MethodFrame, encode_method

CONTRACT_NAMES = """
ConnectionStart ConnectionStartOk ConnectionSecure ConnectionSecureOk ConnectionTune
ConnectionTuneOk ConnectionOpen ConnectionOpenOk ConnectionClose ConnectionCloseOk
ConnectionBlocked ConnectionUnblocked ChannelOpen ChannelOpenOk ChannelFlow ChannelFlowOk
ChannelClose ChannelCloseOk ExchangeDeclare ExchangeDeclareOk ExchangeDelete ExchangeDeleteOk
ExchangeBind ExchangeBindOk ExchangeUnbind ExchangeUnbindOk QueueDeclare QueueDeclareOk
QueueBind QueueBindOk QueueUnbind QueueUnbindOk QueuePurge QueuePurgeOk QueueDelete
QueueDeleteOk BasicQos BasicQosOk BasicConsume BasicConsumeOk BasicCancel BasicCancelOk
BasicPublish BasicReturn BasicDeliver BasicGet BasicGetOk BasicGetEmpty BasicAck BasicReject
BasicRecoverAsync BasicRecover BasicRecoverOk BasicNack TxSelect TxSelectOk TxCommit TxCommitOk
TxRollback TxRollbackOk ConfirmSelect ConfirmSelectOk ConnectionUpdateSecret
ConnectionUpdateSecretOk
""".split()

ALL_METHODS = sorted(spec.METHODS.values(), key=lambda cls: cls.INDEX)


def test_every_contract_method_is_generated() -> None:
    assert sorted(CONTRACT_NAMES) == sorted(cls.__name__ for cls in ALL_METHODS)
    for name in CONTRACT_NAMES:
        assert getattr(spec, name) is spec.METHODS[getattr(spec, name).INDEX]


def test_metadata_of_well_known_methods() -> None:
    publish = spec.BasicPublish
    assert (publish.CLASS_ID, publish.METHOD_ID, publish.INDEX) == (60, 40, 0x003C0028)
    assert publish.NAME == "basic.publish"
    assert publish.HAS_CONTENT and not publish.SYNCHRONOUS and publish.RESPONSES == ()
    assert publish.__slots__ == ("exchange", "routing_key", "mandatory", "immediate")
    assert spec.BasicGet.RESPONSES == (spec.BasicGetOk, spec.BasicGetEmpty)
    assert spec.QueueDeclare.SYNCHRONOUS and spec.QueueDeclare.RESPONSES == (spec.QueueDeclareOk,)
    assert spec.BasicRecover.RESPONSES == (spec.BasicRecoverOk,)  # an erratum to the XML
    assert spec.BasicQos.__slots__ == ("prefetch_size", "prefetch_count", "global_")
    assert spec.ConfirmSelect.__slots__ == ("nowait",)
    assert spec.ConnectionStart.__slots__ == (
        "version_major",
        "version_minor",
        "server_properties",
        "mechanisms",
        "locales",
    )
    assert (
        spec.ConnectionBlocked.INDEX == 0x000A003C and spec.ConnectionUnblocked.INDEX == 0x000A003D
    )
    assert spec.ConnectionUpdateSecret.__slots__ == ("new_secret", "reason")
    # RabbitMQ extensions the server sends to clients.
    assert spec.BasicAck.TO_CLIENT and spec.BasicNack.TO_CLIENT and spec.BasicCancel.TO_CLIENT
    assert spec.BasicDeliver.TO_CLIENT and not spec.BasicDeliver.TO_SERVER
    assert spec.CONTENT_METHODS == frozenset(
        cls.INDEX
        for cls in (spec.BasicPublish, spec.BasicReturn, spec.BasicDeliver, spec.BasicGetOk)
    )
    assert (spec.FRAME_METHOD, spec.FRAME_HEADER, spec.FRAME_BODY, spec.FRAME_HEARTBEAT) == (
        1,
        2,
        3,
        8,
    )
    assert (spec.FRAME_END, spec.FRAME_MIN_SIZE) == (206, 4096)


def test_reserved_fields_are_not_arguments() -> None:
    assert spec.ConnectionOpen.__slots__ == ("virtual_host",)
    assert spec.ChannelOpen.__slots__ == ()
    with pytest.raises(TypeError):
        spec.BasicPublish(ticket=0)  # type: ignore[call-arg]
    # ...but they are on the wire, zeroed.
    assert spec.ConnectionOpen(virtual_host="/").encode() == b"\x01/\x00\x00"
    assert spec.ChannelOpenOk().encode() == b"\x00\x00\x00\x00"
    assert spec.BasicPublish().encode() == b"\x00\x00\x00\x00\x00"


def test_defaults_and_no_shared_mutable_state() -> None:
    a, b = spec.QueueDeclare(), spec.QueueDeclare()
    assert (a.queue, a.durable, a.arguments) == ("", False, {})
    a.arguments["x-max-length"] = 1
    assert b.arguments == {}
    assert spec.ConnectionStart().mechanisms == b""
    assert spec.BasicAck().delivery_tag == 0


def test_eq_and_repr() -> None:
    m = spec.BasicAck(delivery_tag=7, multiple=True)
    assert m == spec.BasicAck(delivery_tag=7, multiple=True)
    assert m != spec.BasicAck(delivery_tag=8, multiple=True)
    assert m != spec.BasicNack(delivery_tag=7, multiple=True)
    assert repr(m) == "BasicAck(delivery_tag=7, multiple=True)"


def test_bits_pack_into_one_octet_in_order() -> None:
    declare = spec.QueueDeclare(queue="q", passive=True, exclusive=True, no_wait=True)
    assert declare.encode() == b"\x00\x00\x01q" + bytes([0b10101]) + b"\x00\x00\x00\x00"
    nack = spec.BasicNack(delivery_tag=1, multiple=False, requeue=True)
    assert nack.encode() == b"\x00\x00\x00\x00\x00\x00\x00\x01\x02"


def test_longstr_accepts_str_and_decodes_to_bytes() -> None:
    start = spec.ConnectionStart(mechanisms="PLAIN AMQPLAIN", locales=b"en_US")
    decoded = spec.ConnectionStart.decode(start.encode())
    assert decoded.mechanisms == b"PLAIN AMQPLAIN" and decoded.locales == b"en_US"


def test_shortstr_round_trips_any_bytes() -> None:
    raw = b"\x00\xff\xfe caf\xc3\xa9"  # not valid UTF-8 as a whole
    payload = b"\x00\x00" + bytes([len(raw)]) + raw + b"\x00\x00"
    publish = spec.BasicPublish.decode(payload)
    assert publish.exchange.encode("utf-8", "surrogateescape") == raw
    assert publish.encode() == payload


def test_decode_accepts_offset_and_buffers() -> None:
    payload = spec.BasicAck(delivery_tag=99, multiple=True).encode()
    expected = spec.BasicAck(delivery_tag=99, multiple=True)
    assert spec.BasicAck.decode(b"junk" + payload, 4) == expected
    assert spec.BasicAck.decode(memoryview(payload)) == expected
    assert spec.BasicAck.decode(bytearray(payload)) == expected


@pytest.mark.parametrize(
    "method, message",
    [
        (spec.BasicPublish(exchange="x" * 256), "longer than 255 bytes"),
        (spec.BasicAck(delivery_tag=-1), "basic.ack"),
        (spec.BasicQos(prefetch_count=65536), "basic.qos"),
        (spec.ConnectionTune(frame_max=2**32), "connection.tune"),
        (spec.QueueDeclare(arguments={"x": object()}), "cannot encode object"),
    ],
)
def test_encode_rejects_bad_values_with_value_or_type_error(method: object, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        method.encode()  # type: ignore[attr-defined]


def test_decode_errors_name_the_method() -> None:
    with pytest.raises(AMQPSyntaxError, match="basic.publish: arguments truncated") as info:
        spec.BasicPublish.decode(b"\x00\x00\x05ab")
    assert (info.value.reply_code, info.value.class_id, info.value.method_id) == (502, 60, 40)
    with pytest.raises(AMQPSyntaxError, match="2 unexpected bytes"):
        spec.BasicAck.decode(bytes(9) + b"xx")
    with pytest.raises(AMQPSyntaxError, match="queue.declare.arguments: "):
        spec.QueueDeclare.decode(b"\x00\x00\x00\x00\x00\x00\x00\x05\x01a?")


@pytest.mark.parametrize("cls", ALL_METHODS, ids=lambda cls: cls.NAME)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_round_trip_every_method(cls: type, data: st.DataObject) -> None:
    method = data.draw(methods(cls))
    payload = method.encode()
    assert cls.decode(payload) == method
    if not cls.HAS_CONTENT:  # ...and through a method frame and the parser
        parser = FrameParser(expect_protocol_header=False)
        assert parser.feed(encode_method(3, method)) == [MethodFrame(3, method)]
