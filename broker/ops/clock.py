"""One clock for every timer in the broker: TTLs, x-expires, heartbeats.

Everything time-based asks a Clock rather than the loop or `time`, so tests
swap in a VirtualClock and make an hour pass in microseconds (the trio
MockClock idea) instead of sleeping.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .stalls import JobTimes


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock:
    """Real time, driven by the running event loop.

    With the loop-lag probe on, `jobs` is set and every callback scheduled here runs through
    `JobTimes.run`, so a stall can name the timer or slice of background work that held the
    loop (broker/ops/stalls.py); otherwise the callback is handed to the loop as it is.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self.jobs: JobTimes | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (for deadlines)."""
        return self.loop.time()

    def wall(self) -> float:
        """Seconds since the epoch (for timestamps clients can read)."""
        return time.time()

    def precise(self) -> float:
        """Seconds on a monotonic clock finer than the loop's (uvloop's ticks are 1 ms), for
        measuring short intervals; never for deadlines."""
        return time.monotonic()

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> TimerHandle:
        if self.jobs is not None:
            return self.loop.call_later(max(0.0, delay), self.jobs.run, callback, *args)
        return self.loop.call_later(max(0.0, delay), callback, *args)

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> TimerHandle:
        if self.jobs is not None:
            return self.loop.call_at(when, self.jobs.run, callback, *args)
        return self.loop.call_at(when, callback, *args)

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> TimerHandle:
        """On the next loop turn (a slice of background work); real even with a VirtualClock."""
        if self.jobs is not None:
            return self.loop.call_soon(self.jobs.run, callback, *args)
        return self.loop.call_soon(callback, *args)


class _VirtualTimer:
    __slots__ = ("when", "seq", "callback", "args", "cancelled")

    def __init__(self, when: float, seq: int, callback: Callable[..., Any], args: tuple) -> None:
        self.when = when
        self.seq = seq
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def __lt__(self, other: _VirtualTimer) -> bool:
        return (self.when, self.seq) < (other.when, other.seq)


class VirtualClock(Clock):
    """Time that moves only when a test calls `advance`.

    Due timers run in deadline order inside `advance`, each seeing `monotonic()`
    equal to its own deadline, so a chain of timers behaves as it would in
    real time.
    """

    def __init__(self, start: float = 1_000_000.0, wall_start: float = 1_700_000_000.0) -> None:
        super().__init__()
        self._now = start
        self._wall_offset = wall_start - start
        self._timers: list[_VirtualTimer] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now + self._wall_offset

    def precise(self) -> float:
        return self._now

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> TimerHandle:
        return self.call_at(self._now + max(0.0, delay), callback, *args)

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> TimerHandle:
        timer = _VirtualTimer(when, next(self._seq), callback, args)
        heapq.heappush(self._timers, timer)
        return timer

    def advance(self, seconds: float) -> int:
        """Move time forward, running every timer that falls due; returns how many ran."""
        deadline = self._now + seconds
        ran = 0
        while self._timers and self._timers[0].when <= deadline:
            timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self._now = max(self._now, timer.when)
            timer.callback(*timer.args)
            ran += 1
        self._now = deadline
        return ran

    def pending(self) -> int:
        return sum(1 for t in self._timers if not t.cancelled)
