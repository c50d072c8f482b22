"""RoarMQ as another revision: ``git archive REV`` unpacked and built as its ``make install``
would, to run as the "before" of a before/after (``--roarmq-rev`` of overload.py, topic_go.py)
while the work tree changes; lib/brokers.py runs it with ``src=`` that tree.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lib import REPO


def export_rev(rev: str, into: Path, compiled: bool = True) -> Path:
    """``git archive rev`` unpacked into ``into``: a RoarMQ tree to run as a "before".

    With ``compiled`` (the default) the tree's own ``COMPILED`` modules are built beside
    their sources, as its ``make install`` would (``build_in_place``): without them a
    revision runs as pure Python, and a before/after would compare the source of one with
    the build of the other. Copying this checkout's ``.so`` files instead is no better: they
    run together or not at all (``roarmq/__init__.py``), so one from another revision sends
    the whole group back to its source.
    """
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"git archive {rev}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    if compiled:
        build_in_place(into)
    return into


def build_in_place(tree: Path) -> None:
    """Compile ``tree``'s ``COMPILED`` modules (its ``roarmq/__init__.py``) with this venv's
    Cython and ``cc``, as its setup.py would: the tree's own ``.pxd`` files, annotations not
    typed. Raises ``SystemExit`` naming the module that would not build."""
    init = (tree / "roarmq" / "__init__.py").read_text()
    modules: dict[str, str] = {}
    for node in ast.parse(init).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "COMPILED":
            modules = ast.literal_eval(node.value)
    include = tree / "build" / "cython-include" / "roarmq"  # .pxd files by their full names
    include.mkdir(parents=True, exist_ok=True)
    for package in ("protocol", "broker"):
        (include / package).symlink_to(tree / package)
    cython = Path(sys.executable).with_name("cython")
    headers = sysconfig.get_paths()["include"]
    suffix = sysconfig.get_config_var("EXT_SUFFIX")

    def build(item: tuple[str, str]) -> None:
        name, source = item
        base = tree / source.removesuffix(".py")
        steps = [
            [str(cython), "-3", "-X", "annotation_typing=False", "-I", str(include.parent)]
            + ["--module-name", name, str(tree / source), "-o", f"{base}.c"],
            ["cc", "-shared", "-fPIC", "-O2", "-fwrapv", "-DNDEBUG", f"-I{headers}"]
            + [f"{base}.c", "-o", f"{base}{suffix}"],
        ]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"building {name} of {tree}: {done.stderr.strip()[-2000:]}")

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(build, modules.items()))
