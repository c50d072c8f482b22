"""Hostile AMQP client sessions for fuzz/live.py, as lists of frames (bytes).

Frames are encoded here, from the spec XML, independently of the codec under test, so
that the generators can produce what the codec would refuse to: reserved fields set,
lengths that lie, names that are not UTF-8, tables thousands deep.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from roarmq.protocol import spec

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = b"\xce"
STRATEGIES = ("valid", "mutate", "sequence", "values", "random")

# -- frame and field encoding (independent of the codec under test) --------------------


def frame(kind: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", kind, channel & 0xFFFF, len(payload)) + payload + FRAME_END


def shortstr(raw: bytes) -> bytes:
    raw = raw[:255]
    return bytes((len(raw),)) + raw


def longstr(raw: bytes) -> bytes:
    return struct.pack(">I", len(raw)) + raw


def table(entries: list[tuple[bytes, bytes]]) -> bytes:
    """entries: (key, tag + value bytes)."""
    body = b"".join(shortstr(k) + v for k, v in entries)
    return longstr(body)


def deep_table(depth: int) -> bytes:
    """A field table nested ``depth`` levels ({"a": {"a": ...}}), built inside out."""
    inner = table([])
    for _ in range(depth):
        inner = table([(b"a", b"F" + inner)])
    return inner


def deep_array(depth: int) -> bytes:
    inner = longstr(b"")
    for _ in range(depth):
        inner = longstr(b"A" + inner)
    return inner


def method_payload(cls: type, args: list[bytes]) -> bytes:
    return struct.pack(">HH", cls.CLASS_ID, cls.METHOD_ID) + b"".join(args)


def _all_fields() -> dict[tuple[int, int], list[tuple[str, str]]]:
    """Every method's fields, reserved ones included, read from the spec XML itself (the
    codec's classes list only the fields a caller sets)."""
    root = ElementTree.parse(Path(spec.__file__).parent / "xml" / "amqp0-9-1-rabbit.xml").getroot()
    domains = {d.get("name"): d.get("type") for d in root.iter("domain")}
    fields = {}
    for c in root.iter("class"):
        for m in c.iter("method"):
            fields[int(c.get("index")), int(m.get("index"))] = [
                (f.get("name").replace("-", "_"), f.get("type") or domains[f.get("domain")])
                for f in m.iter("field")
            ]
    return fields


ALL_FIELDS = _all_fields()


def method_frame(channel: int, cls: type, values: dict[str, Any]) -> bytes:
    """Encode ``cls`` with ``values`` (raw bytes for tables; anything missing is zero)."""
    out: list[bytes] = []
    bits: list[bool] = []
    for name, kind in ALL_FIELDS.get((cls.CLASS_ID, cls.METHOD_ID), cls.FIELDS):
        if kind != "bit" and bits:
            out.append(bytes((sum(1 << i for i, b in enumerate(bits) if b),)))
            bits = []
        v = values.get(name)
        if kind == "bit":
            bits.append(bool(v))
            if len(bits) == 8:
                out.append(bytes((sum(1 << i for i, b in enumerate(bits) if b),)))
                bits = []
        elif kind == "octet":
            out.append(struct.pack(">B", (v or 0) & 0xFF))
        elif kind == "short":
            out.append(struct.pack(">H", (v or 0) & 0xFFFF))
        elif kind == "long":
            out.append(struct.pack(">I", (v or 0) & 0xFFFFFFFF))
        elif kind in ("longlong", "timestamp"):
            out.append(struct.pack(">Q", (v or 0) & 0xFFFFFFFFFFFFFFFF))
        elif kind == "shortstr":
            out.append(shortstr(v if isinstance(v, bytes) else str(v or "").encode()))
        elif kind == "longstr":
            out.append(longstr(v if isinstance(v, bytes) else str(v or "").encode()))
        elif kind == "table":
            out.append(v if isinstance(v, bytes) else table([]))
        else:  # pragma: no cover - the spec has no other field types
            raise ValueError(kind)
    if bits:
        out.append(bytes((sum(1 << i for i, b in enumerate(bits) if b),)))
    return frame(1, channel, method_payload(cls, out))


def _property_order() -> tuple[tuple[str, str], ...]:
    """The 14 basic properties in flag order, as the spec lists them (`spec.BASIC_PROPERTIES`,
    generated from the XML); encoded here on our own, a timestamp as a longlong."""
    return tuple(
        (name, "longlong" if kind == "timestamp" else kind) for name, kind in spec.BASIC_PROPERTIES
    )


PROPERTY_ORDER = _property_order()


def properties(values: dict[str, Any]) -> bytes:
    flags = 0
    out: list[bytes] = []
    for i, (name, kind) in enumerate(PROPERTY_ORDER):
        if name not in values:
            continue
        flags |= 1 << (15 - i)
        v = values[name]
        if kind == "shortstr":
            out.append(shortstr(v if isinstance(v, bytes) else str(v).encode()))
        elif kind == "octet":
            out.append(struct.pack(">B", v & 0xFF))
        elif kind == "longlong":
            out.append(struct.pack(">Q", v & 0xFFFFFFFFFFFFFFFF))
        else:
            out.append(v)
    return struct.pack(">H", flags) + b"".join(out)


def content(channel: int, props: bytes, body: bytes, frame_max: int = 131072) -> list[bytes]:
    header = frame(2, channel, struct.pack(">HHQ", 60, 0, len(body)) + props)
    frames = [header]
    step = frame_max - 8
    for start in range(0, len(body), step):
        frames.append(frame(3, channel, body[start : start + step]))
    return frames


def handshake(user: bytes = b"guest", password: bytes = b"guest") -> list[bytes]:
    caps = table(
        [
            (b"publisher_confirms", b"t\x01"),
            (b"basic.nack", b"t\x01"),
            (b"consumer_cancel_notify", b"t\x01"),
            (b"connection.blocked", b"t\x01"),
            (b"authentication_failure_close", b"t\x01"),
        ]
    )
    client_props = table(
        [(b"product", b"S" + longstr(b"roarmq-fuzz")), (b"capabilities", b"F" + caps)]
    )
    return [
        PROTOCOL_HEADER,
        method_frame(
            0,
            spec.ConnectionStartOk,
            {
                "client_properties": client_props,
                "mechanism": b"PLAIN",
                "response": b"\x00" + user + b"\x00" + password,
                "locale": b"en_US",
            },
        ),
        method_frame(
            0, spec.ConnectionTuneOk, {"channel_max": 16, "frame_max": 131072, "heartbeat": 0}
        ),
        method_frame(0, spec.ConnectionOpen, {"virtual_host": b"/"}),
    ]


# -- interesting values ------------------------------------------------------------------

QUEUES = [b"fz-q%d" % i for i in range(6)] + [b"", b"amq.gen-fuzz", b"fz-\xff\xfe"]
EXCHANGES = [b"fz-x%d" % i for i in range(5)] + [
    b"",
    b"amq.direct",
    b"amq.topic",
    b"amq.fanout",
    b"amq.headers",
    b"amq.match",
    b"amq.foo",
    b"fz-\xc3\x28",
]
TYPES = [b"direct", b"topic", b"fanout", b"headers", b"x-unknown", b""]
KEYS = [
    b"",
    b"a",
    b"a.b",
    b"a.b.c",
    b"#",
    b"*",
    b"*.b.#",
    b"a.#.c",
    b"k\xff",
    b"." * 40,
    b"x" * 255,
]
ARG_KEYS = [
    b"x-match",
    b"x-message-ttl",
    b"x-expires",
    b"x-dead-letter-exchange",
    b"x-dead-letter-routing-key",
    b"x-max-length",
    b"x-max-length-bytes",
    b"x-overflow",
    b"x-max-priority",
    b"x-queue-mode",
    b"x-queue-type",
    b"x-single-active-consumer",
    b"x-consumer-timeout",
    b"x-priority",
    b"alternate-exchange",
    b"CC",
    b"BCC",
    b"x-death",
    b"x-first-death-reason",
    b"x-delay",
    b"\xff\xfe",
    b"",
    b"k",
]


class Values:
    """Random field values, biased towards the edges."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def integer(self, bits: int, signed: bool = False) -> int:
        r = self.rng
        top = 1 << bits
        pool = [v for v in (0, 1, 2, 5, 10, 100, 1000) if v < top] + [
            top - 1,
            top // 2,
            top // 2 - 1,
        ]
        v = r.choice(pool) if r.random() < 0.7 else r.randrange(top)
        return (v - top // 2 if signed and r.random() < 0.3 else v) & (top - 1)

    def value(self, depth: int = 0) -> bytes:
        """One tagged field value."""
        r = self.rng
        tag = r.choice("tbBsuIiLlfdDSTVAFx" if depth < 3 else "tbBsuIiLlfdDSTVx")
        if tag == "t":
            return b"t" + bytes((r.choice((0, 1, 2, 255)),))
        if tag in "bB":
            return tag.encode() + bytes((self.integer(8),))
        if tag in "su":
            return tag.encode() + struct.pack(">H", self.integer(16))
        if tag in "Ii":
            return tag.encode() + struct.pack(">I", self.integer(32))
        if tag in "Ll":
            return tag.encode() + struct.pack(">Q", self.integer(64))
        if tag == "f":
            return b"f" + struct.pack(">f", r.choice((0.0, -1.5, float("inf"), float("nan"))))
        if tag == "d":
            return b"d" + struct.pack(">d", r.choice((0.0, 1e308, float("-inf"), float("nan"))))
        if tag == "D":
            return b"D" + bytes((r.choice((0, 2, 255)),)) + struct.pack(">I", self.integer(32))
        if tag == "S":
            return b"S" + longstr(self.text())
        if tag == "T":
            return b"T" + struct.pack(">Q", self.integer(64))
        if tag == "V":
            return b"V"
        if tag == "x":
            return b"x" + longstr(r.randbytes(r.randrange(8)))
        if tag == "A":
            return b"A" + longstr(b"".join(self.value(depth + 1) for _ in range(r.randrange(4))))
        return b"F" + self.table(depth + 1)

    def text(self) -> bytes:
        r = self.rng
        return r.choice(
            [
                b"",
                b"drop-head",
                b"reject-publish",
                b"reject-publish-dlx",
                b"all",
                b"any",
                b"any-with-x",
                b"lazy",
                b"classic",
                b"quorum",
                b"stream",
                b"fz-x1",
                b"fz-q2",
                b"\xff\xfe",
                r.randbytes(r.randrange(16)),
            ]
        )

    def table(self, depth: int = 0) -> bytes:
        r = self.rng
        entries = [(r.choice(ARG_KEYS), self.value(depth)) for _ in range(r.randrange(5))]
        return table(entries)

    def arguments(self) -> bytes:
        r = self.rng
        if r.random() < 0.5:
            return table([])
        if r.random() < 0.5:  # plausible x-arguments with plausible values
            choices = [
                (b"x-message-ttl", b"I" + struct.pack(">i", r.choice((0, 1, 50, -1)))),
                (b"x-expires", b"I" + struct.pack(">i", r.choice((1, 100, 0)))),
                (b"x-dead-letter-exchange", b"S" + longstr(r.choice(EXCHANGES))),
                (b"x-dead-letter-routing-key", b"S" + longstr(r.choice(KEYS))),
                (b"x-max-length", b"I" + struct.pack(">i", r.choice((0, 1, 3)))),
                (b"x-overflow", b"S" + longstr(self.text())),
                (b"x-max-priority", b"B" + bytes((r.choice((0, 5, 255)),))),
                (b"x-match", b"S" + longstr(self.text())),
                (b"alternate-exchange", b"S" + longstr(r.choice(EXCHANGES))),
                (b"x-queue-mode", b"S" + longstr(b"lazy")),
                (b"x-single-active-consumer", b"t\x01"),
                (b"x-priority", b"I" + struct.pack(">i", r.choice((-5, 0, 10)))),
            ]
            return table(r.sample(choices, r.randrange(1, 4)))
        return self.table()

    def props(self) -> bytes:
        r = self.rng
        values: dict[str, Any] = {}
        for name, kind in PROPERTY_ORDER:
            if r.random() < 0.25:
                if kind == "shortstr":
                    values[name] = (
                        r.choice([b"0", b"1", b"100", b"-1", b"abc", b"guest", b"nobody"])
                        if name in ("expiration", "user_id")
                        else self.text()
                    )
                elif kind == "octet":
                    values[name] = r.choice((0, 1, 2, 9, 255))
                elif kind == "longlong":
                    values[name] = self.integer(64)
                else:
                    values[name] = self.headers()
        return properties(values)

    def headers(self) -> bytes:
        r = self.rng
        if r.random() < 0.4:
            keys = [b"CC", b"BCC"]
            arr = b"".join(b"S" + longstr(r.choice(KEYS + QUEUES)) for _ in range(r.randrange(3)))
            return table([(r.choice(keys), b"A" + longstr(arr)), (b"k", self.value())])
        return self.table()


# -- session generators ------------------------------------------------------------------

CLIENT_METHODS = [
    m for m in spec.METHODS.values() if m.TO_SERVER and m.CLASS_ID != 10
]  # connection-class methods are sent by the handshake and close


@dataclass
class Session:
    strategy: str
    frames: list[bytes]
    hand: int = 0  # how many leading frames are the handshake


def random_method(
    rng: random.Random, vals: Values, channel: int, cls: type | None = None
) -> list[bytes]:
    """One client method (with its content when it carries some) with random arguments."""
    cls = cls or rng.choice(CLIENT_METHODS)
    values: dict[str, Any] = {}
    for name, kind in cls.FIELDS:
        if kind == "bit":
            values[name] = rng.random() < 0.3
        elif kind == "octet":
            values[name] = vals.integer(8)
        elif kind == "short":
            values[name] = vals.integer(16) if name != "ticket" else 0
        elif kind == "long":
            values[name] = rng.choice((0, 1, 10, 100)) if rng.random() < 0.8 else vals.integer(32)
        elif kind == "longlong":
            values[name] = rng.choice((0, 1, 2, 3, 50)) if rng.random() < 0.8 else vals.integer(64)
        elif kind == "shortstr":
            if name == "queue":
                values[name] = rng.choice(QUEUES)
            elif name in ("exchange", "destination", "source"):
                values[name] = rng.choice(EXCHANGES)
            elif name == "routing_key":
                values[name] = rng.choice(KEYS)
            elif name == "type":
                values[name] = rng.choice(TYPES)
            elif name == "consumer_tag":
                values[name] = rng.choice([b"", b"c1", b"c2", b"\xff"])
            else:
                values[name] = vals.text()
        elif kind == "longstr":
            values[name] = vals.text()
        elif kind == "table":
            values[name] = vals.arguments()
    out = [method_frame(channel, cls, values)]
    if cls.HAS_CONTENT:
        body = rng.randbytes(rng.choice((0, 1, 16, 1000, 140000)))
        out += content(channel, vals.props(), body)
    return out


def valid_session(rng: random.Random, vals: Values) -> Session:
    frames = handshake()
    hand = len(frames)
    channels = [1, 2]
    for ch in channels:
        frames.append(method_frame(ch, spec.ChannelOpen, {}))
    if rng.random() < 0.5:
        frames.append(method_frame(1, spec.ConfirmSelect, {}))
    for _ in range(rng.randrange(3, 30)):
        ch = rng.choice(channels)
        pick = rng.random()
        if pick < 0.3:
            cls = rng.choice(
                [spec.QueueDeclare, spec.ExchangeDeclare, spec.QueueBind, spec.ExchangeBind]
            )
        elif pick < 0.6:
            cls = spec.BasicPublish
        elif pick < 0.8:
            cls = rng.choice(
                [spec.BasicConsume, spec.BasicGet, spec.BasicAck, spec.BasicNack, spec.BasicReject]
            )
        else:
            cls = None
        frames += random_method(rng, vals, ch, cls)
    if rng.random() < 0.7:
        frames.append(
            method_frame(0, spec.ConnectionClose, {"reply_code": 200, "reply_text": b"bye"})
        )
    return Session("valid", frames, hand)


def mutate(rng: random.Random, session: Session) -> Session:
    frames = list(session.frames)
    head, tail = frames[: session.hand], frames[session.hand :]
    if rng.random() < 0.1 and head:  # sometimes the handshake too
        tail, head = head[1:] + tail, head[:1]
    for _ in range(rng.randrange(1, 6)):
        if not tail:
            break
        i = rng.randrange(len(tail))
        f = bytearray(tail[i])
        op = rng.randrange(9)
        if op == 0 and f:  # flip a byte
            j = rng.randrange(len(f))
            f[j] ^= 1 << rng.randrange(8)
        elif op == 1 and f:  # set a byte to an edge value
            f[rng.randrange(len(f))] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, 0xCE))
        elif op == 2:  # insert bytes
            j = rng.randrange(len(f) + 1)
            f[j:j] = rng.randbytes(rng.randrange(1, 9))
        elif op == 3 and len(f) > 1:  # delete a range
            j = rng.randrange(len(f))
            del f[j : j + rng.randrange(1, 9)]
        elif op == 4:  # drop the frame
            del tail[i]
            continue
        elif op == 5:  # duplicate it
            tail.insert(i, bytes(f))
        elif op == 6 and len(tail) > 1:  # swap with another
            j = rng.randrange(len(tail))
            tail[i], tail[j] = tail[j], tail[i]
            continue
        elif op == 7 and len(f) >= 7:  # lie about the payload size
            f[3:7] = struct.pack(
                ">I", rng.choice((0, 1, len(f) - 7, len(f), 0x7FFFFFFF, 0xFFFFFFFF))
            )
        elif op == 8 and len(f) >= 3:  # another channel
            f[1:3] = struct.pack(">H", rng.choice((0, 1, 2, 3, 16, 17, 0xFFFF)))
        tail[i] = bytes(f)
    return Session("mutate", head + tail, len(head))


def invalid_sequence(rng: random.Random, vals: Values) -> Session:
    frames = handshake()
    hand = len(frames)
    frames.append(method_frame(1, spec.ChannelOpen, {}))
    pieces: list[list[bytes]] = []
    for _ in range(rng.randrange(2, 12)):
        ch = rng.choice((0, 1, 1, 1, 2, 17, 65535))
        kind = rng.randrange(10)
        if kind == 0:  # content with no method before it
            pieces.append(content(ch, vals.props(), b"orphan"))
        elif kind == 1:  # body longer than the header said
            pieces.append(
                [method_frame(ch, spec.BasicPublish, {"routing_key": b"a"})]
                + [
                    frame(2, ch, struct.pack(">HHQ", 60, 0, 2) + properties({})),
                    frame(3, ch, b"toolong"),
                ]
            )
        elif kind == 2:  # a header of another class, or weight set
            pieces.append(
                [
                    method_frame(ch, spec.BasicPublish, {}),
                    frame(
                        2,
                        ch,
                        struct.pack(">HHQ", rng.choice((10, 20, 0, 61)), rng.choice((0, 1)), 1)
                        + properties({}),
                    ),
                    frame(3, ch, b"x"),
                ]
            )
        elif kind == 3:  # a method while content is expected
            pieces.append(
                [method_frame(ch, spec.BasicPublish, {}), method_frame(ch, spec.BasicQos, {})]
            )
        elif kind == 4:  # methods only a server sends
            cls = rng.choice([m for m in spec.METHODS.values() if not m.TO_SERVER])
            pieces.append(random_method(rng, vals, ch, cls))
        elif kind == 5:  # heartbeat on a channel, unknown frame types
            pieces.append(
                [frame(rng.choice((8, 4, 9, 0, 255)), ch, rng.randbytes(rng.randrange(4)))]
            )
        elif kind == 6:  # connection methods at the wrong time
            cls = rng.choice([m for m in spec.METHODS.values() if m.CLASS_ID == 10 and m.TO_SERVER])
            pieces.append(random_method(rng, vals, ch, cls))
        elif kind == 7:  # channel open twice / close-ok unasked / flow
            cls = rng.choice(
                [spec.ChannelOpen, spec.ChannelCloseOk, spec.ChannelFlow, spec.ChannelClose]
            )
            pieces.append([method_frame(ch, cls, {})])
        elif kind == 8:  # a protocol header mid-stream
            pieces.append([PROTOCOL_HEADER])
        else:
            pieces.append(random_method(rng, vals, ch))
    for p in pieces:
        frames += p
    return Session("sequence", frames, hand)


def hostile_values(rng: random.Random, vals: Values) -> Session:
    frames = handshake()
    hand = len(frames)
    frames.append(method_frame(1, spec.ChannelOpen, {}))
    durable = rng.random() < 0.5
    bad_name = rng.choice([b"fuzz-\xff\xfe", b"fz-\xc3\x28", b"fz-\xed\xa0\x80", b"\xff"])
    depth = rng.choice((50, 400, 600, 1000, 5000))
    pick = rng.randrange(9)
    if pick == 0:
        frames.append(method_frame(1, spec.QueueDeclare, {"queue": bad_name, "durable": durable}))
    elif pick == 1:
        frames.append(
            method_frame(
                1,
                spec.ExchangeDeclare,
                {"exchange": bad_name, "type": b"topic", "durable": durable},
            )
        )
        frames.append(method_frame(1, spec.ExchangeDelete, {"exchange": bad_name}))
    elif pick == 2:  # deep binding arguments on a headers exchange
        frames.append(method_frame(1, spec.QueueDeclare, {"queue": b"fz-deep"}))
        frames.append(
            method_frame(
                1,
                spec.QueueBind,
                {
                    "queue": b"fz-deep",
                    "exchange": b"amq.headers",
                    "arguments": table([(b"h", b"F" + deep_table(depth))]),
                },
            )
        )
    elif pick == 3:  # deep header published to a headers exchange
        frames.append(method_frame(1, spec.BasicPublish, {"exchange": b"amq.headers"}))
        nested = b"F" + deep_table(depth) if rng.random() < 0.5 else b"A" + deep_array(depth * 4)
        frames += content(1, properties({"headers": table([(b"h", nested)])}), b"deep")
    elif pick in (4, 5):  # headers the broker must carry through BCC and dead-lettering
        q, dlx = b"fz-dlq-src", b"fz-dlx"
        frames.append(method_frame(1, spec.ExchangeDeclare, {"exchange": dlx, "type": b"fanout"}))
        frames.append(method_frame(1, spec.QueueDeclare, {"queue": b"fz-dlq-dst"}))
        frames.append(method_frame(1, spec.QueueBind, {"queue": b"fz-dlq-dst", "exchange": dlx}))
        args = table(
            [
                (b"x-dead-letter-exchange", b"S" + longstr(dlx)),
                (b"x-message-ttl", b"I" + struct.pack(">i", rng.choice((1, 100000)))),
            ]
        )
        frames.append(method_frame(1, spec.QueueDeclare, {"queue": q, "arguments": args}))
        odd = rng.choice(
            [
                (b"ts", b"T" + b"\xff" * 8),
                (b"x-death", b"I" + struct.pack(">i", 7)),
                (b"x-death", b"A" + longstr(b"I\x00\x00\x00\x01")),
                (b"x-death", b"A" + longstr(b"F" + table([(b"count", b"S" + longstr(b"x"))]))),
                (b"d", b"D\xff\xff\xff\xff\xff"),
                (b"\xff", b"S" + longstr(b"\xfe")),
            ]
        )
        hdr = [odd, (b"BCC", b"A" + longstr(b"S" + longstr(b"fz-q1")))]
        frames.append(method_frame(1, spec.BasicPublish, {"routing_key": q}))
        frames += content(
            1, properties({"headers": table(hdr), "timestamp": 0xFFFFFFFFFFFFFFFF}), b"odd"
        )
        frames.append(method_frame(1, spec.BasicGet, {"queue": q}))
        frames.append(method_frame(1, spec.BasicReject, {"delivery_tag": 1, "requeue": False}))
        frames.append(method_frame(1, spec.QueuePurge, {"queue": b"fz-dlq-dst"}))
    elif pick == 6:  # content header with no property flags, or flags naming absent data
        frames.append(method_frame(1, spec.BasicPublish, {"routing_key": b"fz-q0"}))
        payload = rng.choice(
            [
                b"",
                b"\xff\xff",
                b"\x80\x00",
                b"\x00\x01",
                b"\x20\x00\x00\x00\x00\x05",
                b"\x00\x00junk",
            ]
        )
        frames.append(frame(2, 1, struct.pack(">HHQ", 60, 0, 1) + payload))
        frames.append(frame(3, 1, b"x"))
    elif pick == 7:  # a huge declared body, or frame sizes at the limit
        frames.append(method_frame(1, spec.BasicPublish, {"routing_key": b"fz-q0"}))
        frames.append(
            frame(
                2,
                1,
                struct.pack(">HHQ", 60, 0, rng.choice((2**63, 2**64 - 1, 2**40))) + properties({}),
            )
        )
    else:  # hostile strings in every string property
        props = {
            n: rng.choice([b"\xff\xfe", b"\x00", b"x" * 255])
            for n, k in PROPERTY_ORDER
            if k == "shortstr"
        }
        frames.append(method_frame(1, spec.BasicPublish, {"routing_key": b"fz-q0"}))
        frames += content(1, properties(props), b"s")
    return Session("values", frames, hand)


def random_bytes(rng: random.Random) -> Session:
    if rng.random() < 0.5:
        frames = handshake()
        hand = len(frames)
    else:
        frames, hand = (
            [
                rng.choice(
                    [PROTOCOL_HEADER, b"AMQP\x01\x01\x00\x09", b"GET / HTTP/1.1\r\n\r\n", b""]
                )
            ],
            1,
        )
    frames.append(rng.randbytes(rng.randrange(1, 4096)))
    return Session("random", frames, hand)


def generate(rng: random.Random, strategy: str) -> Session:
    vals = Values(rng)
    if strategy == "valid":
        return valid_session(rng, vals)
    if strategy == "mutate":
        return mutate(rng, valid_session(rng, vals))
    if strategy == "sequence":
        return invalid_sequence(rng, vals)
    if strategy == "values":
        return hostile_values(rng, vals)
    return random_bytes(rng)
