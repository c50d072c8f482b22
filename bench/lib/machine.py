"""The machine facts every benchmark writes next to its figures, and the tree it measured.

``machine_info`` (nproc, CPU, Python, platform, load average, plus a script's own facts) and
``tree_state`` (the commit, and the broker's files that differ from it: other engineers edit
the tree while benchmarks run).
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from lib import REPO


def cpu_model() -> str:
    """/proc/cpuinfo's first "model name" ("unknown" elsewhere)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def loadavg_line() -> str:
    """/proc/loadavg as it reads now ("" elsewhere)."""
    with contextlib.suppress(OSError):
        return Path("/proc/loadavg").read_text().strip()
    return ""


def machine_info(**extra: Any) -> dict[str, Any]:
    """nproc, CPU model, Python, platform and load average, plus a script's own ``extra``."""
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg": loadavg_line(),
        **extra,
    }


def machine_with_versions(versions: dict[str, str]) -> dict[str, Any]:
    """``machine_info`` with uvloop's version and each broker's (``{kind}_version``)."""
    try:
        import uvloop

        uv = uvloop.__version__
    except ImportError:
        uv = None
    return machine_info(uvloop=uv, **{f"{k}_version": v for k, v in versions.items()})


def tree_state() -> str:
    """The commit measured, and the files of the broker's code that differ from it (other
    engineers edit the tree while benchmarks run)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--short", "--", "broker", "protocol", "roarmq"],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.split("\n")
    except OSError:
        return "?"
    changed = [line[3:] for line in dirty if line.strip()]
    return head + (f" + uncommitted changes to {', '.join(changed)}" if changed else "")
