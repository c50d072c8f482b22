"""The machine facts every benchmark writes next to its figures (one place for all scripts)."""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path
from typing import Any


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
    try:
        import uvloop

        uv = uvloop.__version__
    except ImportError:
        uv = None
    return machine_info(uvloop=uv, **{f"{k}_version": v for k, v in versions.items()})
