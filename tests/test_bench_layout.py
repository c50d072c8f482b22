"""bench/'s layout: scripts share code only through bench/lib/, and every script answers
--help.

A script is a ``bench/*.py``, run as ``python bench/X.py`` (so bench/ is first on its
``sys.path`` and a script's stem is an importable name); what two scripts share lives in
bench/lib/, which scripts import and which imports no script. Read from the source: every
import statement at any depth (a function-local import counts too). Then each script's
``--help``, run as a user runs it (in parallel: a few seconds in all).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
SCRIPTS = sorted(BENCH.glob("*.py"))
LIB = sorted((BENCH / "lib").glob("*.py"))
STEMS = {path.stem for path in SCRIPTS}


def imported(path: Path) -> set[str]:
    """The top-level names of every module ``path`` imports (absolute imports)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_scripts_and_the_lib_are_there():
    assert len(SCRIPTS) >= 20 and (BENCH / "lib" / "__init__.py") in LIB
    assert not {"lib"} & STEMS, "a script named lib.py would shadow bench/lib/"


def test_no_script_imports_another_script():
    found = {
        path.name: sorted(imported(path) & (STEMS - {path.stem}))
        for path in SCRIPTS
        if imported(path) & (STEMS - {path.stem})
    }
    assert not found, f"scripts importing scripts (move what they share into bench/lib/): {found}"


def test_lib_imports_no_script():
    found = {path.name: sorted(imported(path) & STEMS) for path in LIB if imported(path) & STEMS}
    assert not found, f"bench/lib/ modules importing scripts: {found}"


def test_every_script_takes_its_arguments_with_argparse():
    missing = [path.name for path in SCRIPTS if "argparse" not in imported(path)]
    assert not missing, f"scripts without argparse (so no --help): {missing}"


@pytest.fixture(scope="module")
def helps() -> dict[str, subprocess.CompletedProcess]:
    """``python bench/X.py --help`` of every script, as a user runs them, in parallel."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def run(path: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(path.relative_to(REPO)), "--help"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    with ThreadPoolExecutor(8) as pool:
        return dict(zip((p.name for p in SCRIPTS), pool.map(run, SCRIPTS), strict=True))


@pytest.mark.parametrize("name", [path.name for path in SCRIPTS])
def test_help(helps, name):
    done = helps[name]
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("usage:"), done.stdout + done.stderr
