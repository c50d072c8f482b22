"""The AMQP 1.0 message codec (protocol/stream/amqp10.py) and the mapping to and from AMQP
0-9-1 (broker/core/amqp10_map.py), in process."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from roarmq.broker.core.amqp10_map import to_amqp091, to_amqp10
from roarmq.protocol.spec import BasicProperties
from roarmq.protocol.stream.amqp10 import (
    AMQP_VALUE,
    Amqp10Error,
    Byte,
    Message10,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    decode_message,
    encode_message,
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(0, 2**64 - 1).map(ULong),
    st.integers(0, 2**32 - 1).map(UInt),
    st.integers(0, 255).map(UByte),
    st.integers(-128, 127).map(Byte),
    st.floats(allow_nan=False),
    st.text(max_size=300),
    st.text(alphabet="abcxyz-.", max_size=20).map(Symbol),
    st.binary(max_size=300),
    st.integers(0, 2**62).map(Timestamp),
    st.uuids(),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=20,
)


@given(
    st.dictionaries(st.text(max_size=10), values, max_size=5),
    st.lists(st.binary(max_size=500), min_size=1, max_size=3),
)
def test_a_message_reads_back_as_written(app, body):
    msg = Message10(
        header={"durable": True, "priority": UByte(4)},
        message_annotations={Symbol("x-opt"): "v"},
        properties={"message_id": ULong(9), "content_type": Symbol("text/plain")},
        application_properties=app or None,
        body=body,
    )
    back = decode_message(encode_message(msg))
    assert back.application_properties == (app or None)
    assert back.body == body and back.header == msg.header
    assert back.properties == msg.properties and back.message_annotations == msg.message_annotations


def test_an_amqp_value_body_and_bad_bytes():
    msg = decode_message(encode_message(Message10(body={"k": [1, 2]}, body_kind=AMQP_VALUE)))
    assert msg.body == {"k": [1, 2]} and msg.body_kind == AMQP_VALUE
    for bad in (b"\x00\x53\x75\xa0\x05ab", b"\x01", b"\x00\x53\x70\xc0\x09\x05"):
        with pytest.raises(Amqp10Error):
            decode_message(bad)


def test_typed_ids_go_back_to_their_types():
    uid = uuid.uuid4()
    props = BasicProperties(
        message_id=str(uid),
        correlation_id="42",
        headers={"x-message-id-type": "uuid", "x-correlation-id-type": "ulong", "k": "v"},
    )
    msg = decode_message(to_amqp10("", "q", props.encode(), props, b"body"))
    assert msg.properties["message_id"] == uid and msg.properties["correlation_id"] == 42
    assert msg.application_properties == {"k": "v"}
    back, body = to_amqp091(encode_message(msg))
    assert (back.message_id, back.correlation_id, body) == (str(uid), "42", b"body")
    assert back.headers == {"x-message-id-type": "uuid", "x-correlation-id-type": "ulong", "k": "v"}
