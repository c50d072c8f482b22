"""The compiled modules (setup.py) and their switch: which build runs, a stale one is never
used, and they run compiled together or not at all.

`make test` runs the whole suite compiled (when a C compiler is present,
ROARMQ_EXPECT_COMPILED=1 makes the build's absence a failure here) and the tests of the
compiled packages not marked slow again with ROARMQ_NO_EXTENSIONS=1, on the Python source
(the Makefile's PURE_PYTHON_TESTS, which must name every package a compiled module is in).
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

from machine import missing

import roarmq
from roarmq.protocol import frames

REPO = Path(__file__).resolve().parents[2]


def test_the_codec_runs_the_build_this_run_asked_for() -> None:
    origin = frames.__file__ or ""
    if roarmq.NO_EXTENSIONS:
        assert origin.endswith(".py"), origin
        assert "roarmq.protocol.frames" not in roarmq.compiled_modules()
    elif os.environ.get("ROARMQ_EXPECT_COMPILED"):
        assert origin.endswith(tuple(EXTENSION_SUFFIXES)), (
            f"{origin}: the codec is not compiled although a C compiler is present; "
            "see `make install`'s output for setup.py's reason"
        )
        for name in roarmq.COMPILED:
            importlib.import_module(name)
        assert [m for m in roarmq.compiled_modules() if m in roarmq.COMPILED] == sorted(
            roarmq.COMPILED
        )


def _origin(env: dict[str, str]) -> str:
    code = "import roarmq.protocol.frames as f; print(f.__file__)"
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        env={**os.environ, **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


def test_no_extensions_imports_the_source() -> None:
    env = {k: v for k, v in os.environ.items() if k != "ROARMQ_NO_EXTENSIONS"}
    assert _origin({**env, "ROARMQ_NO_EXTENSIONS": "1"}).endswith("frames.py")


def _pair(tmp_path: Path, compiled_newer: bool) -> None:
    source = tmp_path / "widget.py"
    built = tmp_path / f"widget{EXTENSION_SUFFIXES[0]}"
    source.write_text("VALUE = 1\n")
    built.write_bytes(b"not really a shared object")
    older, newer = (source, built) if compiled_newer else (built, source)
    os.utime(older, (1_000_000, 1_000_000))
    os.utime(newer, (2_000_000, 2_000_000))


def test_a_compiled_module_older_than_its_source_is_bypassed(tmp_path: Path, recwarn) -> None:
    _pair(tmp_path, compiled_newer=False)
    spec = roarmq._SourceFirst.find_spec("roarmq.widget", [str(tmp_path)])
    if roarmq.NO_EXTENSIONS:
        assert spec is not None and spec.origin == str(tmp_path / "widget.py")
        return
    assert spec is not None and spec.origin == str(tmp_path / "widget.py")
    assert any("is older than" in str(w.message) for w in recwarn.list)


def test_a_fresh_compiled_module_is_left_to_the_usual_import(tmp_path: Path) -> None:
    _pair(tmp_path, compiled_newer=True)
    spec = roarmq._SourceFirst.find_spec("roarmq.widget", [str(tmp_path)])
    if roarmq.NO_EXTENSIONS:
        assert spec is not None and spec.origin == str(tmp_path / "widget.py")
    else:
        assert spec is None  # the path finder then picks the extension module


def test_modules_outside_roarmq_are_not_touched(tmp_path: Path) -> None:
    _pair(tmp_path, compiled_newer=False)
    assert roarmq._SourceFirst.find_spec("widget", [str(tmp_path)]) is None
    assert roarmq._SourceFirst.find_spec("roarmq.widget", None) is None


def _copy_checkout(tmp_path: Path) -> Path:
    """The repository's importable part (roarmq/, protocol/, broker/, with whatever is
    compiled there) in a folder of its own: a checkout whose files a test may touch."""
    tree = tmp_path / "checkout"
    tree.mkdir()
    (tree / "pyproject.toml").write_text("")
    for folder in ("roarmq", "protocol", "broker"):
        shutil.copytree(REPO / folder, tree / folder, copy_function=shutil.copy2)
    return tree


def test_the_compiled_modules_run_together_or_not_at_all(tmp_path: Path) -> None:
    """One compiled module older than its .pxd (or its source) sends all of them to their
    source: a compiled channel would refuse an uncompiled queue's classes at import."""
    if not all(roarmq._built(str(REPO / path)) for path in roarmq.COMPILED.values()):
        missing(
            "the modules are not all compiled here (`make install` compiles them)",
            "ROARMQ_EXPECT_COMPILED",
        )
    tree = _copy_checkout(tmp_path)
    built = roarmq._built(str(tree / "broker" / "core" / "queue.py"))
    later = os.stat(built).st_mtime + 10
    os.utime(tree / "broker" / "core" / "queue.pxd", (later, later))
    code = (
        "import importlib, roarmq\n"
        "for name in roarmq.COMPILED: print(importlib.import_module(name).__file__)"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("ROARMQ_NO_EXTENSIONS", "PYTHONPATH")}
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        env={**env, "PYTHONPATH": str(tree)},
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    origins = out.stdout.split()
    assert len(origins) == len(roarmq.COMPILED)
    assert all(o.startswith(str(tree)) and o.endswith(".py") for o in origins), origins


def test_each_compiled_module_imports_first() -> None:
    """Whichever compiled module a program imports first, it imports: their .pxd files
    cimport one another's classes, so each one's init imports the others (a channel's needs
    the connection's, whose module must then not want channel's names half-made)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for name in [*roarmq.COMPILED, "roarmq.broker.server"]:
        subprocess.run(
            [sys.executable, "-W", "ignore", "-c", f"import {name}"],
            env=env,
            cwd=REPO,
            capture_output=True,
            timeout=60,
            check=True,
        )


def test_messages_in_flight_are_out_of_the_collectors_sight() -> None:
    """Compiled, a published message and its content header are not tracked by the garbage
    collector (they can be in no cycle: reference counting frees them), so a young-generation
    collection does not scan every message in flight again. They still read and free as ever."""
    import gc

    from roarmq.broker.core.message import Message
    from roarmq.protocol import spec
    from roarmq.protocol.frames import PROTOCOL_HEADER, FrameParser, encode_content
    from roarmq.protocol.properties import BasicProperties

    props = BasicProperties(headers={"a": [1, {"b": b"c"}]}, delivery_mode=2, priority=3)
    publish = spec.BasicPublish(exchange="x", routing_key="k")
    events = FrameParser().feed(PROTOCOL_HEADER + encode_content(1, publish, props, b"abc", 4096))
    header = events[-1].header
    msg = Message("x", "k", header, b"abc")
    compiled = not roarmq.NO_EXTENSIONS and bool(roarmq.compiled_modules())
    assert gc.is_tracked(header) is not compiled
    assert gc.is_tracked(msg) is not compiled
    assert msg.persistent and msg.priority == 3
    assert msg.header.properties.headers == {"a": [1, {"b": b"c"}]}
    import tracemalloc

    def made_and_dropped(n: int) -> None:
        for _ in range(n):
            feed = FrameParser().feed(
                PROTOCOL_HEADER + encode_content(1, publish, props, b"abc", 4096)
            )
            Message("x", "k", feed[-1].header, b"abc")

    made_and_dropped(100)  # caches warm (the decoded-properties dict)
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        made_and_dropped(2000)  # untracked, so only reference counting can free them
        left = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert left < 20_000, f"{left} bytes left behind by 2,000 messages"


def test_the_python_pass_covers_every_package_that_is_compiled() -> None:
    """A module added to COMPILED in a package whose tests the second pass does not run
    would be tested only as its compiled build."""
    makefile = (REPO / "Makefile").read_text()
    line = next(x for x in makefile.splitlines() if x.startswith("PURE_PYTHON_TESTS ?="))
    passes = set(line.split("?=", 1)[1].split())
    for path in roarmq.COMPILED.values():
        package = Path(path).parent.name  # protocol/frames.py -> protocol; broker/core/... -> core
        assert f"tests/{package}" in passes, (path, sorted(passes))
        assert (REPO / "tests" / package).is_dir(), package
