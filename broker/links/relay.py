"""What a shovel and a federation link share: a relay that consumes from a queue on one
broker and republishes each message to another (or the same), acknowledging at the source
as its acknowledgement mode says, over two `AmqpClient`s; its sessions, its state for the
API, and its reconnects.

A subclass says what a session sets up (`_prepare`: connect both ends, declare what it
needs, and name the queue to consume, with how many messages to move before it is done)
and where each message goes (`_target`: the destination exchange, routing key and content
header, or None to drop it, acknowledged). The rest is here:

* the acknowledgement modes, with RabbitMQ's guarantees: `on-confirm` (a source delivery is
  acked only once the destination confirmed its publish; a multiple confirm acks the
  source with multiple, as deliveries and publishes keep one order; a nack there nacks
  it at the source, requeued: nothing is lost, a message may come twice after a
  failure), `on-publish` (acked once written to the destination), `no-ack` (the source
  forgets it as it delivers it);
* flow: while the destination's socket cannot take more, or its broker has blocked the
  connection, the source's socket is not read, so at most a prefetch of messages is in
  flight;
* sessions: any failure (either connection or channel closed, a refused declare, a
  cancelled consumer) ends the session; the state is `terminated` with the reason, and a
  new session starts after `reconnect-delay` seconds (0: never). Reaching the count of
  messages to move ends the relay (`on_finished`).
"""

from __future__ import annotations

import abc
import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from roarmq.protocol import spec
from roarmq.protocol.errors import NOT_FOUND
from roarmq.protocol.frames import ContentHeader

from ..ops.tasks import cancel_and_wait
from .client import AmqpClient, ClientChannel, LinkClosed
from .uri import AmqpUri

log = logging.getLogger("roarmq.links")

Connect = Callable[[AmqpUri, str], Awaitable[AmqpClient]]

#: What ends a session and is retried (anything else is a bug, logged with its trace).
SESSION_ERRORS = (LinkClosed, OSError, TimeoutError, ValueError)


async def connect_network(uri: AmqpUri, name: str) -> AmqpClient:
    """A connection over the network (the default `Connect`)."""
    return await AmqpClient.connect(uri, name=name)


class Finished(Exception):
    """The relay moved what it was to move: its work is done."""


async def ensure_queue(client: AmqpClient, queue: str, arguments: dict[str, Any]) -> None:
    """RabbitMQ's shovel `ensure_queue`: a passive declare, and if no such queue, a durable
    one with `arguments`."""
    channel = await client.channel()
    try:
        await channel.call(spec.QueueDeclare(queue=queue, passive=True))
    except LinkClosed as exc:
        if exc.reply_code != NOT_FOUND:
            raise
        declaring = await client.channel()
        await declaring.call(spec.QueueDeclare(queue=queue, durable=True, arguments=arguments))
        await declaring.close()
        return
    await channel.close()


class Relay(abc.ABC):
    """One relay (module doc): `start`, `stop`, `restart`; `state`, `reason` and
    `changed_at` for the API; `moved` and `reconnects` for Prometheus."""

    #: What it is called in logs ("shovel", "federation link").
    kind = "link"

    def __init__(
        self,
        vhost: str,
        name: str,
        *,
        ack_mode: str,
        prefetch: int,
        reconnect_delay: float,
        connect: Connect = connect_network,
        on_finished: Callable[[], object] = lambda: None,
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.ack_mode = ack_mode
        self.prefetch = prefetch
        self.reconnect_delay = reconnect_delay
        self.connect = connect
        self.on_finished = on_finished
        self.state = "starting"
        self.reason: str | None = None
        self.changed_at = time.time()
        self.moved = 0
        self.reconnects = 0
        self._task: asyncio.Task[None] | None = None
        self._clients: list[AmqpClient] = []
        # the session's
        self._src: AmqpClient | None = None
        self._src_ch: ClientChannel | None = None
        self._dest_ch: ClientChannel | None = None
        self._consumer_arguments: dict[str, Any] = {}
        self._unacked: dict[int, int] = {}  # destination publish seq -> source tag
        self._remaining: int | None = None
        self._remaining_unacked: int | None = None
        self._done: asyncio.Future[None] | None = None
        self._paused: set[str] = set()

    # -- life ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    @property
    def started(self) -> bool:
        """Running here: in a session, or waiting to start one."""
        return self._task is not None

    async def stop(self) -> None:
        """End the session under way (its connections closed as the task unwinds)."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def restart(self) -> None:
        await self.stop()
        self.start()

    def _set_state(self, state: str, reason: str | None = None) -> None:
        self.state, self.reason, self.changed_at = state, reason, time.time()

    async def _run(self) -> None:
        me = asyncio.current_task()
        while self._task is me:  # (a stop that this task's cancellation missed ends it here)
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except Finished:
                log.info(
                    "%s %r in vhost %r: no messages left to transfer, shutting down",
                    self.kind,
                    self.name,
                    self.vhost,
                )
                await self._close_clients()
                self.on_finished()
                return
            except SESSION_ERRORS as exc:
                reason = self.describe(exc)
                log.warning(
                    "%s %r in vhost %r terminated: %s", self.kind, self.name, self.vhost, reason
                )
                self._set_state("terminated", reason)
            finally:
                await self._close_clients()
            if self.reconnect_delay <= 0 or self._task is not me:
                return
            await asyncio.sleep(self.reconnect_delay)
            self.reconnects += 1

    def describe(self, exc: BaseException) -> str:
        """Why a session ended, as the API shows it (RabbitMQ's shovel and federation word
        it differently: each relay kind its own)."""
        return reason_of(exc)

    async def connect_any(self, uris: tuple[AmqpUri, ...]) -> AmqpClient:
        """One of `uris` at random, the others if it fails (RabbitMQ's order); closed with
        the session."""
        left = list(uris)
        while True:
            uri = left.pop(random.randrange(len(left)))
            try:
                client = await self.connect(uri, f"{self.kind.capitalize()} {self.name}")
            except (LinkClosed, OSError, TimeoutError) as exc:
                log.error(
                    "%s %r in vhost %r failed to connect (URI: %s): %s",
                    self.kind,
                    self.name,
                    self.vhost,
                    uri.redacted,
                    reason_of(exc),
                )
                if not left:
                    raise
                continue
            self._clients.append(client)
            return client

    async def _close_clients(self) -> None:
        clients, self._clients = self._clients, []
        for client in clients:
            try:
                await client.close(timeout=2.0)
            except Exception:  # noqa: BLE001  # it is going anyway
                client.abort(f"{self.kind} stopped")
        self._src, self._src_ch, self._dest_ch = None, None, None

    # -- a session -------------------------------------------------------------------------

    @abc.abstractmethod
    async def _prepare(self) -> tuple[AmqpClient, ClientChannel, AmqpClient, str, int | None]:
        """Connect both ends and declare what the relay needs: (the source's client, its
        channel to consume on, the destination's client, the queue to consume, how many
        messages to move before it is done: None for no end)."""

    @abc.abstractmethod
    def _target(
        self, exchange: str, routing_key: str, redelivered: bool, header: ContentHeader
    ) -> tuple[str, str, ContentHeader] | None:
        """Where a message consumed from `exchange` with `routing_key` goes: (exchange,
        routing key, content header) at the destination, or None to drop it."""

    async def _consume(self, channel: ClientChannel, queue: str) -> None:
        """Start consuming `queue` on the source's channel (a queue link waits for its
        downstream's demand first: it overrides this)."""
        consume = spec.BasicConsume(
            queue=queue, no_ack=self.ack_mode == "no-ack", arguments=self._consumer_arguments
        )
        await channel.call(consume)

    async def _session(self) -> None:
        self._set_state("starting")
        self._unacked = {}
        self._paused = set()
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        src, src_ch, dest, queue, remaining = await self._prepare()
        self._src, self._src_ch = src, src_ch
        dest_ch = self._dest_ch = await dest.channel()
        no_ack = self.ack_mode == "no-ack"
        if not no_ack:
            await src_ch.call(spec.BasicQos(prefetch_count=self.prefetch))
        if remaining == 0:
            raise Finished()
        self._remaining = self._remaining_unacked = remaining
        if self.ack_mode == "on-confirm":
            await dest_ch.confirm_select()
            dest_ch.on_confirm = self._confirmed
        dest.on_writable = lambda writable: self._pause_source("socket", not writable)
        dest.on_blocked = lambda reason: self._pause_source("blocked", reason is not None)
        if dest.blocked is not None:
            self._pause_source("blocked", True)
        src_ch.on_delivery = self._forward
        src_ch.on_cancel = lambda _tag: self._end(
            LinkClosed(0, "the source cancelled the consumer")
        )
        dest_ch.on_cancel = src_ch.on_cancel
        await self._consume(src_ch, queue)
        self._set_state("running")
        log.info("%s %r in vhost %r is running", self.kind, self.name, self.vhost)
        watched = [src.closed, dest.closed, src_ch.closed, dest_ch.closed]
        for future in watched:
            future.add_done_callback(lambda f: self._end(f.result()))
        await self._done  # raises what ended it

    def _end(self, why: BaseException) -> None:
        done = self._done
        if done is not None and not done.done():
            done.set_exception(why)
            done.exception()  # (retrieved: a session that already ended awaits it no more)

    def _pause_source(self, reason: str, on: bool) -> None:
        """Stop (or go on) reading the source's socket while the destination cannot take
        more: the source's broker keeps what it has not sent."""
        was = bool(self._paused)
        if on:
            self._paused.add(reason)
        else:
            self._paused.discard(reason)
        transport = self._src.transport if self._src is not None else None
        if transport is None or was == bool(self._paused):
            return
        if self._paused:
            transport.pause_reading()
        else:
            transport.resume_reading()

    # -- moving messages -------------------------------------------------------------------

    def _forward(
        self,
        _consumer: str,
        tag: int,
        redelivered: bool,
        exchange: str,
        routing_key: str,
        header: ContentHeader,
        body: bytes,
    ) -> None:
        if self._remaining_unacked == 0:  # all it must move are out: requeued later
            return
        src_ch, dest_ch = self._src_ch, self._dest_ch
        if src_ch is None or dest_ch is None:
            return
        no_ack = self.ack_mode == "no-ack"
        target = self._target(exchange, routing_key, redelivered, header)
        if target is None:  # dropped: done with at the source at once
            if not no_ack:
                src_ch.send(spec.BasicAck(delivery_tag=tag))
            return
        try:
            seq = dest_ch.publish(*target, body)
        except LinkClosed as exc:
            self._end(exc)
            return
        self.moved += 1
        if self._remaining_unacked is not None:
            self._remaining_unacked -= 1
        if self.ack_mode == "on-confirm":
            self._unacked[seq] = tag
        elif not no_ack:
            src_ch.send(spec.BasicAck(delivery_tag=tag))
            self._count_done(1)
        else:
            self._count_done(1)

    def _confirmed(self, seq: int, multiple: bool, ack: bool) -> None:
        src_ch = self._src_ch
        tag = self._unacked.get(seq)
        if tag is None or src_ch is None:
            return
        if ack:
            src_ch.send(spec.BasicAck(delivery_tag=tag, multiple=multiple))
        else:
            src_ch.send(spec.BasicNack(delivery_tag=tag, multiple=multiple, requeue=True))
        if multiple:
            done = [s for s in self._unacked if s <= seq]
            for s in done:
                del self._unacked[s]
            self._count_done(len(done))
        else:
            del self._unacked[seq]
            self._count_done(1)

    def _count_done(self, n: int) -> None:
        if self._remaining is None:
            return
        self._remaining -= n
        if self._remaining <= 0:
            self._end(Finished())


def status_time(at: float) -> str:
    """A status row's `timestamp` as RabbitMQ's shovel and federation plugins write it: local
    time, the hour not padded ("2026-11-29 8:47:35")."""
    t = time.localtime(at)
    return f"{t.tm_year}-{t.tm_mon:02d}-{t.tm_mday:02d} {t.tm_hour}:{t.tm_min:02d}:{t.tm_sec:02d}"


def reason_of(exc: BaseException) -> str:
    if isinstance(exc, LinkClosed):
        return f"{exc.reply_code} {exc.reply_text}" if exc.reply_code else exc.reply_text
    if isinstance(exc, ConnectionRefusedError):
        return "connection to target host was refused (ECONNREFUSED)"
    if isinstance(exc, TimeoutError):
        return "connection to target host timed out (ETIMEDOUT)"
    return str(exc) or type(exc).__name__
