"""A channel: consumers, delivery tags, acks, qos, confirms and transactions.

Every channel-class method a client can send is handled here; a SoftError
raised by a handler closes just this channel with RabbitMQ's reply code and
text. Publishing and delivering run synchronously from the connection's
data_received, so the hot path has no task or future per message.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
from collections.abc import Callable
from functools import partial, wraps
from typing import TYPE_CHECKING, Any

from roarmq.protocol import spec
from roarmq.protocol.errors import (
    ACCESS_REFUSED,
    NOT_ALLOWED,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    REPLY_SUCCESS,
    SoftError,
)
from roarmq.protocol.frames import ContentHeader, encode_ack, encode_content, encode_deliver

from ..core import trace
from ..core.delayed import SCHEDULED
from ..core.exchange import EXCHANGE_TYPES, unknown_exchange_type
from ..core.message import FLAG_HEADERS, FLAG_REPLY_TO, FLAG_USER_ID, Message, copy_properties
from ..core.queue import Entry, Queue, delivery_header, enqueue
from ..core.queue_arguments import amqp_type_name, check_consumer_arguments, check_server_named
from ..core.stream import TOUCHED, Stream, check_consume
from ..core.stream import confirm_after as stream_confirm_after
from ..core.stream import refuse as stream_refuses
from ..core.vhost import (
    REPLY_TO_PREFIX,
    REPLY_TO_QUEUE,
    check_deletable_exchange,
    check_new_exchange_name,
    check_new_queue_name,
    check_not_default,
)
from ..errors import channel_error, connection_error
from ..routing.graph import route_key
from ..routing.headers import erlang_type_name
from .session import CHANNEL_RULES, ChannelState, bind_rows

if TYPE_CHECKING:
    from .connection import Connection

log = logging.getLogger("roarmq.channel")

#: Longest time between two consumer-timeout sweeps of a channel, and most unacked
#: deliveries one sweep looks at.
SWEEP_MAX_SECONDS = 15.0
SWEEP_SCAN = 10_000

OPEN, CLOSING, CLOSED = ChannelState.OPEN, ChannelState.CLOSING, ChannelState.CLOSED


def _tag(prefix: str) -> str:
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


class Consumer:
    __slots__ = (
        "channel",
        "queue",
        "tag",
        "no_ack",
        "exclusive",
        "priority",
        "prefetch",
        "unacked",
        "arguments",
    )

    def __init__(
        self,
        channel: Channel,
        queue: Queue | None,
        tag: str,
        no_ack: bool,
        exclusive: bool,
        priority: int,
        prefetch: int,
        arguments: dict,
    ) -> None:
        self.channel = channel
        self.queue = queue
        self.tag = tag
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.priority = priority
        self.prefetch = prefetch
        self.unacked = 0
        self.arguments = arguments

    def has_credit(self) -> bool:
        ch = self.channel
        if not ch.can_deliver:
            return False
        if self.no_ack:
            return True
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        if ch.prefetch_global and len(ch.unacked) >= ch.prefetch_global:
            return False
        return not (ch.prefetch_size and ch.unacked_bytes >= ch.prefetch_size)


# Channel.stats: the rarer message_stats counters (metrics.channel_counts reads them in order).
_RETURNED, _DROPPED, _REDELIVERED, _GET, _GET_NO_ACK, _GET_EMPTY, _NACKED = range(7)


class Channel:
    def __init__(self, conn: Connection, channel_id: int) -> None:
        self.conn = conn
        self.id = channel_id
        self.vhost = conn.vhost
        conn.broker.totals.channels_opened += 1
        self.state = OPEN
        # This state's rules (broker/amqp/session.py): the connection dispatches every method
        # on this channel as self._row[type(method)](self, method).
        self._row = _ROWS[OPEN]
        self.flow_active = True
        self.can_deliver = conn.writable
        self.consumers: dict[str, Consumer] = {}
        self.unacked: dict[int, Entry] = {}
        self.unacked_bytes = 0
        self.delivery_tag = 0
        self.prefetch_count = 0  # per consumer, for consumers created after qos
        self.prefetch_global = 0  # shared by the channel
        self.prefetch_size = 0
        self.confirm = False
        self.publish_seq = 0
        self._acks_ready: list[int] = []  # confirmed, ack not yet sent
        self._acks_waiting: dict[int, None] = {}  # publish seqs awaiting fsync, ascending
        self._acked_sent = 0
        self.tx: list[Callable[[], None]] | None = None
        self.reply_key: str | None = None
        # message_stats (metrics.channel_counts): integers bumped where the work is done
        # anyway; deliveries are counted by `delivery_tag` itself, confirms by `publish_seq`.
        # The rarer ones share one list: a Channel keeps at most 29 attributes, since past
        # 30 CPython 3.11 stops sharing the instance dict's keys and every attribute read
        # on the message path gets slower (callgrind, direct: +3%).
        self.stats_published = 0
        self.stats_no_ack = 0  # deliveries and basic.gets without acks
        self.stats_acked = 0
        self.stats = [0] * 7  # returned, dropped, redelivered, get, get_no_ack, get_empty, nacked
        self._publish_exchanges: dict[str, Any] = {}  # checked for existence and permission
        # Consumer timeout: the shortest timeout of the queues we take deliveries from, and
        # (time, delivery_tag) marks that bound when each unacked delivery went out.
        self._shortest_timeout: float | None = None
        self._marks: list[tuple[float, int]] = []
        self._sweep: Any = None

    # -- plumbing ---------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The channel's name in the API and metrics, as RabbitMQ's: its connection's, then
        its number."""
        return f"{self.conn.name} ({self.id})"

    def send_method(self, method: Any) -> None:
        replicated = self.vhost.replicated
        if replicated.definitions_dirty:
            replicated.hold_reply(self.conn)  # a durable declare waits for the in-sync set
        self.conn.send_method(self.id, method)

    def _enter(self, state: ChannelState) -> None:
        """The one place the channel's state changes: its row of rules changes with it."""
        self.state = state
        self._row = _ROWS[state]

    def update_writable(self, writable: bool) -> None:
        self.can_deliver = writable and self.flow_active and self.state is OPEN
        if self.can_deliver:
            self._redispatch()

    def _redispatch(self) -> None:
        seen = set()
        for consumer in list(self.consumers.values()):
            queue = consumer.queue
            if queue is not None and queue not in seen:
                seen.add(queue)
                queue.dispatch()

    def close_by_server(self, error: SoftError) -> None:
        """Channel exception: tell the client, drop our state, await close-ok."""
        self.conn.settle_store_write()
        log.info(
            "channel error",
            extra={
                "conn": self.conn.name,
                "channel": self.id,
                "code": error.reply_code,
                "text": error.text,
            },
        )
        self.flush_confirms()
        self.release()
        self._enter(CLOSING)
        self.send_method(
            spec.ChannelClose(
                reply_code=error.reply_code,
                reply_text=error.close_text,
                class_id=error.class_id,
                method_id=error.method_id,
            )
        )

    def _answer_close(self, m: spec.ChannelClose) -> None:
        """The client closed too while we were closing: close-ok, and wait for ours."""
        self.send_method(spec.ChannelCloseOk())

    def _close_ok_received(self, m: spec.ChannelCloseOk) -> None:
        """Our channel.close is answered: the channel is gone."""
        self._enter(CLOSED)
        self.conn.channel_closed(self)

    def connection_closing(self) -> None:
        """The connection lets go of its channels: release everything and send nothing more
        (late confirms and the like)."""
        self.release()
        self._enter(CLOSED)

    def release(self) -> None:
        """Requeue unacked messages (in order) and cancel consumers; the channel is going away."""
        self.can_deliver = False
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        self._marks.clear()
        for consumer in list(self.consumers.values()):
            self._remove_consumer(consumer)
        self.consumers.clear()
        self._requeue_all()
        self.tx = None
        if self.reply_key is not None:
            self.conn.broker.reply_to.pop(self.reply_key, None)
            self.reply_key = None

    def _requeue_all(self) -> None:
        """Every unacked message back to its queue (channel closing, basic.recover).

        A client can hold any number unacked (prefetch 0), so past REQUEUE_SLICE they go
        back a slice per loop turn; the queues' heaps keep them in publish order whatever
        arrives in between.
        """
        entries = list(self.unacked.values())
        self.unacked.clear()
        self.unacked_bytes = 0
        for entry in entries:
            consumer = entry.consumer
            if consumer is not None:
                consumer.unacked -= 1  # its credit comes back now, not slice by slice
                entry.consumer = None
        _requeue_slices(entries, 0)

    # -- delivering -------------------------------------------------------------------

    def _hand_out(self, entry: Entry, no_ack: bool) -> tuple[int, bytes]:
        """Give an entry the next delivery tag: settled at once (no-ack) or tracked as unacked.

        Returns the tag and the body to send (read back from the log if it was paged out).
        """
        self.delivery_tag += 1
        tag = self.delivery_tag
        msg = entry.msg
        body = msg.body
        if msg.store_id is not None:
            body = self._persisted(entry, body)
        queue = entry.queue
        if entry.redelivered and queue is not None:
            queue.stats_redelivered += 1
            self.stats[_REDELIVERED] += 1
        if no_ack:
            self.stats_no_ack += 1
            if queue is not None:
                queue.stats_no_ack += 1
                queue.settle(entry)
        else:
            self.unacked[tag] = entry
            self.unacked_bytes += msg.size
            queue.lend(msg.size)
            if self._sweep is None and self._shortest_timeout is not None:
                self._start_sweep()
        return tag, body

    # -- consumer timeout ---------------------------------------------------------------

    def _note_timeout(self, queue: Queue) -> None:
        """We take deliveries from `queue`: sweep at least as often as its timeout needs."""
        timeout = queue.consumer_timeout
        if timeout is not None and (
            self._shortest_timeout is None or timeout < self._shortest_timeout
        ):
            self._shortest_timeout = timeout

    def _start_sweep(self) -> None:
        """Time unacked deliveries without a clock read per delivery: each sweep notes the
        current delivery tag, so a delivery is at least as old as the first mark at or after
        its tag (a sweep's precision: timeouts fire up to two sweep periods late)."""
        clock = self.conn.broker.clock
        self._marks.append((clock.monotonic(), self.delivery_tag))
        period = min(max(self._shortest_timeout / 4, 0.01), SWEEP_MAX_SECONDS)  # type: ignore[operator]  # called only once a consumer timeout is set
        self._sweep = clock.call_later(period, self._check_timeouts)

    def _check_timeouts(self) -> None:
        self._sweep = None
        marks = self._marks
        if self.state is not OPEN or not self.unacked or self._shortest_timeout is None:
            marks.clear()
            return
        now = self.conn.broker.clock.monotonic()
        shortest = self._shortest_timeout
        oldest = next(iter(self.unacked))
        k = 0
        while k < len(marks) and marks[k][1] < oldest:
            k += 1
        del marks[:k]
        j = 0
        for scanned, (tag, entry) in enumerate(self.unacked.items()):
            while j < len(marks) and marks[j][1] < tag:
                j += 1
            if j == len(marks) or scanned >= SWEEP_SCAN:
                break  # delivered since the last mark, or enough for one sweep
            age = now - marks[j][0]
            if age <= shortest:
                break  # this one and every later delivery are within every timeout
            timeout = entry.queue.consumer_timeout if entry.queue is not None else None
            if timeout is not None and age > timeout:
                self.close_by_server(
                    channel_error(
                        PRECONDITION_FAILED,
                        f"delivery acknowledgement on channel {self.id} timed out. Timeout "
                        f"value used: {round(timeout * 1000)} ms. This timeout value can be "
                        "configured, see consumers doc guide to learn more",
                    )
                )
                return
        self._start_sweep()

    def deliver(self, consumer: Consumer, entry: Entry) -> None:
        """Write one basic.deliver (method + header + body) as a single buffer."""
        tag, body = self._hand_out(entry, consumer.no_ack)
        if not consumer.no_ack:
            entry.consumer = consumer
            consumer.unacked += 1
        msg = entry.msg
        conn = self.conn
        queue = entry.queue  # None: a direct reply-to delivery
        conn.send(
            encode_deliver(
                self.id,
                consumer.tag,
                tag,
                entry.redelivered,
                msg.exchange,
                msg.routing_key,
                delivery_header(entry)
                if queue is not None and queue.counts_deliveries
                else msg.header.raw,
                body,
                conn.frame_max,
            )
        )

    def _persisted(self, entry: Entry, body: bytes | None) -> bytes:
        """Delivering a stored message: note the first delivery, read a paged-out body back."""
        queue = entry.queue
        store = queue.store if queue is not None else None  # a clustered vhost's, or the node's
        if store is None:
            store = self.conn.broker.store  # (opened by Broker.start)
            return body if body is not None else store.body(entry.msg)  # type: ignore[union-attr]  # a stored message: the broker's store is open
        if not entry.marked:
            entry.marked = True
            store.delivered(queue, entry.msg.store_id)  # type: ignore[arg-type]  # stored: has one
        return body if body is not None else store.body(entry.msg)

    def cancel_by_server(self, consumer: Consumer) -> None:
        """The queue went away: forget the consumer and tell a client that understands."""
        self.consumers.pop(consumer.tag, None)
        if self.state is OPEN and self.conn.capabilities.get("consumer_cancel_notify"):
            self.send_method(spec.BasicCancel(consumer_tag=consumer.tag, no_wait=True))

    def _remove_consumer(self, consumer: Consumer) -> None:
        self.consumers.pop(consumer.tag, None)
        if consumer.queue is not None:
            consumer.queue.remove_consumer(consumer)

    # -- channel class ----------------------------------------------------------------

    def _channel_flow(self, m: spec.ChannelFlow) -> None:
        self.flow_active = m.active
        self.send_method(spec.ChannelFlowOk(active=m.active))
        self.update_writable(self.conn.writable)

    def _channel_close(self, m: spec.ChannelClose) -> None:
        # Confirms owed go out before close-ok; those still waiting for the disk never do
        # (a frame on a closed channel is an error to clients such as amqplib).
        self.flush_confirms()
        self.release()
        self.send_method(spec.ChannelCloseOk())
        self._enter(CLOSED)
        self.conn.channel_closed(self)

    # -- exchange class ---------------------------------------------------------------

    def permissions_changed(self) -> None:
        """The user's permissions changed: forget which exchanges were checked already."""
        self._publish_exchanges.clear()

    def _check(self, action: str, kind: str, name: str) -> None:
        """RabbitMQ's configure/write/read check; the default exchange is 'amq.default'."""
        if not name and kind == "exchange":
            name = "amq.default"
        perm = self.conn.permission
        if not perm.allows(action, name):
            raise channel_error(
                ACCESS_REFUSED,
                f"access to {kind} '{name}' in vhost '{self.vhost.name}' refused for user "
                f"'{self.conn.user.name}'",
            )

    def _check_topic(self, action: str, exchange: Any, key: str) -> None:
        """Topic permissions: only on topic exchanges, only for users who have some."""
        perm = self.conn.permission
        if (
            perm.topics
            and exchange is not None
            and exchange.type == "topic"
            and not perm.allows_topic(action, exchange.name, key)
        ):
            raise channel_error(
                ACCESS_REFUSED,
                f"access to topic '{key}' in exchange '{exchange.name}' in vhost "
                f"'{self.vhost.name}' refused for user '{self.conn.user.name}'",
            )

    def _check_argument_exchange(
        self, kind: str, name: str, arguments: dict | None, key: str
    ) -> None:
        """The exchange a new exchange (alternate-exchange) or queue (x-dead-letter-exchange)
        names, checked as RabbitMQ does: its type (void too: probed on 3.10.8), read on the
        new object, write on it."""
        if not arguments or key not in arguments:
            return
        target = arguments[key]
        if not isinstance(target, str):
            raise channel_error(
                PRECONDITION_FAILED,
                f"invalid type '{amqp_type_name(target)}' for arg '{key}' in {kind} "
                f"'{name}' in vhost '{self.vhost.name}'",
            )
        self._check("read", kind, name)
        self._check("write", "exchange", target)

    def _exchange_declare(self, m: spec.ExchangeDeclare) -> None:
        if not m.passive:
            # RabbitMQ's order: the type, the default exchange, configure; then, for a new
            # exchange only, the reserved prefix and the alternate exchange.
            if m.type not in EXCHANGE_TYPES:
                raise unknown_exchange_type(m.type)
            check_not_default(m.exchange)
            self._check("configure", "exchange", m.exchange)
            if m.exchange not in self.vhost.exchanges:
                check_new_exchange_name(m.exchange)
                self._check_argument_exchange(
                    "exchange", m.exchange, m.arguments, "alternate-exchange"
                )
        exchange, created = self.vhost.declare_exchange(
            m.exchange,
            m.type,
            passive=m.passive,
            durable=m.durable,
            auto_delete=m.auto_delete,
            internal=m.internal,
            arguments=m.arguments,
        )
        if not m.no_wait:
            self.send_method(spec.ExchangeDeclareOk())

    def _exchange_delete(self, m: spec.ExchangeDelete) -> None:
        check_deletable_exchange(m.exchange, self.vhost.name)
        self._check("configure", "exchange", m.exchange)
        self.vhost.delete_exchange(m.exchange, if_unused=m.if_unused)
        if not m.no_wait:
            self.send_method(spec.ExchangeDeleteOk())

    def _exchange_bind(self, m: spec.ExchangeBind) -> None:
        self._check("write", "exchange", m.destination)
        check_not_default(m.destination, m.source)
        self._check("read", "exchange", m.source)
        destination = self.vhost.get_exchange(m.destination)
        source = self.vhost.get_exchange(m.source)
        self._check_topic("read", source, m.routing_key)
        self.vhost.bind_exchange(destination, source, m.routing_key, m.arguments)
        if not m.no_wait:
            self.send_method(spec.ExchangeBindOk())

    def _exchange_unbind(self, m: spec.ExchangeUnbind) -> None:
        self._check("write", "exchange", m.destination)
        check_not_default(m.destination, m.source)
        self._check("read", "exchange", m.source)
        destination = self.vhost.exchanges.get(m.destination)
        source = self.vhost.exchanges.get(m.source)
        self._check_topic("read", source, m.routing_key)
        if destination is not None and source is not None:
            self.vhost.unbind_exchange(destination, source, m.routing_key, m.arguments)
        if not m.no_wait:
            self.send_method(spec.ExchangeUnbindOk())

    # -- queue class ------------------------------------------------------------------

    def _queue_declare(self, m: spec.QueueDeclare) -> None:
        name = m.queue
        if name == REPLY_TO_QUEUE or name.startswith(REPLY_TO_PREFIX):
            # RabbitMQ lets clients passively check the pseudo-queue.
            if not m.no_wait:
                self.send_method(spec.QueueDeclareOk(queue=name, message_count=0, consumer_count=0))
            return
        if not m.passive:
            if not name:  # named here, so the check sees the name the queue will have
                check_server_named(m.arguments)  # (not a quorum queue or a stream)
                name = self.conn.server_named(m)
            else:
                check_new_queue_name(name)
            self._check("configure", "queue", name)
            if name not in self.vhost.queues:  # dead-lettering reads the queue, writes the DLX
                self._check_argument_exchange("queue", name, m.arguments, "x-dead-letter-exchange")
        queue, created = self.vhost.declare_queue(
            name,
            self.conn,
            passive=m.passive,
            durable=m.durable,
            exclusive=m.exclusive,
            auto_delete=m.auto_delete,
            arguments=m.arguments,
        )
        self.conn.last_queue = queue.name
        if not m.no_wait:
            self.send_method(
                spec.QueueDeclareOk(
                    queue=queue.name,
                    message_count=queue.message_count(),
                    # RabbitMQ's declare-ok counts no consumers of a stream (its stat
                    # answers 0 for them, 3.9 to 4.2): clients see the same
                    consumer_count=0 if type(queue) is Stream else queue.consumer_count,
                )
            )

    def _queue_name(self, name: str) -> str:
        """An empty queue name means the last queue declared on this channel's connection."""
        if name:
            return name
        if self.conn.last_queue is None:
            raise channel_error(NOT_FOUND, "no previously declared queue")
        return self.conn.last_queue

    def _queue_bind(self, m: spec.QueueBind) -> None:
        qname = self._queue_name(m.queue)
        self._check("write", "queue", qname)
        check_not_default(m.exchange)
        self._check("read", "exchange", m.exchange)
        queue = self.vhost.get_queue(qname, self.conn)
        exchange = self.vhost.get_exchange(m.exchange)
        self._check_topic("read", exchange, m.routing_key)
        self.vhost.bind_queue(queue, exchange, m.routing_key, m.arguments)
        if not m.no_wait:
            self.send_method(spec.QueueBindOk())

    def _queue_unbind(self, m: spec.QueueUnbind) -> None:
        qname = self._queue_name(m.queue)
        self._check("write", "queue", qname)
        check_not_default(m.exchange)
        self._check("read", "exchange", m.exchange)
        # RabbitMQ answers unbind-ok whatever is missing: queue, exchange or binding.
        queue = self.vhost.queues.get(qname)
        exchange = self.vhost.exchanges.get(m.exchange)
        self._check_topic("read", exchange, m.routing_key)
        if queue is not None:
            self.vhost.check_exclusive(queue, self.conn)
            if exchange is not None:
                self.vhost.unbind_queue(queue, exchange, m.routing_key, m.arguments)
        self.send_method(spec.QueueUnbindOk())

    def _queue_purge(self, m: spec.QueuePurge) -> None:
        qname = self._queue_name(m.queue)
        self._check("read", "queue", qname)
        queue = self.vhost.get_queue(qname, self.conn)
        count = queue.purge()
        if not m.no_wait:
            self.send_method(spec.QueuePurgeOk(message_count=count))

    def _queue_delete(self, m: spec.QueueDelete) -> None:
        qname = self._queue_name(m.queue)
        self._check("configure", "queue", qname)
        queue = self.vhost.queues.get(qname)
        reply = None if m.no_wait else self._delete_ok
        if queue is None:
            if reply is not None:
                reply(0)  # RabbitMQ: deleting what is not there is fine
            return
        self.vhost.check_exclusive(queue, self.conn)
        self.vhost.delete_queue(queue, if_unused=m.if_unused, if_empty=m.if_empty, reply=reply)

    def _delete_ok(self, count: int) -> None:
        self.send_method(spec.QueueDeleteOk(message_count=count))

    # -- basic class: qos, consume, cancel, get ----------------------------------------

    def _basic_qos(self, m: spec.BasicQos) -> None:
        """global: the channel's shared limit. Not global: the limit of each consumer the
        channel has and will have. RabbitMQ gives it only to consumers created afterwards;
        we re-limit the existing ones too, as LavinMQ does, because Celery's worker raises
        its one consumer's prefetch this way to hold countdown tasks (kombu sends global
        only to RabbitMQ 3.3-3.x): docs/operations.md, "Consumer prefetch"."""
        if m.global_:
            self.prefetch_global = m.prefetch_count
        else:
            self.prefetch_count = m.prefetch_count
            for consumer in self.consumers.values():
                consumer.prefetch = m.prefetch_count
        self.prefetch_size = m.prefetch_size
        self.send_method(spec.BasicQosOk())
        self._redispatch()

    def _basic_consume(self, m: spec.BasicConsume) -> None:
        tag = m.consumer_tag or _tag("amq.ctag-")
        if tag in self.consumers:
            raise connection_error(NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'")
        args = m.arguments or {}
        if m.queue == REPLY_TO_QUEUE:
            self._consume_reply_to(m, tag)
            return
        qname = self._queue_name(m.queue)
        self._check("read", "queue", qname)
        queue = self.vhost.get_queue(qname, self.conn)
        if type(queue) is Stream:
            # no exclusivity: RabbitMQ takes an exclusive consumer of a stream and any
            # other consumer beside it (each reads on its own)
            check_consume(self, queue, m.no_ack, args)
        else:
            # another type's argument (x-stream-offset on a classic queue) first, as
            # RabbitMQ checks it: before the queue's exclusive use
            check_consumer_arguments(queue.queue_type, args, queue.description)
            if queue.has_exclusive_consumer() or (m.exclusive and queue.consumer_count):
                raise channel_error(
                    ACCESS_REFUSED,
                    f"queue '{queue.name}' in vhost '{self.vhost.name}' in exclusive use",
                )
        priority = args.get("x-priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise channel_error(
                PRECONDITION_FAILED,
                f"invalid arg 'x-priority' for consumer '{tag}': expected an integer",
            )
        consumer = Consumer(
            self, queue, tag, m.no_ack, m.exclusive, priority, self.prefetch_count, args
        )
        if not m.no_ack:
            self._note_timeout(queue)
        self.consumers[tag] = consumer
        if not m.no_wait:
            self.send_method(spec.BasicConsumeOk(consumer_tag=tag))
        queue.add_consumer(consumer)

    def _consume_reply_to(self, m: spec.BasicConsume, tag: str) -> None:
        if not m.no_ack:
            raise channel_error(PRECONDITION_FAILED, "reply consumer cannot acknowledge")
        if self.reply_key is not None:
            raise channel_error(PRECONDITION_FAILED, "reply consumer already set")
        consumer = Consumer(self, None, tag, True, False, 0, 0, {})
        self.consumers[tag] = consumer
        self.reply_key = _tag("")
        self.conn.broker.reply_to[self.reply_key] = consumer
        if not m.no_wait:
            self.send_method(spec.BasicConsumeOk(consumer_tag=tag))

    def _basic_cancel(self, m: spec.BasicCancel) -> None:
        consumer = self.consumers.get(m.consumer_tag)
        if consumer is not None:
            self._remove_consumer(consumer)
            if consumer.queue is None and self.reply_key is not None:
                self.conn.broker.reply_to.pop(self.reply_key, None)
                self.reply_key = None
        if not m.no_wait:
            self.send_method(spec.BasicCancelOk(consumer_tag=m.consumer_tag))

    def _basic_get(self, m: spec.BasicGet) -> None:
        qname = self._queue_name(m.queue)
        self._check("read", "queue", qname)
        queue = self.vhost.get_queue(qname, self.conn)
        if type(queue) is Stream:
            raise stream_refuses("basic.get", queue)
        entry = queue.get()
        if entry is None:
            queue.stats_get_empty += 1
            self.stats[_GET_EMPTY] += 1
            self.send_method(spec.BasicGetEmpty())
            return
        if m.no_ack:
            queue.stats_get_no_ack += 1
            self.stats[_GET_NO_ACK] += 1
        else:
            queue.stats_get += 1
            self.stats[_GET] += 1
            self._note_timeout(queue)
        if self.vhost.tracing:
            trace.delivered(self, entry)
        tag, body = self._hand_out(entry, m.no_ack)
        msg = entry.msg
        method = spec.BasicGetOk(
            delivery_tag=tag,
            redelivered=entry.redelivered,
            exchange=msg.exchange,
            routing_key=msg.routing_key,
            message_count=queue.message_count(),
        )
        header = msg.header
        if queue.counts_deliveries:
            header = ContentHeader(60, header.body_size, delivery_header(entry))
        self.conn.send(encode_content(self.id, method, header, body, self.conn.frame_max))

    # -- basic class: acks -------------------------------------------------------------

    def _take_unacked(self, tag: int, multiple: bool) -> list[Entry]:
        unacked = self.unacked
        if multiple and tag == 0:
            entries = list(unacked.values())
            unacked.clear()
        elif tag not in unacked:
            raise _unknown_tag(tag)
        elif multiple:
            # Tags are ascending in the dict: walk only the ones settled, never copy it all.
            tags = []
            for t in unacked:
                if t > tag:
                    break
                tags.append(t)
            pop = unacked.pop
            entries = [pop(t) for t in tags]
        else:
            entries = [unacked.pop(tag)]
        for entry in entries:
            self._release(entry)
        return entries

    def _release(self, entry: Entry) -> None:
        """An entry taken out of `unacked`: its consumer's, queue's and our counts drop."""
        size = entry.msg.size
        self.unacked_bytes -= size
        consumer = entry.consumer
        if consumer is not None:
            consumer.unacked -= 1
            entry.consumer = None
        queue = entry.queue
        if queue is not None:
            queue.take_back(1, size)

    def _settle(self, tag: int, multiple: bool, action: Callable[[list[Entry]], None]) -> None:
        if self.tx is not None:
            # Validate now (unknown tags fail at once, as in RabbitMQ), apply at commit.
            if not (multiple and tag == 0) and tag not in self.unacked:
                raise _unknown_tag(tag)
            self.tx.append(lambda: action(self._take_unacked(tag, multiple)))
            return
        entries = self._take_unacked(tag, multiple)
        action(entries)
        if self.prefetch_global or self.prefetch_size or len(entries) > 64:
            self._redispatch()  # credit is shared by the channel's consumers
            return
        # Only the queues whose consumers got credit back, not every consumer of the channel.
        seen = None
        for entry in entries:
            queue = entry.queue
            if queue is not None and queue is not seen:
                seen = queue
                queue.dispatch()

    def _basic_ack(self, m: spec.BasicAck) -> None:
        if not m.multiple and self.tx is None:
            self._ack_one(m.delivery_tag)
            return

        def ack(entries: list[Entry]) -> None:
            self.stats_acked += len(entries)
            for entry in entries:
                if entry.queue is not None and not entry.queue.deleted:
                    entry.queue.ack(entry)

        self._settle(m.delivery_tag, m.multiple, ack)

    def _ack_one(self, tag: int) -> None:
        """One basic.ack, not multiple, outside a transaction: what a consumer that acks each
        delivery sends, once per message. `_take_unacked` + `_settle` for one entry, without
        the list, the closure and the loops (bench/hotpath.py acks: docs/benchmarks.md)."""
        entry = self.unacked.pop(tag, None)
        if entry is None:
            raise _unknown_tag(tag)
        self._release(entry)
        self.stats_acked += 1
        queue = entry.queue
        if queue is not None and not queue.deleted:
            queue.ack(entry)
        if self.prefetch_global or self.prefetch_size:
            self._redispatch()  # credit is shared by the channel's consumers
        elif queue is not None:
            queue.dispatch()

    def _reject_entries(self, entries: list[Entry], requeue: bool, failed: bool = True) -> None:
        """basic.reject or (`failed` False) basic.nack: RabbitMQ 4.3 counts a reject as a
        failed delivery and a nack as a message handed back (`Queue.requeue`)."""
        for entry in entries:
            if type(entry.queue) is Stream:
                raise stream_refuses("basic.nack and basic.reject", entry.queue)
        if requeue:
            by_queue: dict[Queue, list[Entry]] = {}
            for entry in entries:
                if entry.queue is not None:
                    by_queue.setdefault(entry.queue, []).append(entry)
            for queue, group in by_queue.items():
                queue.requeue(group, failed)
        else:
            for entry in entries:
                if entry.queue is not None:
                    entry.queue.reject(entry, False)

    def _basic_reject(self, m: spec.BasicReject) -> None:
        self._settle(m.delivery_tag, False, lambda es: self._reject_entries(es, m.requeue))

    def _basic_nack(self, m: spec.BasicNack) -> None:
        self._settle(
            m.delivery_tag, m.multiple, lambda es: self._reject_entries(es, m.requeue, False)
        )

    def _basic_recover(self, m: spec.BasicRecover) -> None:
        if not m.requeue:
            raise connection_error(NOT_IMPLEMENTED, "requeue=false")
        for entry in self.unacked.values():
            if type(entry.queue) is Stream:  # 3.10: 541; later versions: this 540
                raise stream_refuses("basic.nack and basic.reject", entry.queue)
        if isinstance(m, spec.BasicRecover):  # before the redeliveries, as RabbitMQ sends it
            self.send_method(spec.BasicRecoverOk())
        self._requeue_all()
        self._redispatch()

    # -- basic class: publish ----------------------------------------------------------

    def _basic_publish(self, method: spec.BasicPublish, header: Any, body: bytes) -> None:
        """An assembled basic.publish (the only content a client may send: the session
        table refuses the others, and drops content on a channel that is closing)."""
        if self.confirm:
            self.publish_seq += 1
        if method.immediate:
            raise connection_error(NOT_IMPLEMENTED, "immediate=true")
        exchange = self._publish_exchanges.get(method.exchange)
        if exchange is None or exchange.deleted:
            exchange = self._publish_exchange(method.exchange)
        if self.conn.permission.topics:
            self._check_topic("write", exchange, method.routing_key)
        try:
            # exchange.name, not the frame's copy: every message shares the one string
            msg = Message(exchange.name, method.routing_key, header, body)
        except ValueError as exc:  # a malformed per-message TTL
            raise channel_error(PRECONDITION_FAILED, str(exc)) from None
        if msg.flags & (FLAG_USER_ID | FLAG_REPLY_TO):
            msg = self._check_properties(msg)
        if msg.flags & FLAG_HEADERS:
            headers = msg.headers
            if "CC" in headers or "BCC" in headers:  # type: ignore[operator]  # FLAG_HEADERS: the headers are a dict
                _check_sender_selected(headers)  # type: ignore[arg-type]  # (as above)
        if self.tx is not None:  # (a partial, not a lambda: no closure in a compiled cpdef)
            self.tx.append(partial(self._route, exchange, msg, method.mandatory, self.publish_seq))
            return
        self._route(exchange, msg, method.mandatory, self.publish_seq)

    def _publish_exchange(self, name: str) -> Any:
        """Look up, check and cache an exchange this channel publishes to."""
        self._check("write", "exchange", name)  # before the lookup, as RabbitMQ
        exchange = self.vhost.exchanges.get(name)
        if exchange is None:
            raise channel_error(NOT_FOUND, f"no exchange '{name}' in vhost '{self.vhost.name}'")
        if exchange.internal:
            raise channel_error(
                ACCESS_REFUSED,
                f"cannot publish to internal exchange '{name}' in vhost '{self.vhost.name}'",
            )
        if len(self._publish_exchanges) > 1000:
            self._publish_exchanges.clear()
        self._publish_exchanges[name] = exchange
        return exchange

    def _check_properties(self, msg: Message) -> Message:
        """Fast reply-to, then user_id: RabbitMQ's order (maybe_set_fast_reply_to first)."""
        props = msg.properties
        user = self.conn.user
        if props.reply_to == REPLY_TO_QUEUE:
            if self.reply_key is None:
                raise channel_error(PRECONDITION_FAILED, "fast reply consumer does not exist")
            new = copy_properties(props)
            new.reply_to = REPLY_TO_PREFIX + self.reply_key
            msg = msg.with_properties(new)
        if (
            props.user_id is not None
            and props.user_id != user.name
            and "impersonator" not in user.tags
        ):
            raise channel_error(
                PRECONDITION_FAILED,
                f"user_id property set to '{props.user_id}' but authenticated user was "
                f"'{user.name}'",
            )
        return msg

    def _route(self, exchange: Any, msg: Message, mandatory: bool, seq: int) -> None:
        self.stats_published += 1
        exchange.stats_in += 1
        if exchange.name == "" and msg.routing_key.startswith(REPLY_TO_PREFIX):
            consumer = self.conn.broker.reply_to.get(msg.routing_key[len(REPLY_TO_PREFIX) :])
            if consumer is not None:
                if consumer.channel.state is OPEN:
                    consumer.channel.deliver(consumer, Entry(msg, 0, None))  # type: ignore[arg-type]  # a direct reply-to delivery belongs to no queue
                self._confirmed(seq, True)
                return
            queues: Any = ()
        elif msg.flags & FLAG_HEADERS:
            queues = self.vhost.route(exchange, msg)
        else:  # VirtualHost.route's common case, C to C
            queues = route_key(exchange, msg.routing_key, None, self.vhost.exchanges.get)
        archive = self.conn.broker.archive
        if archive is not None:
            archive.record(self.vhost.name, msg, queues)
        if self.vhost.tracing:
            trace.published(self, msg, queues)
        if not queues:
            exchange.stats_unroutable += 1
            if mandatory:
                self._return(msg, 312, "NO_ROUTE")
            else:
                self.stats[_DROPPED] += 1
            self._confirmed(seq, True)
            return
        if msg.flags & FLAG_HEADERS and "BCC" in msg.headers:  # type: ignore[operator]  # (it has)
            msg = _strip_bcc(msg)
        ok, token = enqueue(msg, queues, self.confirm)
        for queue in queues:
            if queue.throttled is not None:
                if queue.throttled is SCHEDULED:  # a delayed exchange took it
                    if mandatory:
                        self._return(msg, 312, "NO_ROUTE")
                else:
                    queue.hold_publisher(self.conn)
        if TOUCHED:  # streams took it: a confirm waits for their fsync; TOUCHED is this route's
            if self.confirm:
                stream_confirm_after(self, seq, token, ok)
                return
            TOUCHED.clear()
        if token is not None and ok and self.confirm:
            self.vhost.message_store.confirm_after(token, self, seq)
            return
        self._confirmed(seq, ok)

    def _return(self, msg: Message, code: int, text: str) -> None:
        self.conn.broker.totals.returned += 1
        self.stats[_RETURNED] += 1
        method = spec.BasicReturn(
            reply_code=code, reply_text=text, exchange=msg.exchange, routing_key=msg.routing_key
        )
        self.conn.send(encode_content(self.id, method, msg.header, msg.body, self.conn.frame_max))

    # -- confirms ---------------------------------------------------------------------

    def _confirmed(self, seq: int, ok: bool) -> None:
        """A publish was routed: ack now (transient) or nack (refused by x-overflow)."""
        if not self.confirm:
            return
        if ok:
            self._acks_ready.append(seq)
            self.conn.want_flush(self)
        else:
            self.stats[_NACKED] += 1
            self.flush_confirms()
            self.conn.send_method(
                self.id, spec.BasicNack(delivery_tag=seq, multiple=False, requeue=False)
            )

    def confirm_later(self, seq: int) -> None:
        """The publish waits for its data to reach the disk before it may be acked."""
        if self.confirm:
            self._acks_waiting[seq] = None

    def disk_confirmed(self, seq: int) -> None:
        """Called when the batch holding `seq` was fsynced; the caller then flushes."""
        if self._acks_waiting.pop(seq, 0) is None:
            self._acks_ready.append(seq)

    def disk_failed(self, seq: int) -> None:
        """The store could not make `seq` durable: nack it (confirms' "not taken")."""
        if self._acks_waiting.pop(seq, 0) is None:
            self._confirmed(seq, False)

    def flush_confirms(self) -> None:
        """Send the fewest acks that cover what is confirmed.

        Everything below the oldest publish still waiting for the disk is
        covered by one basic.ack(multiple); confirmed publishes above it are
        acked one by one, since a multiple ack would also confirm the waiter.
        """
        ready = self._acks_ready
        if not ready or self.state is not OPEN:
            return
        self._acks_ready = []
        self.conn.broker.totals.confirmed += len(ready)
        floor = next(iter(self._acks_waiting), None)
        if floor is None or max(ready) < floor:
            top = max(ready)
            multiple = len(ready) > 1 or top - self._acked_sent > 1
            self.conn.send(encode_ack(self.id, top, multiple))
            self._acked_sent = max(self._acked_sent, top)
            return
        ready.sort()
        below = [s for s in ready if s < floor]
        if below:
            top = below[-1]
            multiple = len(below) > 1 or top - self._acked_sent > 1
            self.conn.send(encode_ack(self.id, top, multiple))
            self._acked_sent = max(self._acked_sent, top)
        for seq in ready[len(below) :]:
            self.conn.send(encode_ack(self.id, seq, False))

    def _confirm_select(self, m: spec.ConfirmSelect) -> None:
        if self.tx is not None:
            raise channel_error(PRECONDITION_FAILED, "cannot switch from tx to confirm mode")
        self.confirm = True
        if not m.nowait:
            self.send_method(spec.ConfirmSelectOk())

    # -- tx ----------------------------------------------------------------------------

    def _tx_select(self, m: spec.TxSelect) -> None:
        if self.confirm:
            raise channel_error(PRECONDITION_FAILED, "cannot switch from confirm to tx mode")
        if self.tx is None:
            self.tx = []
        self.send_method(spec.TxSelectOk())

    def _tx_commit(self, m: spec.TxCommit) -> None:
        if self.tx is None:
            raise channel_error(PRECONDITION_FAILED, "channel is not transactional")
        ops, self.tx = self.tx, []
        for op in ops:
            op()
        self._redispatch()
        self.send_method(spec.TxCommitOk())

    def _tx_rollback(self, m: spec.TxRollback) -> None:
        if self.tx is None:
            raise channel_error(PRECONDITION_FAILED, "channel is not transactional")
        self.tx = []
        self.send_method(spec.TxRollbackOk())


#: Unacked messages requeued per loop turn when a channel lets go of them all.
REQUEUE_SLICE = 10_000


def _requeue_slices(entries: list[Entry], start: int) -> None:
    by_queue: dict[Queue, list[Entry]] = {}
    for entry in entries[start : start + REQUEUE_SLICE]:
        if entry.queue is not None:
            by_queue.setdefault(entry.queue, []).append(entry)
    for queue, group in by_queue.items():
        queue.take_back(len(group), sum(e.msg.size for e in group))
        queue.requeue(group)
    start += REQUEUE_SLICE
    if start < len(entries):
        asyncio.get_running_loop().call_soon(_requeue_slices, entries, start)


def _check_sender_selected(headers: dict) -> None:
    """CC and BCC must be arrays (of routing keys), or RabbitMQ refuses the message."""
    for name in ("CC", "BCC"):
        if name in headers and not isinstance(headers[name], list):
            kind = erlang_type_name(headers[name])
            raise channel_error(
                PRECONDITION_FAILED,
                f'invalid message: {{unacceptable_type_in_header,"{name}",{kind}}}',
            )


def _strip_bcc(msg: Message) -> Message:
    """Sender-selected distribution: BCC routes the message but is never delivered."""
    props = copy_properties(msg.properties)
    headers = props.headers  # (it has a BCC header)
    props.headers = {k: v for k, v in headers.items() if k != "BCC"}  # type: ignore[union-attr]  # the caller saw a BCC header
    return msg.with_properties(props)


def _unknown_tag(tag: int) -> SoftError:
    """406 for an ack, nack or reject of a delivery tag the channel does not hold."""
    return channel_error(PRECONDITION_FAILED, f"unknown delivery tag {tag}")


class ClosedChannel:
    """What a channel number maps to once its close / close-ok exchange is over.

    Frames the client sent before it saw the close are dropped, as the CLOSED row of
    `session.CHANNEL_RULES` says, until channel.open reuses the number. Small on purpose
    (two slots, not a whole Channel): a client may close tens of thousands of channels.
    """

    __slots__ = ("conn", "id")
    state = CLOSED

    def __init__(self, conn: Connection, channel_id: int) -> None:
        self.conn = conn
        self.id = channel_id

    def _reopen(self, m: spec.ChannelOpen) -> None:
        self.conn._open_channel(self.id, m)


#: Each channel state's row, bound: a Channel's are OPEN and CLOSING, CLOSED is its tombstone's.
_ROWS = {
    **bind_rows({s: CHANNEL_RULES[s] for s in (OPEN, CLOSING)}, Channel, "channel"),
    **bind_rows({CLOSED: CHANNEL_RULES[CLOSED]}, ClosedChannel, "channel"),
}
ClosedChannel._row = _ROWS[CLOSED]  # type: ignore[attr-defined]  # a native class's row, set once its rows exist

#: The methods whose durable change may stop at its definitions write and be handled again
#: once the write is done off the event loop (broker/core/persistence.py, `deferrable`).
DEFERRABLE = (
    spec.ExchangeDeclare,
    spec.ExchangeDelete,
    spec.ExchangeBind,
    spec.ExchangeUnbind,
    spec.QueueDeclare,
    spec.QueueBind,
    spec.QueueUnbind,
    spec.QueueDelete,
)


def _deferrable(handler: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    @wraps(handler)
    def handle(channel: Any, method: Any) -> None:
        with channel.vhost.broker.persistence.deferrable:
            handler(channel, method)

    return handle


for _method in DEFERRABLE:
    _ROWS[OPEN][_method] = _deferrable(_ROWS[OPEN][_method])

__all__ = ["Channel", "ClosedChannel", "Consumer", "REPLY_SUCCESS"]
