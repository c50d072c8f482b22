"""Consuming over the stream protocol: subscriptions (read by chunk while they have credit,
single-active-consumer groups), credit, unsubscribe, stored offsets. Each command is a
function of (connection, frame fields)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from roarmq.protocol.stream.codec import (
    Code,
    Fields,
    Key,
    OffsetType,
    encode_consumer_update,
    encode_credit_response,
    encode_deliver_head,
)

from ..core.stream import Stream
from . import single_active, super_streams
from .errors import Refused

if TYPE_CHECKING:
    from .connection import StreamConnection

log = logging.getLogger("roarmq.stream")


class Subscription:
    """A subscription: the stream hands it chunks while it has credit (`deliver_chunk`).
    In a single-active-consumer group (`group`), it reads only while `active`."""

    __slots__ = (
        "conn", "id", "stream", "credit", "chunk_bytes", "properties", "delivered", "start",
        "filters", "match_unfiltered", "group", "super_stream", "partition_index", "active",
        "reading",
    )  # fmt: skip

    def __init__(self, conn: StreamConnection, sid: int, stream: Stream, credit: int) -> None:
        self.conn = conn
        self.id = sid
        self.stream = stream
        self.credit = credit
        self.chunk_bytes = max(conn.frame_max - 128, 4096)  # within what tune agreed
        self.properties: dict[str, str] = {}
        self.delivered = 0
        self.start = 0  # where it reads from when it starts
        self.filters: list[str] | None = None
        self.match_unfiltered = False
        self.group: str | None = None  # single active consumer: the group's name
        self.super_stream: str | None = None
        self.partition_index = 0
        self.active = False
        self.reading = False  # subscribed to the stream's records

    def read(self, start: int) -> None:
        if not self.reading and not self.stream.deleted:
            self.reading = True
            self.stream.subscribe(self, start, self.filters, self.match_unfiltered)

    def stop(self) -> None:
        if self.reading:
            self.reading = False
            self.stream.unsubscribe(self)

    def deliver_chunk(
        self, first: int, timestamp_ms: int, parts: list, size: int, crc: int, n: int
    ) -> None:
        """`n` messages from offset `first` as one chunk: their entries, `size` bytes in
        `parts` (stored batches, sent as they are: never joined into one copy) whose CRC-32
        is `crc`."""
        conn = self.conn
        conn.send(self._chunk_head(first, timestamp_ms, size, crc, n))
        for part in parts:
            conn.send(part)

    def deliver_file(
        self,
        first: int,
        timestamp_ms: int,
        fd: int,
        runs: list[tuple[int, int]],
        size: int,
        crc: int,
        n: int,
    ) -> None:
        """`deliver_chunk` of stored batches left in their segment file: `size` bytes of
        entries in `runs` of `fd` (file position, length), sent from the file
        (`StreamConnection.send_file`)."""
        self.conn.send_file(self._chunk_head(first, timestamp_ms, size, crc, n), fd, runs)

    def _chunk_head(self, first: int, timestamp_ms: int, size: int, crc: int, n: int) -> bytes:
        """A chunk about to go: counted against the credit and in the totals; the head of
        its deliver frame."""
        self.credit -= 1
        self.delivered += n
        conn = self.conn
        conn.broker.totals.stream_delivered += n
        committed = self.stream.committed - 1 if conn.deliver_v2 else None
        return encode_deliver_head(self.id, first, timestamp_ms, size, crc, n, committed=committed)

    def activate(self) -> None:
        """It became its group's active member: ask where to start (consumer-update)."""
        self.active = True
        conn = self.conn
        conn.update_corr += 1
        conn.updates_waiting[conn.update_corr] = self
        conn.send(encode_consumer_update(conn.update_corr, self.id, True))

    def deactivate(self) -> None:
        self.active = False
        self.stop()
        conn = self.conn
        conn.update_corr += 1
        conn.updates_waiting[conn.update_corr] = self
        conn.send(encode_consumer_update(conn.update_corr, self.id, False))


def offset_spec(conn: StreamConnection, f: Fields) -> tuple[int, int]:
    """An offset specification: its type and value (an offset, or a timestamp in ms)."""
    kind = f.u16()
    value = 0
    if kind == OffsetType.OFFSET:
        value = f.u64()
    elif kind == OffsetType.TIMESTAMP:
        value = f.i64()
    return kind, value


def start_of(stream: Stream, kind: int, value: int) -> int:
    if kind == OffsetType.FIRST:
        return stream.start_offset("first", None)
    if kind == OffsetType.LAST:
        return stream.start_offset("last", None)
    if kind == OffsetType.NEXT:
        return stream.start_offset("next", None)
    if kind == OffsetType.OFFSET:
        return stream.start_offset("offset", value)
    if kind == OffsetType.TIMESTAMP:
        return stream.start_offset("timestamp", value / 1000)
    raise Refused(Code.PRECONDITION_FAILED, f"unknown offset type {kind}")


def subscribe(conn: StreamConnection, f: Fields) -> None:
    corr = f.u32()
    sid = f.u8()
    name = f.text()
    kind, value = offset_spec(conn, f)
    credit = f.u16()
    props = f.properties() if f.remaining() else {}

    def run() -> None:
        if sid in conn.subscriptions:
            raise Refused(Code.SUBSCRIPTION_ID_ALREADY_EXISTS)
        conn.check("read", name)
        stream = conn.stream_named(name)
        sub = Subscription(conn, sid, stream, credit)
        sub.start = start_of(stream, kind, value)
        sub.properties = props
        filters = [v for k, v in sorted(props.items()) if k.startswith("filter.")]
        sub.filters = filters or None
        sub.match_unfiltered = props.get("match-unfiltered", "false").lower() == "true"
        if props.get("single-active-consumer", "false").lower() == "true":
            group = props.get("name")
            if not group:
                raise Refused(Code.PRECONDITION_FAILED, "single active consumer without a name")
            sub.group = group
            sub.super_stream = props.get("super-stream") or None
            if sub.super_stream is not None:
                sub.partition_index = super_streams.partition_index(
                    conn.vhost, sub.super_stream, stream
                )
        conn.subscriptions[sid] = sub
        stream.watchers.add(conn)
        conn.after_subscribe = sub

    conn.answer(Key.SUBSCRIBE, corr, run)
    sub = conn.after_subscribe
    if sub is not None:  # answered first: deliveries and updates follow the OK
        conn.after_subscribe = None
        if sub.group is None:
            sub.read(sub.start)
        else:
            single_active.join(sub)


def consumer_update_answer(conn: StreamConnection, f: Fields) -> None:
    corr = f.u32()
    f.u16()  # the client's response code
    sub = conn.updates_waiting.pop(corr, None)
    kind: int = OffsetType.NEXT
    value = 0
    if f.remaining() >= 2:
        kind = f.u16()
        if f.remaining() >= 8:
            value = f.u64() if kind != OffsetType.TIMESTAMP else f.i64()
    if sub is None or not sub.active or conn.subscriptions.get(sub.id) is not sub:
        return
    try:
        start = start_of(sub.stream, kind, value)
    except Refused:
        start = sub.start
    sub.read(start)


def end_subscription(conn: StreamConnection, sub: Subscription) -> None:
    sub.stop()
    if sub.group is not None:
        single_active.leave(sub)


def credit(conn: StreamConnection, f: Fields) -> None:
    sid = f.u8()
    credit = f.u16()
    sub = conn.subscriptions.get(sid)
    if sub is None:
        conn.send(encode_credit_response(Code.SUBSCRIPTION_ID_DOES_NOT_EXIST, sid))
        return
    sub.credit += credit
    if sub.reading:
        sub.stream.dispatch()


def unsubscribe(conn: StreamConnection, f: Fields) -> None:
    corr = f.u32()
    sid = f.u8()

    def run() -> None:
        sub = conn.subscriptions.pop(sid, None)
        if sub is None:
            raise Refused(Code.SUBSCRIPTION_ID_DOES_NOT_EXIST)
        end_subscription(conn, sub)
        conn.unwatch_if_unused(sub.stream)

    conn.answer(Key.UNSUBSCRIBE, corr, run)


def store_offset(conn: StreamConnection, f: Fields) -> None:
    reference = f.text()
    name = f.text()
    offset = f.u64()
    if not reference or len(reference.encode()) > 255:
        return  # no response to this command: RabbitMQ ignores it too
    try:
        conn.check("read", name)
        stream = conn.stream_named(name)
    except Refused as exc:
        log.info("store offset refused: %s", exc, extra={"conn": conn.name})
        return
    stream.store_offset(reference, offset)


def query_offset(conn: StreamConnection, f: Fields) -> None:
    corr = f.u32()
    reference = f.text()
    name = f.text()

    def run() -> bytes:
        conn.check("read", name)
        stream = conn.stream_named(name)
        offset = stream.tracked_offset(reference)
        if offset is None:
            raise Refused(Code.NO_OFFSET)
        return offset.to_bytes(8, "big")

    conn.answer(Key.QUERY_OFFSET, corr, run)
