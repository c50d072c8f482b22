"""A delayed exchange's schedule: the messages it holds until they are due.

An `x-delayed-message` exchange's index (broker/routing/delayed.py) sends every message
whose `x-delay` asks for a delay to one destination, the exchange's `Schedule`, through
the same `enqueue` as any queue (so a publisher's confirm, tracing and the archive see
it as routed). The schedule keeps it in due order (equal due times in publish order) and,
once its time has come and not before, routes it through the exchange's own rules: the
underlying type's index, exchange-to-exchange bindings and the alternate exchange, as
the plugin's `rabbit_delayed_message:route` does. The message leaves with `x-delay`
set to minus its delay, as the plugin leaves it, which also keeps it from being delayed
again by a delayed exchange further along.
"""

from __future__ import annotations

import bisect
import heapq
import logging
import math
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roarmq.protocol.errors import PRECONDITION_FAILED
from roarmq.protocol.tables import Int64

from ..errors import channel_error
from ..routing.delayed import DELAY_HEADER, DelayedIndex, delay_of
from ..store.due_index import DueIndex
from ..store.segments import SegmentLogError
from .message import Message, copy_properties
from .queue import Queue

if TYPE_CHECKING:
    from ..store.messages import MessageStore, Returned
    from .exchange import Exchange

log = logging.getLogger("roarmq.delayed")

#: Upper bounds (seconds) of the lateness histogram: how long past its due time a message
#: was routed (`roarmq_delayed_lateness_seconds`).
LATENESS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0)

#: Due messages routed per loop turn; the rest go on the next turn, so a crowd due at the
#: same millisecond never holds the loop (as queue expiry's budget).
ROUTE_BUDGET = 2000


class _NeverHeld(set):
    """The schedule's `throttled`: a channel that sees it answers a mandatory publish with
    basic.return (NO_ROUTE) instead of holding its publisher, as the plugin does (its
    route finds no queue at publish time: it cannot know what will be bound when the
    message is due). Its own class, so no other empty set is ever taken for it."""


SCHEDULED = _NeverHeld()


def now_ms(exchange: Exchange) -> float:
    return exchange.vhost.clock.wall() * 1000.0


#: Schedules' ids in the message store have the top bit set; durable queues' ids (rows of
#: the definitions store, or a clustered vhost's counter) never reach it.
SCHEDULE_ID_BIT = 1 << 31


def schedule_store_id(vhost: str, exchange: str) -> int:
    """The id a durable delayed exchange's schedule has in the message store: derived from
    its names, so it is the same after a restart, on every cluster node and after a
    definitions import, with nothing more to store."""
    key = f"{vhost}\x00{exchange}".encode("utf-8", "surrogateescape")
    return SCHEDULE_ID_BIT | (zlib.crc32(key) & (SCHEDULE_ID_BIT - 1))


def _unshared_store_id(exchange: Exchange) -> int:
    """`schedule_store_id`, refused (406) in the rare case another durable delayed exchange
    of the broker has it: two schedules must never share their messages."""
    store_id = schedule_store_id(exchange.vhost.name, exchange.name)
    for vhost in exchange.vhost.broker.vhosts.values():
        for other in vhost.stored_schedules():
            if other.store_id == store_id and not other.deleted:
                raise channel_error(
                    PRECONDITION_FAILED,
                    f"delayed exchange '{exchange.name}' in vhost '{exchange.vhost.name}' "
                    f"would share its message store id with '{other.exchange.name}' in vhost "
                    f"'{other.vhost.name}': choose another name",
                    40,
                    10,
                )
    return store_id


class ScheduleStore:
    """The message store as a schedule sees it (its `store`): a message that reaches the
    schedule alone, as a delayed message does, is stored as one delayed publish record
    carrying its due time (MessageStore.persist_delayed), so nothing but the store's index
    entry is kept for it in memory and no second record is needed; anything else is the
    store's own."""

    __slots__ = ("store", "schedule", "due")

    def __init__(self, store: MessageStore, schedule: Schedule) -> None:
        self.store = store
        self.schedule = schedule
        #: The due time of the message just stored (the schedule's `publish` takes it).
        self.due: int | None = None

    def persist(self, msg: Message, queues: list[Queue], page_out: bool) -> int:
        """`enqueue`'s call (broker/core/queue.py `_persist`), the schedule among `queues`."""
        delay = delay_of(msg.headers)
        if len(queues) != 1 or delay is None:
            return self.store.persist(msg, queues, page_out)
        due = math.ceil(now_ms(self.schedule.exchange)) + delay
        msg_id, token = self.store.persist_delayed(msg, self.schedule, due)
        msg.store_id = msg_id
        self.due = due
        return token

    @property
    def refused(self) -> int:
        return self.store.refused

    @refused.setter
    def refused(self, value: int) -> None:
        self.store.refused = value

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


class DormantSchedule:
    """What a recovery gives the stored messages of a durable exchange's schedule when the
    exchange has none at this start: one a policy made delayed (LavinMQ's
    `delayed-message`) that no policy makes delayed now. The first such message wakes the
    exchange's schedule (delaying nothing new), so what it held is routed when due rather
    than dropped as a deleted queue's; an exchange with none stays as it is."""

    __slots__ = ("exchange", "store", "store_id", "_schedule")

    def __init__(self, exchange: Exchange, store: MessageStore, store_id: int) -> None:
        self.exchange = exchange
        self.store = store
        self.store_id = store_id
        self._schedule: Schedule | None = None

    def _woken(self) -> Schedule:
        schedule = self._schedule
        if schedule is None:
            schedule = self._schedule = self.exchange.make_delayed(False, self.store_id)
            schedule.use_store(self.store)
        return schedule

    def restore_due(self, msg_id: int, size: int, due_ms: int) -> None:
        self._woken().restore_due(msg_id, size, due_ms)

    def restore_stored(self, *args: Any) -> None:
        self._woken().restore_stored(*args)

    def restored(self) -> None:
        if self._schedule is not None:
            self._schedule.restored()


def dormant_schedules(exchanges: Any, store: MessageStore) -> dict[int, DormantSchedule]:
    """A DormantSchedule for each durable exchange of `exchanges` without a schedule, by
    the store id its schedule would have (`schedule_store_id`)."""
    return {
        store_id: DormantSchedule(x, store, store_id)
        for x in exchanges
        if x.durable and x.name and not isinstance(x.index, DelayedIndex)
        for store_id in (schedule_store_id(x.vhost.name, x.name),)
    }


class Schedule(Queue):
    """The messages a delayed exchange holds (module doc). A destination of its exchange's
    index, never a queue of the vhost: it has no consumers, takes no policies and is not
    listed; it has a __dict__ (no __slots__), read per delayed message only.

    Two sources, merged by (due, publish order): transient messages (and every message of
    a transient exchange) as objects in a heap, and stored ones as bare ids in a `DueIndex`
    on disk (broker/store/due_index.py), whose memory does not grow with their number."""

    def __init__(self, exchange: Exchange, store_id: int | None = None) -> None:
        """`store_id`: the id its stored messages name (a recovery's), taken as it is."""
        super().__init__(exchange.vhost, f"amq.delayed-{exchange.name}", durable=exchange.durable)
        self.policy = self.operator_policy = None  # policies are for queues a client sees
        self._settle()
        self.exchange = exchange
        self.throttled = SCHEDULED
        if exchange.durable:  # persistent messages are stored as a durable queue's
            self.store_id = store_id if store_id is not None else _unshared_store_id(exchange)
            self.use_store(exchange.vhost.message_store)
        self._held: list[tuple[int, int, Message]] = []  # (due ms, publish order, message)
        self._stored: DueIndex | None = None  # made at the first stored message
        self._order = 0
        self._timer: Any = None
        self._timer_due: int | None = None
        self.held_bytes = 0
        #: Routed once due, and how late each was when it left: the sum (seconds) and
        #: each LATENESS_BUCKETS bucket's own count (the last: over the top bound).
        self.routed = 0
        self.lateness_seconds = 0.0
        self.lateness_buckets = [0] * (len(LATENESS_BUCKETS) + 1)

    def __repr__(self) -> str:
        return f"<Schedule of {self.exchange!r} holding {self.message_count()}>"

    # -- what the vhost and the API ask ------------------------------------------------

    def message_count(self) -> int:
        return len(self._held) + (self._stored.count if self._stored is not None else 0)

    @property
    def next_due_ms(self) -> int | None:
        """The wall-clock time (ms since the epoch) the next message is due, if any."""
        first = self._first()
        return first[0] if first is not None else None

    def _first(self) -> tuple[int, int, Any] | None:
        held = self._held[0] if self._held else None
        stored = self._stored.first() if self._stored is not None else None
        if held is None:
            return stored
        if stored is None or held[:2] < stored[:2]:
            return held
        return stored

    def _pop(self) -> tuple[int, int, Message | int]:
        """Take the next due message (an object, or a stored one's id)."""
        held, stored = self._held, self._stored
        if held and (stored is None or not stored.count or held[0][:2] < stored.first()[:2]):  # type: ignore[index]  # count > 0: there is a first
            return heapq.heappop(held)
        assert stored is not None
        return stored.pop()

    def use_store(self, store: MessageStore | None) -> None:
        """Keep its persistent messages in `store` (the node's, or its clustered vhost's)."""
        self.store = None if store is None else ScheduleStore(store, self)  # type: ignore[assignment]  # the store, as the schedule sees it

    def _due_index(self) -> DueIndex:
        if self._stored is None:
            assert self.store_id is not None  # a stored message: a durable exchange's
            data_dir = Path(self.vhost.broker.config.storage.data_dir)
            self._stored = DueIndex(data_dir / "delayed" / f"{self.store_id:08x}")
        return self._stored

    # -- taking a message --------------------------------------------------------------

    def publish(self, msg: Message) -> bool:
        """A message the exchange's index found delayed: hold it until it is due."""
        if self.deleted:
            return True
        delay = delay_of(msg.headers)
        if delay is None:  # (the index checked; a header cannot change on the way)
            return True
        due = math.ceil(now_ms(self.exchange)) + delay
        self._order += 1
        self.stats_published += 1
        store: ScheduleStore | None = self.store  # type: ignore[assignment]  # (use_store)
        if msg.store_id is not None and store is not None:
            # Stored by `enqueue`, which waits for it before confirming: only its id is
            # kept, on disk (a DueIndex).
            if store.due is not None:  # its own delayed publish record, due then
                due, store.due = store.due, None
                msg_id = msg.store_id
            else:  # a publish record it shares with queues: a record of its own instead
                msg_id, _ = store.store.persist_delayed(msg, self, due)
                self.stored(msg.size)
                self.unstore(msg.store_id, msg.size)
            self._due_index().add(due, self._order, msg_id)
        else:
            held = _leaving_form(msg, delay)
            heapq.heappush(self._held, (due, self._order, held))
            self.held_bytes += held.size
            self._account(held.size)
        if self._timer_due is None or due < self._timer_due:
            self._arm(due)
        return True

    # -- recovery (the message store calls these, in publish order) ----------------------

    def restore_due(self, msg_id: int, size: int, due_ms: int) -> None:
        """A stored message and its due record, found at start."""
        self._due_index().add(due_ms, msg_id, msg_id)
        self._order = max(self._order, msg_id)
        self.stored(size)

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
        """A publish record it shared with queues, whose copy of its own did not reach the
        disk (the broker stopped in between): due its delay after it was published if its
        record says when (`entered_ms`: it can expire in one of those queues), else after
        this start, so late, never early. (`returned` is a queue's: a schedule delivers
        to nobody, so none names it.)"""
        assert self.store is not None
        try:
            delay = delay_of(self.store.load(msg_id, 0).headers) or 0
        except (KeyError, SegmentLogError) as exc:
            log.error("cannot read a delayed message back", extra={"error": str(exc)})
            delay = 0
        since = entered_ms if entered_ms is not None else math.ceil(now_ms(self.exchange))
        self.restore_due(msg_id, size, since + delay)

    def restored(self) -> None:
        first = self._first()
        if first is not None:
            self._arm(first[0])

    # -- routing what is due -------------------------------------------------------------

    def _arm(self, due: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_due = due
        delay = (due - now_ms(self.exchange)) / 1000.0
        self._timer = self.vhost.clock.call_later(max(0.0, delay), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_due = None
        if self.deleted:
            return
        now = now_ms(self.exchange)
        budget = ROUTE_BUDGET
        while budget > 0:
            first = self._first()
            if first is None or first[0] > now:
                break
            when, _, held = self._pop()
            budget -= 1
            late = (now - when) / 1000.0
            self.routed += 1
            self.lateness_seconds += late
            self.lateness_buckets[bisect.bisect_left(LATENESS_BUCKETS, late)] += 1
            if isinstance(held, int):
                msg = self._take_stored(held)
                if msg is not None:
                    self._route(msg)
                    self.unstore(held, msg.size)
                continue
            self.held_bytes -= held.size
            self._account(-held.size)
            self._route(held)
        first = self._first()
        if first is not None:
            if budget == 0:  # more may be due: the next loop turn
                self._timer_due = first[0]
                self._timer = self.vhost.clock.call_soon(self._on_timer)
            else:  # a timer may fire a little early on the loop's clock: never route early
                self._arm(first[0])

    def _take_stored(self, msg_id: int) -> Message | None:
        """A stored message read back as it leaves; the schedule lets go of its record
        (an ack, after the routed copies' own publish records, so a crash in between
        routes it twice rather than never)."""
        store = self.store
        assert store is not None
        try:
            msg = store.load(msg_id, 1 << 62)
        except (KeyError, SegmentLogError) as exc:
            log.error("cannot read a delayed message back", extra={"error": str(exc)})
            return None
        delay = delay_of(msg.headers)
        return msg if delay is None else _leaving_form(msg, delay)

    def _route(self, msg: Message) -> None:
        """Route a due message through its exchange's rules, as a publish would."""
        exchange = self.exchange
        vhost = self.vhost
        queues = vhost.route(exchange, msg)
        if not queues:
            exchange.stats_unroutable += 1
            return
        vhost.enqueue(msg, queues)

    # -- going away ------------------------------------------------------------------

    def forget(self) -> None:
        """Drop what it holds from memory and write nothing: this node stopped leading the
        exchange's clustered vhost (or leads it again, and recovers it from the vhost's
        log), so another copy of the log is the truth now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_due = None
        self._account(-self.held_bytes)
        self.held_bytes = 0
        self._held = []
        if self._stored is not None:
            self._stored.clear()
        self.persistent = self.persistent_bytes = 0

    def on_deleted(self) -> list:
        """The exchange is deleted: what it held is dropped (as the plugin's, and
        RabbitMQ's for a deleted queue's messages), and settled in the store."""
        stored = self._stored
        if stored is not None and self.store is not None:
            for _, _, msg_id in stored.drain():
                self.store.settled(self, msg_id)
        self.forget()
        self.deleted = True
        return []


def _leaving_form(msg: Message, delay: int) -> Message:
    """The message as it leaves the schedule: `x-delay` set to minus its delay, a signed
    64-bit integer (the plugin's `swap_delay_header`; RabbitMQ 3.13+ writes it as a long)."""
    props = copy_properties(msg.properties)
    headers = dict(props.headers or {})
    headers[DELAY_HEADER] = Int64(-delay)
    props.headers = headers
    held = msg.with_properties(props)
    held.persistent = msg.persistent
    return held
