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
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from roarmq.protocol.errors import (
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
    encode_close,
    encode_heartbeat,
    encode_metadata_update,
    encode_properties,
    encode_response,
    encode_strings,
    encode_tune,
)

from .. import __version__
from ..amqp.tls import session_of
from ..core.auth import AuthError
from ..core.stream import Stream
from ..ops.clock import TimerHandle
from ..store.definitions import DefinitionsWriteFailed
from . import commands, consuming, publishing, relay
from .consuming import Subscription
from .errors import CODES, Refused
from .publishing import Publisher

if TYPE_CHECKING:
    from ..server import Broker

log = logging.getLogger("roarmq.stream")

#: What the server proposes in tune (RabbitMQ's defaults); a client may ask for less.
FRAME_MAX = 1_048_576
HEARTBEAT = 60
FLUSH_THRESHOLD = 256 << 10
_IOV_MAX = os.sysconf("SC_IOV_MAX")  # buffers one writev takes
#: A close's answer has this long to arrive before the socket is closed anyway.
CLOSE_TIMEOUT = 1.0


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
        self.held: dict[Publisher, publishing.Held] = {}  # frames of this read, not yet stored
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
        self.after_subscribe: Subscription | None = None
        self._sasl: bytes | None = None  # PLAIN's response: a relay logs in with it
        self._relay: asyncio.StreamWriter | None = None  # the serving node, when relaying
        self._relay_task: asyncio.Task | None = None
        self._early: list[bytes] = []  # what came after the open, before the relay began
        self.writable = True  # the socket takes more (asyncio's pause/resume_writing)
        self._socket = -1  # its descriptor, for sendfile (-1: TLS, whose bytes are encrypted)
        self.blocked = False  # not read while a resource alarm is set (after a publish)
        self.update_corr = 0
        # consumer-updates sent, by correlation id: the subscription that waits for its answer
        self.updates_waiting: dict[int, Subscription] = {}

    # -- asyncio ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport
        peer = transport.get_extra_info("peername") or ("", 0)
        local = transport.get_extra_info("sockname") or ("", 0)
        self.peer, self.local = (peer[0], peer[1]), (local[0], local[1])
        self.name = f"{_host(peer[0])}:{peer[1]} -> {_host(local[0])}:{local[1]}"
        sock = transport.get_extra_info("socket")
        if not self.tls and sock is not None:
            self._socket = sock.fileno()
            # Subscriptions pause as soon as the transport holds a byte and resume once it
            # is empty, so each chunk finds it empty and goes by sendfile (`send_file`):
            # with the default marks a consumer slower than the broker kept some bytes
            # buffered, and every later chunk was read into memory and copied.
            transport.set_write_buffer_limits(high=0, low=0)  # type: ignore[attr-defined]  # a stream transport
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
        publishing.release_held(self)
        self.flush()

    def _dispatch(self, fields: Fields) -> None:
        key = fields.key
        if self.held and key != Key.PUBLISH:
            publishing.release_held(self)  # every other command sees them stored
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
    def sends_files(self) -> bool:
        """Chunks may go from their segment files straight to the socket (`send_file`)."""
        return self._socket >= 0

    def send_file(self, head: bytes, fd: int, runs: list[tuple[int, int]]) -> None:
        """`head`, then the file `fd`'s `runs` (position, length): written to the socket
        directly (what waits in `send`'s list first, then sendfile for each run: the bytes
        go from the page cache, never copied into this process) while the transport holds
        nothing unsent, so the order is kept; whatever the socket does not take at once
        goes through the transport after it (read into memory), as everything does when the
        transport already holds bytes."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        out = self._out
        out.append(head)
        size = self._out_bytes + len(head)
        self._out, self._out_bytes = [], 0
        self._dirty = False
        count = sum(length for _at, length in runs)
        self.send_oct += size + count
        wrote = 0
        done = 0  # runs sent whole
        cut = 0  # bytes sent of the run after them
        sent = 0  # bytes of the file sent
        if transport.get_write_buffer_size() == 0:
            try:
                wrote = os.writev(self._socket, out) if len(out) < _IOV_MAX else 0
                if wrote == size:
                    for at, length in runs:
                        moved = os.sendfile(self._socket, fd, at, length)
                        sent += moved
                        if moved < length:
                            cut = moved
                            break
                        done += 1
            except OSError:  # full (or failing: the transport finds out and closes)
                pass
        if wrote < size:
            transport.writelines(out if wrote == 0 else [b"".join(out)[wrote:]])
        totals = self.broker.totals
        totals.stream_file_bytes_sent += sent
        if sent < count:
            totals.stream_file_bytes_copied += count - sent
            at, length = runs[done]
            rest = [(at + cut, length - cut), *runs[done + 1 :]]
            transport.writelines([os.pread(fd, n, position) for position, n in rest])

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
            consuming.end_subscription(self, sub)
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

    def check(self, action: str, name: str) -> None:
        if not self.permission.allows(action, name):
            raise Refused(
                Code.ACCESS_REFUSED,
                f"access to queue '{name}' in vhost '{self.vhost.name}' refused for user "
                f"'{self.user.name}'",
            )

    def stream_named(self, name: str) -> Stream:
        queue = self.vhost.queues.get(name)
        if type(queue) is not Stream or queue.deleted:
            raise Refused(Code.STREAM_DOES_NOT_EXIST, f"stream '{name}' does not exist")
        return queue

    def answer(self, key: Key, corr: int, run: Callable[[], bytes | None]) -> None:
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
            self.send(encode_response(key, corr, CODES.get(exc.reply_code, Code.INTERNAL_ERROR)))
            return
        except DefinitionsWriteFailed as exc:
            log.error("stream command %s failed: %s", key.name.lower(), exc,
                      extra={"conn": self.name})  # fmt: skip
            self.send(encode_response(key, corr, Code.INTERNAL_ERROR))
            return
        self.send(encode_response(key, corr, Code.OK, extra))

    def unwatch_if_unused(self, stream: Stream) -> None:
        """The connection's last publisher or subscription on `stream` went: a deletion of
        the stream no longer concerns it (no metadata update, as RabbitMQ's connection
        forgets a stream it neither publishes to nor reads from)."""
        if not any(p.stream is stream for p in self.publishers.values()) and not any(
            s.stream is stream for s in self.subscriptions.values()
        ):
            stream.watchers.discard(self)

    def stream_deleted(self, stream: Stream) -> None:
        """A stream this connection publishes to or reads from is gone (over either
        protocol): a metadata update, and its publishers and subscriptions go."""
        for sid, sub in list(self.subscriptions.items()):
            if sub.stream is stream:
                del self.subscriptions[sid]
                consuming.end_subscription(self, sub)
        for pid, pub in list(self.publishers.items()):
            if pub.stream is stream:
                del self.publishers[pid]
        self.send(encode_metadata_update(MetadataCode.STREAM_NOT_AVAILABLE, stream.name))

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


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


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
        Key.DECLARE_PUBLISHER: publishing.declare_publisher,
        Key.PUBLISH: publishing.publish,
        Key.QUERY_PUBLISHER_SEQUENCE: publishing.query_publisher_sequence,
        Key.DELETE_PUBLISHER: publishing.delete_publisher,
        Key.SUBSCRIBE: consuming.subscribe,
        Key.CREDIT: consuming.credit,
        Key.STORE_OFFSET: consuming.store_offset,
        Key.QUERY_OFFSET: consuming.query_offset,
        Key.UNSUBSCRIBE: consuming.unsubscribe,
        Key.CONSUMER_UPDATE | 0x8000: consuming.consumer_update_answer,
        Key.CREATE: commands.create,
        Key.DELETE: commands.delete,
        Key.METADATA: commands.metadata,
        Key.STREAM_STATS: commands.stream_stats,
        Key.CREATE_SUPER_STREAM: commands.create_super_stream,
        Key.DELETE_SUPER_STREAM: commands.delete_super_stream,
        Key.PARTITIONS: commands.partitions,
        Key.ROUTE: commands.route,
        Key.EXCHANGE_COMMAND_VERSIONS: _C._exchange_versions,
        Key.HEARTBEAT: _C._heartbeat,
        Key.CLOSE: _C._close,
        Key.CLOSE | 0x8000: _C._close_answer,
    },
    "closing": {Key.CLOSE | 0x8000: _C._close_answer, Key.HEARTBEAT: _C._heartbeat},
}
