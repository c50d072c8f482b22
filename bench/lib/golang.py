"""The Go load generator (bench/go: standard library only, Debian's golang-go): built once per
run into a temporary directory, then run as child processes that take a JSON spec (a role:
load, probe, capacity, a bad client) and speak JSON lines (overload.py, topic_go.py,
cluster.py, cluster_profile.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from lib import REPO
from lib.output import next_json_line, read_json_lines
from lib.procs import Procs, pinned, sweep

GO_GENERATOR = REPO / "bench" / "go"


def build_load_generator(out_dir: Path, needed_by: str) -> tuple[Path, str]:
    """Compile bench/go into ``out_dir``; (the binary, ``go version``). ``needed_by`` names
    the script in the error."""
    go = shutil.which("go") or "/usr/lib/go/bin/go"
    if not os.access(go, os.X_OK):
        raise SystemExit(f"{needed_by} needs Go: apt-get install golang-go")
    binary = out_dir / "roarmq-load"
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOCACHE": str(out_dir / "gocache")}
    build = subprocess.run(
        [go, "build", "-o", str(binary), "."],
        cwd=GO_GENERATOR,
        capture_output=True,
        text=True,
        env=env,
    )
    if build.returncode != 0:
        raise SystemExit(f"go build in bench/go failed:\n{build.stderr}")
    version = subprocess.run([go, "version"], capture_output=True, text=True).stdout.strip()
    return binary, version


class Child:
    """A generator process (pinned to the load core): JSON lines out, commands in."""

    def __init__(self, procs: Procs, binary: Path, spec: dict[str, Any], cpu: int | None) -> None:
        self.procs = procs
        self.instance = uuid.uuid4().hex
        self.lines: queue.Queue = queue.Queue()
        self.proc = procs.start(
            pinned(cpu, [str(binary), json.dumps(spec)]),
            instance=self.instance,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=read_json_lines, args=(self.proc, self.lines), daemon=True).start()

    def line(self, timeout: float) -> dict[str, Any] | None:
        """The next JSON line within ``timeout`` s (None on timeout or exit)."""
        return next_json_line(self.lines, time.monotonic() + timeout)

    def expect(self, key: str, timeout: float) -> dict[str, Any]:
        """The next line, which must carry ``key`` (else RuntimeError with what came)."""
        got = self.line(timeout)
        if not got or key not in got:
            raise RuntimeError(f"expected {key!r} from the generator, got {got}")
        return got

    def tell(self, text: str | None) -> None:
        """Write a line to its stdin, or close stdin (None)."""
        with contextlib.suppress(OSError, ValueError):
            if text is None:
                self.proc.stdin.close()  # type: ignore[union-attr]
            else:
                self.proc.stdin.write(text + "\n")  # type: ignore[union-attr]
                self.proc.stdin.flush()  # type: ignore[union-attr]

    def stop(self) -> None:
        self.procs.stop(self.proc, grace=5)
        sweep(self.instance)
