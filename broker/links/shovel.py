"""A dynamic shovel at work: it consumes from its source and republishes to its
destination, as RabbitMQ's `rabbit_amqp091_shovel` does, over two `AmqpClient`s.

A session: connect to a source URI and a destination URI (one at random, then the others
if it fails), declare what the definition names (a destination queue, or the source
queue, each declared durable if a passive declare finds none; for a source exchange, an
exclusive server-named queue bound with `src-exchange-key`), set the source prefetch
(not in `no-ack`), and consume. Each delivery is published to the destination queue (by
the default exchange), or to `dest-exchange` (the message's own exchange if none) with
`dest-exchange-key` (its own routing key if none); its properties are the source's
unless `dest-publish-properties`, `dest-add-forward-headers` (an `x-shovelled` entry, as
RabbitMQ writes it) or `dest-add-timestamp-header` (`x-shovelled-timestamp`) change them.

The acknowledgement modes, with RabbitMQ's guarantees:
* `on-confirm` (the default): a source delivery is acked only once the destination
  confirmed its publish (a multiple confirm acks the source with multiple, as the
  deliveries and the publishes keep one order); a nack there nacks it at the source,
  requeued. Nothing is lost; a message may come twice after a failure.
* `on-publish`: acked at the source once published (written) to the destination.
* `no-ack`: the source forgets it as it delivers it.

`src-delete-after` (`queue-length`: the messages the queue held when the shovel started;
a count: that many) ends the shovel once that many are done with (confirmed, published,
or delivered by mode); its owner then removes its parameter.

Flow: while the destination's socket cannot take more, or its broker has blocked the
connection, the source's socket is not read, so at most a prefetch of messages is in
flight. Any failure (either connection or channel closed, a refused declare, a cancelled
consumer) ends the session: the state is `terminated` with the reason, and a new
session starts after `reconnect-delay` seconds (0: never).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from roarmq.protocol import spec
from roarmq.protocol.errors import NOT_FOUND
from roarmq.protocol.frames import ContentHeader
from roarmq.protocol.properties import BasicProperties
from roarmq.protocol.tables import Int64

from .client import AmqpClient, ClientChannel, LinkClosed
from .shovel_definition import ShovelDefinition
from .uri import AmqpUri

log = logging.getLogger("roarmq.shovel")

ROUTING_HEADER = "x-shovelled"
TIMESTAMP_HEADER = "x-shovelled-timestamp"

Connect = Callable[[AmqpUri, str], Awaitable[AmqpClient]]


async def connect_network(uri: AmqpUri, name: str) -> AmqpClient:
    """A connection over the network (the default `Connect`)."""
    return await AmqpClient.connect(uri, name=name)


class _Finished(Exception):
    """`src-delete-after` reached: the shovel's work is done."""


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


class Shovel:
    """One dynamic shovel (module doc). `on_finished` runs when `src-delete-after` is
    reached (its owner clears the parameter); `connect` makes the connections."""

    def __init__(
        self,
        vhost: str,
        name: str,
        definition: ShovelDefinition,
        *,
        cluster_name: str,
        node: str,
        connect: Connect = connect_network,
        on_finished: Callable[[], object] = lambda: None,
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.definition = definition
        self.cluster_name = cluster_name
        self.node = node
        self.connect = connect
        self.on_finished = on_finished
        self.state = "starting"
        self.reason: str | None = None
        self.changed_at = time.time()
        self.src_uri: str | None = None  # the URIs of the current session, redacted
        self.dest_uri: str | None = None
        self.moved = 0
        self.reconnects = 0
        self._task: asyncio.Task[None] | None = None
        self._clients: list[AmqpClient] = []
        # the session's
        self._src: AmqpClient | None = None
        self._src_ch: ClientChannel | None = None
        self._dest_ch: ClientChannel | None = None
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
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def restart(self) -> None:
        await self.stop()
        self.start()

    def _set_state(self, state: str, reason: str | None = None) -> None:
        self.state, self.reason, self.changed_at = state, reason, time.time()

    async def _run(self) -> None:
        delay = self.definition.reconnect_delay
        while True:
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except _Finished:
                log.info(
                    "shovel %r in vhost %r: no messages left to transfer, shutting down",
                    self.name,
                    self.vhost,
                )
                await self._close_clients()
                self.on_finished()
                return
            except (LinkClosed, OSError, TimeoutError, ValueError) as exc:
                reason = _reason_of(exc)
                log.warning("shovel %r in vhost %r terminated: %s", self.name, self.vhost, reason)
                self._set_state("terminated", reason)
            finally:
                await self._close_clients()
            if delay <= 0:
                return
            await asyncio.sleep(delay)
            self.reconnects += 1

    async def _connect_any(self, uris: tuple[AmqpUri, ...]) -> AmqpClient:
        """One of `uris` at random, the others if it fails (RabbitMQ's order)."""
        left = list(uris)
        while True:
            uri = left.pop(random.randrange(len(left)))
            try:
                client = await self.connect(uri, f"Shovel {self.name}")
            except (LinkClosed, OSError, TimeoutError) as exc:
                log.error(
                    "shovel %r in vhost %r failed to connect (URI: %s): %s",
                    self.name,
                    self.vhost,
                    uri.redacted,
                    _reason_of(exc),
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
                client.abort("shovel stopped")
        self._src, self._src_ch, self._dest_ch = None, None, None

    # -- a session -------------------------------------------------------------------------

    async def _session(self) -> None:
        d = self.definition
        self._set_state("starting")
        self._unacked = {}
        self._paused = set()
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        src = self._src = await self._connect_any(d.src_uris)
        dest = await self._connect_any(d.dest_uris)
        self.src_uri, self.dest_uri = src.uri.redacted, dest.uri.redacted
        dest_ch = self._dest_ch = await dest.channel()
        if d.dest_queue is not None:
            await ensure_queue(dest, d.dest_queue, d.dest_queue_args)
        src_ch = self._src_ch = await src.channel()
        if d.src_queue is not None:
            await ensure_queue(src, d.src_queue, d.src_queue_args)
            queue = d.src_queue
        else:
            ok = await src_ch.call(spec.QueueDeclare(queue="", exclusive=True))
            queue = ok.queue
            bind = spec.QueueBind(
                queue=queue, exchange=d.src_exchange or "", routing_key=d.src_exchange_key
            )
            await src_ch.call(bind)
        no_ack = d.ack_mode == "no-ack"
        if not no_ack:
            await src_ch.call(spec.BasicQos(prefetch_count=d.prefetch_count))
        remaining: int | None = None
        if d.delete_after == "queue-length":
            ok = await src_ch.call(spec.QueueDeclare(queue=queue, passive=True))
            remaining = ok.message_count
        elif isinstance(d.delete_after, int):
            remaining = d.delete_after
        if remaining == 0:
            raise _Finished()
        self._remaining = self._remaining_unacked = remaining
        if d.ack_mode == "on-confirm":
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
        consume = spec.BasicConsume(queue=queue, no_ack=no_ack, arguments=d.src_consumer_args)
        await src_ch.call(consume)
        self._set_state("running")
        log.info("shovel %r in vhost %r is running", self.name, self.vhost)
        watched = [src.closed, dest.closed, src_ch.closed, dest_ch.closed]
        for future in watched:
            future.add_done_callback(lambda f: self._end(f.result()))
        await self._done  # raises what ended it

    def _end(self, why: BaseException) -> None:
        done = self._done
        if done is not None and not done.done():
            done.set_exception(why)

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
        _redelivered: bool,
        exchange: str,
        routing_key: str,
        header: ContentHeader,
        body: bytes,
    ) -> None:
        if self._remaining_unacked == 0:  # all it must move are out: requeued later
            return
        d = self.definition
        src_ch, dest_ch = self._src_ch, self._dest_ch
        if src_ch is None or dest_ch is None:
            return
        if d.dest_queue is not None:
            exchange, routing_key = "", d.dest_queue
        else:
            if d.dest_exchange is not None:
                exchange = d.dest_exchange
            if d.dest_exchange_key is not None:
                routing_key = d.dest_exchange_key
        try:
            seq = dest_ch.publish(exchange, routing_key, self._header(header), body)
        except LinkClosed as exc:
            self._end(exc)
            return
        self.moved += 1
        if self._remaining_unacked is not None:
            self._remaining_unacked -= 1
        mode = d.ack_mode
        if mode == "on-confirm":
            self._unacked[seq] = tag
        elif mode == "on-publish":
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
            self._end(_Finished())

    def _header(self, header: ContentHeader) -> ContentHeader:
        """The content header to publish: the source's as it is, unless the definition
        sets properties or adds headers (then decoded, changed, encoded)."""
        d = self.definition
        if not (d.publish_properties or d.add_forward_headers or d.add_timestamp_header):
            return header
        props = BasicProperties.decode(header.raw)
        for key, value in d.publish_properties.items():
            setattr(props, key, value)
        headers = dict(props.headers or {})
        if d.add_forward_headers:
            entry = {
                "shovelled-by": self.cluster_name,
                "shovel-type": "dynamic",
                "shovel-name": self.name,
                "shovel-vhost": self.vhost,
                "src-uri": self.src_uri or "",
                "dest-uri": self.dest_uri or "",
            }
            if d.src_queue is not None:
                entry["src-queue"] = d.src_queue
            else:
                entry["src-exchange"] = d.src_exchange or ""
                entry["src-exchange-key"] = d.src_exchange_key
            for key, value in (
                ("dest-exchange", d.dest_exchange),
                ("dest-exchange-key", d.dest_exchange_key),
                ("dest-queue", d.dest_queue),
            ):
                if value is not None:
                    entry[key] = value
            earlier = headers.get(ROUTING_HEADER)
            headers[ROUTING_HEADER] = [entry, *(earlier if isinstance(earlier, list) else [])]
        if d.add_timestamp_header:
            headers[TIMESTAMP_HEADER] = Int64(int(time.time()))
        props.headers = headers
        return ContentHeader.from_properties(props, 60, header.body_size)

    # -- what the API shows ----------------------------------------------------------------

    def row(self) -> dict[str, Any]:
        """GET /api/shovels' row (RabbitMQ's fields), no credentials."""
        d = self.definition
        row: dict[str, Any] = {
            "node": self.node,
            "timestamp": status_time(self.changed_at),
            "name": self.name,
            "vhost": self.vhost,
            "type": "dynamic",
            "state": self.state,
        }
        if self.state == "terminated":
            row["reason"] = self.reason
            return row
        row.update(
            {
                "src_uri": self.src_uri,
                "src_protocol": "amqp091",
                "dest_protocol": "amqp091",
                "dest_uri": self.dest_uri,
            }
        )
        if d.src_queue is not None:
            row["src_queue"] = d.src_queue
        else:
            row["src_exchange"] = d.src_exchange
            row["src_exchange_key"] = d.src_exchange_key
        for key, value in (
            ("dest_exchange", d.dest_exchange),
            ("dest_exchange_key", d.dest_exchange_key),
            ("dest_queue", d.dest_queue),
        ):
            if value is not None:
                row[key] = value
        return row


def status_time(at: float) -> str:
    """A status row's `timestamp` as RabbitMQ's shovel and federation plugins write it: local
    time, the hour not padded ("2026-11-29 8:47:35")."""
    t = time.localtime(at)
    return f"{t.tm_year}-{t.tm_mon:02d}-{t.tm_mday:02d} {t.tm_hour}:{t.tm_min:02d}:{t.tm_sec:02d}"


def _reason_of(exc: BaseException) -> str:
    if isinstance(exc, LinkClosed):
        return f"{exc.reply_code} {exc.reply_text}" if exc.reply_code else exc.reply_text
    if isinstance(exc, ConnectionRefusedError):
        return "connection to target host was refused (ECONNREFUSED)"
    if isinstance(exc, TimeoutError):
        return "connection to target host timed out (ETIMEDOUT)"
    return str(exc) or type(exc).__name__
