"""Event-loop stalls: the probe that sees them, and what the loop was doing meanwhile.

`LoopLag` (on with `[diagnostics] loop_lag_probe_ms`) is a timer due every `interval`: how
late it runs is how long the loop was held (`roarmq_event_loop_lag_max_seconds`). A stall of
`[diagnostics] stall_threshold_ms` or more is kept in a bounded ring (GET
/api/diagnostics/stalls) and logged once (at most one line per `LOG_EVERY` seconds), with
what overlapped it:

- the cyclic garbage collector's passes (`GcWatch`, on `gc.callbacks`, always on: it also
  feeds the `roarmq_gc_*` metric families): generation, pause, objects collected;
- the broker's periodic jobs that ran long (`JobTimes.run`, the one wrapper every timer and
  slice of background work goes through while the probe is on: `Clock` wraps its timers
  and `call_soon`s, the message store its writer thread's callbacks, the management API
  its requests);
- the loop thread's CPU time and run-queue wait over the window (Linux's
  /proc/thread-self/schedstat), the process's other threads' CPU time and the longest
  run-queue wait of one of them (`OtherThreads`: one the loop handed the GIL to makes it
  wait that long), and the steal time
  of the CPU the loop thread runs on (/proc/stat: in a VM, time the hypervisor gave that
  virtual CPU's core to someone else, which the guest counts neither as the thread's CPU
  time nor as a wait for a core), which tell code that ran (on CPU) from a loop that was
  not running at all: runnable but its core taken by another process, its virtual CPU
  taken by the hypervisor, waiting for the GIL, or blocked: reading a page of its own back
  from disk (a major page fault, counted per thread by getrusage: the kernel reclaimed a
  page of code or of a mapped file the loop then touched), in a system call, or asleep in
  its poll past a timer the machine delivered late (in a VM, now and then tens of ms late
  with no wait for a core nor steal counted: the loop's counters cannot tell that from a
  system call that blocked).

`Stall.explain` is the one rule that turns those into a cause. Nothing here runs per
message: a tick is a clock read, two CPU clock reads, a 40-byte pread and a getrusage (4.2 us
against the bare timer's 0.3, so 0.4% of a core more at 1 ms), a pread per other thread
(1.4 us each: six threads add 0.8% of a core at 1 ms) and every `STEAL_EVERY` seconds a read
of /proc/stat (19 us: 0.2% of a core), a collection or a job run two clock reads and a few
additions.
"""

from __future__ import annotations

import gc
import logging
import os
import resource
import threading
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .logs import NOTICE

log = logging.getLogger("roarmq.stalls")

#: The clock of every window and pause here (CLOCK_MONOTONIC, sub-microsecond).
now = time.perf_counter

#: Stalls kept for GET /api/diagnostics/stalls (the oldest dropped first).
STALL_RING = 128
#: At most one log line per this many seconds; the next one counts the stalls not logged.
LOG_EVERY = 10.0
#: A job run at least this long is kept for attribution (shorter ones are only counted).
JOB_FLOOR = 0.001
#: Collections and long job runs remembered for attribution (a stall's window is recent).
RECENT = 256
#: Upper bounds (seconds) of the GC pause histogram's buckets (`roarmq_gc_pause_seconds`).
GC_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)

#: What can explain a stall (`Stall.explain`), the `kind` label of roarmq_event_loop_stalls.
STALL_KINDS = ("gc", "job", "run_queue", "steal", "gil", "page_in", "blocked", "on_cpu")
#: getrusage's "this thread" (Linux), or None.
THREAD_USAGE: int | None = getattr(resource, "RUSAGE_THREAD", None)
#: Seconds between two reads of the CPUs' steal times: a stall's is the steal since the
#: last read before its window, so it may count up to this much from before the window
#: (and /proc/stat counts in 10-ms ticks).
STEAL_EVERY = 0.01


def _overlapping(recent: deque[Any], start: float, end: float) -> list[Any]:
    """The (start, end, ...) entries of `recent` (in the order they ended) that overlap the
    window from `start` to `end`: read from the newest back to the first that ended before."""
    found = []
    for entry in reversed(recent):
        if entry[1] <= start:
            break
        if entry[0] < end:
            found.append(entry)
    found.reverse()
    return found


# -- the collector ------------------------------------------------------------------------


class GcGeneration:
    """One generation's collections since the watch was installed."""

    __slots__ = ("collections", "seconds", "longest", "collected", "uncollectable", "buckets")

    def __init__(self) -> None:
        self.collections = 0
        self.seconds = 0.0
        self.longest = 0.0
        self.collected = 0
        self.uncollectable = 0
        self.buckets = [0] * (len(GC_BUCKETS) + 1)  # the last: longer than every bound


class GcWatch:
    """Every pass of this process's cyclic garbage collector, timed (`gc.callbacks`).

    Process-wide, as the collector is: installed by the first broker to start and removed
    when the last one stops (an in-process broker leaves its host's `gc.callbacks` as it
    found them); its counts go on from where they were. A few additions per pass.
    """

    def __init__(self) -> None:
        self.generations = [GcGeneration() for _ in range(3)]
        #: (start, end, generation, collected), in the order they ended.
        self.recent: deque[tuple[float, float, int, int]] = deque(maxlen=RECENT)
        self._started = 0.0
        self._users = 0

    def install(self) -> None:
        """A broker starts: watch from now on (the first one installs the callback)."""
        self._users += 1
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        """A broker stops: the last one removes the callback."""
        self._users = max(self._users - 1, 0)
        if not self._users and self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = now()
            return
        end = now()
        start = self._started
        pause = end - start
        generation = info["generation"]
        g = self.generations[generation]
        g.collections += 1
        g.seconds += pause
        if pause > g.longest:
            g.longest = pause
        g.collected += info["collected"]
        g.uncollectable += info["uncollectable"]
        g.buckets[bisect_left(GC_BUCKETS, pause)] += 1
        self.recent.append((start, end, generation, info["collected"]))

    def overlapping(self, start: float, end: float) -> list[tuple[float, float, int, int]]:
        """The passes that ran, at least in part, between `start` and `end`."""
        return _overlapping(self.recent, start, end)


#: The process's one watch.
GC_WATCH = GcWatch()


# -- periodic jobs --------------------------------------------------------------------------

#: What a job is called in the stall ring, by its callback's qualified name (others go by that
#: name: a renamed method only loses its label).
JOB_LABELS = {
    "Queue._on_expiry_timer": "message TTL expiry",
    "Queue._on_idle": "queue x-expires",
    "Channel._check_timeouts": "consumer-timeout sweep",
    "RateSampler._tick": "management sampler",
    "RateSampler._tick.<locals>.step": "management sampler",
    "VirtualHost._sweep": "binding sweep",
    "Broker._compact": "message store compaction",
    "MessageStore.records_durable": "message store: fsync done, confirms sent",
    "MessageStore._ack_sync_due": "message store: ack sync",
    "SegmentDurability._segment_deleted": "message store: segment deleted",
    "Connection._heartbeat_tick": "heartbeats",
}


def job_name(callback: Callable[..., Any]) -> str:
    name = getattr(callback, "__qualname__", None) or type(callback).__qualname__
    return JOB_LABELS.get(name, name)


class JobTimes:
    """How long the broker's jobs run: per job its runs, total and longest, and the runs of
    at least `floor` seconds with their times, for attribution. `run` is the wrapper."""

    def __init__(self, floor: float = JOB_FLOOR) -> None:
        self.floor = floor
        #: (start, end, name) of the long runs, in the order they ended.
        self.recent: deque[tuple[float, float, str]] = deque(maxlen=RECENT)
        #: name -> [runs, seconds, longest]
        self.jobs: dict[str, list[Any]] = {}

    def run(self, callback: Callable[..., Any], *args: Any) -> Any:
        """Call `callback(*args)` and note how long it took (a loop callback's wrapper)."""
        start = now()
        try:
            return callback(*args)
        finally:
            self.note(job_name(callback), start, now())

    def note(self, name: str, start: float, end: float) -> None:
        took = end - start
        job = self.jobs.get(name)
        if job is None:
            job = self.jobs[name] = [0, 0.0, 0.0]
        job[0] += 1
        job[1] += took
        if took > job[2]:
            job[2] = took
        if took >= self.floor:
            self.recent.append((start, end, name))

    def overlapping(self, start: float, end: float) -> list[tuple[float, float, str]]:
        """The long runs that ran, at least in part, between `start` and `end`."""
        return _overlapping(self.recent, start, end)


# -- one stall ------------------------------------------------------------------------------


@dataclass(slots=True)
class Stall:
    """One stall: how long, when, and what overlapped its window (the time since the tick
    before: the loop ran, or waited, on something in it that kept the next tick `lag` late)."""

    id: int
    wall: float  # time.time() when it was seen
    lag: float  # seconds the tick was late
    window: float  # seconds since the tick before
    cpu: float  # the loop thread's CPU seconds in the window
    run_queue: float | None  # seconds it was runnable but not running (None: not known)
    others_cpu: float  # the process's other threads' CPU seconds in the window
    #: the longest any other thread of the process waited for a core in the window: a
    #: loop that handed it the GIL waits that long, off CPU (`OtherThreads`)
    others_run_queue: float = 0.0
    #: the window's end on `now`'s clock (CLOCK_MONOTONIC on Linux: the same clock in
    #: every process, so another process's record of the same moments can be set beside it)
    at: float = 0.0
    #: seconds the hypervisor took the loop thread's virtual CPU in (or just before) the
    #: window (None: not known)
    steal: float | None = None
    #: major page faults of the loop thread in the window (pages read back from disk)
    page_ins: int = 0
    #: per generation that ran: [generation, passes, seconds of them in the window,
    #: the longest pass's whole pause, objects collected]
    gc: list[list[Any]] = field(default_factory=list)
    #: per job that ran at least `JobTimes.floor`: [name, runs, seconds in the window]
    jobs: list[list[Any]] = field(default_factory=list)
    kind: str = ""  # one of STALL_KINDS
    cause: str = ""  # one line for people

    def explain(self) -> None:
        """Set `kind` and `cause`. GC passes explain it when they cover half the lag (a pass
        inside a job is the GC's), else one job that does; else, when the loop thread was on
        CPU for most of the window, code nothing here times; else what kept it off CPU: the
        run queue (another process had the core), the hypervisor (steal), other threads
        (the GIL: they ran, or one the loop handed it to waited for a core), whichever
        covers half of that time; else pages of the loop's read back from disk if it took
        a major fault (page_in), or a system call (blocked)."""
        half = self.lag / 2
        ms = 1000
        on = f"loop on CPU {self.cpu * ms:.1f} of {self.window * ms:.1f} ms"
        if self.run_queue is not None and self.run_queue * ms >= 0.5:
            on += f", waiting for a core {self.run_queue * ms:.1f} ms"
        if self.steal:
            on += f", its virtual CPU stolen {self.steal * ms:.0f} ms"
        if self.page_ins:
            on += f", {self.page_ins} major page fault{'s' if self.page_ins > 1 else ''}"
        if sum(g[2] for g in self.gc) >= half:
            self.kind = "gc"
            passes = ", ".join(
                f"gen{g}: {n} pass{'es' if n > 1 else ''} {inside * ms:.1f} ms"
                for g, n, inside, _, _ in sorted(self.gc, key=lambda g: -g[2])
            )
            self.cause = f"GC {passes} ({on})"
            return
        top = max(self.jobs, key=lambda j: j[2], default=None)
        if top is not None and top[2] >= half:
            self.kind, self.cause = "job", f"{top[0]} ran {top[2] * ms:.1f} ms ({on})"
            return
        off = self.window - self.cpu
        if off < half:
            self.kind = "on_cpu"
            self.cause = (
                f"{on}; no GC pass or timed job explains it: AMQP work or an untimed callback"
            )
        elif self.run_queue is not None and self.run_queue >= off / 2:
            self.kind = "run_queue"
            self.cause = f"another process had the core ({on})"
        elif self.steal is not None and self.steal >= off / 2:
            self.kind = "steal"
            self.cause = f"the hypervisor gave the VM's CPU to someone else ({on})"
        elif self.others_cpu >= off / 2:
            self.kind = "gil"
            self.cause = (
                f"the broker's other threads ran {self.others_cpu * ms:.1f} ms: the GIL ({on})"
            )
        elif self.others_run_queue >= off / 2:
            self.kind = "gil"
            self.cause = (
                f"the GIL handed to a thread of the broker's that waited "
                f"{self.others_run_queue * ms:.1f} ms for a core ({on})"
            )
        elif self.page_ins:
            self.kind = "page_in"
            self.cause = (
                f"off CPU {off * ms:.1f} ms, reading pages of its own back from disk: the "
                f"kernel had reclaimed them ({on})"
            )
        else:
            self.kind = "blocked"
            self.cause = (
                f"off CPU {off * ms:.1f} ms, not waiting for a core: blocked in a system call, "
                f"or asleep past its timer, which the machine delivered late ({on})"
            )

    def as_json(self) -> dict[str, Any]:
        def ms(seconds: float | None) -> float | None:
            return None if seconds is None else round(seconds * 1000, 3)

        return {
            "id": self.id,
            "at": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(self.wall))
            + f".{int(self.wall * 1000) % 1000:03d}Z",
            "lag_ms": ms(self.lag),
            "window_ms": ms(self.window),
            "cpu_ms": ms(self.cpu),
            "run_queue_ms": ms(self.run_queue),
            "other_threads_cpu_ms": ms(self.others_cpu),
            "other_threads_run_queue_ms": ms(self.others_run_queue),
            "steal_ms": ms(self.steal),
            "major_page_faults": self.page_ins,
            "gc": [
                {
                    "generation": g,
                    "passes": n,
                    "ms": ms(inside),
                    "longest_ms": ms(longest),
                    "collected": collected,
                }
                for g, n, inside, longest, collected in self.gc
            ],
            "jobs": [{"name": name, "runs": n, "ms": ms(inside)} for name, n, inside in self.jobs],
            "kind": self.kind,
            "cause": self.cause,
        }


# -- the probe ------------------------------------------------------------------------------


class ThreadTimes:
    """The calling thread's CPU time (its CPU clock) and run-queue wait (Linux's
    /proc/thread-self/schedstat, read with one pread of the file opened once; None
    elsewhere), cumulative, in seconds. (schedstat's own CPU figure is not brought up to
    date for a running thread: up to a scheduler tick behind.)"""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None

    def read(self) -> tuple[float, float | None]:
        if self._fd is not None:
            return time.thread_time(), int(os.pread(self._fd, 64, 0).split()[1]) / 1e9
        return time.thread_time(), None

    @staticmethod
    def page_ins() -> int:
        """The calling thread's major page faults so far (0 where threads are not counted)."""
        return resource.getrusage(THREAD_USAGE).ru_majflt if THREAD_USAGE is not None else 0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class OtherThreads:
    """The run-queue wait (schedstat's second field, cumulative seconds) of each thread of
    the process but the calling one, by thread id: a thread that wants the GIL back while
    the loop runs makes the loop hand it over and wait until it has taken it (CPython's
    forced switch), so a store thread waiting for a core holds the loop off CPU though
    neither runs. The list of threads is read again every `RELIST` seconds (a thread
    started since is not counted until then); empty where there is no /proc."""

    RELIST = 0.1

    def __init__(self) -> None:
        self._own = threading.get_native_id()
        self._fds: dict[int, int] = {}
        self._listed_at = float("-inf")

    def read(self, at: float) -> dict[int, float]:
        if at - self._listed_at >= self.RELIST:
            self._relist()
            self._listed_at = at
        waited = {}
        for tid, fd in list(self._fds.items()):
            try:
                waited[tid] = int(os.pread(fd, 64, 0).split()[1]) / 1e9
            except (OSError, IndexError, ValueError):  # the thread has ended
                os.close(self._fds.pop(tid))
        return waited

    def _relist(self) -> None:
        try:
            tids = {int(name) for name in os.listdir("/proc/self/task")} - {self._own}
        except OSError:
            return
        for tid in set(self._fds) - tids:
            os.close(self._fds.pop(tid))
        for tid in tids - set(self._fds):
            try:
                self._fds[tid] = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
            except OSError:
                pass

    @staticmethod
    def longest(before: dict[int, float], after: dict[int, float]) -> float:
        """The longest wait of one thread between two reads."""
        return max((after[t] - before[t] for t in after if t in before), default=0.0)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class CpuSteal:
    """Each CPU's steal time (/proc/stat's eighth column: in a VM, time its virtual CPU was
    runnable but the hypervisor ran something else), and the CPU the calling thread is on
    (/proc/thread-self/stat); cumulative, in seconds. Empty where there is no /proc."""

    def __init__(self) -> None:
        self.tick = 1 / os.sysconf("SC_CLK_TCK")

    def read(self) -> dict[int, float]:
        """CPU number -> its steal seconds."""
        try:
            with open("/proc/stat", "rb") as f:
                f.readline()  # the sum over all CPUs
                steal = {}
                for line in f:
                    if not line.startswith(b"cpu"):
                        break
                    fields = line.split()
                    steal[int(fields[0][3:])] = int(fields[8]) * self.tick
                return steal
        except (OSError, IndexError, ValueError):
            return {}

    @staticmethod
    def cpu() -> int | None:
        try:
            with open("/proc/thread-self/stat", "rb") as f:
                return int(f.read().rsplit(b")", 1)[1].split()[36])  # field 39, "processor"
        except (OSError, IndexError, ValueError):
            return None


#: What `LoopLag` reads of the loop thread each tick: its CPU seconds and run-queue wait,
#: the process's CPU seconds, the thread's major faults, the other threads' run-queue waits.
_Readings = tuple[float, "float | None", float, int, dict[int, float]]


class LoopLag:
    """How late the event loop runs a timer due every `interval` seconds: its longest stall,
    and each stall of `threshold` or more with what the loop was doing (module docstring).

    Off unless `[diagnostics] loop_lag_probe_ms` is set (a 1 ms timer costs about 1% of a
    core, and 0.14% more for each other thread); benchmarks turn it on and read
    `roarmq_event_loop_lag_max_seconds` and the ring.
    """

    def __init__(
        self,
        loop: Any,
        interval: float,
        threshold: float = 0.005,
        *,
        jobs: JobTimes | None = None,
        watch: GcWatch = GC_WATCH,
        ring: int = STALL_RING,
    ) -> None:
        self.loop = loop
        self.interval = interval
        self.threshold = threshold
        self.jobs = jobs
        self.watch = watch
        self.max_lag = 0.0  # since the last `take_max`
        self.stalls: deque[Stall] = deque(maxlen=ring)
        self.recorded = 0  # stalls of `threshold` or more since start
        self.by_kind: dict[str, int] = {}
        self._due = 0.0
        self._timer: Any = None
        self._times: ThreadTimes | None = None  # opened on the loop's thread, in start()
        self._others: OtherThreads | None = None  # (the same)
        #: The tick before: its time (the start of the next stall's window) and what the
        #: thread counters read then (`_read`).
        self._last = 0.0
        self._before: _Readings | None = None
        self._steal = CpuSteal()
        self._stolen: dict[int, float] = {}  # each CPU's steal at `_stolen_at`
        self._stolen_at = float("-inf")
        self._logged_at = float("-inf")
        self._unlogged = 0

    def start(self) -> None:
        self._times = ThreadTimes()
        self._others = OtherThreads()
        at = now()
        self._last, self._before = at, self._read(at)
        self._due = at + self.interval
        self._timer = self.loop.call_later(self.interval, self._tick)

    def _read(self, at: float) -> _Readings:
        cpu, run_queue = self._times.read()  # type: ignore[union-attr]  # the probe runs only where the times can be read
        others = self._others.read(at)  # type: ignore[union-attr]  # (as above)
        return cpu, run_queue, time.process_time(), ThreadTimes.page_ins(), others

    def _tick(self) -> None:
        """Once a tick, the counters are read once, right after the clock: a window and
        its counters start at the same moment, so that what the probe's own work after
        a stall waits (its log line's write, a core) counts in the next window's causes
        as it does in its lag."""
        at = now()
        readings = self._read(at)
        lag = at - self._due
        if lag > self.max_lag:
            self.max_lag = lag
        if lag >= self.threshold:
            self._stalled(at, lag, readings)
        if at - self._stolen_at >= STEAL_EVERY:
            self._stolen, self._stolen_at = self._steal.read(), at
        self._last, self._before = at, readings
        self._due = at + self.interval
        self._timer = self.loop.call_later(self.interval, self._tick)

    def _stalled(self, at: float, lag: float, readings: _Readings) -> None:
        start = self._last
        cpu_then, run_queue_then, process_then, page_ins_then, others_then = self._before  # type: ignore[misc]  # read by start()
        cpu_now, run_queue, process_now, page_ins, others_now = readings
        cpu = cpu_now - cpu_then
        others = process_now - process_then - cpu
        steal = None
        where = self._steal.cpu()
        stolen = self._steal.read()
        if where in stolen and where in self._stolen:
            steal = stolen[where] - self._stolen[where]
        self._stolen, self._stolen_at = stolen, at  # (the tick reads it again only later)
        gcs: dict[int, list[Any]] = {}
        for begun, end, g, collected in self.watch.overlapping(start, at):
            entry = gcs.setdefault(g, [g, 0, 0.0, 0.0, 0])
            entry[1] += 1
            entry[2] += min(end, at) - max(begun, start)
            entry[3] = max(entry[3], end - begun)
            entry[4] += collected
        jobs: dict[str, list[Any]] = {}
        for begun, end, name in self.jobs.overlapping(start, at) if self.jobs else ():
            entry = jobs.setdefault(name, [name, 0, 0.0])
            entry[1] += 1
            entry[2] += min(end, at) - max(begun, start)
        self.recorded += 1
        stall = Stall(
            id=self.recorded,
            wall=time.time(),
            at=at,
            lag=lag,
            window=at - start,
            cpu=cpu,
            run_queue=None if run_queue is None else run_queue - run_queue_then,  # type: ignore[operator]  # both read by the same probe, or neither
            others_cpu=max(0.0, others),
            others_run_queue=OtherThreads.longest(others_then, others_now),
            steal=steal,
            page_ins=page_ins - page_ins_then,
            gc=sorted(gcs.values()),
            jobs=list(jobs.values()),
        )
        stall.explain()
        self.stalls.append(stall)
        self.by_kind[stall.kind] = self.by_kind.get(stall.kind, 0) + 1
        self._log(stall, at)

    def _log(self, stall: Stall, at: float) -> None:
        if at - self._logged_at < LOG_EVERY:
            self._unlogged += 1
            return
        log.log(
            NOTICE,
            "event loop stalled %.1f ms: %s",
            stall.lag * 1000,
            stall.cause,
            extra={"stall": stall.id, "kind": stall.kind, "not_logged_since": self._unlogged},
        )
        self._logged_at = at
        self._unlogged = 0

    def take_max(self) -> float:
        """The longest stall since the last call (a scrape)."""
        lag, self.max_lag = self.max_lag, 0.0
        return lag

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._times is not None:
            self._times.close()
        if self._others is not None:
            self._others.close()


__all__ = [
    "GC_WATCH",
    "STALL_KINDS",
    "CpuSteal",
    "OtherThreads",
    "GcWatch",
    "JobTimes",
    "LoopLag",
    "Stall",
    "job_name",
]
