"""The broker as an AMQP 0-9-1 client: one connection to another broker (RoarMQ, RabbitMQ
or any other), on protocol/'s codec, for shovels and federation links.

`AmqpClient.connect(uri)` makes the connection (TCP, or TLS for amqps, as the URI's
options say), logs in (PLAIN, AMQPLAIN or EXTERNAL, the first of the URI's mechanisms the
server offers), tunes (frame_max, channel_max and heartbeat negotiated as RabbitMQ's
Erlang client does: the smaller non-zero value) and opens the URI's vhost. Channels are
`ClientChannel`s: `call` sends a synchronous method and returns its reply (one at a time
per channel), `publish` writes a message (its publish sequence number when the channel
confirms), and what the server sends on its own (deliveries, confirms, returns, a
consumer's cancel, the channel's close) goes to the callbacks a link sets.

A connection is over when `closed` is done: its result is the `LinkClosed` that says why
(the server's connection.close with its code and text, a missed heartbeat, the socket
gone, our own close). Everything waiting then fails with it; nothing waits forever: the
handshake has the URI's connection timeout, every call the link's own.

Flow: the transport's write marks pause and resume the connection (`writable`,
`on_writable`), and RabbitMQ's connection.blocked / unblocked set `blocked`, so a link can
stop taking messages while the far end cannot take them.
"""

from __future__ import annotations

import asyncio
import logging
import platform
import socket
from collections import deque
from collections.abc import Callable
from typing import Any

from roarmq.protocol import spec
from roarmq.protocol.errors import CONNECTION_FORCED, REPLY_SUCCESS
from roarmq.protocol.frames import (
    PROTOCOL_HEADER,
    ContentHeader,
    ContentMessage,
    FrameParser,
    Heartbeat,
    encode_content,
    encode_heartbeat,
    encode_method,
)
from roarmq.protocol.method import Method
from roarmq.protocol.tables import encode_table

from .. import __version__
from .uri import AmqpUri

log = logging.getLogger("roarmq.links")

#: Missed heartbeat intervals after which the server is taken as gone (the Erlang
#: client's rule: two).
MISSED_HEARTBEATS = 2
#: The frame_max and channel_max we offer when the URI asks for none.
CLIENT_FRAME_MAX = 131072
CLIENT_CHANNEL_MAX = 2047


class LinkClosed(Exception):
    """Why a connection or channel is over: the server's close (its code and text), or
    ours, or the network's."""

    def __init__(self, reply_code: int, reply_text: str, by_server: bool = False) -> None:
        super().__init__(f"{reply_code} {reply_text}")
        self.reply_code = reply_code
        self.reply_text = reply_text
        self.by_server = by_server


def negotiate(ours: int, theirs: int) -> int:
    """A tune value both sides take: the smaller, where 0 means no limit."""
    if ours == 0 or theirs == 0:
        return max(ours, theirs)
    return min(ours, theirs)


class ClientChannel:
    """One channel of an `AmqpClient` (module doc)."""

    def __init__(self, client: AmqpClient, number: int) -> None:
        self.client = client
        self.number = number
        self.closed: asyncio.Future[LinkClosed] = client.loop.create_future()
        self._replies: deque[tuple[tuple[type, ...], asyncio.Future[Any]]] = deque()
        self._lock = asyncio.Lock()
        self.confirming = False
        self.next_publish = 1
        #: (consumer tag, delivery tag, redelivered, exchange, routing key, header, body)
        self.on_delivery: (
            Callable[[str, int, bool, str, str, ContentHeader, bytes], None] | None
        ) = None
        #: (delivery tag, multiple, ack: True for basic.ack, False for basic.nack)
        self.on_confirm: Callable[[int, bool, bool], None] | None = None
        #: (reply code, reply text, exchange, routing key, header, body)
        self.on_return: Callable[[int, str, str, str, ContentHeader, bytes], None] | None = None
        self.on_cancel: Callable[[str], None] | None = None  # the server cancelled a consumer

    # -- asking --------------------------------------------------------------------------

    async def call(self, method: Method, timeout: float | None = None) -> Any:
        """Send a synchronous method; its reply (a LinkClosed if the channel closes first)."""
        async with self._lock:
            self._check_open()
            reply = self.client.loop.create_future()
            self._replies.append((type(method).RESPONSES, reply))
            self.client.send_method(self.number, method)
            return await asyncio.wait_for(reply, timeout or self.client.call_timeout)

    def send(self, method: Method) -> None:
        """An asynchronous method (basic.ack, basic.nack, basic.reject; nowait forms)."""
        self._check_open()
        self.client.send_method(self.number, method)

    def publish(
        self,
        exchange: str,
        routing_key: str,
        header: ContentHeader,
        body: bytes,
        mandatory: bool = False,
    ) -> int:
        """Write a message; its publish sequence number (confirms count from 1)."""
        self._check_open()
        method = spec.BasicPublish(exchange=exchange, routing_key=routing_key, mandatory=mandatory)
        client = self.client
        client.write(encode_content(self.number, method, header, body, client.frame_max))
        seq = self.next_publish
        if self.confirming:
            self.next_publish += 1
        return seq

    async def confirm_select(self) -> None:
        await self.call(spec.ConfirmSelect())
        self.confirming = True

    async def close(self) -> None:
        if self.closed.done():
            return
        try:
            await self.call(spec.ChannelClose(reply_code=REPLY_SUCCESS, reply_text="bye"))
        except (TimeoutError, LinkClosed):
            pass
        self._over(LinkClosed(REPLY_SUCCESS, "closed by the link"))

    def _check_open(self) -> None:
        if self.closed.done():
            raise self.closed.result()

    # -- what the server sends -------------------------------------------------------------

    def received(self, event: Any) -> None:
        method = event.method
        if isinstance(event, ContentMessage):
            if isinstance(method, spec.BasicDeliver):
                if self.on_delivery is not None:
                    self.on_delivery(
                        method.consumer_tag,
                        method.delivery_tag,
                        method.redelivered,
                        method.exchange,
                        method.routing_key,
                        event.header,
                        event.body,
                    )
            elif isinstance(method, spec.BasicReturn):
                if self.on_return is not None:
                    self.on_return(
                        method.reply_code,
                        method.reply_text,
                        method.exchange,
                        method.routing_key,
                        event.header,
                        event.body,
                    )
            else:  # basic.get-ok: a reply
                self._reply(event)
            return
        if isinstance(method, (spec.BasicAck, spec.BasicNack)):
            if self.on_confirm is not None:
                ack = isinstance(method, spec.BasicAck)
                self.on_confirm(method.delivery_tag, method.multiple, ack)
        elif isinstance(method, spec.BasicCancel):
            if self.on_cancel is not None:
                self.on_cancel(method.consumer_tag)
        elif isinstance(method, spec.ChannelClose):
            self.client.send_method(self.number, spec.ChannelCloseOk())
            self._over(LinkClosed(method.reply_code, method.reply_text, by_server=True))
        elif isinstance(method, spec.ChannelFlow):
            self.client.send_method(self.number, spec.ChannelFlowOk(active=method.active))
        else:
            self._reply(method)

    def _reply(self, reply: Any) -> None:
        method = reply.method if isinstance(reply, ContentMessage) else reply
        if not self._replies:
            log.warning("unexpected %s from the server", method.NAME, extra=self.client.extra)
            return
        wanted, future = self._replies.popleft()
        if not future.done():
            if isinstance(method, wanted) or (
                isinstance(method, spec.BasicGetEmpty) and spec.BasicGetOk in wanted
            ):
                future.set_result(reply)
            else:
                future.set_exception(
                    LinkClosed(CONNECTION_FORCED, f"{method.NAME} came for a call")
                )
        if isinstance(method, spec.ChannelCloseOk):
            self._over(LinkClosed(REPLY_SUCCESS, "closed by the link"))

    def _over(self, why: LinkClosed) -> None:
        if self.closed.done():
            return
        self.closed.set_result(why)
        while self._replies:
            _, future = self._replies.popleft()
            if not future.done():
                future.set_exception(why)
        self.client.channels.pop(self.number, None)


class AmqpClient(asyncio.Protocol):
    """One connection to another broker (module doc)."""

    def __init__(
        self,
        uri: AmqpUri,
        loop: asyncio.AbstractEventLoop,
        *,
        name: str = "",
        call_timeout: float = 30.0,
    ) -> None:
        self.uri = uri
        self.loop = loop
        self.name = name or uri.redacted
        self.extra = {"link": self.name}
        self.call_timeout = call_timeout
        self.transport: asyncio.Transport | None = None
        self.parser = FrameParser(expect_protocol_header=False, frame_max=CLIENT_FRAME_MAX)
        self.frame_max = CLIENT_FRAME_MAX
        self.channel_max = CLIENT_CHANNEL_MAX
        self.heartbeat = 0
        self.server_properties: dict[str, Any] = {}
        self.channels: dict[int, ClientChannel] = {}
        self._next_channel = 1
        self.opened: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[LinkClosed] = loop.create_future()
        self.writable = True
        self.on_writable: Callable[[bool], None] | None = None
        self.blocked: str | None = None  # connection.blocked's reason while blocked
        self.on_blocked: Callable[[str | None], None] | None = None
        self._heartbeat_timer: asyncio.TimerHandle | None = None
        self._received = self._sent = 0.0
        self._closing = False

    # -- making it -------------------------------------------------------------------------

    @classmethod
    async def connect(
        cls, uri: AmqpUri, *, name: str = "", call_timeout: float = 30.0
    ) -> AmqpClient:
        """A connection, opened on the URI's vhost; LinkClosed (or OSError) if it cannot be,
        within the URI's connection timeout."""
        if uri.host is None:
            raise ValueError("the local broker is reached without a socket, not by connect()")
        loop = asyncio.get_running_loop()
        client = cls(uri, loop, name=name, call_timeout=call_timeout)
        ssl_context, server_hostname = None, None
        if uri.tls is not None:
            ssl_context, sni = uri.tls.context(uri.host)
            server_hostname = sni if sni is not None else ""  # "": no SNI sent
        timeout = uri.connection_timeout_ms / 1000
        try:
            await asyncio.wait_for(
                loop.create_connection(
                    lambda: client,
                    uri.host,
                    uri.port,
                    ssl=ssl_context,
                    server_hostname=server_hostname,
                ),
                timeout,
            )
        except BaseException:
            client.abort("could not open the connection")
            raise
        await client.wait_opened(timeout)
        return client

    async def wait_opened(self, timeout: float) -> None:
        """Until the handshake is over and the vhost open; if it fails or takes longer than
        `timeout`, the connection is aborted and the server's own reason raised when it gave
        one (a refused login's 403, an unknown vhost's 530)."""
        try:
            await asyncio.wait_for(asyncio.shield(self.opened), timeout)
        except BaseException:
            self.abort("could not open the connection")
            if self.closed.done() and self.closed.result().by_server:
                raise self.closed.result() from None
            raise

    async def channel(self) -> ClientChannel:
        """A new open channel."""
        if self.closed.done():
            raise self.closed.result()
        number = self._next_channel
        while number in self.channels:
            number = number % (self.channel_max or CLIENT_CHANNEL_MAX) + 1
        self._next_channel = number % (self.channel_max or CLIENT_CHANNEL_MAX) + 1
        channel = self.channels[number] = ClientChannel(self, number)
        await channel.call(spec.ChannelOpen())
        return channel

    async def close(self, timeout: float = 5.0) -> None:
        """connection.close, and its close-ok (or the timeout), then the socket."""
        if self.closed.done() or self.transport is None:
            self.abort("closed by the link")
            return
        self._closing = True
        self.send_method(
            0, spec.ConnectionClose(reply_code=REPLY_SUCCESS, reply_text="closed by the link")
        )
        try:
            await asyncio.wait_for(asyncio.shield(self.closed), timeout)
        except TimeoutError:
            pass
        self.abort("closed by the link")

    def abort(self, reason: str) -> None:
        """Over at once: the socket closed, everything waiting failed."""
        self._over(LinkClosed(CONNECTION_FORCED, reason))
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()

    # -- writing ---------------------------------------------------------------------------

    def send_method(self, channel: int, method: Method) -> None:
        self.write(encode_method(channel, method))

    def write(self, data: bytes) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            raise (
                self.closed.result()
                if self.closed.done()
                else LinkClosed(CONNECTION_FORCED, "not connected")
            )
        transport.write(data)
        self._sent = self.loop.time()

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream socket's
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._received = self.loop.time()
        self.write(PROTOCOL_HEADER)

    def data_received(self, data: bytes) -> None:
        self._received = self.loop.time()
        try:
            events = self.parser.feed(data)
        except Exception as exc:  # a frame we cannot read: the connection is unusable
            log.warning("bad frame from the server: %s", exc, extra=self.extra)
            self.abort(f"bad frame from the server: {exc}")
            return
        for event in events:
            if isinstance(event, Heartbeat):
                continue
            if event.channel == 0:
                self._connection_method(event.method)
            else:
                channel = self.channels.get(event.channel)
                if channel is not None:
                    channel.received(event)
            if self.closed.done():
                return

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f"connection lost: {exc}" if exc else "the server closed the socket"
        self._over(LinkClosed(CONNECTION_FORCED, reason))

    def pause_writing(self) -> None:
        self.writable = False
        if self.on_writable is not None:
            self.on_writable(False)

    def resume_writing(self) -> None:
        self.writable = True
        if self.on_writable is not None:
            self.on_writable(True)

    # -- channel 0 -------------------------------------------------------------------------

    def _connection_method(self, method: Any) -> None:
        if isinstance(method, spec.ConnectionStart):
            self._start(method)
        elif isinstance(method, spec.ConnectionTune):
            self._tune(method)
        elif isinstance(method, spec.ConnectionOpenOk):
            if not self.opened.done():
                self.opened.set_result(None)
        elif isinstance(method, spec.ConnectionClose):
            self.send_method(0, spec.ConnectionCloseOk())
            log.info(
                "the server closed the connection: %d %s",
                method.reply_code,
                method.reply_text,
                extra=self.extra,
            )
            self._over(LinkClosed(method.reply_code, method.reply_text, by_server=True))
            if self.transport is not None:
                self.transport.close()
        elif isinstance(method, spec.ConnectionCloseOk):
            self._over(LinkClosed(REPLY_SUCCESS, "closed by the link"))
            if self.transport is not None:
                self.transport.close()
        elif isinstance(method, spec.ConnectionBlocked):
            self.blocked = method.reason or "blocked"
            if self.on_blocked is not None:
                self.on_blocked(self.blocked)
        elif isinstance(method, spec.ConnectionUnblocked):
            self.blocked = None
            if self.on_blocked is not None:
                self.on_blocked(None)

    def _start(self, m: spec.ConnectionStart) -> None:
        self.server_properties = dict(m.server_properties or {})
        offered = m.mechanisms
        names = (offered.decode() if isinstance(offered, bytes) else offered).split()
        mechanism = next((mech for mech in self.uri.mechanisms if mech in names), None)
        if mechanism is None:
            self.abort(f"the server offers none of {', '.join(self.uri.mechanisms)} ({offered!r})")
            return
        user, password = self.uri.user.encode(), self.uri.password.encode()
        if mechanism == "PLAIN":
            response = b"\x00" + user + b"\x00" + password
        elif mechanism == "AMQPLAIN":
            response = encode_table({"LOGIN": self.uri.user, "PASSWORD": self.uri.password})[4:]
        else:  # EXTERNAL: the TLS client certificate is the credential
            response = b""
        properties = {
            "product": "RoarMQ",
            "version": __version__,
            "platform": f"Python {platform.python_version()}",
            "connection_name": self.name,
            "capabilities": {
                "publisher_confirms": True,
                "exchange_exchange_bindings": True,
                "basic.nack": True,
                "consumer_cancel_notify": True,
                "connection.blocked": True,
                "authentication_failure_close": True,
            },
        }
        self.send_method(
            0,
            spec.ConnectionStartOk(
                client_properties=properties, mechanism=mechanism, response=response, locale="en_US"
            ),
        )

    def _tune(self, m: spec.ConnectionTune) -> None:
        uri = self.uri
        self.frame_max = negotiate(uri.frame_max or CLIENT_FRAME_MAX, m.frame_max)
        self.channel_max = negotiate(uri.channel_max or CLIENT_CHANNEL_MAX, m.channel_max)
        self.heartbeat = negotiate(uri.heartbeat, m.heartbeat)
        self.parser.frame_max = self.frame_max
        self.send_method(
            0,
            spec.ConnectionTuneOk(
                channel_max=self.channel_max, frame_max=self.frame_max, heartbeat=self.heartbeat
            ),
        )
        self.send_method(0, spec.ConnectionOpen(virtual_host=uri.vhost))
        if self.heartbeat:
            self._heartbeat_timer = self.loop.call_later(self.heartbeat / 2, self._beat)

    def _beat(self) -> None:
        """Every half interval: a heartbeat if we sent nothing meanwhile; over if the
        server has been silent for MISSED_HEARTBEATS intervals."""
        self._heartbeat_timer = None
        if self.closed.done():
            return
        now = self.loop.time()
        if now - self._received > self.heartbeat * MISSED_HEARTBEATS:
            log.warning("missed heartbeats from the server", extra=self.extra)
            self.abort("missed heartbeats from the server")
            return
        if now - self._sent >= self.heartbeat / 2:
            self.write(encode_heartbeat())
        self._heartbeat_timer = self.loop.call_later(self.heartbeat / 2, self._beat)

    def _over(self, why: LinkClosed) -> None:
        if self.closed.done():
            return
        self.closed.set_result(why)
        if self._heartbeat_timer is not None:
            self._heartbeat_timer.cancel()
            self._heartbeat_timer = None
        if not self.opened.done():
            self.opened.set_exception(why)
            self.opened.exception()  # (retrieved: connect() raises `closed`'s instead)
        for channel in list(self.channels.values()):
            channel._over(why)
