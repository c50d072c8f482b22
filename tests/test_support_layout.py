"""The tests' own layout, read from their source with `ast`:

* a test module imports no other module of tests/ but tests/support/* and tests/machine.py
  (what tests share lives there; fixtures come from conftest.py by name, unimported);
* no test module, and no support module but tests/support/waiting.py, defines its own
  `free_port`, `until` or `wait_for` at module level (waiting.py has the one of each);
* `python -m roarmq` is started with `subprocess.Popen` only by
  tests/support/broker_process.py, and by the few tests in `OWN_POPEN` whose subject is the
  process's own command line or output (each with its reason).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SUPPORT = TESTS / "support"

#: Where a shared module may come from: tests/support/ and tests/machine.py.
SHARED = {"support", "machine"}

#: The waiting and port helpers waiting.py holds (their private spellings too).
WAITING = {"free_port", "until", "until_async", "wait_for"}
WAITING |= {"_" + name for name in WAITING}

#: Tests that start `python -m roarmq` with their own Popen on purpose, and why.
OWN_POPEN = {
    "amqp/test_lifecycle.py": "start-up and shutdown as an operator sees them: the broker's "
    "own stderr line by line and its exit code (one line and exit 1 for a data dir that "
    "is unusable or in use)",
    "ops/test_logs.py": "the log lines of a first boot and of a clean shutdown, read from "
    "the process's own stderr as it writes them",
    "cli/test_config_cli.py": "the daemon's command line itself: `python -m roarmq` and the "
    "`roarmq serve` console script, with the container's ROARMQ_DEFAULT_USER/_PASS "
    "environment, its first line on stderr and its exit code",
}


def _test_modules() -> Iterator[Path]:
    for path in sorted(TESTS.rglob("test_*.py")):
        if "node_modules" not in path.parts:
            yield path


def _local_names() -> set[str]:
    """The top-level names a module of tests/ can be imported by: each folder of tests/
    that is not a package is on sys.path while its tests run (pytest's `prepend` import
    mode); a package's modules are reached through it (support.waiting)."""
    names = {"tests"}
    for path in TESTS.rglob("*"):
        if {"node_modules", "__pycache__"} & set(path.parts):
            continue
        if (path.parent / "__init__.py").exists():
            continue
        if path.is_dir():
            names.add(path.name)
        elif path.suffix == ".py":
            names.add(path.stem)
    return names - {"__init__"}


def _rel(path: Path) -> str:
    return path.relative_to(TESTS).as_posix()


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def test_no_test_module_imports_another_module_of_tests():
    local = _local_names() - SHARED
    wrong = []
    for path in _test_modules():
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.level:
                wrong.append(f"{_rel(path)}:{node.lineno}: relative import")
                continue
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                if top in local or top.startswith("test_"):
                    wrong.append(f"{_rel(path)}:{node.lineno}: imports {name}")
    assert not wrong, "move what tests share into tests/support/:\n" + "\n".join(wrong)


def _module_level_names(tree: ast.Module) -> Iterator[tuple[str, int]]:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node.name, node.lineno
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        yield sub.id, node.lineno
        elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
            yield node.target.id, node.lineno


def test_nothing_but_waiting_py_defines_a_waiting_helper():
    paths = [*_test_modules(), *(p for p in SUPPORT.glob("*.py") if p.name != "waiting.py")]
    wrong = [
        f"{_rel(path)}:{line}: {name}"
        for path in paths
        for name, line in _module_level_names(_tree(path))
        if name in WAITING
    ]
    assert not wrong, "use tests/support/waiting.py's:\n" + "\n".join(wrong)


def _starts_roarmq_with_popen(tree: ast.Module) -> bool:
    """A Popen call in a module whose source spells `"-m", "roarmq"` in a list or tuple."""
    popen = any(
        isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Attribute) and node.func.attr == "Popen")
            or (isinstance(node.func, ast.Name) and node.func.id == "Popen")
        )
        for node in ast.walk(tree)
    )
    if not popen:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.List | ast.Tuple):
            words = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            if any(a == "-m" and b == "roarmq" for a, b in zip(words, words[1:], strict=False)):
                return True
    return False


def test_only_broker_process_and_the_listed_tests_popen_the_broker():
    paths = [*_test_modules(), *(p for p in SUPPORT.glob("*.py") if p.name != "broker_process.py")]
    starting = {_rel(path) for path in paths if _starts_roarmq_with_popen(_tree(path))}
    assert starting <= set(OWN_POPEN), (
        f"{sorted(starting - set(OWN_POPEN))}: start the broker with tests/support/"
        "broker_process.py's BrokerProcess, or list the test in OWN_POPEN with the reason it "
        "needs the raw process"
    )
    assert set(OWN_POPEN) <= starting, f"OWN_POPEN lists tests that no longer do: {OWN_POPEN}"
