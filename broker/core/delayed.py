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

import heapq
import math
from typing import TYPE_CHECKING, Any

from roarmq.protocol.tables import Int64

from ..routing.delayed import DELAY_HEADER, delay_of
from .message import Message, copy_properties
from .queue import Queue

if TYPE_CHECKING:
    from .exchange import Exchange

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


class Schedule(Queue):
    """The messages a delayed exchange holds (module doc). A destination of its exchange's
    index, never a queue of the vhost: it has no consumers, takes no policies and is not
    listed; it has a __dict__ (no __slots__), read per delayed message only."""

    def __init__(self, exchange: Exchange) -> None:
        super().__init__(exchange.vhost, f"amq.delayed-{exchange.name}", durable=exchange.durable)
        self.policy = self.operator_policy = None  # policies are for queues a client sees
        self._settle()
        self.exchange = exchange
        self.throttled = SCHEDULED
        self._due: list[tuple[int, int, Message]] = []  # (due ms, publish order, message)
        self._order = 0
        self._timer: Any = None
        self._timer_due: int | None = None
        self.held_bytes = 0
        #: Routed once due, and how late (ms past the due time) each was when it left.
        self.routed = 0
        self.late_ms_total = 0.0
        self.late_ms_max = 0.0

    def __repr__(self) -> str:
        return f"<Schedule of {self.exchange!r} holding {len(self._due)}>"

    # -- what the vhost and the API ask ------------------------------------------------

    def message_count(self) -> int:
        return len(self._due)

    @property
    def next_due_ms(self) -> int | None:
        """The wall-clock time (ms since the epoch) the next message is due, if any."""
        return self._due[0][0] if self._due else None

    # -- taking a message --------------------------------------------------------------

    def publish(self, msg: Message) -> bool:
        """A message the exchange's index found delayed: hold it until it is due."""
        if self.deleted:
            return True
        delay = delay_of(msg.headers)
        if delay is None:  # (the index checked; a header cannot change on the way)
            return True
        due = math.ceil(now_ms(self.exchange)) + delay
        held = _leaving_form(msg, delay)
        self._order += 1
        heapq.heappush(self._due, (due, self._order, held))
        self.stats_published += 1
        self.held_bytes += held.size
        self._account(held.size)
        if self._timer_due is None or due < self._timer_due:
            self._arm(due)
        return True

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
        due = self._due
        while due and due[0][0] <= now and budget > 0:
            when, _, msg = heapq.heappop(due)
            self.held_bytes -= msg.size
            self._account(-msg.size)
            late = now - when
            self.routed += 1
            self.late_ms_total += late
            if late > self.late_ms_max:
                self.late_ms_max = late
            self._route(msg)
            budget -= 1
        if due:
            if budget == 0:  # more are due: the next loop turn
                self._timer_due = due[0][0]
                self._timer = self.vhost.clock.call_soon(self._on_timer)
            else:  # a timer may fire a little early on the loop's clock: never route early
                self._arm(due[0][0])

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

    def on_deleted(self) -> list:
        """The exchange is deleted: what it held is dropped (as the plugin's, and
        RabbitMQ's for a deleted queue's messages)."""
        self.deleted = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_due = None
        self._account(-self.held_bytes)
        self.held_bytes = 0
        self._due.clear()
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
