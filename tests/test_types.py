"""The packages pyproject.toml's [tool.mypy] names type-check clean (`make typecheck`),
so a change that breaks their types fails the suite, not only `make lint`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # seconds; the same in both builds: run once

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_is_clean_over_the_typed_packages(tmp_path):
    tree = tmp_path / "roarmq"  # the folders at their import names, as installed
    tree.mkdir()
    for folder in ("broker", "protocol", "pipeline"):
        (tree / folder).symlink_to(ROOT / folder)
    (tree / "__init__.py").symlink_to(ROOT / "roarmq" / "__init__.py")
    env = {**os.environ, "MYPYPATH": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Success" in run.stdout
