"""The processes a benchmark starts, and what it reads of a process group from /proc.

Every process is started in a session (so a process group) of its own and tagged with
``MARKER`` in its environment, so that everything it spawned (epmd and friends detach) can be
swept away on every exit path; ``group_cpu_s`` and ``group_pids`` read a group's CPU time and
members, ``pinned`` puts a command on one CPU.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from lib import REPO

MARKER = "ROARBENCH_INSTANCE"  # env var tagging every process we start, for the final sweep


class Procs:
    """Every process we start: own session (so a process group), tagged with MARKER."""

    def __init__(self) -> None:
        self.live: list[subprocess.Popen] = []

    def start(
        self,
        cmd: list[str],
        *,
        instance: str,
        env: dict[str, str] | None = None,
        cwd: Path = REPO,
        **kw: Any,
    ) -> subprocess.Popen:
        full_env = dict(os.environ if env is None else env)
        full_env[MARKER] = instance
        proc = subprocess.Popen(cmd, env=full_env, start_new_session=True, cwd=cwd, **kw)
        self.live.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen, grace: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL it after ``grace`` seconds."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # the group may outlive its leader
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc in self.live:
            self.live.remove(proc)

    def stop_all(self) -> None:
        for proc in list(self.live):
            self.stop(proc, grace=3.0)


def sweep(instance: str) -> int:
    """SIGKILL any process still carrying our instance tag (epmd and friends detach)."""
    needle = f"{MARKER}={instance}".encode()
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
    return killed


def _group_stats(pgid: int) -> list[tuple[int, list[str]]]:
    """(pid, /proc/PID/stat's fields after the command) of every live process of ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # pgrp
            found.append((int(entry.name), fields))
    return found


def group_pids(pgid: int) -> list[int]:
    """The live processes of group ``pgid``."""
    return [pid for pid, _ in _group_stats(pgid)]


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) used so far by the live processes of group ``pgid``."""
    ticks = sum(int(fields[11]) + int(fields[12]) for _, fields in _group_stats(pgid))
    return ticks / os.sysconf("SC_CLK_TCK")  # utime + stime


def pinned(cpu: int | None, cmd: list[str]) -> list[str]:
    """``cmd`` on CPU ``cpu`` (``taskset``), or as it is with None."""
    return cmd if cpu is None else ["taskset", "-c", str(cpu), *cmd]
