"""A process a test started and controls by its PID: kill -9, SIGSTOP/SIGCONT, SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import time


class ControlledProcess:
    """`proc` is set by the subclass's start(); `frozen` says whether it is SIGSTOPped."""

    #: Seconds `stop` waits after SIGTERM before SIGKILL.
    STOP_GRACE = 10.0

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.frozen = False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """kill -9 and reap."""
        if self.running:
            os.kill(self.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
            self.proc.wait(10)  # type: ignore[union-attr]
        self.frozen = False

    def stop(self, grace: float | None = None) -> None:
        """SIGTERM (a frozen process woken first, so that it can stop), SIGKILL after
        `grace` seconds (STOP_GRACE)."""
        grace = self.STOP_GRACE if grace is None else grace
        if self.running:
            self.thaw()
            os.kill(self.proc.pid, signal.SIGTERM)  # type: ignore[union-attr]
            try:
                self.proc.wait(grace)  # type: ignore[union-attr]
            except subprocess.TimeoutExpired:
                self.kill9()

    def freeze(self) -> None:
        """SIGSTOP, and return once every thread of it is stopped: the signal is only
        pending when kill() returns, and a thread on the other core runs on until the
        kernel stops it (a test that goes on at once could see it answer)."""
        if self.running:
            pid = self.proc.pid  # type: ignore[union-attr]
            os.kill(pid, signal.SIGSTOP)
            self.frozen = True
            deadline = time.monotonic() + 10
            while not _all_stopped(pid):
                if time.monotonic() > deadline:
                    raise AssertionError(f"pid {pid} not stopped 10 s after SIGSTOP")
                time.sleep(0.001)

    def thaw(self) -> None:
        if self.running:
            os.kill(self.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
        self.frozen = False


def _all_stopped(pid: int) -> bool:
    """Whether every thread of `pid` is in state T (stopped), from /proc; a thread that
    exits meanwhile is not waited for."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        if state not in ("T", "t"):
            return False
    return True


def process_rss(pid: int) -> int:
    """A process's resident memory (VmRSS), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")
