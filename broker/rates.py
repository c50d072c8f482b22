"""Message rates for the management API (`*_details.rate`), sampled on a timer.

RabbitMQ samples its statistics every 5 s (`collect_statistics_interval`) and reports each
counter's rate over the last interval; so does this, from the integers queues, exchanges and
`Totals` keep anyway. The message path pays nothing: one pass over the queues and exchanges
every `interval` seconds, only while the management API runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .metrics import global_counts

if TYPE_CHECKING:
    from .server import Broker

#: RabbitMQ's collect_statistics_interval.
INTERVAL = 5.0

QUEUE_COUNTERS = (
    ("publish", "stats_published"),
    ("deliver_get", "stats_delivered"),
    ("ack", "stats_acked"),
)
EXCHANGE_COUNTERS = (("publish_in", "stats_in"),)


class RateSampler:
    def __init__(self, broker: Broker, interval: float = INTERVAL) -> None:
        self.broker = broker
        self.interval = interval
        self._timer: Any = None
        self._at: float | None = None
        self._previous: dict[Any, tuple[Any, tuple[int, ...]]] = {}
        self.rates: dict[Any, dict[str, float]] = {}  # ("queue"|"exchange", vhost, name), "global"

    def start(self) -> None:
        self.sample()
        self._timer = self.broker.clock.call_later(self.interval, self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        self.sample()
        self._timer = self.broker.clock.call_later(self.interval, self._tick)

    def sample(self) -> None:
        """Take the counters now; rates are their change since the last sample."""
        now = self.broker.clock.monotonic()
        elapsed = None if self._at is None else now - self._at
        self._at = now
        totals = global_counts(self.broker)
        current: dict[Any, tuple[Any, tuple[int, ...]]] = {"global": (None, tuple(totals.values()))}
        names: dict[str, list[str]] = {
            "global": list(totals),
            "queue": [n for n, _ in QUEUE_COUNTERS],
            "exchange": [n for n, _ in EXCHANGE_COUNTERS],
        }
        for vhost in self.broker.vhosts.values():
            for q in vhost.queues.values():
                counts = tuple(getattr(q, attr) for _, attr in QUEUE_COUNTERS)
                current[("queue", vhost.name, q.name)] = (q, counts)
            for x in vhost.exchanges.values():
                counts = tuple(getattr(x, attr) for _, attr in EXCHANGE_COUNTERS)
                current[("exchange", vhost.name, x.name)] = (x, counts)
        rates: dict[Any, dict[str, float]] = {}
        for key, (obj, counts) in current.items():
            kind = key if key == "global" else key[0]
            before = self._previous.get(key)
            if elapsed and before is not None and before[0] is obj:
                rates[key] = {
                    n: max(c - b, 0) / elapsed
                    for n, c, b in zip(names[kind], counts, before[1], strict=True)
                }
        self._previous = current
        self.rates = rates

    def stats(self, key: Any, counts: dict[str, int]) -> dict[str, Any]:
        """RabbitMQ's `message_stats`: each counter with its `_details.rate`."""
        rates = self.rates.get(key, {})
        out: dict[str, Any] = {}
        for name, value in counts.items():
            out[name] = value
            out[f"{name}_details"] = {"rate": round(rates.get(name, 0.0), 1)}
        return out
