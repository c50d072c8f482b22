"""The stream protocol's commands on streams themselves: create and delete (a stream is a
queue of the vhost either way), metadata, stream stats, and super streams (create, delete,
partitions, route). Each command is a function of (connection, frame fields)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from roarmq.protocol.stream.codec import (
    Code,
    Fields,
    Key,
    encode_metadata,
    encode_strings,
)

from ..core.stream import Stream
from . import super_streams
from .errors import Refused

if TYPE_CHECKING:
    from .connection import StreamConnection

#: Stream arguments of create, as RabbitMQ maps them to the queue's x-arguments: key ->
#: (x-argument, type).
STREAM_ARGUMENTS: dict[str, tuple[str, type]] = {
    "max-length-bytes": ("x-max-length-bytes", int),
    "max-age": ("x-max-age", str),
    "stream-max-segment-size-bytes": ("x-stream-max-segment-size-bytes", int),
    "initial-cluster-size": ("x-initial-cluster-size", int),
    "queue-leader-locator": ("x-queue-leader-locator", str),
    "stream-filter-size-bytes": ("x-stream-filter-size-bytes", int),
}


def create(conn: StreamConnection, f: Fields) -> None:
    corr = f.u32()
    name = f.text()
    args = f.properties()

    def run() -> None:
        check_new_name(conn, name)
        conn.check("configure", name)
        if name in conn.vhost.queues:
            raise Refused(Code.STREAM_ALREADY_EXISTS)
        conn.vhost.declare_queue(name, None, durable=True, arguments=stream_arguments(args))

    conn.answer(Key.CREATE, corr, run)


def delete(conn: StreamConnection, f: Fields) -> None:
    corr = f.u32()
    name = f.text()

    def run() -> None:
        conn.check("configure", name)
        stream = conn.stream_named(name)
        conn.vhost.delete_queue(stream)

    conn.answer(Key.DELETE, corr, run)


def metadata(conn: StreamConnection, f: Fields) -> None:
    corr = f.u32()
    names = f.strings()
    host, port = conn.advertised()
    rows: list[tuple[str, int, int, list[int]]] = []
    for name in names:
        queue = conn.vhost.queues.get(name)
        if type(queue) is Stream and not queue.deleted:
            rows.append((name, Code.OK, 0, []))
        else:
            rows.append((name, Code.STREAM_DOES_NOT_EXIST, 0xFFFF, []))
    conn.send(encode_metadata(corr, [(0, host, port)], rows))


def stream_stats(conn: StreamConnection, f: Fields) -> None:
    corr = f.u32()
    name = f.text()

    def run() -> bytes:
        conn.check("read", name)
        stream = conn.stream_named(name)
        first = stream.first_offset if stream.committed > stream.first_offset else -1
        stats = {
            "first_chunk_id": first,
            "committed_chunk_id": stream.last_chunk if first >= 0 else -1,
        }
        return len(stats).to_bytes(4, "big") + b"".join(
            _string(k) + v.to_bytes(8, "big", signed=True) for k, v in stats.items()
        )

    conn.answer(Key.STREAM_STATS, corr, run)


def check_new_name(conn: StreamConnection, name: str) -> None:
    if not name or len(name.encode()) > 255 or name.startswith("amq."):
        raise Refused(Code.PRECONDITION_FAILED, f"invalid stream name {name!r}")


def create_super_stream(conn: StreamConnection, f: Fields) -> None:
    corr = f.u32()
    name = f.text()
    partitions = f.strings()
    keys = f.strings()
    args = f.properties()

    def run() -> None:
        check_new_name(conn, name)
        if not partitions or len(partitions) != len(keys):
            raise Refused(
                Code.PRECONDITION_FAILED, "a super stream needs as many keys as partitions"
            )
        for partition in partitions:
            check_new_name(conn, partition)
            conn.check("configure", partition)
        conn.check("configure", name)
        if name in conn.vhost.exchanges or any(p in conn.vhost.queues for p in partitions):
            raise Refused(Code.STREAM_ALREADY_EXISTS)
        super_streams.create(conn.vhost, name, partitions, keys, stream_arguments(args))

    conn.answer(Key.CREATE_SUPER_STREAM, corr, run)


def delete_super_stream(conn: StreamConnection, f: Fields) -> None:
    corr = f.u32()
    name = f.text()

    def run() -> None:
        conn.check("configure", name)
        exchange = super_streams.exchange_of(conn.vhost, name)
        if exchange is None:
            raise Refused(Code.STREAM_DOES_NOT_EXIST)
        for partition in super_streams.partitions(exchange):
            conn.check("configure", partition)
        super_streams.delete(conn.vhost, exchange)

    conn.answer(Key.DELETE_SUPER_STREAM, corr, run)


def partitions(conn: StreamConnection, f: Fields) -> None:
    corr = f.u32()
    name = f.text()

    def run() -> bytes:
        exchange = super_streams.exchange_of(conn.vhost, name)
        if exchange is None:
            raise Refused(Code.STREAM_DOES_NOT_EXIST)
        return encode_strings(super_streams.partitions(exchange))

    conn.answer(Key.PARTITIONS, corr, run)


def route(conn: StreamConnection, f: Fields) -> None:
    corr = f.u32()
    key = f.text()
    name = f.text()

    def run() -> bytes:
        exchange = super_streams.exchange_of(conn.vhost, name)
        if exchange is None:
            raise Refused(Code.STREAM_DOES_NOT_EXIST)
        return encode_strings(super_streams.route(exchange, key))

    conn.answer(Key.ROUTE, corr, run)


def stream_arguments(args: dict[str, str]) -> dict[str, Any]:
    """A create's string arguments as the queue's typed x-arguments (as AMQP 0-9-1 would
    declare them); a value of the wrong type is refused, unknown keys are ignored (as
    RabbitMQ)."""
    out: dict[str, Any] = {"x-queue-type": "stream"}
    for key, value in args.items():
        known = STREAM_ARGUMENTS.get(key)
        if known is None:
            continue
        name, kind = known
        if kind is int:
            try:
                out[name] = int(value)
            except ValueError:
                raise Refused(
                    Code.PRECONDITION_FAILED, f"stream argument {key}: {value!r} is not a number"
                ) from None
        else:
            out[name] = value
    return out


def _string(value: str) -> bytes:
    raw = value.encode()
    return len(raw).to_bytes(2, "big") + raw
