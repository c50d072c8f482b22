"""The machine's own late wake-ups, witnessed by processes that do nothing else.

On the VMs here a sleeping thread's timer is now and then delivered late: a process that
only sleeps 1 ms at a time wakes 20 to 32 ms late, often on both virtual CPUs at once,
though it neither waited for a core (schedstat's run delay) nor was stolen from (/proc/stat).
`perf record -e sched:sched_switch,sched:sched_waking` shows the wake-up itself coming late,
while the task asleep in clock_nanosleep. The broker's stall probe (broker/ops/stalls.py)
can only call such a stall of its loop, asleep in epoll_wait past its timer, "blocked in a
system call", as it would a write of its own that blocked: the loop's own counters are the
same for both.

`TimerWitness` runs one witness process per CPU the caller may use, pinned to it, each
sleeping 1 ms at a time and recording each wake-up that came `FLOOR` or more late beyond
its own wait for a core: time the machine took from every sleeper on that CPU.
`late(start, end)` is the most any one witness lost inside a window of `time.perf_counter`
(CLOCK_MONOTONIC, the same clock in every process).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: A wake-up this much later than its sleep and its wait for a core is recorded (seconds).
FLOOR = 0.003

_WITNESS = """
import os, sys, time
cpu, path, floor = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
os.sched_setaffinity(0, {cpu})
stat = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
out = open(path, "w", buffering=1)
out.write("ready\\n")
def waited():
    return int(os.pread(stat, 64, 0).split()[1]) / 1e9
while True:
    before, slept = waited(), time.perf_counter()
    time.sleep(0.001)
    woke = time.perf_counter()
    lost = woke - slept - 0.001 - (waited() - before)
    if lost >= floor:
        out.write(f"{woke - lost:.6f} {woke:.6f}\\n")
"""


class TimerWitness:
    """One witness process per CPU of the caller's, while in a `with` block."""

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="timer-witness-"))
        self._procs: list[subprocess.Popen[bytes]] = []
        self.files: list[Path] = []

    def __enter__(self) -> TimerWitness:
        for cpu in sorted(os.sched_getaffinity(0)):
            path = self._dir / f"cpu{cpu}"
            self.files.append(path)
            self._procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", _WITNESS, str(cpu), str(path), str(FLOOR)],
                    stdin=subprocess.DEVNULL,
                )
            )
        deadline = time.monotonic() + 30
        while not all(p.exists() and p.read_text().startswith("ready") for p in self.files):
            assert all(proc.poll() is None for proc in self._procs), "a timer witness died"
            assert time.monotonic() < deadline, "the timer witnesses did not start in 30 s"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self._procs:
            proc.kill()
            proc.wait()
        for path in self.files:
            path.unlink(missing_ok=True)
        self._dir.rmdir()

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs]

    def intervals(self) -> list[list[tuple[float, float]]]:
        """Per witness, the (start, end) of each stretch its wake-up came late (the lines
        written whole: the last, after the final newline, may be under way)."""
        return [
            [(float(a), float(b)) for a, b in (line.split() for line in lines[1:-1])]
            for lines in (path.read_text().split("\n") for path in self.files)
        ]

    def late(self, start: float, end: float) -> float:
        """The most seconds one witness lost to late wake-ups inside [start, end]."""
        return max(
            (
                sum(max(0.0, min(b, end) - max(a, start)) for a, b in stretches)
                for stretches in self.intervals()
            ),
            default=0.0,
        )
