"""Message rates for the management API (`*_details.rate`), sampled on a timer.

RabbitMQ samples its statistics every 5 s (`collect_statistics_interval`) and reports each
counter's rate over the last interval; so does this, from the integers queues, exchanges and
`Totals` keep anyway. The message path pays nothing: a pass over the queues and exchanges
every `interval` seconds, only while the management API runs, in slices of SLICE queues so
that no turn of the event loop is held long (`bench/management.py`: one whole pass over
100,000 queues takes 0.066 s).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .metrics import churn_counts, global_counts

if TYPE_CHECKING:
    from .server import Broker

#: RabbitMQ's collect_statistics_interval.
INTERVAL = 5.0
#: Queues sampled per turn of the event loop.
SLICE = 5000

#: What a sample holds per queue, per exchange, and for "depth" (names of `message_stats`
#: counters; the two starting with "_" are depths, for `depth`).
QUEUE_FIELDS = (
    "publish", "deliver_get", "ack", "_ready", "_unacked",
    "redeliver", "get", "get_no_ack", "get_empty",
)  # fmt: skip
EXCHANGE_FIELDS = ("publish_in", "publish_out")
DEPTH_FIELDS = ("_ready", "_unacked")


class RateSampler:
    """Two snapshots of the counters, `interval` apart; a rate is computed when asked for."""

    def __init__(self, broker: Broker, interval: float = INTERVAL) -> None:
        self.broker = broker
        self.interval = interval
        self._timer: Any = None
        self._elapsed: float | None = None
        self._at: float | None = None
        # id(object) or "global" -> (object, counts): the latest sample and the one before.
        self._last: dict[Any, tuple[Any, tuple[int, ...]]] = {}
        self._before: dict[Any, tuple[Any, tuple[int, ...]]] = {}
        self._names: dict[Any, tuple[str, ...]] = {"depth": DEPTH_FIELDS}

    def start(self) -> None:
        self.sample()
        self._timer = self.broker.clock.call_later(self.interval, self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        steps = self._steps()
        loop = self.broker.clock.loop

        def step() -> None:
            if not next(steps, False):  # exhausted: the pass is done
                self._timer = self.broker.clock.call_later(self.interval, self._tick)
            else:
                self._timer = loop.call_soon(step)

        step()

    def sample(self) -> None:
        """Take the counters now, in one go; rates are their change since the sample before."""
        for _ in self._steps():
            pass

    def _steps(self) -> Iterator[bool]:
        now = self.broker.clock.monotonic()
        totals = global_counts(self.broker)
        churn = churn_counts(self.broker)
        current: dict[Any, tuple[Any, tuple[int, ...]]] = {
            "global": (None, tuple(totals.values())),
            "churn": (None, tuple(churn.values())),
        }
        done = 0
        ready_all = unacked_all = 0
        for vhost in list(self.broker.vhosts.values()):
            for q in list(vhost.queues.values()):
                ready, unacked = q.message_count(), q.unacked
                ready_all += ready
                unacked_all += unacked
                current[id(q)] = (
                    q,
                    (
                        q.stats_published,
                        q.stats_delivered,
                        q.stats_acked,
                        ready,
                        unacked,
                        q.stats_requeued,
                        q.stats_get,
                        q.stats_get_no_ack,
                        q.stats_get_empty,
                    ),
                )
                done += 1
                if done % SLICE == 0:
                    yield True
            for x in list(vhost.exchanges.values()):
                current[id(x)] = (x, (x.stats_in, x.stats_in - x.stats_unroutable))
        current["depth"] = (None, (ready_all, unacked_all))
        self._elapsed = None if self._at is None else now - self._at
        self._at = now
        self._names = {"global": tuple(totals), "churn": tuple(churn), "depth": DEPTH_FIELDS}
        self._before, self._last = self._last, current

    def _rates(self, obj: Any) -> dict[str, float]:
        """Per-second change of each counter of `obj` between the last two samples."""
        is_named = isinstance(obj, str)
        key = obj if is_named else id(obj)
        last, before = self._last.get(key), self._before.get(key)
        if not self._elapsed or last is None or before is None:
            return {}
        if not is_named and (last[0] is not obj or before[0] is not obj):
            return {}  # another object now has that id
        if is_named:
            names = self._names.get(obj, ())
        else:
            names = QUEUE_FIELDS if len(last[1]) == len(QUEUE_FIELDS) else EXCHANGE_FIELDS
        return {
            name: (now - then) / self._elapsed
            if name.startswith("_")
            else max(now - then, 0) / self._elapsed
            for name, now, then in zip(names, last[1], before[1], strict=True)
        }

    def depth(self, obj: Any) -> dict[str, Any]:
        """`messages_details` and its ready/unacknowledged kin: how fast a queue's depth (or,
        for "depth", every queue's) changed over the last interval, as RabbitMQ reports it."""
        rates = self._rates(obj)
        ready, unacked = rates.get("_ready", 0.0), rates.get("_unacked", 0.0)
        return {
            "messages_details": {"rate": round(ready + unacked, 1)},
            "messages_ready_details": {"rate": round(ready, 1)},
            "messages_unacknowledged_details": {"rate": round(unacked, 1)},
        }

    def stats(self, obj: Any, counts: dict[str, int]) -> dict[str, Any]:
        """RabbitMQ's `message_stats` for a queue, an exchange, "global" or "churn": each counter
        with its `_details.rate` over the last interval."""
        rates = self._rates(obj)
        out: dict[str, Any] = {}
        for name, value in counts.items():
            out[name] = value
            out[f"{name}_details"] = {"rate": round(rates.get(name, 0.0), 1)}
        return out
