"""What the scripts print and write: figures as text, Markdown tables, the JSON results file
(bench/results/ by default), and the JSON lines their child processes print.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import queue
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

# -- a child's JSON lines ------------------------------------------------------------------


def read_json_lines(proc: subprocess.Popen, lines: queue.Queue) -> None:
    """Put every JSON line ``proc`` prints into ``lines`` (others are passed over), then
    None once its stdout closes: run it in a thread."""
    for line in proc.stdout:  # type: ignore[union-attr]
        with contextlib.suppress(ValueError):
            lines.put(json.loads(line))
    lines.put(None)


def next_json_line(lines: queue.Queue, deadline: float) -> dict | None:
    """The next line ``read_json_lines`` put, or None at ``deadline`` (time.monotonic)."""
    try:
        return lines.get(timeout=max(0.0, deadline - time.monotonic()))
    except queue.Empty:
        return None


# -- figures as text -----------------------------------------------------------------------


def number(value: Any) -> float | None:
    """``value`` as a float; None for None and NaN (what JSON cannot hold)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)


def fmt(value: float | None, digits: int) -> str:
    """``value`` with thousands separators and ``digits`` decimals; "-" for None."""
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def markdown_table(head: Sequence[str], rows: Iterable[Sequence[Any]], align: str = "") -> str:
    """A Markdown table: ``head``'s titles, then each row's cells (``str()`` of each).
    ``align`` has a letter a column, ``l`` or ``r`` (figures); columns past it are left."""
    marks = ["---:" if a == "r" else "---" for a in align.ljust(len(head), "l")[: len(head)]]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(marks) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


# -- the results file ----------------------------------------------------------------------


def write_json(path: Path, result: Any, *, indent: int = 2, default: Any = None) -> None:
    """Write ``result`` to ``path`` as JSON (its folder made if need be)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=indent, default=default) + "\n")


def read_json(path: Path) -> dict[str, Any]:
    """An earlier results file (a script that runs some parts keeps the others' last
    figures), or {} where there is none or it does not parse."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def command_line() -> str:
    """How this script was run, as a shell would take it back (``python bench/X.py ...``)."""
    return " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])


def write_results(path: Path, rows: list[dict[str, Any]]) -> None:
    """The usual results file: how the script was run, the machine, its rows."""
    from .machine import machine_info

    write_json(
        path, {"command": command_line(), "machine": machine_info(), "results": rows}, indent=1
    )
    print(f"wrote {path}")


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """A script's arguments for its results file: all but ``json`` (where the file goes),
    paths as text."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "json"}
