"""What each package may import at run time (docs/architecture.md, "Packages"), read from
the source: every import statement at any depth (a function-local import counts too);
imports only for type checking (under `if TYPE_CHECKING:`) are free. And no module imports
itself back through others."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the package `roarmq`'s directory
TOP = {"broker": "roarmq.broker", "protocol": "roarmq.protocol", "pipeline": "roarmq.pipeline"}

#: Package (or top-level module) of roarmq.broker -> what it may import of roarmq.broker at
#: run time besides itself, errors.py and config.py. "*" is anything.
ALLOWED: dict[str, tuple[str, ...]] = {
    "": (),  # the package itself: its version
    "errors": (),
    "config": (),
    "ops": (),
    "routing": (),
    "store": ("ops", "core.message"),  # core.message: the messages it rebuilds
    "replog": ("store.segments", "store.record_tags", "ops.tasks"),
    "core": ("ops", "routing", "store", "cluster_hooks"),
    "amqp": ("ops", "routing", "store", "core", "cluster_hooks"),
    "stream_protocol": ("ops", "routing", "store", "core", "amqp.tls", "cluster_hooks"),
    "links": ("ops", "routing", "store", "core", "amqp", "cluster_hooks"),
    "cluster_hooks": (),
    "archive": ("ops",),
    "cluster": ("ops", "routing", "store", "core", "amqp", "cluster_hooks", "replog"),
    "management": ("*",),
    "cli": ("*",),
    "server": ("*",),
    "testing": ("*",),
    "__main__": ("*",),
}


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = [*TOP[rel.parts[0]].split("."), *rel.with_suffix("").parts[1:]]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _exists(name: str) -> bool:
    rel = ROOT / Path(*name.split(".")[1:])
    return rel.with_suffix(".py").exists() or (rel / "__init__.py").exists()


def _imports(path: Path, *, types: bool = False) -> set[str]:
    """The roarmq modules and packages `path` imports at run time (and for types too if
    `types`): `from p import m` names the module p.m when there is one, else p."""
    me = _module_of(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    typing_only: set[int] = set()
    if not types:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                typing_only.update(id(sub) for sub in ast.walk(node))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("roarmq"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("roarmq"):
                continue
            modules = {f"{target}.{a.name}" for a in node.names} - {me}
            modules = {m for m in modules if _exists(m)}
            found.update(modules or {target})
    return found - {me}


def _sources(*packages: str) -> list[Path]:
    return sorted(p for package in packages for p in (ROOT / package).rglob("*.py"))


def _unit(module: str) -> str:
    """The ALLOWED key a roarmq.broker module belongs to."""
    return module.split(".")[2] if module.count(".") >= 2 else ""


def test_each_package_imports_only_what_its_layer_allows():
    bad: dict[str, set[str]] = {}
    for path in _sources("broker"):
        me = _module_of(path)
        unit = _unit(me)
        allowed = ALLOWED[unit]
        if "*" in allowed:
            continue
        for name in _imports(path):
            if not name.startswith("roarmq.broker.") or _unit(name) in (unit, "errors", "config"):
                continue
            rest = name[len("roarmq.broker.") :]
            if not any(rest == a or rest.startswith(a + ".") for a in allowed):
                bad.setdefault(str(path.relative_to(ROOT)), set()).add(rest)
    assert not bad, bad


def test_every_broker_package_has_a_rule():
    units = {_unit(_module_of(p)) for p in _sources("broker")}
    units -= {"www"}  # files the management server serves, no Python
    assert units <= set(ALLOWED), units - set(ALLOWED)


def test_only_the_broker_and_the_cluster_page_import_the_cluster():
    """The core asks the `ClusterHooks` seam (broker/cluster_hooks.py); the cluster package
    is imported by the broker when `[cluster]` is configured, by the management page that
    moves vhosts, and by nothing else."""
    importers = {
        str(p.relative_to(ROOT))
        for p in _sources("broker")
        if _unit(_module_of(p)) != "cluster"
        and any(_unit(n) == "cluster" for n in _imports(p, types=True))
    }
    assert importers <= {"broker/server.py", "broker/management/cluster.py"}, importers


def test_the_wire_protocol_imports_nothing_of_the_broker():
    bad = {
        str(p): names
        for p in _sources("protocol")
        if (names := {n for n in _imports(p, types=True) if not n.startswith("roarmq.protocol")})
    }
    assert not bad, bad


def test_no_module_imports_itself_back():
    """No cycle among modules at run time (a package's own __init__ aside: it imports its
    modules, which name their package to reach their siblings)."""
    graph = {}
    for path in _sources("broker", "protocol"):
        me = _module_of(path)
        graph[me] = {n for n in _imports(path) if not me.startswith(n + ".")}
    cycles = _cycles(graph)
    assert not cycles, cycles


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = itertools.count()

    def visit(v: str) -> None:
        index[v] = low[v] = next(counter)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def test_the_rules_see_real_imports_and_cycles():
    """The scan finds what is there (a rule over nothing would pass)."""
    found = _imports(ROOT / "broker/replog/replication.py")
    assert {"roarmq.broker.store.segments", "roarmq.broker.replog.wire"} <= found
    channel = _imports(ROOT / "broker/amqp/channel.py")
    assert "roarmq.broker.core.queue" in channel
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
