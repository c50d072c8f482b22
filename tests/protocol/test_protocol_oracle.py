"""Byte-for-byte agreement with pamqp, the test oracle, in both directions.

For every method and for content headers with random properties: our
encoding equals pamqp's; we decode pamqp's bytes to the values; pamqp
decodes our bytes to the values. Values are drawn from pamqp's correct
domain (see ``protocol_strategies``: ``oracle_*``); the remaining
differences are reserved fields, listed in ``PAMQP_RESERVED_QUIRKS``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import body as pamqp_body
from pamqp import commands as pamqp_commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from support.protocol_strategies import method_args, oracle_properties

from roarmq.protocol import spec
from roarmq.protocol.codegen import find_spec, load_spec
from roarmq.protocol.frames import (
    ContentHeader,
    ContentMessage,
    FrameParser,
    encode_content,
    encode_method,
)
from roarmq.protocol.method import Method
from roarmq.protocol.properties import BasicProperties

ALL_METHODS = sorted(spec.METHODS.values(), key=lambda cls: cls.INDEX)

# pamqp names every field, reserved ones included, in wire order; so do we
# (reserved ones are ours to zero). Map ours -> pamqp by position.
_SPEC = {(m.class_index << 16) | m.index: m for m in load_spec(find_spec()).methods}


def field_map(cls: type[Method]) -> list[tuple[str | None, str, str]]:
    """(our attribute or None if reserved, pamqp attribute, AMQP type) in wire order."""
    pamqp_cls = pamqp_commands.INDEX_MAPPING[cls.INDEX]
    fields = _SPEC[cls.INDEX].fields
    assert len(fields) == len(pamqp_cls.__slots__), cls.NAME
    return [
        (None if f.reserved else f.attr, pamqp_name, f.type)
        for f, pamqp_name in zip(fields, pamqp_cls.__slots__, strict=True)
    ]


RESERVED_ZERO = {"short": 0, "shortstr": "", "longstr": "", "bit": False}

# pamqp insists the reserved channel.open out-of-band and channel.open-ok
# channel-id be the string "0"; the spec (and RabbitMQ, pika) send them empty,
# as we do. For these two, pamqp's validate() is stubbed while it encodes our
# empty values, so the rest of the frame is still compared byte for byte.
PAMQP_RESERVED_QUIRKS = {spec.ChannelOpen.INDEX, spec.ChannelOpenOk.INDEX}


def to_pamqp(cls: type[Method], values: dict[str, Any]) -> Any:
    pamqp_cls = pamqp_commands.INDEX_MAPPING[cls.INDEX]
    obj = pamqp_cls.__new__(pamqp_cls)
    for ours, theirs, kind in field_map(cls):
        setattr(obj, theirs, RESERVED_ZERO[kind] if ours is None else values[ours])
    return obj


def pamqp_marshal(cls: type[Method], obj: Any, channel: int) -> bytes:
    with pytest.MonkeyPatch.context() as patch:
        if cls.INDEX in PAMQP_RESERVED_QUIRKS:
            patch.setattr(type(obj), "validate", lambda self: None)
        return pamqp_frame.marshal(obj, channel)


def ours_from(cls: type[Method], values: dict[str, Any]) -> Method:
    """Our method for ``values``; longstr values (str here) decode back as bytes."""
    kinds = dict(cls.FIELDS)
    return cls(**{k: v.encode() if kinds[k] == "longstr" else v for k, v in values.items()})


@pytest.mark.filterwarnings("ignore:This command is deprecated:DeprecationWarning")  # recover-async
@pytest.mark.parametrize("cls", ALL_METHODS, ids=lambda cls: cls.NAME)
@settings(max_examples=20, deadline=None)
@given(data=st.data(), channel=st.integers(0, 65535))
def test_method_matches_pamqp_both_directions(
    cls: type[Method], data: st.DataObject, channel: int
) -> None:
    values = data.draw(method_args(cls, oracle=True))
    ours = ours_from(cls, values)
    theirs = pamqp_marshal(cls, to_pamqp(cls, values), channel)

    # 1. our bytes == pamqp's bytes
    frame = encode_method(channel, ours)
    assert frame == theirs

    # 2. we decode pamqp's bytes to the values
    assert cls.decode(theirs[11:-1]) == ours
    if not cls.HAS_CONTENT:
        (event,) = FrameParser(expect_protocol_header=False).feed(theirs)
        assert (event.channel, event.method) == (channel, ours)

    # 3. pamqp decodes our bytes to the values
    consumed, their_channel, decoded = pamqp_frame.unmarshal(frame)
    assert (consumed, their_channel) == (len(frame), channel)
    for our_name, their_name, _kind in field_map(cls):
        if our_name is not None:
            assert getattr(decoded, their_name) == values[our_name], our_name


def pamqp_properties(values: dict[str, Any]) -> Any:
    renamed = {("message_type" if k == "type" else k): v for k, v in values.items()}
    return pamqp_commands.Basic.Properties(**renamed)


@settings(max_examples=150, deadline=None)
@given(values=oracle_properties, body=st.binary(max_size=64), channel=st.integers(1, 65535))
def test_content_header_matches_pamqp_both_directions(
    values: dict[str, Any], body: bytes, channel: int
) -> None:
    props = BasicProperties(**values)
    their_props = pamqp_properties(values)
    method = spec.BasicPublish(exchange="amq.topic", routing_key="a.b")

    # 1. our bytes == pamqp's bytes (property list, then the whole message)
    assert props.encode() == their_props.marshal()
    ours = encode_content(channel, method, props, body, 131072)
    theirs = b"".join(
        [
            pamqp_frame.marshal(
                pamqp_commands.Basic.Publish(exchange="amq.topic", routing_key="a.b"), channel
            ),
            pamqp_frame.marshal(pamqp_header.ContentHeader(0, len(body), their_props), channel),
            pamqp_frame.marshal(pamqp_body.ContentBody(body), channel) if body else b"",
        ]
    )
    assert ours == theirs

    # 2. we decode pamqp's bytes to the values
    (message,) = FrameParser(expect_protocol_header=False).feed(theirs)
    assert isinstance(message, ContentMessage)
    assert (message.channel, message.method, message.body) == (channel, method, body)
    assert message.header.properties == props
    assert message.header == ContentHeader.from_properties(props, body_size=len(body))

    # 3. pamqp decodes our bytes to the values
    offset, frames = 0, []
    while offset < len(ours):
        consumed, _, frame = pamqp_frame.unmarshal(ours[offset:])
        frames.append(frame)
        offset += consumed
    header = frames[1]
    assert (header.class_id, header.body_size) == (60, len(body))
    for name, value in values.items():
        their_name = "message_type" if name == "type" else name
        assert getattr(header.properties, their_name) == value, name
    assert b"".join(f.value for f in frames[2:]) == body
