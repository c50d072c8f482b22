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
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .metrics import churn_counts, global_counts, queue_counts

if TYPE_CHECKING:
    from .server import Broker

#: RabbitMQ's collect_statistics_interval.
INTERVAL = 5.0
#: Queues sampled per turn of the event loop.
SLICE = 5000

#: What a sample holds per queue, exchange, connection and for "depth" (names of
#: `message_stats` counters; those starting with "_" are not counters: depths, for `depth`,
#: and the seconds a queue's consumers had no credit, for `utilisation`).
QUEUE_FIELDS = (
    "publish", "deliver_get", "deliver", "deliver_no_ack", "ack", "_ready", "_unacked",
    "redeliver", "get", "get_no_ack", "get_empty", "_blocked",
)  # fmt: skip
EXCHANGE_FIELDS = ("publish_in", "publish_out")
CONNECTION_FIELDS = ("recv_oct", "send_oct")
CHANNEL_FIELDS = ("_activity",)
DEPTH_FIELDS = ("_ready", "_unacked")
#: Fields whose first N counts, unchanged between samples, make an object idle.
_STILL = {QUEUE_FIELDS: len(QUEUE_FIELDS) - 1, CHANNEL_FIELDS: 1}


def _iso(wall: float) -> str:
    """RabbitMQ's idle_since: "2026-11-22T22:46:46.361+00:00"."""
    moment = datetime.fromtimestamp(wall, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}+00:00"


class RateSampler:
    """Two snapshots of the counters, `interval` apart; a rate is computed when asked for.

    It also notes when an object's counters last moved, for RabbitMQ's `idle_since`.
    """

    def __init__(self, broker: Broker, interval: float = INTERVAL) -> None:
        self.broker = broker
        self.interval = interval
        self._timer: Any = None
        self._elapsed: float | None = None
        self._at: float | None = None
        # id(object) or a name -> (object, field names, counts): the latest sample and the
        # one before.
        self._last: dict[Any, tuple[Any, tuple[str, ...], tuple[float, ...]]] = {}
        self._before: dict[Any, tuple[Any, tuple[str, ...], tuple[float, ...]]] = {}
        # id(object) -> (object, wall time of the first sample that saw its counters still)
        self._idle: dict[int, tuple[Any, float]] = {}

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
        clock = self.broker.clock
        now = clock.precise()  # the interval, and the queues' blocked time, on this clock
        totals = global_counts(self.broker)
        churn = churn_counts(self.broker)
        current: dict[Any, tuple[Any, tuple[str, ...], tuple[float, ...]]] = {
            "global": (None, tuple(totals), tuple(totals.values())),
            "churn": (None, tuple(churn), tuple(churn.values())),
        }
        done = 0
        ready_all = unacked_all = 0
        for vhost in list(self.broker.vhosts.values()):
            for q in list(vhost.queues.values()):
                ready, unacked = q.message_count(), q.unacked
                ready_all += ready
                unacked_all += unacked
                c = queue_counts(q)
                current[id(q)] = (
                    q,
                    QUEUE_FIELDS,
                    (
                        c["publish"], c["deliver_get"], c["deliver"], c["deliver_no_ack"],
                        c["ack"], ready, unacked, c["redeliver"], c["get"], c["get_no_ack"],
                        c["get_empty"], q.blocked_time(now),
                    ),
                )  # fmt: skip
                done += 1
                if done % SLICE == 0:
                    yield True
            for x in list(vhost.exchanges.values()):
                counts = (x.stats_in, x.stats_in - x.stats_unroutable)
                current[id(x)] = (x, EXCHANGE_FIELDS, counts)
        for conn in list(self.broker.connections):
            current[id(conn)] = (conn, CONNECTION_FIELDS, (conn.recv_oct, conn.send_oct))
            for ch in list(conn.channels.values()):
                activity = (ch.stats_published + ch.delivery_tag,)
                current[id(ch)] = (ch, CHANNEL_FIELDS, activity)
        current["depth"] = (None, DEPTH_FIELDS, (ready_all, unacked_all))
        self._elapsed = None if self._at is None else now - self._at
        self._at = now
        self._note_idle(current, clock.wall())
        self._before, self._last = self._last, current

    def _note_idle(self, current: dict[Any, Any], wall: float) -> None:
        """A queue or channel whose counters did not move since the last sample is idle
        since then (a queue's `_blocked` seconds do not count as activity)."""
        last, idle = self._last, {}
        for key, (obj, fields, counts) in current.items():
            still = _STILL.get(fields)
            if still is None:
                continue
            before = last.get(key)
            if before is None or before[0] is not obj:
                continue  # new: not seen still yet
            if before[2][:still] == counts[:still]:
                seen = self._idle.get(key)
                idle[key] = seen if seen is not None and seen[0] is obj else (obj, wall)
        self._idle = idle

    def idle_since(self, obj: Any) -> dict[str, str]:
        """{"idle_since": …} while a queue or channel has been still, as RabbitMQ reports it
        (absent while it is busy)."""
        seen = self._idle.get(id(obj))
        if seen is None or seen[0] is not obj:
            return {}
        return {"idle_since": _iso(seen[1])}

    def _rates(self, obj: Any) -> dict[str, float]:
        """Per-second change of each counter of `obj` between the last two samples."""
        key = obj if isinstance(obj, str) else id(obj)
        last, before = self._last.get(key), self._before.get(key)
        if not self._elapsed or last is None or before is None:
            return {}
        if last[0] is not before[0] or (not isinstance(obj, str) and last[0] is not obj):
            return {}  # another object now has that id
        return {
            name: (now - then) / self._elapsed
            if name.startswith("_")
            else max(now - then, 0) / self._elapsed
            for name, now, then in zip(last[1], last[2], before[2], strict=True)
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

    def utilisation(self, q: Any) -> float:
        """RabbitMQ's consumer_utilisation: the share of the last interval in which the queue
        could hand a message to a consumer at once (0 without consumers, as RabbitMQ 3.10)."""
        if not q.consumer_count:
            return 0.0
        blocked = self._rates(q).get("_blocked")
        if blocked is None:  # not two samples yet: how it stands now
            return 0.0 if q.consumers_blocked else 1.0
        return min(max(1.0 - blocked, 0.0), 1.0)

    def stats(self, obj: Any, counts: dict[str, int]) -> dict[str, Any]:
        """RabbitMQ's `message_stats` for a queue, an exchange, "global" or "churn": each counter
        with its `_details.rate` over the last interval."""
        rates = self._rates(obj)
        out: dict[str, Any] = {}
        for name, value in counts.items():
            out[name] = value
            out[f"{name}_details"] = {"rate": round(rates.get(name, 0.0), 1)}
        return out
