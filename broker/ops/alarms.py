"""Resource alarms: the broker's memory and free disk space, watched from the loop.

RabbitMQ's rule, kept here: while an alarm is set every connection that
publishes is blocked (`connection.blocked`, its socket unread: `flow.ALARM`)
and consumers keep draining; the alarm clears once the resource is back under
its low mark. Memory is the process's resident set (what the kernel charges us,
not an estimate from message counts), sampled every `MEMORY_CHECK` seconds and
between samples raised by the bytes queued since, so a burst of large messages
cannot overshoot the watermark between two samples.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..server import Broker

log = logging.getLogger("roarmq.alarms")

MEMORY = "memory"
DISK = "disk"
#: Set by a cluster node whose lease is not confirmed (Broker.set_cluster_fenced).
CLUSTER = "cluster"

#: Seconds between resident-memory samples (reading /proc/self/statm costs ~10 us).
MEMORY_CHECK = 0.1
#: Seconds between free-disk samples.
DISK_CHECK = 2.0
#: Bytes the message store writes before the next free-disk sample, at the least.
DISK_STEP_MIN = 1 << 20
#: Bodies queued between two samples that make us check the estimate at once.
QUEUED_STEP = 4 * 1024 * 1024
#: The memory alarm clears under this fraction of the high watermark.
LOW_FRACTION = 0.9

_PAGE = os.sysconf("SC_PAGE_SIZE")


def total_memory() -> int:
    """Bytes of RAM on this machine (or the cgroup limit, when that is lower)."""
    total = _PAGE * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            total = int(text)
    return total


def resident_bytes() -> int:
    """The process's resident set size."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def watermark_bytes(value: int | float) -> int:
    """`[memory] high_watermark`: a fraction of RAM (0 < x <= 1) or bytes."""
    if isinstance(value, float) or value <= 1:
        return int(total_memory() * float(value))
    return int(value)


def _malloc_trim() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


class ResourceMonitor:
    """Sets and clears the broker's memory and disk alarms."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.high = watermark_bytes(broker.config.memory.high_watermark)
        self.low = int(self.high * LOW_FRACTION)
        self.disk_limit = broker.config.storage.disk_free_limit
        self.data_dir = broker.config.storage.data_dir
        self.rss = resident_bytes()
        self.disk_free: int | None = None
        self._queued_at_sample = 0
        self._trim = _malloc_trim()
        self._timers: dict[str, Any] = {}

    def start(self) -> None:
        self._check_memory()
        self._check_disk()

    def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def _later(self, which: str, delay: float, callback: Any) -> None:
        # The real loop, not broker.clock: a VirtualClock must not stop resource checks.
        self._timers[which] = self.broker.clock.loop.call_later(delay, callback)

    # -- memory ---------------------------------------------------------------------------

    def estimate(self) -> int:
        """Resident memory now: the last sample plus bodies queued since."""
        grown = self.broker.queued_bytes - self._queued_at_sample
        return self.rss + grown if grown > 0 else self.rss

    def _check_memory(self) -> None:
        broker = self.broker
        alarmed = MEMORY in broker.alarms
        if alarmed and self._trim is not None and self.rss >= self.low:
            self._trim(0)  # hand freed heap back to the kernel, or RSS never falls
        self.rss = resident_bytes()
        self._queued_at_sample = broker.queued_bytes
        broker.memory_check_at = broker.queued_bytes + QUEUED_STEP
        if not alarmed and self.rss > self.high:
            broker.set_alarm(MEMORY, True, used=self.rss, limit=self.high)
        elif alarmed and self.rss < self.low:
            broker.set_alarm(MEMORY, False, used=self.rss, limit=self.high)
        self._later(MEMORY, MEMORY_CHECK, self._check_memory)

    def queued_grew(self) -> None:
        """Bodies were queued: set the alarm now if they push the estimate over the mark."""
        self.broker.memory_check_at = self.broker.queued_bytes + QUEUED_STEP
        if MEMORY in self.broker.alarms:
            return
        estimate = self.estimate()
        if estimate > self.high:
            self.broker.set_alarm(MEMORY, True, used=estimate, limit=self.high)

    # -- disk -----------------------------------------------------------------------------

    def check_disk_now(self) -> None:
        """Sample free disk space now (a write failed, or much was written since)."""
        timer = self._timers.pop(DISK, None)
        if timer is not None:
            timer.cancel()
        self._check_disk()

    def _check_disk(self) -> None:
        broker = self.broker
        try:
            st = os.statvfs(self.data_dir)
        except OSError:
            self._later(DISK, DISK_CHECK, self._check_disk)
            return
        self.disk_free = free = st.f_bavail * st.f_frsize
        store = broker.store
        if store is not None:
            # Between samples the store's own writes are what eat the disk: sample again
            # as soon as it has written half the room left above the limit, so publishers
            # are blocked before the disk is full even when it fills within one period.
            room = max(free - self.disk_limit, 0)
            store.disk_check_at = store.log.bytes_written + max(room // 2, DISK_STEP_MIN)
        alarmed = DISK in broker.alarms
        if not alarmed and free < self.disk_limit:
            broker.set_alarm(DISK, True, used=free, limit=self.disk_limit)
        elif alarmed and free >= self.disk_limit:
            broker.set_alarm(DISK, False, used=free, limit=self.disk_limit)
        # Sample faster when close to the limit, as RabbitMQ does.
        near = free < 4 * self.disk_limit
        self._later(DISK, DISK_CHECK / 10 if near else DISK_CHECK, self._check_disk)


__all__ = [
    "DISK",
    "MEMORY",
    "ResourceMonitor",
    "resident_bytes",
    "total_memory",
    "watermark_bytes",
]
