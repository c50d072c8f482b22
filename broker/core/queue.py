"""A queue: its ready messages, its consumers, and the rules that move one to the other.

Each queue owns its messages outright (a deque, or one deque per priority) and
dispatches synchronously: a publish that finds a consumer with credit is
written out at once, with no task or future per message. Expiry, max-length
and dead-lettering happen here because only the queue knows its order.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from roarmq.protocol.properties import with_long_header

from ..store.segments import LogFailed
from . import queue_arguments, trace
from .policy import Policy, effective_definition
from .ready import INLINE_MAX, Cleared, FifoReady, PriorityReady

if TYPE_CHECKING:
    from collections.abc import Collection

    from ..amqp.channel import Consumer
    from ..ops.clock import TimerHandle
    from ..store.messages import MessageStore, Returned
    from .message import Message
    from .vhost import VirtualHost

#: Seconds between tries of at-least-once dead-lettering that found no exchange, no route
#: or a target that did not take the message.
DEAD_LETTER_RETRY = 1.0

#: The longest delayed retry (ms): RabbitMQ's timers take at most 2^32-1 ms.
MAX_RETRY_DELAY_MS = (1 << 32) - 1

#: Most messages one dispatch pass hands out before yielding to the loop, so one
#: queue with a deep backlog cannot starve the others.
DISPATCH_BATCH = 2000

#: A queue with consumers that still has more than FLOW_HIGH ready messages after
#: dispatching -- every consumer is at its prefetch limit -- stops reading the
#: connections that publish to it until it is back under FLOW_LOW: RabbitMQ's credit
#: flow / "flow" state. It keeps latency bounded and leaves the consumers CPU to catch
#: up, where plain buffering would only grow the backlog (and, past a few thousand
#: messages, pack and unpack them: bench/throughput.py persistent-w1000 went from 42k
#: to 58k msg/s and 71 to 15 ms p50 when 4,000/1,000 became 200/50, docs/benchmarks.md).
#: When a consumer does not take deliveries at all (its socket is full, or it sent
#: channel.flow off) the backlog may never drain on its own, and holding the publishers
#: would stall everything else they publish: then only past FLOW_HIGH_UNREAD. The test
#: is a length per publish; consumers are looked at only past FLOW_HIGH, not in flow.
FLOW_HIGH = 200
FLOW_LOW = 50
FLOW_HIGH_UNREAD = 4000


def enqueue(
    msg: Message, queues: Collection[Queue], confirming: bool = False
) -> tuple[bool, int | None]:
    """Hand a routed message to its queues, persisting it first when it must survive.

    Returns (accepted by every queue, store token to wait for before confirming).
    While the message store is failed (LogFailed) a publisher that asked for confirms
    gets (False, None) and the message goes nowhere: it is nacked, "not taken". Without
    confirms nothing was promised, so the message is queued in memory only.
    (`VirtualHost.enqueue` is this function; the channel calls it directly, C to C.)
    """
    token = None
    if msg.persistent:
        try:
            token = _persist(msg, queues)
        except LogFailed:
            if confirming:
                return False, None
    ok = True
    for queue in queues:
        if not queue.publish(msg):
            ok = False
            if queue.store is not None and msg.store_id is not None:
                queue.unstore(msg.store_id, msg.size)
    return ok, token


def _persist(msg: Message, queues: Collection[Queue]) -> int | None:
    """Write a persistent message to its durable queues' store: the token its confirm waits
    for (None: no durable queue took it). LogFailed is counted on the store and raised."""
    durable = [q for q in queues if q.store is not None]
    if not durable:
        return None
    store = durable[0].store  # the node's store, or a clustered vhost's own
    # The body may leave memory only if every holder can read it back: a transient queue
    # beside the durable ones cannot once they let go.
    page_out = len(durable) == len(queues) and any(q.ready_bytes > q.memory_limit for q in durable)
    try:
        token = store.persist(msg, durable, page_out)  # type: ignore[union-attr]  # durable: set
    except LogFailed:
        store.refused += 1  # type: ignore[union-attr]  # (as above)
        raise
    for queue in durable:
        queue.stored(msg.size)
    return token


class Entry:
    """One message's place in one queue: the per-queue state of a shared Message."""

    __slots__ = (
        "msg",
        "seq",
        "redelivered",
        "expires_at",
        "queue",
        "consumer",
        "delivery_count",
        "marked",
    )

    def __init__(self, msg: Message, seq: int, queue: Queue) -> None:
        self.msg = msg
        self.seq = seq
        self.queue = queue
        self.redelivered = False
        self.expires_at: float | None = None
        self.consumer: Consumer | None = None
        self.delivery_count = 0
        self.marked = False  # a delivered marker is in the message store


def delivery_header(entry: Entry) -> bytes:
    """The raw content header a delivery of `entry` carries: the publisher's, and from a
    quorum queue (`counts_deliveries`) with `x-delivery-count`, a long, on every delivery
    (0 on the first; in place of a publisher's own), as RabbitMQ 3.10.8's."""
    raw = entry.msg.header.raw
    queue = entry.queue  # None: a direct reply-to delivery
    if queue is not None and queue.counts_deliveries:
        return with_long_header(raw, "x-delivery-count", entry.delivery_count)
    return raw


class _ConsumerGroup:
    """Consumers of equal x-priority, served round-robin."""

    __slots__ = ("priority", "members", "rr")

    def __init__(self, priority: int) -> None:
        self.priority = priority
        self.members: list[Consumer] = []
        self.rr = 0


class Queue:
    __slots__ = (
        "vhost",
        "name",
        "durable",
        "exclusive_owner",
        "auto_delete",
        "arguments",
        "queue_type",
        "message_ttl",
        "expires",
        "max_length",
        "max_length_bytes",
        "overflow",
        "dlx",
        "dlrk",
        "max_priority",
        "single_active",
        "delivery_limit",
        "retry_type",
        "retry_min",
        "retry_max",
        "_retrying",
        "_retry_timer",
        "dlx_strategy",
        "_dead_held",
        "_dead_timer",
        "consumer_timeout",
        "ready",
        "ready_bytes",
        "unacked",
        "unacked_bytes",
        "_groups",
        "_only",
        "consumer_count",
        "_seq",
        "_expiry_timer",
        "_expiry_at",
        "_timed",
        "_idle_timer",
        "_had_consumers",
        "_dispatch_scheduled",
        "deleted",
        "stats_published",
        "stats_delivered",
        "stats_acked",
        "stats_dead_lettered",
        "stats_get",
        "stats_get_no_ack",
        "stats_get_empty",
        "stats_redelivered",
        "stats_no_ack",
        "persistent",
        "persistent_bytes",
        "store",
        "store_id",
        "counts_deliveries",
        "memory_limit",
        "_account",
        "_reject_overflow",
        "_limited",
        "throttled",
        "_args",
        "policy",
        "operator_policy",
        "effective_policy",
        "_saturated",
        "_blocked_at",
        "blocked_seconds",
    )

    # What the argument table sets (queue_arguments.QUEUE_ATTRS, by `_settle`), typed for
    # the checker: the rows decide the values.
    expires: int | None
    message_ttl: int | None
    dlx: str | None
    dlrk: str | None
    max_length: int | None
    max_length_bytes: int | None
    max_priority: int | None
    overflow: str
    single_active: bool
    delivery_limit: int | None
    retry_type: str
    retry_min: int | None
    retry_max: int | None
    dlx_strategy: str

    def __init__(
        self,
        vhost: VirtualHost,
        name: str,
        *,
        durable: bool = False,
        exclusive_owner: Any = None,
        auto_delete: bool = False,
        arguments: dict | None = None,
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = dict(arguments or {})
        # The x-arguments checked (406 on a bad one) by broker/core/queue_arguments.py's table.
        self._args = queue_arguments.parse(
            self.arguments, name, vhost.name, durable, exclusive_owner, auto_delete
        )
        self.queue_type = self._args["queue-type"]
        #: A quorum queue counts each message's deliveries, and every delivery of it says
        #: how many came before (`x-delivery-count`), as RabbitMQ 3.10.8's do.
        self.counts_deliveries = self.queue_type == "quorum"
        self.policy, self.operator_policy = vhost.policies_for("queue", name, self.queue_type)
        self._settle()
        self.ready: FifoReady | PriorityReady = (
            PriorityReady(self.max_priority, Entry, self)
            if self.max_priority
            else FifoReady(Entry, self)
        )
        self.ready_bytes = 0
        self.unacked = 0
        self.unacked_bytes = 0  # body bytes of the unacknowledged ones
        self._groups: list[_ConsumerGroup] = []
        # The queue's one consumer while it has exactly one, else None: a message's hand-out
        # then reads one pointer, not the group list, a group and its member list (each a
        # cache miss when a message meets one of 100,000 queues; see _next_consumer).
        self._only: Consumer | None = None
        self.consumer_count = 0
        self._seq = 0
        self._expiry_timer: TimerHandle | None = None
        self._expiry_at: float | None = None
        self._timed = 0
        #: Returned messages waiting out their delayed retry: (ready again at, seq, entry),
        #: a heap; and the timer for its first.
        self._retrying: list[tuple[float, int, Entry]] = []
        self._retry_timer: TimerHandle | None = None
        #: At-least-once dead-lettering: the messages whose targets have not all taken
        #: them yet, each [entry, reason, the copy (None: not routed yet), the targets
        #: still to take it], in the order they were dead-lettered; and the retry's timer.
        self._dead_held: list[list[Any]] = []
        self._dead_timer: TimerHandle | None = None
        self._idle_timer: TimerHandle | None = None
        self._had_consumers = False
        self._dispatch_scheduled = False
        self.deleted = False
        self.stats_published = 0
        self.stats_delivered = 0
        self.stats_acked = 0
        self.stats_dead_lettered = 0
        self.stats_get = 0  # basic.get answered, by ack mode, and found empty (the API's
        self.stats_get_no_ack = 0  # message_stats; never counted per consumer delivery)
        self.stats_get_empty = 0
        self.stats_redelivered = 0  # deliveries (and gets) flagged redelivered
        self.stats_no_ack = 0  # deliveries and gets settled as they were sent (no-ack)
        # Messages held in the message store for this queue, and their body bytes
        # (RabbitMQ's messages_persistent: persistent messages of a durable queue).
        self.persistent = 0
        self.persistent_bytes = 0
        self.store: MessageStore | None = None
        self.store_id: int | None = None  # row id of a durable queue in the definitions store
        self._account = vhost.broker.account_bytes
        self.throttled: set | None = None  # publisher connections paused for this queue
        # No consumer had credit at the last dispatch: a publish need not look again
        # (O(1), not O(consumers)); any explicit dispatch() -- an ack, a new consumer,
        # a socket drained, qos -- looks again.
        self._saturated = False
        # Time with messages ready that no consumer had credit for (consumer_utilisation), on
        # the clock's `precise` scale; read only at those transitions, never per message.
        self._blocked_at = 0.0
        self.blocked_seconds = 0.0
        self.touch()

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} vhost={self.vhost.name!r} ready={self.ready.n}>"

    @property
    def description(self) -> str:
        return f"queue '{self.name}' in vhost '{self.vhost.name}'"

    # -- publishing ---------------------------------------------------------------

    def publish(self, msg: Message) -> bool:
        """Accept a routed message; False when x-overflow refuses it (reject-publish)."""
        if self.deleted:
            return True
        if self._reject_overflow and self._would_overflow(msg.size):
            if self.overflow == "reject-publish-dlx":
                self._dead_letter_message(msg, "maxlen")
            return False
        self._seq += 1
        entry = Entry(msg, self._seq, self)
        self.stats_published += 1
        ttl = self.message_ttl
        if msg.expiration_ms is not None and (ttl is None or msg.expiration_ms < ttl):
            ttl = msg.expiration_ms
        # Fast path: nothing waiting and a consumer with credit takes it at once.
        if self.consumer_count and not self.ready.n:
            consumer = self._next_consumer()
            if consumer is not None:
                if self.vhost.tracing:
                    trace.delivered(consumer.channel, entry)
                consumer.channel.deliver(consumer, entry)
                self.stats_delivered += 1
                return True
        if ttl is not None:
            if ttl == 0:
                # RabbitMQ: a zero TTL message that no consumer can take right now expires.
                self._expire_entry(entry)
                return True
            entry.expires_at = self.vhost.clock.monotonic() + ttl / 1000.0
        self.ready.push(entry)
        self.ready_bytes += msg.size
        if msg.body is not None:  # a paged-out body costs no memory
            self._account(msg.size)
        if entry.expires_at is not None:
            self._timed += 1
            if self._expiry_timer is None:
                self._schedule_expiry()
        if self._limited:
            self._enforce_max_length()
        if self.consumer_count and self.ready.n:
            if not self._saturated:
                self.dispatch()
            if (
                self.throttled is None
                and self.ready.n > FLOW_HIGH
                and (self.ready.n > FLOW_HIGH_UNREAD or self._consumers_take())
            ):
                self.throttled = set()  # the publishing channel adds its connection
        return True

    def hold_publisher(self, conn: Any) -> None:
        """In flow state, a connection published to us: stop reading it until we drain."""
        throttled = self.throttled
        if throttled is not None and conn not in throttled:
            throttled.add(conn)
            conn.flow.hold_for_queue(self)

    def forget_publisher(self, conn: Any) -> None:
        """A connection we hold went away."""
        if self.throttled is not None:
            self.throttled.discard(conn)

    def release_publishers(self) -> None:
        """Leave the flow state: resume reading the publishers we paused."""
        paused, self.throttled = self.throttled, None
        for conn in paused or ():
            conn.flow.release_for_queue(self)

    def lend(self, size: int) -> None:
        """A delivery of `size` body bytes is unacked on a channel; counted until it is back."""
        self.unacked += 1
        self.unacked_bytes += size

    def take_back(self, count: int, size: int) -> None:
        """Unacked deliveries came back: acked, rejected, requeued, or their channel went."""
        self.unacked -= count
        self.unacked_bytes -= size

    def _would_overflow(self, size: int) -> bool:
        if self.max_length is not None and self.ready.n >= self.max_length:
            return True
        return self.max_length_bytes is not None and self.ready_bytes + size > self.max_length_bytes

    # -- settings: x-arguments and policies ------------------------------------------

    def _settle(self) -> None:
        """The settings in force: x-arguments combined with the policies, each by its row's
        rule (broker/core/queue_arguments.py); the rows with an `attr` land in that attribute."""
        policy = effective_definition(self.policy, self.operator_policy)
        self.effective_policy = policy
        values = queue_arguments.settings(self._args, policy, self.queue_type)
        for name, attr in queue_arguments.QUEUE_ATTRS:
            setattr(self, attr, values[name])
        timeout = values["consumer-timeout"]
        if timeout is None:
            timeout = self.vhost.broker.config.limits.consumer_timeout_ms
        # Seconds a delivery from this queue may stay unacknowledged (None: forever).
        self.consumer_timeout: float | None = timeout / 1000.0 if timeout else None
        self._reject_overflow = self.overflow != "drop-head"
        # queue-mode "lazy" (RabbitMQ: keep messages on disk as early as possible): the
        # persistent messages of a durable queue are paged out once any are queued.
        lazy = values["queue-mode"] == "lazy"
        self.memory_limit = 0 if lazy else self.vhost.broker.config.storage.queue_memory_limit
        self._limited = self.max_length is not None or self.max_length_bytes is not None

    def apply_policy(self, policy: Policy | None, operator: Policy | None) -> None:
        """A policy changed: new limits hold at once (drop-head trims now), a new expiry
        restarts the countdown; TTLs apply to messages published from now on."""
        if policy is self.policy and operator is self.operator_policy:
            return
        self.policy, self.operator_policy = policy, operator
        expires = self.expires
        self._settle()
        if self._limited and not self._reject_overflow:
            self._enforce_max_length()
        if self.expires != expires:
            self._cancel_idle_timer()
            self.touch()

    def _enforce_max_length(self) -> None:
        while self.ready.n and (
            (self.max_length is not None and self.ready.n > self.max_length)
            or (self.max_length_bytes is not None and self.ready_bytes > self.max_length_bytes)
        ):
            entry = self._take()
            self._dead_letter_entry(entry, "maxlen")

    # -- consumers ----------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        group = next((g for g in self._groups if g.priority == consumer.priority), None)
        if group is None:
            group = _ConsumerGroup(consumer.priority)
            self._groups.append(group)
            self._groups.sort(key=lambda g: -g.priority)
        group.members.append(consumer)
        self.consumer_count += 1
        self._only = consumer if self.consumer_count == 1 else None
        self._had_consumers = True
        self._cancel_idle_timer()
        self.dispatch()

    def remove_consumer(self, consumer: Consumer) -> None:
        for group in self._groups:
            if consumer in group.members:
                group.members.remove(consumer)
                if not group.members:
                    self._groups.remove(group)
                elif group.rr >= len(group.members):
                    group.rr = 0
                self.consumer_count -= 1
                self._only = self._groups[0].members[0] if self.consumer_count == 1 else None
                break
        else:
            return
        if self.consumer_count == 0:
            if self.throttled is not None:
                self.release_publishers()
            if self.auto_delete and self._had_consumers and not self.deleted:
                self.vhost.delete_queue_by_server(self, "auto_delete")
                return
            self.touch()
        elif self.single_active:
            self.dispatch()

    def consumers(self) -> list[Consumer]:
        return [c for g in self._groups for c in g.members]

    def active_consumer(self) -> Consumer | None:
        """Single active consumer: the first registered among the highest priority."""
        for group in self._groups:
            if group.members:
                return group.members[0]
        return None

    def has_exclusive_consumer(self) -> bool:
        return any(c.exclusive for g in self._groups for c in g.members)

    def _next_consumer(self) -> Consumer | None:
        only = self._only
        if only is not None:  # one consumer, single active or not: it or nobody
            return only if only.has_credit() else None
        if self.single_active:
            consumer = self.active_consumer()
            return consumer if consumer is not None and consumer.has_credit() else None
        for group in self._groups:
            members = group.members
            n = len(members)
            if n == 1:  # the common case: skip the round-robin arithmetic
                consumer = members[0]
                if consumer.has_credit():
                    return consumer
                continue
            start = group.rr
            for k in range(n):
                idx = (start + k) % n
                consumer = members[idx]
                if consumer.has_credit():
                    group.rr = (idx + 1) % n
                    return consumer
        return None

    def dispatch(self) -> None:
        """Hand ready messages to consumers with credit, in order, up to one batch."""
        ready = self.ready
        if not ready.n or not self.consumer_count or self.deleted:
            if self._saturated:
                self._unblock()
            return
        now = self.vhost.clock.monotonic() if self._timed else None
        tracing = self.vhost.tracing  # the firehose: read once a batch
        delivered = 0
        if self._saturated:
            self._unblock()
        while ready.n:
            consumer = self._next_consumer()
            if consumer is None:
                self._saturated = True
                self._blocked_at = self.vhost.clock.precise()
                break
            entry = self._take()
            if now is not None and entry.expires_at is not None and entry.expires_at <= now:
                self._expire_entry(entry)
                continue
            if tracing:
                trace.delivered(consumer.channel, entry)
            consumer.channel.deliver(consumer, entry)
            delivered += 1
            if delivered >= DISPATCH_BATCH:
                self._schedule_dispatch()
                break
        self.stats_delivered += delivered
        if self.throttled is not None and ready.n < FLOW_LOW:
            self.release_publishers()

    def _consumers_take(self) -> bool:
        """Every consumer takes deliveries (none has a full socket or channel.flow off):
        what holds them is their prefetch, which their acks open again."""
        return all(c.channel.can_deliver for g in self._groups for c in g.members)

    def _unblock(self) -> None:
        self._saturated = False
        self.blocked_seconds += self.vhost.clock.precise() - self._blocked_at

    @property
    def consumers_blocked(self) -> bool:
        """Messages are ready and no consumer has credit for them."""
        return self._saturated

    def blocked_time(self, now: float) -> float:
        """Seconds so far that ready messages waited for consumer credit."""
        if self._saturated:
            return self.blocked_seconds + now - self._blocked_at
        return self.blocked_seconds

    def _schedule_dispatch(self) -> None:
        if not self._dispatch_scheduled:
            self._dispatch_scheduled = True
            self.vhost.clock.loop.call_soon(self._scheduled_dispatch)

    def _scheduled_dispatch(self) -> None:
        self._dispatch_scheduled = False
        self.dispatch()

    # -- basic.get, ack, reject, requeue -------------------------------------------

    def _take(self) -> Entry:
        entry = self.ready.pop()
        msg = entry.msg
        self.ready_bytes -= msg.size
        if msg.body is not None:
            self._account(-msg.size)
        if self._timed and entry.expires_at is not None:
            self._timed -= 1
            if self._timed and self._expiry_timer is None:
                self._schedule_expiry()
        return entry

    def get(self) -> Entry | None:
        """basic.get: the next live message, or None."""
        self.touch()
        now = self.vhost.clock.monotonic()
        while self.ready.n:
            entry = self._take()
            if entry.expires_at is not None and entry.expires_at <= now:
                self._expire_entry(entry)
                continue
            self.stats_delivered += 1
            return entry
        return None

    def ack(self, entry: Entry) -> None:
        """A consumer acknowledged the message (RabbitMQ's `ack` counts only these)."""
        self.stats_acked += 1
        self.settle(entry)

    def settle(self, entry: Entry) -> None:
        """The message is done with (acked, delivered with no-ack, dropped or dead-lettered)."""
        msg = entry.msg
        if msg.store_id is not None and self.store is not None:
            self.unstore(msg.store_id, msg.size)

    def stored(self, size: int) -> None:
        """The message store now holds a message of `size` body bytes for this queue."""
        self.persistent += 1
        self.persistent_bytes += size

    def unstore(self, store_id: int, size: int) -> None:
        """This queue is done with a stored message: the store may drop its record."""
        self.persistent -= 1
        self.persistent_bytes -= size
        self.store.settled(self, store_id)  # type: ignore[union-attr]  # a stored message's queue has a store

    def restore_stored(
        self,
        msg_id: int,
        size: int,
        priority: int,
        expiration_ms: int | None,
        redelivered: bool,
        entered_ms: int | None = None,
        returned: Returned | None = None,
    ) -> None:
        """A recovered message (in publish order), queued as its bare id: nothing is read.
        Its TTL counts from when it entered its queues (`entered_ms`, ms since the epoch,
        as its record says), as RabbitMQ's does: what expired while the broker was down
        expires as soon as recovery is over. A record that says nothing (a TTL set on the
        queue since) counts from now. `returned`: what its latest returned record says, the
        delivery count it keeps, and a delayed retry's ready time: one still ahead holds
        it until then (read now: a held message is an object, as it was before)."""
        self._seq += 1
        ttl = self.message_ttl
        if expiration_ms is not None and (ttl is None or expiration_ms < ttl):
            ttl = expiration_ms
        expires_at = None
        if ttl is not None:
            clock = self.vhost.clock
            left = ttl / 1000.0
            if entered_ms is not None:
                left += entered_ms / 1000.0 - clock.wall()
            expires_at = clock.monotonic() + left
        count = 0
        if returned is not None:
            count = returned.count
            redelivered = True
            if returned.ready_at_ms and self._restore_held(
                msg_id, priority, expires_at, count, returned.ready_at_ms
            ):
                self.stored(size)
                return
        if expires_at is not None:
            self._timed += 1
        self.ready.push_stored(self._seq, msg_id, priority, expires_at, redelivered, count)
        self.ready_bytes += size  # bodies are on disk: nothing to account as memory
        self.stored(size)

    def _restore_held(
        self, msg_id: int, priority: int, expires_at: float | None, count: int, ready_at_ms: int
    ) -> bool:
        """A recovered message a delayed retry still holds: back in `_retrying` until its
        ready time (none if the queue's retry is off now, or the time has passed)."""
        clock = self.vhost.clock
        left = ready_at_ms / 1000.0 - clock.wall()
        if left <= 0 or self.retry_type == "disabled" or self.retry_min is None:
            return False
        try:
            msg = self.store.load(msg_id, INLINE_MAX)  # type: ignore[union-attr]  # stored: a durable queue's
        except Exception:  # unreadable now: the ready path reads it again and logs it
            return False
        msg.priority = priority
        entry = Entry(msg, self._seq, self)
        entry.redelivered = True
        entry.marked = True
        entry.delivery_count = count
        entry.expires_at = expires_at
        heapq.heappush(self._retrying, (clock.monotonic() + left, entry.seq, entry))
        return True

    def restored(self) -> None:
        """Recovery is over: load the first messages and start the expiry timer."""
        self.ready.fill()
        if self._timed:
            self._schedule_expiry()
        if self._retrying:
            self._arm_retry()

    def reject(self, entry: Entry, requeue: bool) -> None:
        if self.deleted:
            return
        if requeue:
            self.requeue([entry])
        else:
            self._dead_letter_entry(entry, "rejected")

    def requeue(self, entries: list[Entry], failed: bool = True) -> None:
        """Put unacked messages back where they were, marked redelivered. `failed`: the
        delivery failed (basic.reject, its channel or connection gone) rather than was
        handed back (basic.nack, basic.recover), which decides whether a quorum queue's
        delayed retry (`retry_type`, RabbitMQ 4.3's) holds them first."""
        if self.deleted or not entries:
            return
        keep = []
        retrying = self.retry_type != "disabled" and self.retry_min is not None
        kind = self.retry_type
        hold = retrying and (kind == "all" or (kind == "failed") == failed)
        # A quorum queue counts deliveries: 4.3's count, with its delayed retry, only
        # failed ones (a nack is free); 3.10.8's, without, every return.
        counts = self.counts_deliveries and (failed or not retrying)
        stored = self.store  # a durable queue's: its returned records
        now_ms = math.ceil(self.vhost.clock.wall() * 1000) if hold and stored is not None else 0
        for entry in entries:
            entry.redelivered = True
            entry.consumer = None
            if counts:
                entry.delivery_count += 1
                limit = self.delivery_limit
                if limit is not None and entry.delivery_count > limit:
                    self._dead_letter_entry(entry, "delivery_limit")
                    continue
            keep.append(entry)
            if (counts or hold) and stored is not None and entry.msg.store_id is not None:
                ready_at_ms = now_ms + self._retry_delay(entry) if hold else 0
                stored.returned(self, entry.msg.store_id, entry.delivery_count, ready_at_ms)
        if not keep:
            return
        if hold:
            self._hold_for_retry(keep)
        else:
            self._back_to_ready(keep)

    def _retry_delay(self, entry: Entry) -> int:
        """Delayed retry: min(retry_min x its delivery count, retry_max) ms (RabbitMQ
        4.3's linear back-off; at most 2^32-1 ms)."""
        cap = self.retry_max if self.retry_max is not None else MAX_RETRY_DELAY_MS
        return min((self.retry_min or 0) * max(1, entry.delivery_count), cap, MAX_RETRY_DELAY_MS)

    def _hold_for_retry(self, entries: list[Entry]) -> None:
        """Each waits out its delayed retry, then is ready again where it was. Meanwhile
        it is neither ready nor unacked (RabbitMQ's "delayed"). A durable queue's stored
        message has its returned record (with when it is ready again) in the store, so
        the wait survives a restart or a failover (`restore_stored`)."""
        now = self.vhost.clock.monotonic()
        for entry in entries:
            due = now + self._retry_delay(entry) / 1000.0
            heapq.heappush(self._retrying, (due, entry.seq, entry))
        self._arm_retry()

    def _arm_retry(self) -> None:
        if self._retry_timer is not None:
            self._retry_timer.cancel()
            self._retry_timer = None
        if self._retrying:
            due = self._retrying[0][0]
            self._retry_timer = self.vhost.clock.call_at(due, self._on_retry_timer)

    def _on_retry_timer(self) -> None:
        self._retry_timer = None
        if self.deleted:
            return
        now = self.vhost.clock.monotonic()
        due: list[Entry] = []
        while self._retrying and self._retrying[0][0] <= now:
            due.append(heapq.heappop(self._retrying)[2])
        if due:
            self._back_to_ready(due)  # where they were: by publish order
        self._arm_retry()

    def retrying(self) -> int:
        """Messages waiting out a delayed retry (the API's `messages_delayed`)."""
        return len(self._retrying)

    def _back_to_ready(self, keep: list[Entry]) -> None:
        self.ready.requeue(keep)
        self.ready_bytes += sum(e.msg.size for e in keep)
        self._account(sum(e.msg.size for e in keep if e.msg.body is not None))
        timed = sum(1 for e in keep if e.expires_at is not None)
        if timed:
            self._timed += timed
            self._schedule_expiry()
        if self.consumer_count:
            self.dispatch()

    def purge(self) -> int:
        if self.throttled is not None:
            self.release_publishers()
        ready_bytes = self.ready_bytes
        cleared = self.ready.clear()
        self._timed = 0
        self.ready_bytes = 0
        self._forget(cleared, ready_bytes)
        for entry in cleared.entries:
            self.settle(entry)
        held = self._drop_retrying()
        for entry in held:
            self.settle(entry)
        return len(cleared) + len(held)

    def _forget(self, cleared: Cleared, ready_bytes: int) -> None:
        """Account for a cleared ready list of `ready_bytes`: packed messages are settled by
        counting, packed stored ones by id (their sizes are what the rest does not explain)."""
        in_memory = sum(e.msg.size for e in cleared.entries if e.msg.body is not None)
        self._account(-(in_memory + cleared.packed_bytes))
        if cleared.stored and self.store is not None:
            unpacked = sum(e.msg.size for e in cleared.entries)
            self.persistent -= len(cleared.stored)
            self.persistent_bytes -= ready_bytes - unpacked - cleared.packed_bytes
            settled = self.store.settled
            for msg_id in cleared.stored:
                settled(self, msg_id)

    # -- expiry and dead-lettering ------------------------------------------------

    def _schedule_expiry(self) -> None:
        """Arm the timer for the head's deadline.

        Only the head expires, as in RabbitMQ: a timed message behind an untimed
        one waits until it reaches the head (`_popped` re-arms the timer then).
        """
        head = self.ready.peek()
        if head is None or head.expires_at is None:
            return
        deadline = head.expires_at
        if self._expiry_timer is not None:
            if self._expiry_at is not None and self._expiry_at <= deadline:
                return
            self._expiry_timer.cancel()
        self._expiry_at = deadline
        self._expiry_timer = self.vhost.clock.call_at(deadline, self._on_expiry_timer)

    def _on_expiry_timer(self) -> None:
        self._expiry_timer = None
        self._expiry_at = None
        if self.deleted:
            return
        self.expire_due()

    def expire_due(self) -> int:
        """Drop (or dead-letter) expired messages at the head; schedule the next check."""
        now = self.vhost.clock.monotonic()
        expired = 0
        while True:
            head = self.ready.peek()
            if head is None or head.expires_at is None or head.expires_at > now:
                break
            if expired >= DISPATCH_BATCH:  # a million due at once: in slices, not one stall
                self._expiry_at = now
                self._expiry_timer = self.vhost.clock.call_at(now, self._on_expiry_timer)
                return expired
            self._take()
            self._expire_entry(head)
            expired += 1
        self._schedule_expiry()
        return expired

    def _expire_entry(self, entry: Entry) -> None:
        self._dead_letter_entry(entry, "expired")

    def _dead_letter_entry(self, entry: Entry, reason: str) -> None:
        if self.dlx is not None and self.dlx_strategy == "at-least-once":
            if self.overflow == "reject-publish":  # as RabbitMQ, which needs it
                self._dead_held.append([entry, reason, None, None])
                self._deliver_dead_held()
                return
        # Republish first: settling may release a paged-out body the copy still needs.
        self._dead_letter_message(entry.msg, reason)
        self.settle(entry)

    def _deliver_dead_held(self) -> None:
        """At-least-once dead-lettering (RabbitMQ's quorum queues): a dead-lettered message
        leaves this queue only once every queue its DLX routes it to has taken it; until
        then (no such exchange, no route, a full target that rejects publishes, a failed
        store) it is kept here, neither ready nor unacked, and tried again every
        DEAD_LETTER_RETRY seconds, routed anew while it has reached none. Its copy's
        publish record precedes this queue's ack in the log, so a crash in between
        delivers it twice at worst, never loses it."""
        vhost = self.vhost
        kept = []
        # Taken out while they are tried: one dead-lettered meanwhile (a target's own
        # dead-lettering reaching back here) joins after them, not lost by the overwrite.
        pending, self._dead_held = self._dead_held, []
        for held in pending:
            entry, reason, dead, targets = held
            if dead is None or not targets:
                routed = vhost.dead_letter_copy(self, entry.msg, reason)
                if routed is None or not routed[1]:
                    kept.append(held)
                    continue
                dead, targets = routed
            refused = vhost.dead_letter_to(dead, targets)
            if refused:
                held[2], held[3] = dead, refused
                kept.append(held)
                continue
            self.stats_dead_lettered += 1
            self.settle(entry)
        self._dead_held[:0] = kept
        if self._dead_held and self._dead_timer is None and not self.deleted:
            self._dead_timer = vhost.clock.call_later(DEAD_LETTER_RETRY, self._retry_dead)

    def _retry_dead(self) -> None:
        self._dead_timer = None
        if not self.deleted:
            self._deliver_dead_held()

    def dead_lettering(self) -> int:
        """Messages dead-lettered at least once whose targets have not all taken them (the
        API's `messages_dlx`)."""
        return len(self._dead_held)

    def _dead_letter_message(self, msg: Message, reason: str) -> None:
        if self.dlx is None:
            return
        self.stats_dead_lettered += 1
        self.vhost.dead_letter(self, msg, reason)

    # -- x-expires ------------------------------------------------------------------

    def touch(self) -> None:
        """The queue was used: restart its x-expires countdown (if it has no consumers)."""
        if self.expires is None or self.consumer_count or self.deleted:
            return
        self._cancel_idle_timer()
        self._idle_timer = self.vhost.clock.call_later(self.expires / 1000.0, self._on_idle)

    def _cancel_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _on_idle(self) -> None:
        self._idle_timer = None
        if not self.deleted and not self.consumer_count:
            self.vhost.delete_queue_by_server(self, "expired")

    def on_deleted(self) -> list[Entry]:
        """Called by the vhost once the queue is gone: stop timers, hand back ready entries."""
        self.deleted = True
        if self.throttled is not None:
            self.release_publishers()
        self._cancel_idle_timer()
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
        ready_bytes = self.ready_bytes
        cleared = self.ready.clear()
        self._timed = 0
        self._forget(cleared, ready_bytes)
        self.ready_bytes = 0
        self._groups.clear()
        self._only = None
        self.consumer_count = 0
        return cleared.entries + self._drop_retrying() + self._drop_dead_held()

    def _drop_retrying(self) -> list[Entry]:
        """The messages waiting out a delayed retry, taken out (purge, delete)."""
        if self._retry_timer is not None:
            self._retry_timer.cancel()
            self._retry_timer = None
        held = [item[2] for item in self._retrying]
        self._retrying = []
        return held

    def _drop_dead_held(self) -> list[Entry]:
        """The messages at-least-once dead-lettering still holds, taken out (delete)."""
        if self._dead_timer is not None:
            self._dead_timer.cancel()
            self._dead_timer = None
        held = [item[0] for item in self._dead_held]
        self._dead_held = []
        return held

    def message_count(self) -> int:
        return self.ready.n

    def iter_ready(self) -> Iterable[Entry]:
        return iter(self.ready)
