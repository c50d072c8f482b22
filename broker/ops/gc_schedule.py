"""When Python's cyclic garbage collector runs in a broker process (`roarmq serve`; a broker
run in-process, in someone's test suite, leaves its host's collector as it found it).

A pass costs about 0.2 us for each tracked object it visits, and holds the event loop that
long; what it visits is its generation and the younger ones. CPython starts a generation-0
pass when tracked objects minus those freed since grow by its first threshold, so messages
that come and go cost nothing; what triggers passes is objects that stay (queued messages,
new queues, bindings, consumers). The rules, with what they cost (docs/operations.md, "Loop
stalls and the garbage collector"; measured in docs/benchmarks.md):

- what start-up made (definitions, recovered messages: millions of objects, no garbage) is
  frozen once the broker listens, so no pass ever visits it;
- generation 0: a pass per `GEN0` new objects, a few ms (up to 9 ms measured with 101,000
  queues: the young objects hold references to visit too);
- generation 1: a pass per `GEN1` generation-0 passes, visiting at most the survivors of
  those and the young (`GEN0 * (GEN1 + 1)`: 20 ms measured while 101,000 queues, bindings
  and consumers were declared, where 50 let a pass visit a million, 240 ms);
- generation 2, every object not frozen (half a second with 100,000 queues, bindings and
  consumers): rare. CPython's own pass waits for `GEN2` generation-1 passes (and its rule
  that the objects promoted since the last one be a quarter of those it kept); before that,
  `GcSchedule` runs it at an idle moment: when the loop used under `IDLE_SHARE` of a core
  over the last `IDLE_CHECK` seconds, generation 1 has passed since the last full pass (so
  there is something to look at), and the last one was `IDLE_GAP` ago or more. Cyclic
  garbage (a closed connection and its channels) is still collected: young, by the next
  pass of its generation; old, by the next full one, idle or CPython's.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

log = logging.getLogger("roarmq.gc")

#: Net new tracked objects that start a generation-0 pass (CPython: 700).
GEN0 = 20_000
#: Generation-0 passes per generation-1 pass (CPython: 10; RoarMQ had 50).
GEN1 = 2
#: Generation-1 passes before CPython's own full pass (CPython: 10; RoarMQ had 100 with 50
#: above: 2,500 with 2 keeps it as rare, one per 5,000 generation-0 passes).
GEN2 = 2500
#: Seconds between two looks at how busy the loop was.
IDLE_CHECK = 1.0
#: The loop counts as idle under this share of a core since the last look.
IDLE_SHARE = 0.05
#: Seconds at least between two full passes at idle moments.
IDLE_GAP = 300.0


class GcSchedule:
    """Full passes at idle moments (module docstring); `tune` sets the rest."""

    def __init__(
        self,
        loop: Any,
        *,
        check: float = IDLE_CHECK,
        share: float = IDLE_SHARE,
        gap: float = IDLE_GAP,
    ) -> None:
        self.loop = loop
        self.check = check
        self.share = share
        self.gap = gap
        self.idle_passes = 0  # full passes run at idle moments
        self.last_pass: float | None = None  # loop time of the last one
        self._timer: Any = None
        self._at = 0.0
        self._cpu = 0.0

    def start(self) -> None:
        self._at, self._cpu = self.loop.time(), time.thread_time()
        self._timer = self.loop.call_later(self.check, self._look)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _look(self) -> None:
        at, cpu = self.loop.time(), time.thread_time()  # the loop's own thread: its CPU
        busy = (cpu - self._cpu) / max(at - self._at, 1e-3)
        if busy < self.share and gc.get_count()[2] > 0 and self._due(at):
            self.collect(at)
        self._at, self._cpu = self.loop.time(), time.thread_time()
        self._timer = self.loop.call_later(self.check, self._look)

    def _due(self, at: float) -> bool:
        return self.last_pass is None or at - self.last_pass >= self.gap

    def collect(self, at: float) -> None:
        started = time.perf_counter()
        found = gc.collect()
        took = time.perf_counter() - started
        self.idle_passes += 1
        self.last_pass = at
        log.info(
            "garbage collected at an idle moment",
            extra={"ms": round(took * 1000, 1), "collected": found},
        )


def tune(loop: Any) -> GcSchedule:
    """The broker process's collector, once start-up is over: freeze what start-up made, set
    the thresholds, start the idle-time full passes (module docstring)."""
    gc.freeze()  # no collect() first: recovery made millions of objects and no garbage
    gc.set_threshold(GEN0, GEN1, GEN2)
    schedule = GcSchedule(loop)
    schedule.start()
    return schedule


__all__ = ["GEN0", "GEN1", "GEN2", "GcSchedule", "tune"]
