"""One stream-protocol connection: an asyncio protocol around `protocol/stream/codec.py`.

The handshake is RabbitMQ's: peer properties, SASL handshake and authenticate, the
server's tune and the client's answer, open (a vhost). `HANDLERS` says which commands each
state takes; anything else closes the connection with UNKNOWN_FRAME, as RabbitMQ does.
Once open, a connection publishes to streams (`Publisher`: publishing ids confirmed once
the stream has them durably, deduplicated per named publisher), subscribes to them
(`Subscription`: credit counted in chunks) and stores and queries consumer offsets, with
the permissions AMQP 0-9-1 checks (configure to create or delete, write to publish, read
to subscribe and track offsets). Output is coalesced like an AMQP connection's: frames
are appended and written once per loop iteration.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from roarmq.protocol.errors import (
    ACCESS_REFUSED,
    NOT_FOUND,
    PRECONDITION_FAILED,
    SoftError,
)
from roarmq.protocol.stream.codec import (
    VERSIONS,
    Code,
    Fields,
    FrameError,
    FrameSplitter,
    Key,
    MetadataCode,
    OffsetType,
    encode_close,
    encode_consumer_update,
    encode_credit_response,
    encode_deliver_head,
    encode_heartbeat,
    encode_metadata,
    encode_metadata_update,
    encode_properties,
    encode_publish_confirm,
    encode_publish_error,
    encode_response,
    encode_strings,
    encode_tune,
    published,
    published_entries,
)

from .. import __version__
from ..amqp.tls import session_of
from ..core.auth import AuthError
from ..core.stream import Stream
from ..ops.clock import TimerHandle
from ..store.definitions import DefinitionsWriteFailed
from . import relay, single_active, super_streams

if TYPE_CHECKING:
    from ..server import Broker

log = logging.getLogger("roarmq.stream")

#: What the server proposes in tune (RabbitMQ's defaults); a client may ask for less.
FRAME_MAX = 1_048_576
HEARTBEAT = 60
FLUSH_THRESHOLD = 256 << 10
#: A close's answer has this long to arrive before the socket is closed anyway.
CLOSE_TIMEOUT = 1.0

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

#: A refusal's AMQP reply code as the stream protocol's response code.
_CODES = {
    ACCESS_REFUSED: Code.ACCESS_REFUSED,
    NOT_FOUND: Code.STREAM_DOES_NOT_EXIST,
    PRECONDITION_FAILED: Code.PRECONDITION_FAILED,
}


class Refused(Exception):
    """A request answered with `code` (the connection goes on)."""

    def __init__(self, code: int, text: str = "") -> None:
        super().__init__(text)
        self.code = code


class Publisher:
    """A declared publisher: its stream, its reference (deduplication) and the publishes
    waiting for the stream: an internal sequence number each, confirmed in order."""

    __slots__ = (
        "conn", "id", "stream", "reference", "seq", "_ids", "_confirmed", "_failed",
        "published", "confirmed", "errored",
    )  # fmt: skip

    def __init__(self, conn: StreamConnection, pid: int, stream: Stream, reference: str | None):
        self.conn = conn
        self.id = pid
        self.stream = stream
        self.reference = reference
        self.seq = 0
        self._ids: dict[int, list[int]] = {}  # sequence number -> its publishing ids
        self._confirmed: list[int] = []
        self._failed: list[tuple[int, int]] = []
        self.published = self.confirmed = self.errored = 0  # messages, for the API

    def expect(self, publishing_ids: list[int]) -> int:
        """The ids of one append (a batch, or a message alone) wait under one sequence
        number for the stream to have them durably."""
        self.seq += 1
        self._ids[self.seq] = publishing_ids
        return self.seq

    # the stream's confirm waiters call these (as they call a channel's)
    def disk_confirmed(self, seq: int) -> None:
        ids = self._ids.pop(seq, None)
        if ids is not None:
            self._confirmed += ids

    def disk_failed(self, seq: int) -> None:
        ids = self._ids.pop(seq, None)
        if ids is not None:
            self._failed += [(pid, Code.INTERNAL_ERROR) for pid in ids]

    def flush_confirms(self) -> None:
        if self._confirmed:
            ids, self._confirmed = self._confirmed, []
            self.confirmed += len(ids)
            self.conn.broker.totals.stream_confirmed += len(ids)
            self.conn.send(encode_publish_confirm(self.id, ids))
        if self._failed:
            failed, self._failed = self._failed, []
            self.errored += len(failed)
            self.conn.send(encode_publish_error(self.id, failed))


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
        self.chunk_bytes = max((conn.frame_max or FRAME_MAX) - 128, 4096)
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
        self, first: int, timestamp_ms: int, data: bytes, n: int, crc: int | None = None
    ) -> None:
        """`n` messages from offset `first` as one chunk: `data`, their entries (and its
        CRC-32, when the stream has it already)."""
        self.credit -= 1
        self.delivered += n
        self.conn.broker.totals.stream_delivered += n
        conn = self.conn
        committed = self.stream.committed - 1 if conn.deliver_v2 else None
        conn.send(
            encode_deliver_head(self.id, first, timestamp_ms, data, n, committed=committed, crc=crc)
        )
        conn.send(data)  # the entries as they are: not copied into the frame


class StreamConnection(asyncio.Protocol):
    """See the module docstring."""

    def __init__(self, broker: Broker, tls: bool = False) -> None:
        self.broker = broker
        self.tls = tls
        self.transport: asyncio.Transport | None = None
        self.state = "peer"
        self.splitter = FrameSplitter(FRAME_MAX)
        self.frame_max = FRAME_MAX
        self.heartbeat = HEARTBEAT
        self.user: Any = None
        self.vhost: Any = None
        self.permission: Any = None
        self.client_properties: dict[str, str] = {}
        self.publishers: dict[int, Publisher] = {}
        self.subscriptions: dict[int, Subscription] = {}
        self.deliver_v2 = False
        self.peer = ("", 0)
        self.local = ("", 0)
        self.name = ""
        self.connected_at = time.time()
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._dirty = False
        self._last_read = time.monotonic()
        self._timer: TimerHandle | None = None
        self._closed = False
        self.recv_oct = self.send_oct = 0
        self.published = self.confirmed = 0
        self._after_subscribe: Subscription | None = None
        self._sasl: bytes | None = None  # PLAIN's response: a relay logs in with it
        self._relay: asyncio.StreamWriter | None = None  # the serving node, when relaying
        self._relay_task: asyncio.Task | None = None
        self._early: list[bytes] = []  # what came after the open, before the relay began
        self.writable = True  # the socket takes more (asyncio's pause/resume_writing)
        self.blocked = False  # not read while a resource alarm is set (after a publish)
        self._corr = 0
        # consumer-updates sent, by correlation id: the subscription that waits for its answer
        self._updates: dict[int, Subscription] = {}

    # -- asyncio ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport
        peer = transport.get_extra_info("peername") or ("", 0)
        local = transport.get_extra_info("sockname") or ("", 0)
        self.peer, self.local = (peer[0], peer[1]), (local[0], local[1])
        self.name = f"{_host(peer[0])}:{peer[1]} -> {_host(local[0])}:{local[1]}"
        self.broker.stream_connections.add(self)
        # a client has until the handshake timeout to open, as over AMQP
        self._timer = self.broker.clock.call_later(10.0, self._handshake_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()

    def pause_writing(self) -> None:
        """The socket's buffer is full: subscriptions wait (they would only buffer more)."""
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        for stream in {sub.stream for sub in self.subscriptions.values() if sub.reading}:
            stream.dispatch()

    def unblock(self) -> None:
        """The resource alarms cleared: read this publisher again."""
        if self.blocked and self.transport is not None and not self._closed:
            self.blocked = False
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self._last_read = time.monotonic()
        self.recv_oct += len(data)
        if self._relay is not None:  # another node serves the vhost: its bytes, untouched
            self._relay.write(data)
            return
        if self.state == "relaying":  # (the client does not wait for open's answer)
            self._early.append(data)
            return
        try:
            frames = self.splitter.feed(data)
        except FrameError as exc:
            self._fail(exc.code, str(exc))
            return
        for frame in frames:
            if self._closed:
                break
            if self.state == "relaying":  # after the open: the serving node's to answer
                self._early.append(len(frame).to_bytes(4, "big") + frame)
                continue
            try:
                fields = Fields(frame)
                self._dispatch(fields)
            except FrameError as exc:
                self._fail(exc.code, str(exc))
                break
        if self.state == "relaying":  # a frame cut short after the open: in order, theirs too
            self._early.append(self.splitter.unread())
            self.splitter = FrameSplitter()
        self.flush()

    def _dispatch(self, fields: Fields) -> None:
        key = fields.key
        handler = HANDLERS[self.state].get(key)
        if handler is None:
            if self.state == "closing":
                return  # what the client sent before it read our close
            raise FrameError(f"unknown or unexpected command {key:#06x} in state {self.state}")
        if key in _KEYS and fields.version > VERSIONS[Key(key)][1]:
            raise FrameError(f"command {key:#06x} version {fields.version} is not supported")
        handler(self, fields)

    # -- output -------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self._out.append(data)
        self._out_bytes += len(data)
        if not self._dirty:
            self._dirty = True
            self.broker.mark_dirty(self)  # type: ignore[arg-type]  # flushed as a connection is
        if self._out_bytes >= FLUSH_THRESHOLD:
            self.flush()

    def flush(self) -> None:
        self._dirty = False
        out = self._out
        if not out:
            return
        self._out = []
        self.send_oct += self._out_bytes
        self._out_bytes = 0
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.writelines(out)

    @property
    def conn(self) -> StreamConnection:
        """The stream's confirm waiters flush `waiter.conn` (a publisher's is this)."""
        return self

    # -- closing ------------------------------------------------------------------------

    def _fail(self, code: int, reason: str) -> None:
        """A frame this connection cannot go on after: say why and close."""
        log.warning("stream connection closed: %s", reason, extra={"conn": self.name, "code": code})
        self.close(code, reason)

    def close(self, code: int, reason: str) -> None:
        """Server-initiated close: a close frame, then the socket once the client answers
        (or after CLOSE_TIMEOUT)."""
        if self._closed or self.transport is None:
            return
        self.send(encode_close(0, code, reason))
        self.flush()
        self.state = "closing"
        self.broker.clock.call_later(CLOSE_TIMEOUT, self._abort)

    def _abort(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self._release()

    def _release(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.state = "closed"
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for sub in self.subscriptions.values():
            self._end_subscription(sub)
            sub.stream.watchers.discard(self)
        for pub in self.publishers.values():
            pub.stream.watchers.discard(self)
        self.subscriptions.clear()
        self.publishers.clear()
        if self._relay is not None:
            self._relay.close()
            self._relay = None
        if self._relay_task is not None:
            self._relay_task.cancel()
        self.broker.stream_connections.discard(self)
        if self.vhost is not None:
            log.info("stream connection closed", extra={"conn": self.name})

    def force_close(self, reason: str) -> None:
        """The broker closes it (a management DELETE, a shutdown): a close frame, then the
        socket at once."""
        if self._closed or self.transport is None:
            return
        log.info("stream connection closed: %s", reason, extra={"conn": self.name})
        self.send(encode_close(0, Code.OK, reason))
        self.flush()
        self._abort()

    def _handshake_timeout(self) -> None:
        self._timer = None
        if self.state != "opened" and not self._closed:
            self._fail(Code.INTERNAL_ERROR, "handshake timeout")

    def _heartbeat_tick(self) -> None:
        """Send a heartbeat every period; a peer silent for two periods is gone."""
        self._timer = None
        if self._closed:
            return
        if time.monotonic() - self._last_read > 2 * self.heartbeat:
            log.warning("stream connection: missed heartbeats", extra={"conn": self.name})
            self._abort()
            return
        self.send(encode_heartbeat())
        self._timer = self.broker.clock.call_later(self.heartbeat, self._heartbeat_tick)

    # -- the handshake ------------------------------------------------------------------

    def _peer_properties(self, f: Fields) -> None:
        corr = f.u32()
        self.client_properties = f.properties()
        props = {
            "product": "RoarMQ",
            "version": __version__,
            "platform": "Python",
            "copyright": "RoarMQ",
            "information": "RabbitMQ's stream protocol, served by RoarMQ",
            "cluster_name": self.broker.cluster.name,
        }
        self.send(encode_response(Key.PEER_PROPERTIES, corr, Code.OK, encode_properties(props)))
        self.state = "sasl"

    def _mechanisms(self) -> list[str]:
        return ["PLAIN", "EXTERNAL"] if self.tls else ["PLAIN"]

    def _sasl_handshake(self, f: Fields) -> None:
        corr = f.u32()
        self.send(
            encode_response(Key.SASL_HANDSHAKE, corr, Code.OK, encode_strings(self._mechanisms()))
        )

    def _sasl_authenticate(self, f: Fields) -> None:
        corr = f.u32()
        mechanism = f.text()
        data = f.bytes_() or b""
        if mechanism not in self._mechanisms():
            self.send(
                encode_response(Key.SASL_AUTHENTICATE, corr, Code.SASL_MECHANISM_NOT_SUPPORTED)
            )
            return
        try:
            if mechanism == "EXTERNAL":
                user = self.broker.auth.external(self._certificate_user(), self.peer[0])
            else:
                user = self.broker.auth.authenticate("PLAIN", data, self.peer[0])
                self._sasl = data
        except AuthError as exc:
            text = str(exc)
            code = (
                Code.SASL_AUTHENTICATION_FAILURE_LOOPBACK
                if "only connect via localhost" in text
                else Code.AUTHENTICATION_FAILURE
            )
            log.warning("stream connection: login refused: %s", text, extra={"conn": self.name})
            self.send(encode_response(Key.SASL_AUTHENTICATE, corr, code))
            self.flush()
            self.broker.clock.call_later(CLOSE_TIMEOUT, self._abort)
            self.state = "closing"
            return
        self.user = user
        self.send(encode_response(Key.SASL_AUTHENTICATE, corr, Code.OK))
        self.send(encode_tune(FRAME_MAX, HEARTBEAT))
        self.state = "tune"

    def _certificate_user(self) -> str | None:
        """The user a verified client certificate names ([amqp.tls]'s cert_login_* rules)."""
        ssl_object = self.transport.get_extra_info("ssl_object") if self.transport else None
        if ssl_object is None:
            return None
        return session_of(ssl_object, self.broker.config.amqp.tls).login

    def _tune(self, f: Fields) -> None:
        frame_max = f.u32()
        heartbeat = f.u32()
        self.frame_max = min(frame_max, FRAME_MAX) if frame_max else FRAME_MAX
        self.splitter.frame_max = self.frame_max
        self.heartbeat = min(heartbeat, HEARTBEAT) if heartbeat else 0
        self.state = "open"

    def _open(self, f: Fields) -> None:
        corr = f.u32()
        name = f.text()
        vhost = self.broker.vhosts.get(name)
        perm = self.user.permissions.get(name) if vhost is not None else None
        refusal = self._connection_limit(name) if perm is not None else None
        leader = self.broker.cluster.stream_leader(name)
        if perm is not None and refusal is None and leader is not None and self._sasl:
            self.state = "relaying"
            self._relay_task = self.broker.clock.loop.create_task(
                self._start_relay(corr, name, leader)
            )
            return
        if perm is None or refusal is not None or self.broker.cluster.refusal(name):
            log.warning(
                "stream connection: access to vhost %r refused for user %r%s",
                name,
                self.user.name,
                f": {refusal}" if refusal else "",
                extra={"conn": self.name},
            )
            self.send(encode_response(Key.OPEN, corr, Code.VHOST_ACCESS_FAILURE))
            self.flush()
            self.broker.clock.call_later(CLOSE_TIMEOUT, self._abort)
            self.state = "closing"
            return
        self.vhost = vhost
        self.permission = perm
        host, port = self.advertised()
        props = {"advertised_host": host, "advertised_port": str(port)}
        self.send(encode_response(Key.OPEN, corr, Code.OK, encode_properties(props)))
        self.state = "opened"
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.heartbeat:
            self._timer = self.broker.clock.call_later(self.heartbeat, self._heartbeat_tick)
        log.info(
            "stream connection opened",
            extra={"conn": self.name, "user": self.user.name, "vhost": name},
        )

    async def _start_relay(self, corr: int, vhost: str, leader: tuple[str, int]) -> None:
        """Relay this connection to the node serving its vhost (relay.py)."""
        try:
            reader, writer, props = await relay.open_upstream(
                leader[0],
                leader[1],
                vhost=vhost,
                properties=self.client_properties,
                sasl=self._sasl or b"",
                frame_max=self.frame_max,
                heartbeat=self.heartbeat,
            )
        except (OSError, TimeoutError, FrameError, relay.RelayRefused) as exc:
            code = exc.code if isinstance(exc, relay.RelayRefused) else Code.VHOST_ACCESS_FAILURE
            log.warning(
                "stream connection: relay to %s:%d for vhost %r failed: %r",
                leader[0], leader[1], vhost, exc, extra={"conn": self.name},
            )  # fmt: skip
            self.send(encode_response(Key.OPEN, corr, code))
            self.flush()
            self._abort()
            return
        if self._closed or self.transport is None:
            writer.close()
            return
        self.send(encode_response(Key.OPEN, corr, Code.OK, encode_properties(props)))
        self.flush()
        if self._timer is not None:  # the serving node's heartbeats pass through
            self._timer.cancel()
            self._timer = None
        self._relay = writer
        early = b"".join(self._early)  # what the client sent before open's answer
        self._early.clear()
        if early:
            writer.write(early)
        log.info(
            "stream connection relayed to the node serving its vhost",
            extra={"conn": self.name, "vhost": vhost, "to": f"{leader[0]}:{leader[1]}"},
        )
        try:
            await relay.pipe(reader, self.transport)
        finally:
            self._abort()

    def _connection_limit(self, vhost: str) -> str | None:
        broker = self.broker
        most = broker.limit("vhost", vhost, "max-connections")
        if most is not None and broker.vhost_connection_count(vhost) >= most:
            return f"connection limit ({most}) is reached"
        user = self.user.name
        most = broker.limit("user", user, "max-connections")
        if most is not None and broker.user_connection_count(user) >= most:
            return f"user connection limit ({most}) is reached"
        return None

    def advertised(self) -> tuple[str, int]:
        """The host and port clients are told to use: [stream] advertised_host/port, else
        the address and port this connection reached."""
        config = self.broker.config.stream
        host = config.advertised_host or _host(self.local[0])
        port = config.advertised_port or self.local[1]
        return host, port

    def _heartbeat(self, f: Fields) -> None:
        pass

    def _close(self, f: Fields) -> None:
        corr = f.u32()
        f.u16()
        f.string()
        self.send(encode_response(Key.CLOSE, corr, Code.OK))
        self.flush()
        self._abort()

    def _close_answer(self, f: Fields) -> None:
        self._abort()

    # -- streams ------------------------------------------------------------------------

    def _check(self, action: str, name: str) -> None:
        if not self.permission.allows(action, name):
            raise Refused(
                Code.ACCESS_REFUSED,
                f"access to queue '{name}' in vhost '{self.vhost.name}' refused for user "
                f"'{self.user.name}'",
            )

    def _stream(self, name: str) -> Stream:
        queue = self.vhost.queues.get(name)
        if type(queue) is not Stream or queue.deleted:
            raise Refused(Code.STREAM_DOES_NOT_EXIST, f"stream '{name}' does not exist")
        return queue

    def _answer(self, key: Key, corr: int, run: Callable[[], bytes | None]) -> None:
        """Run a request; its response OK (with what it returns) or the refusal's code."""
        try:
            extra = run() or b""
        except Refused as exc:
            if str(exc):
                log.info(
                    "stream command %s refused: %s", key.name.lower(), exc,
                    extra={"conn": self.name},
                )  # fmt: skip
            self.send(encode_response(key, corr, exc.code, _EMPTY_LIST.get(key, b"")))
            return
        except SoftError as exc:
            log.info("stream command %s refused: %s", key.name.lower(), exc.text,
                     extra={"conn": self.name})  # fmt: skip
            self.send(encode_response(key, corr, _CODES.get(exc.reply_code, Code.INTERNAL_ERROR)))
            return
        except DefinitionsWriteFailed as exc:
            log.error("stream command %s failed: %s", key.name.lower(), exc,
                      extra={"conn": self.name})  # fmt: skip
            self.send(encode_response(key, corr, Code.INTERNAL_ERROR))
            return
        self.send(encode_response(key, corr, Code.OK, extra))

    def _create(self, f: Fields) -> None:
        corr = f.u32()
        name = f.text()
        args = f.properties()

        def run() -> None:
            self._check_new_name(name)
            self._check("configure", name)
            if name in self.vhost.queues:
                raise Refused(Code.STREAM_ALREADY_EXISTS)
            self.vhost.declare_queue(name, None, durable=True, arguments=stream_arguments(args))

        self._answer(Key.CREATE, corr, run)

    def _delete(self, f: Fields) -> None:
        corr = f.u32()
        name = f.text()

        def run() -> None:
            self._check("configure", name)
            stream = self._stream(name)
            self.vhost.delete_queue(stream)

        self._answer(Key.DELETE, corr, run)

    def stream_deleted(self, stream: Stream) -> None:
        """A stream this connection publishes to or reads from is gone (over either
        protocol): a metadata update, and its publishers and subscriptions go."""
        for sid, sub in list(self.subscriptions.items()):
            if sub.stream is stream:
                del self.subscriptions[sid]
                self._end_subscription(sub)
        for pid, pub in list(self.publishers.items()):
            if pub.stream is stream:
                del self.publishers[pid]
        self.send(encode_metadata_update(MetadataCode.STREAM_NOT_AVAILABLE, stream.name))

    def _metadata(self, f: Fields) -> None:
        corr = f.u32()
        names = f.strings()
        host, port = self.advertised()
        rows: list[tuple[str, int, int, list[int]]] = []
        for name in names:
            queue = self.vhost.queues.get(name)
            if type(queue) is Stream and not queue.deleted:
                rows.append((name, Code.OK, 0, []))
            else:
                rows.append((name, Code.STREAM_DOES_NOT_EXIST, 0xFFFF, []))
        self.send(encode_metadata(corr, [(0, host, port)], rows))

    def _stream_stats(self, f: Fields) -> None:
        corr = f.u32()
        name = f.text()

        def run() -> bytes:
            self._check("read", name)
            stream = self._stream(name)
            first = stream.first_offset if stream.committed > stream.first_offset else -1
            stats = {
                "first_chunk_id": first,
                "committed_chunk_id": stream.last_chunk if first >= 0 else -1,
            }
            return len(stats).to_bytes(4, "big") + b"".join(
                _string(k) + v.to_bytes(8, "big", signed=True) for k, v in stats.items()
            )

        self._answer(Key.STREAM_STATS, corr, run)

    def _exchange_versions(self, f: Fields) -> None:
        corr = f.u32()
        for _ in range(f.count(6)):
            key, _low, high = f.u16(), f.u16(), f.u16()
            if key == Key.DELIVER and high >= 2:
                self.deliver_v2 = True
        ours = b"".join(
            k.to_bytes(2, "big") + lo.to_bytes(2, "big") + hi.to_bytes(2, "big")
            for k, (lo, hi) in VERSIONS.items()
        )
        self.send(
            encode_response(
                Key.EXCHANGE_COMMAND_VERSIONS,
                corr,
                Code.OK,
                len(VERSIONS).to_bytes(4, "big") + ours,
            )
        )

    # -- publishing ---------------------------------------------------------------------

    def _declare_publisher(self, f: Fields) -> None:
        corr = f.u32()
        pid = f.u8()
        reference = f.string() or None
        name = f.text()

        def run() -> None:
            if pid in self.publishers:
                raise Refused(Code.PRECONDITION_FAILED, f"publisher id {pid} already declared")
            self._check("write", name)
            stream = self._stream(name)
            if reference is not None and len(reference.encode()) > 255:
                raise Refused(Code.PRECONDITION_FAILED, "publisher reference over 255 bytes")
            if reference is not None and any(
                p.reference == reference and p.stream is stream for p in self.publishers.values()
            ):
                raise Refused(Code.PRECONDITION_FAILED, f"publisher reference {reference!r} in use")
            self.publishers[pid] = Publisher(self, pid, stream, reference)
            stream.watchers.add(self)

        self._answer(Key.DECLARE_PUBLISHER, corr, run)

    def _delete_publisher(self, f: Fields) -> None:
        corr = f.u32()
        pid = f.u8()

        def run() -> None:
            pub = self.publishers.pop(pid, None)
            if pub is None:
                raise Refused(Code.PUBLISHER_DOES_NOT_EXIST)
            if not any(p.stream is pub.stream for p in self.publishers.values()) and not any(
                s.stream is pub.stream for s in self.subscriptions.values()
            ):
                pub.stream.watchers.discard(self)

        self._answer(Key.DELETE_PUBLISHER, corr, run)

    def _block_if_alarmed(self) -> None:
        """A resource alarm (memory, disk, a cluster node's lost lease) stops reading from
        publishers, as over AMQP: what was sent waits in the socket until it clears."""
        if self.broker.alarms and not self.blocked and self.transport is not None:
            self.blocked = True
            self.transport.pause_reading()

    def _publish(self, f: Fields) -> None:
        """A publish frame: its messages without a filter value go into the stream as one
        batch record (stored as they will be delivered), those with one each alone (the
        filter summaries are per message); ids a named publisher stored already are
        confirmed and not stored again. Confirmed together once durable."""
        self._block_if_alarmed()
        start = f.pos
        plain = published_entries(f)
        if plain is not None and self._publish_plain(*plain):
            return
        f.pos = start  # read again, message by message
        pid, messages = published(f)
        pub = self.publishers.get(pid)
        if pub is None:
            self.send(
                encode_publish_error(pid, [(m[0], Code.PUBLISHER_DOES_NOT_EXIST) for m in messages])
            )
            return
        stream = pub.stream
        if stream.deleted:
            self.send(
                encode_publish_error(pid, [(m[0], Code.STREAM_DOES_NOT_EXIST) for m in messages])
            )
            return
        reference = pub.reference
        newest = stream.writers.get(reference, -1) if reference is not None else -1
        first_seq = pub.seq + 1
        duplicates: list[int] = []
        failed: list[tuple[int, int]] = []
        batch: list[bytes] = []
        batch_ids: list[int] = []

        def flush_batch() -> None:
            if batch:
                if stream.publish_batch(batch, reference, max(batch_ids)):
                    pub.expect(batch_ids.copy())
                else:
                    failed.extend((one, Code.INTERNAL_ERROR) for one in batch_ids)
                batch.clear()
                batch_ids.clear()

        for publishing_id, filter_value, message in messages:
            if reference is not None and publishing_id <= newest:
                duplicates.append(publishing_id)  # confirmed, not stored (as RabbitMQ)
                continue
            newest = max(newest, publishing_id)
            if filter_value is None:
                if isinstance(message, list):
                    batch.extend(message)  # a sub-entry batch: one publishing id
                else:
                    batch.append(message)
                batch_ids.append(publishing_id)
                continue
            flush_batch()
            bodies = message if isinstance(message, list) else [message]
            ok = all(
                [stream.publish_amqp10(b, filter_value, reference, publishing_id) for b in bodies]
            )
            if ok:
                pub.expect([publishing_id])
            else:
                failed.append((publishing_id, Code.INTERNAL_ERROR))
        flush_batch()
        self.published += len(messages)
        pub.published += len(messages)
        pub.confirmed += len(duplicates)
        self.broker.totals.stream_received += len(messages)
        self.broker.totals.stream_confirmed += len(duplicates)
        if pub.seq >= first_seq:
            stream.confirm_publisher(pub, first_seq, pub.seq)
        if duplicates:
            self.send(encode_publish_confirm(pid, duplicates))
        if failed:
            self.send(encode_publish_error(pid, failed))

    def _publish_plain(self, pid: int, ids: list[int], entries: bytes) -> bool:
        """A frame of plain messages, none already stored: one batch record, as read. False
        (nothing done) where `_publish`'s general path is needed: an unknown publisher, a
        deleted stream, an id a named publisher stored already."""
        pub = self.publishers.get(pid)
        if pub is None or pub.stream.deleted or not ids:
            return False
        stream = pub.stream
        reference = pub.reference
        newest = max(ids)
        if reference is not None and min(ids) <= stream.writers.get(reference, -1):
            return False
        n = len(ids)
        self.published += n
        pub.published += n
        self.broker.totals.stream_received += n
        if stream.publish_entries(entries, n, reference, newest):
            seq = pub.expect(ids)
            stream.confirm_publisher(pub, seq, seq)
        else:
            self.send(encode_publish_error(pid, [(one, Code.INTERNAL_ERROR) for one in ids]))
        return True

    def _query_publisher_sequence(self, f: Fields) -> None:
        corr = f.u32()
        reference = f.text()
        name = f.text()

        def run() -> bytes:
            self._check("read", name)
            stream = self._stream(name)
            return max(stream.writers.get(reference, 0), 0).to_bytes(8, "big")

        self._answer(Key.QUERY_PUBLISHER_SEQUENCE, corr, run)

    # -- consuming ----------------------------------------------------------------------

    def _offset_spec(self, f: Fields) -> tuple[int, int]:
        """An offset specification: its type and value (an offset, or a timestamp in ms)."""
        kind = f.u16()
        value = 0
        if kind == OffsetType.OFFSET:
            value = f.u64()
        elif kind == OffsetType.TIMESTAMP:
            value = f.i64()
        return kind, value

    @staticmethod
    def _start(stream: Stream, kind: int, value: int) -> int:
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

    def _subscribe(self, f: Fields) -> None:
        corr = f.u32()
        sid = f.u8()
        name = f.text()
        kind, value = self._offset_spec(f)
        credit = f.u16()
        props = f.properties() if f.remaining() else {}

        def run() -> None:
            if sid in self.subscriptions:
                raise Refused(Code.SUBSCRIPTION_ID_ALREADY_EXISTS)
            self._check("read", name)
            stream = self._stream(name)
            sub = Subscription(self, sid, stream, credit)
            sub.start = self._start(stream, kind, value)
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
                        self.vhost, sub.super_stream, stream
                    )
            self.subscriptions[sid] = sub
            stream.watchers.add(self)
            self._after_subscribe = sub

        self._answer(Key.SUBSCRIBE, corr, run)
        sub = self._after_subscribe
        if sub is not None:  # answered first: deliveries and updates follow the OK
            self._after_subscribe = None
            if sub.group is None:
                sub.read(sub.start)
            else:
                single_active.join(sub)

    def activate(self, sub: Subscription) -> None:
        """It became its group's active member: ask where to start (consumer-update)."""
        sub.active = True
        self._corr += 1
        self._updates[self._corr] = sub
        self.send(encode_consumer_update(self._corr, sub.id, True))

    def deactivate(self, sub: Subscription) -> None:
        sub.active = False
        sub.stop()
        self._corr += 1
        self._updates[self._corr] = sub
        self.send(encode_consumer_update(self._corr, sub.id, False))

    def _consumer_update_answer(self, f: Fields) -> None:
        corr = f.u32()
        f.u16()  # the client's response code
        sub = self._updates.pop(corr, None)
        kind: int = OffsetType.NEXT
        value = 0
        if f.remaining() >= 2:
            kind = f.u16()
            if f.remaining() >= 8:
                value = f.u64() if kind != OffsetType.TIMESTAMP else f.i64()
        if sub is None or not sub.active or self.subscriptions.get(sub.id) is not sub:
            return
        try:
            start = self._start(sub.stream, kind, value)
        except Refused:
            start = sub.start
        sub.read(start)

    def _end_subscription(self, sub: Subscription) -> None:
        sub.stop()
        if sub.group is not None:
            single_active.leave(sub)

    def _credit(self, f: Fields) -> None:
        sid = f.u8()
        credit = f.u16()
        sub = self.subscriptions.get(sid)
        if sub is None:
            self.send(encode_credit_response(Code.SUBSCRIPTION_ID_DOES_NOT_EXIST, sid))
            return
        sub.credit += credit
        if sub.reading:
            sub.stream.dispatch()

    def _unsubscribe(self, f: Fields) -> None:
        corr = f.u32()
        sid = f.u8()

        def run() -> None:
            sub = self.subscriptions.pop(sid, None)
            if sub is None:
                raise Refused(Code.SUBSCRIPTION_ID_DOES_NOT_EXIST)
            self._end_subscription(sub)

        self._answer(Key.UNSUBSCRIBE, corr, run)

    def _store_offset(self, f: Fields) -> None:
        reference = f.text()
        name = f.text()
        offset = f.u64()
        if not reference or len(reference.encode()) > 255:
            return  # no response to this command: RabbitMQ ignores it too
        try:
            self._check("read", name)
            stream = self._stream(name)
        except Refused as exc:
            log.info("store offset refused: %s", exc, extra={"conn": self.name})
            return
        stream.store_offset(reference, offset)

    def _query_offset(self, f: Fields) -> None:
        corr = f.u32()
        reference = f.text()
        name = f.text()

        def run() -> bytes:
            self._check("read", name)
            stream = self._stream(name)
            offset = stream.tracked_offset(reference)
            if offset is None:
                raise Refused(Code.NO_OFFSET)
            return offset.to_bytes(8, "big")

        self._answer(Key.QUERY_OFFSET, corr, run)

    # -- super streams --------------------------------------------------------------------

    def _check_new_name(self, name: str) -> None:
        if not name or len(name.encode()) > 255 or name.startswith("amq."):
            raise Refused(Code.PRECONDITION_FAILED, f"invalid stream name {name!r}")

    def _create_super_stream(self, f: Fields) -> None:
        corr = f.u32()
        name = f.text()
        partitions = f.strings()
        keys = f.strings()
        args = f.properties()

        def run() -> None:
            self._check_new_name(name)
            if not partitions or len(partitions) != len(keys):
                raise Refused(
                    Code.PRECONDITION_FAILED, "a super stream needs as many keys as partitions"
                )
            for partition in partitions:
                self._check_new_name(partition)
                self._check("configure", partition)
            self._check("configure", name)
            if name in self.vhost.exchanges or any(p in self.vhost.queues for p in partitions):
                raise Refused(Code.STREAM_ALREADY_EXISTS)
            super_streams.create(self.vhost, name, partitions, keys, stream_arguments(args))

        self._answer(Key.CREATE_SUPER_STREAM, corr, run)

    def _delete_super_stream(self, f: Fields) -> None:
        corr = f.u32()
        name = f.text()

        def run() -> None:
            self._check("configure", name)
            exchange = super_streams.exchange_of(self.vhost, name)
            if exchange is None:
                raise Refused(Code.STREAM_DOES_NOT_EXIST)
            for partition in super_streams.partitions(exchange):
                self._check("configure", partition)
            super_streams.delete(self.vhost, exchange)

        self._answer(Key.DELETE_SUPER_STREAM, corr, run)

    def _partitions(self, f: Fields) -> None:
        corr = f.u32()
        name = f.text()

        def run() -> bytes:
            exchange = super_streams.exchange_of(self.vhost, name)
            if exchange is None:
                raise Refused(Code.STREAM_DOES_NOT_EXIST)
            return encode_strings(super_streams.partitions(exchange))

        self._answer(Key.PARTITIONS, corr, run)

    def _route(self, f: Fields) -> None:
        corr = f.u32()
        key = f.text()
        name = f.text()

        def run() -> bytes:
            exchange = super_streams.exchange_of(self.vhost, name)
            if exchange is None:
                raise Refused(Code.STREAM_DOES_NOT_EXIST)
            return encode_strings(super_streams.route(exchange, key))

        self._answer(Key.ROUTE, corr, run)


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


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _string(value: str) -> bytes:
    raw = value.encode()
    return len(raw).to_bytes(2, "big") + raw


_KEYS = {int(k) for k in Key}
#: A refused route or partitions query still carries its (empty) list, as RabbitMQ's.
_EMPTY_LIST = {Key.ROUTE: b"\x00\x00\x00\x00", Key.PARTITIONS: b"\x00\x00\x00\x00"}

_C = StreamConnection
#: Which commands each state takes (anything else closes the connection).
HANDLERS: dict[str, dict[int, Callable[[StreamConnection, Fields], None]]] = {
    "peer": {Key.PEER_PROPERTIES: _C._peer_properties},
    "sasl": {
        Key.SASL_HANDSHAKE: _C._sasl_handshake,
        Key.SASL_AUTHENTICATE: _C._sasl_authenticate,
    },
    "tune": {Key.TUNE: _C._tune, Key.HEARTBEAT: _C._heartbeat},
    "open": {Key.OPEN: _C._open, Key.HEARTBEAT: _C._heartbeat, Key.CLOSE: _C._close},
    "opened": {
        Key.DECLARE_PUBLISHER: _C._declare_publisher,
        Key.PUBLISH: _C._publish,
        Key.QUERY_PUBLISHER_SEQUENCE: _C._query_publisher_sequence,
        Key.DELETE_PUBLISHER: _C._delete_publisher,
        Key.SUBSCRIBE: _C._subscribe,
        Key.CREDIT: _C._credit,
        Key.STORE_OFFSET: _C._store_offset,
        Key.QUERY_OFFSET: _C._query_offset,
        Key.UNSUBSCRIBE: _C._unsubscribe,
        Key.CREATE: _C._create,
        Key.DELETE: _C._delete,
        Key.METADATA: _C._metadata,
        Key.HEARTBEAT: _C._heartbeat,
        Key.CLOSE: _C._close,
        Key.CLOSE | 0x8000: _C._close_answer,
        Key.EXCHANGE_COMMAND_VERSIONS: _C._exchange_versions,
        Key.STREAM_STATS: _C._stream_stats,
        Key.CREATE_SUPER_STREAM: _C._create_super_stream,
        Key.DELETE_SUPER_STREAM: _C._delete_super_stream,
        Key.PARTITIONS: _C._partitions,
        Key.ROUTE: _C._route,
        Key.CONSUMER_UPDATE | 0x8000: _C._consumer_update_answer,
    },
    "closing": {Key.CLOSE | 0x8000: _C._close_answer, Key.HEARTBEAT: _C._heartbeat},
}
