"""The live fuzzer's short run: hostile connections for 30 s beside a well-behaved client.

fuzz/live.py starts its own broker; the run fails on a 541, an error or traceback in the
broker's log, a lost confirmed message or a good client that lost its connection. The long
run and its result are in docs/security.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# slow (a 30 s fuzzer session): `make check` leaves it out
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_live_fuzz_short_run(tmp_path: Path) -> None:
    summary = tmp_path / "fuzz.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "fuzz" / "live.py"),
            "--seconds",
            "30",
            "--seed",
            "make-test",
            "--concurrency",
            "6",
            "--crash-dir",
            str(tmp_path / "crashes"),
            "--json",
            str(summary),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(summary.read_text())
    # The run must have reached the broker in every way, not failed politely at the door.
    assert result["connections_total"] > 100
    assert set(result["connections"]) == {
        "valid",
        "mutate",
        "sequence",
        "values",
        "random",
        "stream",
    }
    assert any(code.startswith("channel ") for code in result["closes"])
    assert any(code.startswith("stream ") for code in result["closes"])  # the stream port too
    assert result["good_client"]["confirmed"] > 100
