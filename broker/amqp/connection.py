"""One AMQP connection: a thin asyncio.Protocol around the sans-IO frame parser.

`data_received` feeds the parser and hands each event to the connection's
handshake state machine or to a channel. Output is coalesced: frames are
appended to a list and written once per loop iteration (or sooner when the
list grows large), and each message is one buffer, so the frames of two
messages can never interleave.
"""

from __future__ import annotations

import asyncio
import logging
import platform
from functools import partial
from time import perf_counter
from typing import TYPE_CHECKING, Any

from roarmq.protocol import spec
from roarmq.protocol.errors import (
    ACCESS_REFUSED,
    CHANNEL_ERROR,
    COMMAND_INVALID,
    CONNECTION_FORCED,
    INTERNAL_ERROR,
    NOT_ALLOWED,
    REPLY_SUCCESS,
    SYNTAX_ERROR,
    HardError,
    ProtocolHeaderMismatch,
    SoftError,
)
from roarmq.protocol.frames import (
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    ContentMessage,
    FrameParser,
    Heartbeat,
    MethodFrame,
    ProtocolHeaderReceived,
    encode_content,
    encode_method,
)

from .. import __version__
from ..core.auth import EXTERNAL, MECHANISMS, AuthError, MalformedResponse
from ..core.persistence import WriteDeferred
from ..core.vhost import server_named_queue
from ..errors import connection_error
from ..store.definitions import DefinitionsWriteFailed

# The module, not its classes: compiled, channel.py's init imports this module for the
# Connection type its .pxd names, so a `from .channel import Channel` here would find
# channel.py half-initialised whenever channel is imported first.
from . import channel as _channel
from .flow import (
    ALARM,
    AWAIT_RECOVERY,
    BACKLOG,
    PARSE_CHUNK,
    READ_BUDGET,
    STEP,
    STORE_WRITE,
    TURN_SECONDS,
    WRITES,
    FlowControl,
)
from .session import CONNECTION_RULES, UNOPENED_RULES, ConnectionState, bind_rows
from .tls import TlsSession, session_of

if TYPE_CHECKING:
    from ..server import Broker
    from .channel import Channel

log = logging.getLogger("roarmq.connection")

# The states and what each method does in each are in broker/amqp/session.py.
AWAIT_HEADER = ConnectionState.AWAIT_HEADER
AWAIT_START_OK = ConnectionState.AWAIT_START_OK
AWAIT_TUNE_OK = ConnectionState.AWAIT_TUNE_OK
AWAIT_OPEN = ConnectionState.AWAIT_OPEN
OPEN = ConnectionState.OPEN
CLOSING = ConnectionState.CLOSING
DRAINING = ConnectionState.DRAINING
CLOSED = ConnectionState.CLOSED

#: Seconds a client has to finish the handshake, as RabbitMQ's handshake_timeout.
HANDSHAKE_TIMEOUT = 10.0
#: Seconds we wait, after sending connection.close, for close-ok, and after sending
#: close-ok, for the client to close the socket (RabbitMQ's CLOSING_TIMEOUT).
CLOSING_TIMEOUT = 30.0
#: Seconds between a client's connection.close and our close-ok when channels were open:
#: RabbitMQ's channel processes shut down in between (aiormq 7.2.4's close tests pass
#: against a close-ok 5 ms late 8 times in 8, against one sent at once 2 in 10).
CLOSE_OK_AFTER_CHANNELS = 0.005
#: Seconds a connection.open may wait for a just-elected leader to recover its vhost, or
#: for a silent leader to be replaced or heard again (cluster only), asking again every
#: OPEN_RETRY.
OPEN_WAIT_RECOVERY = 10.0
OPEN_RETRY = 0.05
#: `store_wait`: a durable change of the connection waits for another's definitions write,
#: or for its own.
WAITS_ITS_TURN = 1
ITS_WRITE = 2
#: Write directly once this many bytes are pending, so one dispatch loop cannot
#: build an unbounded buffer before the transport gets a chance to push back.
FLUSH_THRESHOLD = 256 * 1024

SERVER_CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "consumer_priorities": True,
    "direct_reply_to": True,
}


class Connection:
    """One client connection: an asyncio protocol (by its methods: connection_made,
    data_received, eof_received, connection_lost, pause/resume_writing), which compiled is
    a native class (connection.pxd) and so cannot derive from asyncio.Protocol."""

    # Slots: every frame reads a dozen of these, and past 30 attributes CPython stops
    # sharing instance-dict keys, which made each read slower (measured: +0.7% a message).
    __slots__ = (
        "broker",
        "parser",
        "state",
        "_row",
        "_unopened",
        "_receivers",
        "transport",
        "peer",
        "name",
        "channels",
        "frame_max",
        "channel_max",
        "heartbeat",
        "capabilities",
        "client_properties",
        "user",
        "vhost",
        "permission",
        "exclusive_queues",
        "last_queue",
        "flow",
        "blocked_notified",
        "tls",
        "auth_mechanism",
        "_backlog",
        "_unparsed",
        "_out",
        "_out_bytes",
        "_dirty",
        "output_held",
        "_confirm_channels",
        "_received",
        "_sent",
        "connected_at",
        "recv_oct",
        "recv_cnt",
        "send_oct",
        "send_cnt",
        "_missed",
        "_timer",
        "_cleaned",
        "store_wait",
        "_named",
        "__weakref__",
    )

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.tls: TlsSession | None = None  # an amqps connection: what its handshake settled
        self.auth_mechanism: str | None = None
        cfg = broker.config.limits
        self.parser = FrameParser(
            expect_protocol_header=True,
            # Until connection.tune-ok, an unauthenticated peer may send frames of at most
            # the spec's minimum (4096 bytes), as RabbitMQ: a stranger cannot make the
            # broker buffer 128 KiB before saying who it is.
            frame_max=spec.FRAME_MIN_SIZE,
            max_body_size=cfg.max_message_size,
        )
        self.transport: asyncio.Transport | None = None
        self.peer: tuple[str, int] | None = None
        self.name = "?"
        #: The channels open or closing (what the API lists and channel_max counts).
        self.channels: dict[int, Channel] = {}
        #: Who handles each channel number's frames: 0 the connection itself, an open or
        #: closing channel its Channel, a closed one its tombstone (ClosedChannel); every
        #: one of them dispatches with its state's row, `_row[type(method)]`.
        self._receivers: dict[int, Any] = {0: self}
        self._enter(AWAIT_HEADER)
        self.frame_max = cfg.frame_max
        self.channel_max = cfg.channel_max or 65535
        self.heartbeat = 0
        self.capabilities: dict[str, Any] = {}
        self.client_properties: dict[str, Any] = {}
        self.user: Any = None
        self.vhost: Any = None
        self.permission: Any = None
        self.exclusive_queues: list[Any] = []
        self.last_queue: str | None = None
        self.flow = FlowControl(self._continue)
        self._backlog: tuple[list[Any], int] | None = None  # frames parsed, not yet handled
        self._unparsed = b""  # bytes read, not yet parsed
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._dirty = False
        #: A clustered vhost's durable declare waits for its in-sync set: what is sent
        #: meanwhile stays in `_out` (broker/cluster/replicated_store.py, `hold_reply`).
        self.output_held = False
        self._confirm_channels: list[Channel] = []
        self._received = False
        self._sent = False
        # Bytes and socket reads/writes, as RabbitMQ's recv_oct/recv_cnt/send_oct/send_cnt:
        # counted per read and per coalesced write, never per message.
        self.recv_oct = self.recv_cnt = self.send_oct = self.send_cnt = 0
        self.connected_at = 0  # ms since the epoch, as RabbitMQ's connected_at
        self._missed = 0
        self._timer: Any = None
        self._cleaned = False
        self.blocked_notified = False
        #: A durable change of this connection waits: 0 none, WAITS_ITS_TURN (for another
        #: connection's definitions write), ITS_WRITE (for its own, in the store's thread).
        self.store_wait = 0
        #: (queue.declare, the name the server gave it): the same when it is made again.
        self._named: tuple[Any, str] | None = None

    def _enter(self, state: ConnectionState) -> None:
        """The one place the connection's state changes: its rows change with it (the
        methods on channel 0, and on channel numbers nothing is open on)."""
        self.state = state
        self._row = _ROWS[state]
        self._unopened = _UNOPENED_ROWS[state]

    # -- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # asyncio hands a BaseTransport; a stream socket's is a Transport
        self.connected_at = int(self.broker.clock.wall() * 1000)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.peer = (peer[0], peer[1])
            self.name = connection_name(self.peer, transport.get_extra_info("sockname"))
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None:  # amqps: made once the TLS handshake is done
            self.tls = session_of(ssl_object, self.broker.config.amqp.tls)
        self.flow.attach(self.transport)  # type: ignore[arg-type]  # (set above)
        if transport.get_extra_info("internal_user") is None:
            # (the broker's own connection to itself, broker/links/local.py, is its
            # link's: neither listed, nor counted against limits, nor closed by others)
            self.broker.connection_opened(self)
        self._timer = self.broker.clock.call_later(HANDSHAKE_TIMEOUT, self._handshake_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self.broker.draining.discard(self)
        if self.state is OPEN:
            log.info(
                "client closed the connection without connection.close", extra={"conn": self.name}
            )
        self._enter(CLOSED)
        self._cleanup()

    def eof_received(self) -> None:
        """The client shut its side: return None, so the transport closes (asyncio.Protocol's
        default; connection_lost follows)."""
        return None

    @property
    def writable(self) -> bool:
        return self.flow.writable

    def pause_writing(self) -> None:
        """Our output is backed up: no deliveries, and no reading until it drains."""
        self.flow.writable = False
        for ch in self.channels.values():
            ch.update_writable(False)
        self.flow.hold(WRITES)

    def resume_writing(self) -> None:
        self.flow.writable = True
        for ch in list(self.channels.values()):
            ch.update_writable(True)
        self.flow.release(WRITES)

    def data_received(self, data: bytes) -> None:
        self._received = True
        self.recv_oct += len(data)
        self.recv_cnt += 1
        if self.state is DRAINING:
            return  # what a client sends after our close-ok is read and dropped
        archive = self.broker.archive
        if archive is not None:
            archive.stamp()  # the arrival time of every publish in this read
        if self._unparsed:  # only if a transport delivers data while paused
            self._unparsed += data
        else:
            self._unparsed = data
        if self._backlog is None:
            self._backlog = ([], 0)
        self._pump()

    def _parse_next(self) -> list[Any] | None:
        """Parse the next PARSE_CHUNK bytes of what was read (None: the connection ended).

        Parsing a whole 256 KiB read at once is ~13 ms of small publishes; a piece at a
        time keeps each loop turn short.
        """
        data = self._unparsed
        if len(data) > PARSE_CHUNK:
            self._unparsed = data[PARSE_CHUNK:]
            data = data[:PARSE_CHUNK]
        else:
            self._unparsed = b""
        try:
            return self.parser.feed(data)
        except ProtocolHeaderMismatch:
            self._write_now(PROTOCOL_HEADER)
            self._abort("bad protocol header")
            return None
        except (SoftError, HardError) as exc:
            return self._parse_failure(exc)

    def _parse_failure(self, exc: SoftError | HardError) -> list[Any]:
        """Frames before a parse error, then the error itself, in order.

        A channel error (a message over the size limit) closes just that channel and
        parsing goes on with whatever the parser still holds; a connection error ends it.
        """
        events: list[Any] = []
        while True:
            events.extend(exc.events)
            events.append(_Failure(exc))
            if isinstance(exc, HardError):
                return events
            try:
                events.extend(self.parser.feed(b""))
                return events
            except (SoftError, HardError) as again:
                exc = again

    # -- event processing -------------------------------------------------------------

    def _pump(self) -> None:
        """Parse and handle input for one loop turn, then yield to other connections.

        A turn ends after READ_BUDGET frames or TURN_SECONDS, whichever comes first, or at
        once when a flow-control reason holds (an alarm, a queue in flow state, our output
        backed up). What is left waits -- parsed in `_backlog`, raw in `_unparsed` -- and
        the socket is not read until it is done, so one client can neither monopolise the
        loop nor make the broker buffer replies it does not read.
        """
        events, i = self._backlog  # type: ignore[misc]  # set whenever this runs (the backlog it drains)
        flow = self.flow
        started = perf_counter()
        handled = 0
        while self.state is not CLOSED and self.state is not DRAINING:
            if i >= len(events):
                if not self._unparsed:
                    break
                parsed = self._parse_next()
                if parsed is None:
                    return
                events, i = parsed, 0
                continue
            j = self._process(events, i, STEP)
            handled += j - i
            i = j
            if flow.reasons:
                break
            if handled >= READ_BUDGET or perf_counter() - started > TURN_SECONDS:
                break
        self._after_batch()
        if self.state is CLOSED or self.state is DRAINING:
            self._backlog = None
            self._unparsed = b""
            return
        if i < len(events) or self._unparsed:
            self._backlog = (events, i)
            if not flow.reasons:  # out of budget: continue on the next loop turn
                flow.hold(BACKLOG)
                self.broker.clock.loop.call_soon(self._continue)
            return  # otherwise the last release calls _continue
        self._backlog = None
        flow.resume_reading()

    def _continue(self) -> None:
        """Flow released (or our turn came back): handle the backlog, then read again."""
        flow = self.flow
        flow.reasons.discard(BACKLOG)
        if flow.reasons or self.state is CLOSED:
            return  # still held: the last release calls us again
        if self._backlog is None:
            flow.resume_reading()
            return
        self._pump()

    def _process(self, events: Any, start: int, count: int) -> int:
        """Handle up to `count` events from `start`; returns the index of the first not handled.

        Every method, publishes and acks included, goes to its receiver's row of rules
        (broker/amqp/session.py): one dict lookup for the handler, refusal or drop that the
        receiver's state gives its type.
        """
        i = start
        n = len(events)
        end = min(n, i + count)
        receivers = self._receivers
        reasons = self.flow.reasons
        alarms = self.broker.alarms
        while i < end and self.state is not CLOSED:
            ev = None
            try:
                while i < end:
                    ev = events[i]
                    i += 1
                    if type(ev) is ContentMessage:
                        method = ev.method
                        receiver = receivers.get(ev.channel)
                        if receiver is None:
                            self._unopened[type(method)](self, ev.channel, method)
                            continue
                        receiver._row[type(method)](receiver, method, ev.header, ev.body)
                        if alarms and ALARM not in reasons:
                            self._block()
                    elif type(ev) is MethodFrame:
                        method = ev.method
                        receiver = receivers.get(ev.channel)
                        if receiver is None:
                            self._unopened[type(method)](self, ev.channel, method)
                        else:
                            receiver._row[type(method)](receiver, method)
                    elif type(ev) is ProtocolHeaderReceived:
                        self._send_start()
                    elif type(ev) is _Failure:
                        raise ev.exc
                    # Heartbeat: data_received already noted that the peer is alive.
                    if reasons:
                        return i
            except Exception as exc:
                if self._failed(exc, ev):
                    return i if type(exc) is WriteDeferred else n
            if reasons:
                return i
        return i if self.state is not CLOSED else n

    # -- a durable change waiting for its definitions write (broker/core/persistence.py)

    def _defer(self, deferred: WriteDeferred, event: Any) -> None:
        """The method `event` stopped at its definitions write, which goes on off the loop
        (or waits for another connection's): nothing more of this connection is handled or
        read until the method is handled again, with the write's outcome (`_resume`)."""
        self.flow.hold(STORE_WRITE)
        self.store_wait = WAITS_ITS_TURN if deferred.pending is None else ITS_WRITE
        deferred.then(partial(self._resume, event))

    def _resume(self, event: Any) -> None:
        """Handle the method again (the persistence knows its write's outcome, or that its
        turn came), then the frames that waited behind it."""
        waited, self.store_wait = self.store_wait, 0
        # One that wrote nothing is dropped if the connection is going meanwhile (its vhost
        # or user deleted, say); one whose write committed is made all the same.
        if waited == ITS_WRITE or (not self._cleaned and self.state is OPEN):
            self._handle_again(event)
        if not self.store_wait:  # (or it waits once more)
            self.flow.release(STORE_WRITE)

    def _handle_again(self, event: Any) -> None:
        """`_process` for one method frame, whatever the connection's state (one closing
        makes the change its write committed before its channels go: `settle_store_write`)."""
        receiver = self._receivers.get(event.channel)
        if receiver is None:
            return
        try:
            receiver._row[type(event.method)](receiver, event.method)
        except Exception as exc:
            self._failed(exc, event)

    def _failed(self, exc: Exception, event: Any) -> bool:
        """What handling `event` raised, answered as RabbitMQ does: True when no more of
        this connection's frames are handled now (it closes, or the method waits for its
        definitions write), False when only the frame's channel closed."""
        if isinstance(exc, SoftError):
            _blame(exc, event)
            self._channel_exception(getattr(event, "channel", 0), exc)
            return False
        if isinstance(exc, HardError):
            _blame(exc, event)
            self.close_with_error(exc)
        elif isinstance(exc, DefinitionsWriteFailed):
            self._store_failed(exc, event)
        elif isinstance(exc, WriteDeferred):
            self._defer(exc, event)
        else:
            log.error(
                "internal error while handling a frame",
                exc_info=exc,
                extra={"conn": self.name},
            )
            self.close_with_error(
                connection_error(INTERNAL_ERROR, "internal error; see the broker log")
            )
        return True

    def settle_store_write(self) -> None:
        """A channel or the connection itself is about to go: if its definitions write is
        under way, wait for it and make its change now, while the channel is there."""
        if self.store_wait == ITS_WRITE:
            self.broker.persistence.settle()

    def server_named(self, method: Any) -> str:
        """The name a queue.declare without one gets: the same when the method is handled
        again after its deferred write."""
        named = self._named
        if named is None or named[0] is not method:
            named = self._named = (method, server_named_queue())
        return named[1]

    def _store_failed(self, exc: DefinitionsWriteFailed, event: Any) -> None:
        """A durable change the definitions store could not write (nothing of it was
        applied): RabbitMQ's 541 naming what failed, and one error line, no traceback."""
        exc.log_to(log, conn=self.name)
        error = connection_error(INTERNAL_ERROR, exc.reply_text)
        _blame(error, event)
        self.close_with_error(error)

    def _after_batch(self) -> None:
        if self._confirm_channels:
            for ch in self._confirm_channels:
                ch.flush_confirms()
            self._confirm_channels.clear()

    def flow_state(self) -> str:
        """As RabbitMQ names it: running, flow (held by a queue), blocked (by an alarm)."""
        if self.state is not OPEN:
            return self.state.value
        reasons = self.flow.reasons
        if ALARM in reasons:
            return "blocked"
        if self.broker.alarms:
            return "blocking"  # not published since the alarm went off
        if self.flow.queues:
            return "flow"
        return "running"

    def want_flush(self, channel: Channel) -> None:
        """A channel has confirms to send once the current batch of frames is handled."""
        if channel not in self._confirm_channels:
            self._confirm_channels.append(channel)

    def _open_channel(self, channel_id: int, m: spec.ChannelOpen) -> None:
        """channel.open on a number nothing is open on (never used, or a tombstone)."""
        # As RabbitMQ: channel_max bounds how many channels are open, not their numbers.
        if len(self.channels) >= self.channel_max:
            raise connection_error(
                NOT_ALLOWED,
                f"number of channels opened ({len(self.channels)}) has reached the "
                f"negotiated channel_max ({self.channel_max})",
            )
        most = self.broker.limit("user", self.user.name, "max-channels")
        if most is not None and (
            sum(len(c.channels) for c in self.broker.user_connections(self.user.name)) >= most
        ):
            raise connection_error(
                NOT_ALLOWED,
                f"number of channels opened for user '{self.user.name}' has reached the "
                f"maximum allowed user limit of ({most})",
            )
        ch = _channel.Channel(self, channel_id)
        self.channels[channel_id] = ch
        self._receivers[channel_id] = ch
        self.send_method(channel_id, spec.ChannelOpenOk())

    def channel_closed(self, channel: Channel) -> None:
        """The channel's close / close-ok exchange is over (it is CLOSED and sends nothing
        more): a tombstone takes its number, dropping the frames still in flight for it."""
        if self.channels.get(channel.id) is channel:
            del self.channels[channel.id]
            self._receivers[channel.id] = _channel.ClosedChannel(self, channel.id)
            self.broker.totals.retire_channel(channel)

    def _channel_exception(self, channel_id: int, exc: SoftError) -> None:
        ch = self.channels.get(channel_id)
        if ch is None:
            self.close_with_error(
                connection_error(CHANNEL_ERROR, f"channel error on unopened channel {channel_id}")
            )
            return
        ch.close_by_server(exc)

    # -- connection class (channel 0) -------------------------------------------------

    def _send_start(self) -> None:
        self._enter(AWAIT_START_OK)
        props = {
            "product": "RoarMQ",
            "version": __version__,
            "platform": f"Python {platform.python_version()}",
            "copyright": "Copyright (c) the RoarMQ developers",
            "information": "Licensed under the Apache License 2.0. An AMQP 0-9-1 broker "
            "with trie + roaring-bitmap routing.",
            "cluster_name": self.broker.cluster_name,
            "capabilities": dict(SERVER_CAPABILITIES),
        }
        self.send_method(
            0,
            spec.ConnectionStart(
                version_major=0,
                version_minor=9,
                server_properties=props,
                mechanisms=" ".join(self._mechanisms()),
                locales="en_US",
            ),
        )

    def _mechanisms(self) -> tuple[str, ...]:
        return (*MECHANISMS, EXTERNAL) if self._offers_external() else MECHANISMS

    def _refuse_login(self, error: HardError, mechanism: str, reason: str | None = None) -> None:
        """As RabbitMQ: one log line with the peer address (never the response, which may
        hold a password); connection.close with the code and text to a client that asked
        for authentication_failure_close, else the socket is closed."""
        log.warning(
            "login refused",
            extra={
                "conn": self.name,
                "mechanism": mechanism,
                "reason": reason or error.text,
                "code": error.reply_code,
            },
        )
        if self.capabilities.get("authentication_failure_close"):
            self.close_with_error(error)
        else:
            self._abort("authentication failed")

    def _offers_external(self) -> bool:
        """SASL EXTERNAL: only when enabled, and only on a TLS connection whose client sent a
        certificate our CA verified (the certificate is the credential)."""
        tls = self.tls
        return (
            tls is not None
            and tls.peer_cert is not None
            and self.broker.config.amqp.tls.external_auth
        )

    def _client_close(self, m: spec.ConnectionClose) -> None:
        log.debug("client closed the connection", extra={"conn": self.name})
        self._close_ok()

    def _update_secret(self, m: spec.ConnectionUpdateSecret) -> None:
        self.send_method(0, spec.ConnectionUpdateSecretOk())

    def _start_ok(self, m: spec.ConnectionStartOk) -> None:
        self.client_properties = m.client_properties or {}
        caps = self.client_properties.get("capabilities")
        self.capabilities = caps if isinstance(caps, dict) else {}
        peer_host = self.peer[0] if self.peer else None
        internal = self.transport.get_extra_info("internal_user")  # type: ignore[union-attr]  # a connection's transport is set once made
        if internal is not None:  # the broker's own connection: no login (INTERNAL_USER)
            self.user, self.auth_mechanism = internal, m.mechanism
            return self._tune()
        try:
            tls = self.tls
            if m.mechanism not in self._mechanisms():
                error = HardError(
                    COMMAND_INVALID, f"unknown authentication mechanism '{m.mechanism}'"
                )
                return self._refuse_login(error, m.mechanism)
            if m.mechanism == EXTERNAL:
                self.user = self.broker.auth.external(tls.login, peer_host)  # type: ignore[union-attr]  # EXTERNAL is offered only over TLS, where the login is set
            else:
                self.user = self.broker.auth.authenticate(
                    m.mechanism,
                    m.response,  # type: ignore[arg-type]  # received: bytes (str when we build one)
                    peer_host,
                )
            self.auth_mechanism = m.mechanism
        except MalformedResponse as exc:
            return self._refuse_login(HardError(SYNTAX_ERROR, str(exc)), m.mechanism)
        except AuthError as exc:
            # The same words whether the user exists or not (the log has the reason).
            text = (
                f"Login was refused using authentication mechanism {m.mechanism}. "
                "For details see the broker logfile."
            )
            return self._refuse_login(HardError(ACCESS_REFUSED, text), m.mechanism, str(exc))
        self._tune()

    def _tune(self) -> None:
        self._enter(AWAIT_TUNE_OK)
        limits = self.broker.config.limits
        self.send_method(
            0,
            spec.ConnectionTune(
                channel_max=limits.channel_max,
                frame_max=limits.frame_max,
                heartbeat=limits.heartbeat,
            ),
        )

    def _tune_ok(self, m: spec.ConnectionTuneOk) -> None:
        limits = self.broker.config.limits
        # RabbitMQ's texts (it logs them and closes silently; we send them in the close).
        # Unlike RabbitMQ, 0 ("no limit") is taken as the server's value, as the spec says.
        if m.frame_max and m.frame_max < spec.FRAME_MIN_SIZE:
            raise _negotiation_error("frame_max", m.frame_max, "lower", spec.FRAME_MIN_SIZE)
        if m.frame_max > limits.frame_max:
            raise _negotiation_error("frame_max", m.frame_max, "higher", limits.frame_max)
        server_cmax = limits.channel_max or 65535
        if m.channel_max > server_cmax:
            raise _negotiation_error("channel_max", m.channel_max, "higher", server_cmax)
        self.frame_max = m.frame_max or limits.frame_max
        self.parser.frame_max = self.frame_max
        self.channel_max = m.channel_max or server_cmax
        self.heartbeat = m.heartbeat
        self._enter(AWAIT_OPEN)

    def _open(self, m: spec.ConnectionOpen) -> None:
        self._open_vhost(m.virtual_host)

    def _open_vhost(self, vhost: str, waited: float = 0.0, hand_on: bool = True) -> None:
        """Admit the client to `vhost` here, or hand it to the vhost's leader (`hand_on`: a
        connection handed over to us is never handed on: one hop at most)."""
        cluster = self.broker.cluster
        down = cluster.vhost_down(vhost, self.user.name)
        if down is not None:
            raise connection_error(INTERNAL_ERROR, down)
        refusal = cluster.refusal(vhost)
        if refusal is not None:
            if cluster.must_wait(vhost) and waited < OPEN_WAIT_RECOVERY:
                # Just elected, still recovering its copy of the vhost: answer once it
                # serves (a client reconnecting after a failover sees a pause, not 530),
                # whether it came straight here or was handed over by another node. Or
                # the leader has gone silent (frozen, cut off): hand the client to its
                # successor, not to a socket nobody reads, or to it once it speaks.
                # Frames the client pipelines after connection.open wait for it.
                self.flow.hold(AWAIT_RECOVERY)
                self.broker.clock.loop.call_later(
                    OPEN_RETRY, self._open_again, vhost, waited + OPEN_RETRY, hand_on
                )
                return
            if hand_on and cluster.hand_off(self, vhost, refusal):
                return  # not read until the relay owns the socket (or the 530)
            raise connection_error(NOT_ALLOWED, refusal)
        self._admit(vhost)

    def _open_again(self, vhost: str, waited: float, hand_on: bool) -> None:
        self.flow.release(AWAIT_RECOVERY)  # (held again below if it must wait more)
        if self.state is not AWAIT_OPEN or self.transport is None or self.transport.is_closing():
            return
        try:
            self._open_vhost(vhost, waited, hand_on)
        except HardError as exc:
            if exc.class_id == 0:
                exc.class_id = spec.ConnectionOpen.CLASS_ID
                exc.method_id = spec.ConnectionOpen.METHOD_ID
            self.close_with_error(exc)

    def _admit(self, name: str) -> None:
        """The vhost's checks, then OPEN and connection.open-ok (a direct connection's
        connection.open, and a connection handed over to this node by another)."""
        vhost = self.broker.vhosts.get(name)
        if vhost is None:
            raise connection_error(NOT_ALLOWED, f"vhost {name} not found")
        perm = self.user.permissions.get(name)
        if perm is None:
            raise connection_error(
                NOT_ALLOWED,
                f"access to vhost '{name}' refused for user '{self.user.name}'",
            )
        self._check_connection_limits(vhost)
        self.vhost = vhost
        self.permission = perm
        self._enter(OPEN)
        self.send_method(0, spec.ConnectionOpenOk())
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.heartbeat:
            self._timer = self.broker.clock.call_later(self.heartbeat / 2, self._heartbeat_tick)
        log.info(
            "connection opened",
            extra={"conn": self.name, "user": self.user.name, "vhost": vhost.name},
        )

    # -- cluster hand-off (broker/cluster/handoff.py; never on a single node) -----------

    def detach(self) -> tuple[asyncio.Transport, bytes]:
        """The relaying node's side: give the socket up, unclosed and not read (the relay's
        protocol takes it), and forget this connection. Returns the transport and what the
        client sent past connection.open (`unread`: normally nothing, as clients wait for
        open-ok; a client that pipelines gets its frames answered by the leader)."""
        transport = self.transport
        assert transport is not None
        self.flush()
        rest = self.unread()
        self.transport = None
        self._enter(CLOSED)
        self._cleanup()
        return transport, rest

    def unread(self) -> bytes:
        """What the client sent that this node has not handled, as bytes for a hand-off to
        carry on: frames parsed but not handled yet (framed again, in order), then the
        parser's partial frame, then bytes not parsed yet. A parse error among them ends
        what is carried (logged): the leader sees the frames before it."""
        parts: list[bytes] = []
        backlog = self._backlog
        if backlog is not None:
            events, i = backlog
            for event in events[i:]:
                framed = _frame_again(event, self.frame_max)
                if framed is None:
                    log.warning(
                        "a malformed frame pipelined before connection.open-ok dropped at "
                        "the hand-off, with what followed it",
                        extra={"conn": self.name},
                    )
                    return b"".join(parts)
                parts.append(framed)
        parts.append(bytes(self.parser._tail))
        parts.append(self._unparsed)
        return b"".join(parts)

    def adopt(self, transport: asyncio.Transport, facts: dict[str, Any], data: bytes) -> None:
        """The leader's side: a connection another node authenticated and tuned, handed over
        at connection.open (`facts`, the hand-off preamble). No handshake again: the user
        must exist here and the vhost's checks pass as for a direct connection (same
        texts), then this node answers connection.open-ok itself and the session is OPEN."""
        self.connection_made(transport)
        peer = facts.get("peer")
        if peer:
            self.peer = (str(peer[0]), int(peer[1]))
            local = facts.get("sockname") or transport.get_extra_info("sockname")
            self.name = connection_name(self.peer, local)
        tls = facts.get("tls")
        self.tls = TlsSession(**tls) if tls else None
        self.client_properties = facts.get("client_properties") or {}
        self.capabilities = facts.get("capabilities") or {}
        mechanism = self.auth_mechanism = facts.get("auth_mechanism") or "PLAIN"
        self.frame_max = int(facts["frame_max"])
        self.channel_max = int(facts["channel_max"])
        self.heartbeat = int(facts["heartbeat"])
        self.parser = FrameParser(
            expect_protocol_header=False,
            frame_max=self.frame_max,
            max_body_size=self.broker.config.limits.max_message_size,
        )
        self._enter(AWAIT_OPEN)
        vhost = str(facts["vhost"])
        try:
            self.user = self.broker.auth.users.get(str(facts["user"]))
            if self.user is None:
                log.warning(
                    "handed-over connection refused: unknown user",
                    extra={"conn": self.name, "mechanism": mechanism},
                )
                raise connection_error(
                    ACCESS_REFUSED,
                    f"Login was refused using authentication mechanism {mechanism}. "
                    "For details see the broker logfile.",
                )
            self._open_vhost(vhost, hand_on=False)
        except HardError as exc:
            self.close_with_error(exc)
        if data:  # frames the client pipelined after connection.open
            if self.flow.reasons:  # the vhost is still recovering: they wait for open-ok
                self.recv_oct += len(data)
                self._unparsed, self._backlog = data, ([], 0)
            else:
                self.data_received(data)

    def _check_connection_limits(self, vhost: Any) -> None:
        """RabbitMQ's vhost and user max-connections, with its texts (530 NOT_ALLOWED)."""
        broker = self.broker
        user = self.user.name
        most = broker.limit("vhost", vhost.name, "max-connections")
        if most is not None and broker.vhost_connection_count(vhost.name) >= most:
            raise connection_error(
                NOT_ALLOWED,
                f"access to vhost '{vhost.name}' refused for user '{user}': "
                f"connection limit ({most}) is reached",
            )
        most = broker.limit("user", user, "max-connections")
        if most is not None and broker.user_connection_count(user) >= most:
            raise connection_error(
                NOT_ALLOWED,
                f"connection refused for user '{user}': user connection limit ({most}) is reached",
            )

    def _close_ok_received(self, m: spec.ConnectionCloseOk) -> None:
        """The client answered our connection.close: done."""
        self._abort(None)

    def _close_ok(self) -> None:
        """The client closed: answer close-ok, let go of everything, and (as RabbitMQ) leave
        the socket to the client, reading and dropping what it still sends, for at most
        CLOSING_TIMEOUT. Closing it ourselves would make a client still writing its last
        frames see EPIPE or a reset instead of our close-ok."""
        had_channels = bool(self.channels)
        self._release_channels()
        if had_channels:
            # RabbitMQ answers close-ok only once every channel process has shut down, a
            # few milliseconds after the close; clients such as aiormq 7.2.4 rely on that
            # gap (answered at once, its close observer loses the error the client closed
            # with, and a publish in flight fails with a bare Exception).
            self.broker.clock.loop.call_later(CLOSE_OK_AFTER_CHANNELS, self._send_close_ok)
        else:
            self._send_close_ok()
        self._enter(DRAINING)
        self._cleanup()
        self.broker.draining.add(self)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()  # flow control is over: read on to the EOF
        self._timer = self.broker.clock.call_later(
            CLOSING_TIMEOUT, self._abort, "socket left open after close-ok"
        )

    def _send_close_ok(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.send_method(0, spec.ConnectionCloseOk())
            self.flush()

    def close_with_error(self, exc: HardError, level: int = logging.WARNING) -> None:
        """Connection exception: connection.close with the reply code, then wait for close-ok."""
        if self.state is CLOSING or self.state is CLOSED:
            return
        log.log(
            level,
            "closing connection on error" if level >= logging.WARNING else "closing connection",
            extra={"conn": self.name, "code": exc.reply_code, "text": exc.text},
        )
        if self.state is AWAIT_HEADER:
            self._abort(exc.text)
            return
        self._enter(CLOSING)
        self._release_channels()
        self.send_method(
            0,
            spec.ConnectionClose(
                reply_code=exc.reply_code,
                reply_text=exc.close_text,
                class_id=exc.class_id,
                method_id=exc.method_id,
            ),
        )
        self.flush()
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.broker.clock.call_later(CLOSING_TIMEOUT, self._abort, "close-ok timeout")

    def force_close(self, text: str = "broker shutdown", level: int = logging.WARNING) -> None:
        """Server-initiated close (shutdown, management API): 320 CONNECTION_FORCED. A
        shutdown passes INFO: the broker logs one notice with the count instead."""
        if self.state is OPEN:
            self.close_with_error(HardError(CONNECTION_FORCED, text), level)
        else:
            self._abort(text)

    def _block(self) -> None:
        """We published while a resource alarm is set: stop reading us, and say why.

        As RabbitMQ: only publishing connections are blocked and told (connection.blocked
        goes to a connection when it publishes during an alarm); consumers keep draining.
        """
        self.flow.hold(ALARM)
        if self.state is OPEN and self.capabilities.get("connection.blocked"):
            self.blocked_notified = True
            alarms = self.broker.alarms
            if "memory" in alarms:
                reason = "low on memory"
            elif "disk" in alarms:
                reason = "low on disk"
            else:  # Broker.set_cluster_fenced
                reason = "cluster: leadership not confirmed"
            self.send_method(0, spec.ConnectionBlocked(reason=reason))

    def unblock(self) -> None:
        """Every alarm cleared: read us again, and tell the client if we told it of the block."""
        if self.blocked_notified:
            self.blocked_notified = False
            if self.state is OPEN:
                self.send_method(0, spec.ConnectionUnblocked())
        self.flow.release(ALARM)

    # -- timers -----------------------------------------------------------------------

    def _handshake_timeout(self) -> None:
        self._timer = None
        if self.state is not OPEN:
            log.warning("handshake timeout", extra={"conn": self.name, "state": self.state})
            self._abort("handshake timeout")

    def _heartbeat_tick(self) -> None:
        """Runs every heartbeat/2: send one if we were quiet; give up after 2 silent intervals."""
        self._timer = None
        if self.state is not OPEN:
            return
        if self._received:
            self._received = False
            self._missed = 0
        else:
            self._missed += 1
            if self._missed >= 4:
                log.warning(
                    "missed heartbeats from client, timeout: %ss",
                    self.heartbeat,
                    extra={"conn": self.name},
                )
                self._abort("missed heartbeats")
                return
        if not self._sent:
            self.send(HEARTBEAT_FRAME)
        self._sent = False
        self._timer = self.broker.clock.call_later(self.heartbeat / 2, self._heartbeat_tick)

    # -- output -----------------------------------------------------------------------

    def send_method(self, channel: int, method: Any) -> None:
        self.send(encode_method(channel, method))

    def send(self, data: bytes) -> None:
        self._out.append(data)
        self._out_bytes += len(data)
        if not self._dirty:
            self._dirty = True
            self.broker.mark_dirty(self)
        if self._out_bytes >= FLUSH_THRESHOLD:
            self.flush()

    def flush(self) -> None:
        self._dirty = False
        out = self._out
        if not out or self.output_held:
            return
        self._out = []
        transport = self.transport
        if transport is None or transport.is_closing():
            self._out_bytes = 0
            return
        self._sent = True
        self.send_oct += self._out_bytes
        self.send_cnt += 1
        self._out_bytes = 0
        if len(out) == 1:
            transport.write(out[0])
        else:
            transport.writelines(out)

    def hold_output(self, reason: str) -> None:
        """Keep everything written from now on until `release_output`: a reply that must
        not reach the client before something else is durable (a clustered vhost's
        declare, until its in-sync set holds it). The client is not read meanwhile
        (`reason` is the flow-control hold), so it waits as for any slow reply."""
        if not self.output_held:
            self.output_held = True
            self.flow.hold(reason)

    def release_output(self, reason: str, *, send: bool = True) -> None:
        """End `hold_output`: send what waited, or forget it (`send` false: its outcome is
        unknown and the connection is about to be closed), and read the client again."""
        if not self.output_held:
            return
        self.output_held = False
        if not send:
            self._out = []
            self._out_bytes = 0
        self.flush()
        self.flow.release(reason)

    def _write_now(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.send_oct += len(data)
            self.send_cnt += 1
            self.transport.write(data)

    # -- teardown ---------------------------------------------------------------------

    def _abort(self, reason: str | None) -> None:
        self.broker.draining.discard(self)
        if reason:
            log.info("closing connection", extra={"conn": self.name, "reason": reason})
        self.flush()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        if self.state is not CLOSING:  # closing: until connection_lost, close-ok is answered
            self._enter(CLOSED)
        self._cleanup()

    def _release_channels(self) -> None:
        """The connection is closing: every channel lets go and goes quiet, and every
        channel number but 0 falls to the closing connection's rules for unopened ones."""
        for ch in list(self.channels.values()):
            ch.connection_closing()
            self.broker.totals.retire_channel(ch)
        self.channels.clear()
        self._receivers.clear()  # in place: a batch being handled holds this dict
        self._receivers[0] = self

    def _cleanup(self) -> None:
        """Let go of everything the connection holds (once, however it ended)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._cleaned:
            return
        self._cleaned = True
        self.settle_store_write()
        for queue in self.flow.queues:
            queue.forget_publisher(self)
        self.flow.clear()
        self._backlog = None
        self._unparsed = b""
        self._release_channels()
        for queue in list(self.exclusive_queues):
            queue.vhost.delete_queue(queue, reason="exclusive owner gone")
        self.exclusive_queues.clear()
        self.broker.connection_closed(self)


def _host(address: str) -> str:
    """An address as RabbitMQ writes it in names: IPv6 in brackets, an IPv4-mapped IPv6
    address as plain IPv4 (rabbit_misc:ntoab)."""
    if address.startswith("::ffff:") and "." in address:
        return address[len("::ffff:") :]
    return f"[{address}]" if ":" in address else address


def connection_name(peer: tuple[str, int], local: Any) -> str:
    """RabbitMQ's connection name, "client_host:client_port -> server_host:server_port": the
    `name` of /api/connections rows, what /api/connections/{name} and `ctl close_connection`
    take, and the start of each channel's name."""
    name = f"{_host(peer[0])}:{peer[1]}"
    if isinstance(local, (tuple, list)) and len(local) >= 2:
        return f"{name} -> {_host(str(local[0]))}:{local[1]}"
    return name


def _negotiation_error(field: str, value: int, side: str, bound: int) -> HardError:
    """connection.tune-ok out of bounds, in RabbitMQ's words (530 NOT_ALLOWED)."""
    most = "minimum" if side == "lower" else "maximum"
    return connection_error(
        NOT_ALLOWED,
        f"negotiated {field} = {value} is {side} than the {most} allowed value ({bound})",
    )


_ROWS = bind_rows(CONNECTION_RULES, Connection, "connection")
_UNOPENED_ROWS = bind_rows(UNOPENED_RULES, Connection, "unopened")


def _frame_again(event: Any, frame_max: int) -> bytes | None:
    """A parsed frame as the bytes a parser reads it from again (None: a parse error)."""
    if isinstance(event, ContentMessage):
        return encode_content(event.channel, event.method, event.header, event.body, frame_max)
    if isinstance(event, MethodFrame):
        return encode_method(event.channel, event.method)
    if isinstance(event, Heartbeat):
        return HEARTBEAT_FRAME
    return None


class _Failure:
    """A parse error, queued after the frames read before it so they are handled first."""

    __slots__ = ("exc", "channel")

    def __init__(self, exc: SoftError | HardError) -> None:
        self.exc = exc
        self.channel = getattr(exc, "channel", 0)


def _blame(exc: Any, event: Any) -> None:
    """Name the method that failed in the close frame, as RabbitMQ does."""
    method = getattr(event, "method", None)
    if exc.class_id == 0 and method is not None:
        exc.class_id = method.CLASS_ID
        exc.method_id = method.METHOD_ID


__all__ = ["Connection", "REPLY_SUCCESS"]
