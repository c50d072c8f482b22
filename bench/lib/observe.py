"""What a benchmark watches while it measures: a broker's resident memory, RoarMQ's own
event-loop lag and stall log, and how busy the machine is (others share it).

``RssSampler`` samples VmRSS over a broker's process group in a thread; ``loop_lag_ms`` and
``stall_log`` read RoarMQ's ``/metrics`` gauge and ``GET /api/diagnostics/stalls``;
``machine_busy_s`` and ``machine_steal_s`` read /proc/stat, so that what other processes
used during a window can be told from what the benchmark's own processes used.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from lib.management_api import api
from lib.procs import group_pids

# -- resident memory -----------------------------------------------------------------


def vmrss(pid: int) -> int:
    """Resident memory of ``pid`` in bytes (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def group_rss(pgid: int) -> int:
    """Resident memory summed over the live processes of group ``pgid``, in bytes."""
    return sum(vmrss(pid) for pid in group_pids(pgid))


class RssSampler(threading.Thread):
    """VmRSS summed over a process group every ``period`` s; members re-listed every second."""

    def __init__(self, pgid: int, period: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pgid, self.period = pgid, period
        self.samples: list[tuple[float, int]] = []  # (monotonic, bytes)
        self._done = threading.Event()

    def run(self) -> None:
        pids: list[int] = []
        listed = 0.0
        while not self._done.is_set():
            now = time.monotonic()
            if now - listed > 1.0:
                pids, listed = group_pids(self.pgid), now
            self.samples.append((now, sum(vmrss(pid) for pid in pids)))
            self._done.wait(self.period)

    def stop(self) -> None:
        self._done.set()
        self.join(2)

    def at(self, t: float) -> int | None:
        """The last sample taken at or before ``t``."""
        before = [rss for when, rss in self.samples if when <= t]
        return before[-1] if before else None

    def peak(self, t0: float, t1: float) -> int | None:
        window = [rss for when, rss in list(self.samples) if t0 <= when <= t1]
        return max(window) if window else None


# -- RoarMQ's own event-loop lag probe and stall log ---------------------------------------

LAG_METRIC = "roarmq_event_loop_lag_max_seconds"


def loop_lag_ms(mgmt_port: int | None) -> float | None:
    """RoarMQ's ``roarmq_event_loop_lag_max_seconds`` in ms (max over label sets), if exported."""
    if not mgmt_port:
        return None
    try:
        url = f"http://127.0.0.1:{mgmt_port}/metrics"
        with urllib.request.urlopen(url, timeout=15) as reply:
            text = reply.read().decode()
    except (OSError, ValueError):
        return None
    values = [
        float(line.rsplit(None, 1)[1]) * 1000
        for line in text.splitlines()
        if line.startswith((LAG_METRIC + " ", LAG_METRIC + "{"))
    ]
    return max(values) if values else None


STALLS_PATH = "/api/diagnostics/stalls"


def stall_log(mgmt_port: int | None, since: int = 0) -> dict[str, Any] | None:
    """RoarMQ's GET /api/diagnostics/stalls (the stalls after id ``since``, each with what
    explains it; the jobs' and the collector's times), or None where it has none (another
    broker, an older tree, the probe off)."""
    if not mgmt_port:
        return None
    try:
        found = api(mgmt_port, "GET", f"{STALLS_PATH}?since={since}", timeout=15)
    except (OSError, ValueError):
        return None
    return found if found and found.get("probe_ms") else None


def stall_summary(stall: dict[str, Any]) -> str:
    """One stall in a few words: "16.2 ms GC gen1: 1 pass 15.8 ms"."""
    return f"{stall['lag_ms']:.1f} ms {stall['cause']}"


# -- the machine ---------------------------------------------------------------------


def machine_busy_s() -> float:
    """CPU seconds the whole machine was busy so far (/proc/stat, every CPU; idle and
    iowait excluded): with the CPU of the processes a benchmark knows, what others used."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def machine_steal_s() -> float:
    """CPU seconds the hypervisor kept this VM's CPUs from running so far (/proc/stat's
    steal, every CPU): a loop stall off CPU and out of the run queue may be this."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    return int(fields[7]) / os.sysconf("SC_CLK_TCK")


def loadavg() -> float:
    """The 1-minute load average (NaN where /proc/loadavg cannot be read)."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")


def settled_rss(sampler: RssSampler, quiet: float = 3.0, limit: float = 30.0) -> int:
    """Resident memory once it has moved less than 1% for `quiet` seconds (a broker may
    still be paging or collecting when the queue reports its count), at most `limit` s."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = time.monotonic()
        recent = [rss for when, rss in list(sampler.samples) if when >= now - quiet]
        if recent and max(recent) - min(recent) <= 0.01 * max(recent):
            break
    return sampler.samples[-1][1]
