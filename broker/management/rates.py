"""Message rates for the management API (`*_details.rate`), sampled on a timer.

RabbitMQ samples its statistics every 5 s (`collect_statistics_interval`) and reports each
counter's rate over the last interval; so does this, from the integers queues, exchanges and
`Totals` keep anyway. The message path pays nothing: a pass over the queues and exchanges
every `interval` seconds, only while the management API runs, in slices of SLICE queues (or
SLICE objects, when it looks for idle ones and frees the pass before last) so that no turn
of the event loop is held long: with 100,000 queues, turns of at most 7 ms (before every
part was sliced, a pass had a first turn of 49 ms and a last one of 138 ms).

Each pass is also kept for a while (`History`): the last HISTORY_PASSES passes (10 minutes
at 5 s, RabbitMQ's "basic" retention) of the overview's totals and of at most HISTORY_OBJECTS
queues and exchanges, so that `?lengths_age=`/`?msg_rates_age=` (broker/management/history.py)
answer charts with the last minutes at once, as RabbitMQ's management plugin does.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .metrics import (
    CHANNEL_STATS,
    QueueSums,
    channel_counts,
    churn_counts,
    global_counts,
    queue_counts,
)

if TYPE_CHECKING:
    from ..server import Broker

#: RabbitMQ's collect_statistics_interval.
INTERVAL = 5.0
#: Queues sampled per turn of the event loop (about 1 ms each).
SLICE = 1000

#: What a sample holds per queue, exchange, connection and for "depth" (names of
#: `message_stats` counters; those starting with "_" are not counters: depths, for `depth`,
#: and the seconds a queue's consumers had no credit, for `utilisation`).
QUEUE_FIELDS = (
    "publish", "deliver_get", "deliver", "deliver_no_ack", "ack", "_ready", "_unacked",
    "redeliver", "get", "get_no_ack", "get_empty", "_blocked",
)  # fmt: skip
EXCHANGE_FIELDS = ("publish_in", "publish_out")
CONNECTION_FIELDS = ("recv_oct", "send_oct")
CHANNEL_FIELDS = ("_activity", *CHANNEL_STATS)
#: A vhost's: its channels' message_stats (closed ones' too), its connections' octets, and
#: its queues' depths.
VHOST_FIELDS = (*CHANNEL_STATS, "recv_oct", "send_oct", "_ready", "_unacked")
DEPTH_FIELDS = ("_ready", "_unacked")
#: Fields whose first N counts, unchanged between samples, make an object idle.
_STILL = {QUEUE_FIELDS: len(QUEUE_FIELDS) - 1, CHANNEL_FIELDS: 1}

#: One object's entry in a sample: its field names, then their counts, in one flat tuple
#: (the collector untracks it at its first pass; see RateSampler). `entry[1:]`: the counts.
Entry = tuple[Any, ...]

#: Passes kept in the history: 121 x 5 s, RabbitMQ's "basic" sample retention (605 s).
HISTORY_PASSES = 121
#: Queues and exchanges with a history at most (the overview's totals always have one). A
#: queue's ring is HISTORY_PASSES x 12 doubles (11.6 KiB): at most ~12 MiB in all.
HISTORY_OBJECTS = 1000
#: Fields an object is kept for, and how many of them say it moved.
_KEPT = {QUEUE_FIELDS: len(QUEUE_FIELDS) - 1, EXCHANGE_FIELDS: len(EXCHANGE_FIELDS)}
#: The rings every broker keeps: message_stats, churn_rates, queue_totals.
GLOBAL_KEYS = ("global", "churn", "depth")


_NAMES: dict[tuple[str, ...], tuple[str, ...]] = {}


def _names(counts: dict[str, Any]) -> tuple[str, ...]:
    """The counters' names as one tuple kept from pass to pass (an old, untracked one: an
    entry holding a new tuple would take the collector two passes to untrack)."""
    names = tuple(counts)
    return _NAMES.setdefault(names, names)


def _iso(wall: float) -> str:
    """RabbitMQ's idle_since: "2026-11-22T22:46:46.361+00:00"."""
    moment = datetime.fromtimestamp(wall, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}+00:00"


class RateSampler:
    """Two snapshots of the counters, `interval` apart; a rate is computed when asked for.

    It also notes when an object's counters last moved, for RabbitMQ's `idle_since`.

    A snapshot is `id(object)` (or a name) -> one flat tuple, (field names, count, count,
    ...), beside one dict of the objects themselves, which it keeps alive: while a snapshot
    lives no other object can have an id it holds, so an id found in it names that object
    and no identity check is needed. An entry holds a shared tuple of names and numbers, so
    the collector untracks it at its first young pass (a nested tuple would take two passes,
    the second in generation 1). With 100,000 queues the entries used to be 100,000 tuples a
    pass that held their queue: tracked for good, and scanned by generation-1 passes of up to
    21 ms.
    """

    def __init__(self, broker: Broker, interval: float = INTERVAL) -> None:
        self.broker = broker
        self.interval = interval
        self._timer: Any = None
        self._elapsed: float | None = None
        self._at: float | None = None
        # id(object) or a name -> (field names, *counts): the latest sample and the one
        # before, and id -> object for each (what keeps the ids unique; see above).
        self._last: dict[Any, Entry] = {}
        self._before: dict[Any, Entry] = {}
        self._last_objects: dict[int, Any] = {}
        self._before_objects: dict[int, Any] = {}
        # id(object) -> wall time of the first sample that saw its counters still (the
        # objects are those of the latest sample)
        self._idle: dict[int, float] = {}
        self.history = History()

    def start(self) -> None:
        self.sample()
        self._timer = self.broker.clock.call_later(self.interval, self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        steps = self._steps()

        def step() -> None:
            if not next(steps, False):  # exhausted: the pass is done
                self._timer = self.broker.clock.call_later(self.interval, self._tick)
            else:
                self._timer = self.broker.clock.call_soon(step)

        step()

    def sample(self, at: float | None = None) -> None:
        """Take the counters now, in one go; rates are their change since the sample before.
        `at` (tests) is the wall time the history notes for this pass instead of now."""
        for _ in self._steps(at):
            pass

    def _steps(self, at: float | None = None) -> Iterator[bool]:
        clock = self.broker.clock
        now = clock.precise()  # the interval, and the queues' blocked time, on this clock
        churn = churn_counts(self.broker)
        current: dict[Any, Entry] = {"churn": (_names(churn), *churn.values())}
        objects: dict[int, Any] = {}
        sums = QueueSums(self.broker, [])  # every queue's counters, added as they are walked
        walked: list[Any] = []
        done = 0
        ready_all = unacked_all = 0
        per_vhost: dict[Any, list[int]] = {}
        for vhost in list(self.broker.vhosts.values()):
            in_vhost = per_vhost[vhost] = [*vhost.channel_stats, 0, 0, 0, 0]
            for q in list(vhost.queues.values()):
                ready, unacked = q.message_count(), q.unacked
                ready_all += ready
                unacked_all += unacked
                in_vhost[-2] += ready
                in_vhost[-1] += unacked
                c = queue_counts(q)
                walked.append(q)
                objects[id(q)] = q
                current[id(q)] = (
                    QUEUE_FIELDS,
                    c["publish"], c["deliver_get"], c["deliver"], c["deliver_no_ack"],
                    c["ack"], ready, unacked, c["redeliver"], c["get"], c["get_no_ack"],
                    c["get_empty"], q.blocked_time(now),
                )  # fmt: skip
                done += 1
                if done % SLICE == 0:
                    sums.add(walked)
                    walked.clear()
                    yield True
            for x in list(vhost.exchanges.values()):
                objects[id(x)] = x
                current[id(x)] = (EXCHANGE_FIELDS, x.stats_in, x.stats_in - x.stats_unroutable)
        width = len(CHANNEL_STATS)
        for conn in list(self.broker.connections):
            objects[id(conn)] = conn
            current[id(conn)] = (CONNECTION_FIELDS, conn.recv_oct, conn.send_oct)
            in_vhost = per_vhost.get(conn.vhost)
            if in_vhost is not None:
                in_vhost[width] += conn.recv_oct
                in_vhost[width + 1] += conn.send_oct
            for ch in list(conn.channels.values()):
                counts = channel_counts(ch)
                objects[id(ch)] = ch
                current[id(ch)] = (CHANNEL_FIELDS, ch.stats_published + ch.delivery_tag, *counts)
                if in_vhost is not None:
                    for i, n in enumerate(counts):
                        in_vhost[i] += n
        for vhost, in_vhost in per_vhost.items():
            objects[id(vhost)] = vhost
            current[id(vhost)] = (VHOST_FIELDS, *in_vhost)
        current["depth"] = (DEPTH_FIELDS, ready_all, unacked_all)
        sums.add(walked)
        totals = global_counts(self.broker, sums)
        current["global"] = (_names(totals), *totals.values())
        self._elapsed = None if self._at is None else now - self._at
        self._at = now
        wall = clock.wall()
        yield from self._note_idle(current, wall)
        yield from self.history.record(current, objects, self._last, wall if at is None else at)
        old, self._before, self._last = self._before, self._last, current
        old_objects = self._before_objects
        self._before_objects, self._last_objects = self._last_objects, objects
        for pass_before_last in (old, old_objects):
            while pass_before_last:  # freed a slice a turn, not all at once (~20 ms)
                for _ in range(min(SLICE, len(pass_before_last))):
                    pass_before_last.popitem()
                yield True

    def watch(self, obj: Any) -> None:
        """A queue's or exchange's page was looked at: keep its history (from the last two
        samples on, if it had none) while it is looked at."""
        self.history.watch(obj, self._last.get(id(obj)), self._before.get(id(obj)))

    def _note_idle(self, current: dict[Any, Any], wall: float) -> Iterator[bool]:
        """A queue or channel whose counters did not move since the last sample is idle
        since then (a queue's `_blocked` seconds do not count as activity). In slices of
        SLICE objects, as the rest of the pass (100,000 queues: 140 ms in one go)."""
        last, idle = self._last, {}
        for seen, (key, entry) in enumerate(current.items(), 1):
            if seen % SLICE == 0:
                yield True
            still = _STILL.get(entry[0])
            if still is None:
                continue
            before = last.get(key)  # the same object: both samples keep theirs alive
            if before is None:
                continue  # new: not seen still yet
            if before[1 : 1 + still] == entry[1 : 1 + still]:
                since = self._idle.get(key)  # noted from `last`'s objects: the same one
                idle[key] = wall if since is None else since
        self._idle = idle

    def idle_since(self, obj: Any) -> dict[str, str]:
        """{"idle_since": …} while a queue or channel has been still, as RabbitMQ reports it
        (absent while it is busy)."""
        since = self._idle.get(id(obj))  # the latest sample's objects: obj is the one
        if since is None:
            return {}
        return {"idle_since": _iso(since)}

    def _rates(self, obj: Any) -> dict[str, float]:
        """Per-second change of each counter of `obj` between the last two samples."""
        key = obj if isinstance(obj, str) else id(obj)
        last, before = self._last.get(key), self._before.get(key)
        if not self._elapsed or last is None or before is None:
            return {}  # (both samples keep their objects: an id in both names obj)
        return {
            name: (now - then) / self._elapsed
            if name.startswith("_")
            else max(now - then, 0) / self._elapsed
            for name, now, then in zip(last[0], last[1:], before[1:], strict=True)
        }

    def rate(self, obj: Any, *names: str) -> float:
        """The rate `stats()`/`depth()` report for one counter (or the sum of several, as
        `messages_details` is), read from the last two samples without building the rest:
        a sort key for a list of 100,000 queues, nothing computed per message."""
        key = obj if isinstance(obj, str) else id(obj)
        last, before = self._last.get(key), self._before.get(key)
        if not self._elapsed or last is None or before is None:
            return 0.0
        fields, total = last[0], 0.0
        for name in names:
            if name not in fields:
                continue
            i = fields.index(name)
            change = last[1 + i] - before[1 + i]
            total += (change if name.startswith("_") else max(change, 0)) / self._elapsed
        return round(total, 1)

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


class _Ring:
    """One object's counts over the history's passes: `values[slot * width + i]` is field i
    in the pass whose slot that is; valid for passes from `start` on."""

    __slots__ = ("obj", "fields", "width", "values", "start", "moved", "watched")

    def __init__(self, obj: Any, fields: tuple[str, ...], start: int, passes: int) -> None:
        self.obj = obj
        self.fields = fields
        self.width = len(fields)
        self.values = array("d", bytes(8 * passes * self.width))
        self.start = start  # the first pass it holds
        self.moved = start  # the last pass its counters changed in
        self.watched = -1  # looked at: kept until this pass

    def put(self, slot: int, counts: tuple[float, ...]) -> None:
        w = self.width
        self.values[slot * w : slot * w + w] = array("d", counts)

    def get(self, slot: int) -> array:
        w = self.width
        return self.values[slot * w : slot * w + w]


class History:
    """The last `passes` samples of the overview's totals and of up to `limit` queues and
    exchanges, in rings of plain doubles (nothing per message: written once a pass).

    Which objects: those whose page was looked at lately (`watch`; kept while looked at),
    then those whose counters moved, while there is room; an object whose counters stood
    still for a whole ring gives its place up to one that moves. The pass times are one ring
    shared by all (`times`, wall clock in ms)."""

    def __init__(self, passes: int = HISTORY_PASSES, limit: int = HISTORY_OBJECTS) -> None:
        self.passes = passes
        self.limit = limit
        self.count = 0  # passes recorded so far
        self.times = array("d", bytes(8 * passes))
        self.rings: dict[Any, _Ring] = {}

    def _slot(self, n: int) -> int:
        return n % self.passes

    def _objects(self) -> int:
        """Queues and exchanges with a ring (the limit's count)."""
        return len(self.rings) - sum(key in self.rings for key in GLOBAL_KEYS)

    def record(
        self,
        current: dict[Any, Entry],
        objects: dict[int, Any],
        last: dict[Any, Entry],
        wall: float,
    ) -> Iterator[bool]:
        """Note one pass of the sampler (`current`, its `objects`; `last` is the pass before).
        A ring keeps its object alive, as the samples keep theirs: an id names one object."""
        n, slot = self.count, self._slot(self.count)
        if n and wall * 1000.0 < self.times[self._slot(n - 1)]:
            for ring in self.rings.values():  # the clock went back: start again from here
                ring.start = ring.moved = n
        self.times[slot] = wall * 1000.0
        self.count += 1
        for key in GLOBAL_KEYS:
            if key not in self.rings and key in current:
                self.rings[key] = _Ring(None, current[key][0], n, self.passes)
        stale = []
        for key, ring in list(self.rings.items()):
            entry = current.get(key)
            if entry is None:
                del self.rings[key]  # deleted
                continue
            counts = entry[1:]
            if n > ring.start:
                still = _KEPT.get(ring.fields, ring.width)
                if tuple(ring.get(self._slot(n - 1))[:still]) != tuple(counts[:still]):
                    ring.moved = n
            ring.put(slot, counts)
            if ring.obj is not None and ring.watched < n and n - ring.moved >= self.passes:
                stale.append(key)
        room = self.limit - self._objects() + len(stale)
        if room <= 0:
            return
        seen = 0
        for key, entry in current.items():
            seen += 1
            if seen % SLICE == 0:
                yield True
            fields = entry[0]
            still = _KEPT.get(fields)
            if still is None or key in self.rings:
                continue
            before = last.get(key)
            if before is not None and before[1 : 1 + still] == entry[1 : 1 + still]:
                continue  # not moving: not worth a place
            if self._objects() >= self.limit:
                if not stale:
                    return  # a page looked at took the place meanwhile
                del self.rings[stale.pop()]
            ring = self.rings[key] = _Ring(objects.get(key), fields, n, self.passes)
            ring.put(slot, entry[1:])
            if before is not None and n >= 1:
                ring.put(self._slot(n - 1), before[1:])  # the pass before: how it moved
                ring.start = n - 1
            room -= 1
            if room == 0:
                return

    def watch(self, obj: Any, last: Entry | None, before: Entry | None) -> None:
        """Keep `obj`'s history while it is looked at; started from the sampler's last two
        passes (`last`, `before`: its entries there, or None) when it had none. (A ring and
        the samples keep their objects alive, so `id(obj)` found there is obj.)"""
        key = id(obj)
        ring = self.rings.get(key)
        if ring is None:
            entry = last
            if entry is None or _KEPT.get(entry[0]) is None or self.count == 0:
                return  # not sampled yet: the next pass admits it (it moved: it is new)
            if self._objects() >= self.limit:
                evictable = [
                    (r.moved, k)
                    for k, r in self.rings.items()
                    if r.obj is not None and r.watched < self.count
                ]
                if not evictable:
                    return
                del self.rings[min(evictable, key=lambda e: e[0])[1]]
            n = self.count - 1
            ring = self.rings[key] = _Ring(obj, entry[0], n, self.passes)
            ring.put(self._slot(n), entry[1:])
            if before is not None and n >= 1:
                ring.put(self._slot(n - 1), before[1:])
                ring.start = n - 1
        ring.watched = self.count + self.passes

    def series(
        self, key: Any, obj: Any, names: tuple[str, ...], first: float, last: float, incr: float
    ) -> dict[str, list[tuple[float, float]]] | None:
        """{field: [(timestamp ms, value)], oldest first} at each of first, first + incr, ...,
        last (ms): the value of the latest pass at or before that time; points before the
        object's history begins are left out. None when it has no history."""
        ring = self.rings.get(key)
        if ring is None or (obj is not None and ring.obj is not obj):
            return None
        index = {f: i for i, f in enumerate(ring.fields)}
        wanted = [(name, index[name]) for name in names if name in index]
        out: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in wanted}
        passes = range(max(ring.start, self.count - self.passes), self.count)
        at = -1  # index into passes of the latest pass at or before t
        newest = self.times[self._slot(passes[-1])] if passes else first
        t = first
        while t <= last and t - incr < newest:  # up to the first point after the newest pass
            while at + 1 < len(passes) and self.times[self._slot(passes[at + 1])] <= t:
                at += 1
            if at >= 0:
                row = ring.get(self._slot(passes[at]))
                for name, i in wanted:
                    out[name].append((t, row[i]))
            t += incr
        return out
