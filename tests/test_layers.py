"""What each package may import (docs/architecture.md, "Packages"), read from the source:
every import statement, at any depth (a function-local import counts too)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the package `roarmq`'s directory


def _module_of(path: Path) -> str:
    parts = ["roarmq", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The roarmq modules `path` imports (a package's submodules named as such)."""
    me = _module_of(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("roarmq"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("roarmq"):
                found.add(target)
                found.update(f"{target}.{a.name}" for a in node.names)
    return found


def _sources(*packages: str) -> list[Path]:
    return sorted(p for package in packages for p in (ROOT / package).rglob("*.py"))


def _offending(paths: list[Path], allowed: tuple[str, ...]) -> dict[str, set[str]]:
    """Per module, the roarmq imports that are not (in) an allowed module or package."""

    def ok(name: str) -> bool:
        return any(name == a or name.startswith(a + ".") for a in allowed)

    bad = {str(p.relative_to(ROOT)): {n for n in _imports(p) if not ok(n)} for p in paths}
    return {k: v for k, v in bad.items() if v}


def _existing(names: set[str]) -> set[str]:
    """The names that are modules or packages (not names imported from a module)."""
    out = set()
    for name in names:
        rel = Path(*name.split(".")[1:])
        if (ROOT / rel).with_suffix(".py").exists() or (ROOT / rel / "__init__.py").exists():
            out.add(name)
    return out


def test_the_replicated_log_imports_only_the_segment_log():
    bad = _offending(
        _sources("broker/replog"),
        (
            "roarmq.broker.replog",
            "roarmq.broker.store.segments",
            "roarmq.broker.store.record_tags",
            "roarmq.broker.tasks",
        ),
    )
    assert not bad, bad


def test_the_store_knows_nothing_of_cluster_replication_or_management():
    bad = _offending(
        _sources("broker/store"),
        (
            "roarmq.broker.store",
            "roarmq.protocol",
            "roarmq.broker.errors",
            "roarmq.broker.logs",
            "roarmq.broker.message",  # a stored message is rebuilt as one
            "roarmq.broker.channel",  # confirms (for types)
            "roarmq.broker.queue",  # (for types)
            "roarmq.broker.stalls",  # (for types)
        ),
    )
    assert not bad, bad


def test_only_the_broker_and_the_cluster_page_import_the_cluster():
    """The core asks the `ClusterHooks` seam (broker/cluster_hooks.py); the cluster package
    is imported by the broker when `[cluster]` is configured, by the management page that
    moves vhosts, and by nothing else."""
    outside = [p for p in _sources("broker") if "cluster" not in p.relative_to(ROOT).parts[1:2]]
    importers = {
        str(p.relative_to(ROOT))
        for p in outside
        if any(
            n.startswith("roarmq.broker.cluster.") or n == "roarmq.broker.cluster"
            for n in _imports(p)
        )
    }
    assert importers <= {"broker/server.py", "broker/management/cluster.py"}, importers


def test_the_wire_protocol_imports_nothing_of_the_broker():
    bad = _offending(_sources("protocol"), ("roarmq.protocol",))
    assert not bad, bad


def test_the_rules_see_real_imports():
    """The scan finds what is there (a rule over nothing would pass)."""
    found = _imports(ROOT / "broker/replog/replication.py")
    assert "roarmq.broker.store.segments" in _existing(found)
    assert "roarmq.broker.replog.wire" in _existing(found)
