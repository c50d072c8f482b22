"""Real brokers in subprocesses, and real faults injected into their real system calls.

`BrokerProcess` runs `python -m roarmq` on its own loopback ports and data dir, so a test
can kill -9 it and start it again. `inject()` attaches Debian's strace to the running
broker and makes chosen system calls on chosen files fail (`strace -e inject=...`), for
as long as the `with` block lasts: the fault is real (the broker's own call into the
kernel returns the error), and it ends when strace detaches. `small_tmpfs()` mounts a
tmpfs of a few megabytes to fill up, where the machine lets us mount.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from machine import missing

from support.waiting import free_port

ROOT = Path(__file__).resolve().parents[2]
PERSISTENT = pika.BasicProperties(delivery_mode=2)
STRACE = shutil.which("strace")


class BrokerProcess:
    """`python -m roarmq` on a free port with its own data dir; management optional."""

    def __init__(
        self, data_dir: Path, port: int | None = None, *, extra: str = "", storage: str = ""
    ) -> None:
        """`storage`: lines for the [storage] section; `extra`: further sections."""
        self.data_dir = Path(data_dir)
        self.storage = storage
        self._port_given = port is not None
        self.port = port or free_port()
        self.mgmt_port = free_port()
        self.extra = extra
        self.proc: subprocess.Popen | None = None
        self.log = self.data_dir.parent / f"broker-{self.port}.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> BrokerProcess:
        """Start it and wait until its log says it serves (a port taken meanwhile by
        another test's process: new ports, up to five tries; a connection alone would
        reach whatever holds the port)."""
        for _ in range(5):
            if self._launch():
                return self
            self.port, self.mgmt_port = self.port if self._port_given else free_port(), free_port()
        raise AssertionError(f"broker did not start: {self.log.read_text()[-2000:]}")

    def _launch(self) -> bool:
        config = self.data_dir.parent / f"config-{self.port}.toml"
        config.write_text(
            '[amqp]\nbind = ["127.0.0.1"]\n'
            f'[management]\nenabled = true\nbind = "127.0.0.1"\nport = {self.mgmt_port}\n'
            "[storage]\nsegment_size = 1048576\n" + self.storage + "\n" + self.extra
        )
        start = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "roarmq",
                    "--config",
                    str(config),
                    "--port",
                    str(self.port),
                    "--data-dir",
                    str(self.data_dir),
                    "--log-level",
                    "info",
                ],
                stdout=out,
                stderr=out,
                cwd=ROOT,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with open(self.log, "rb") as f:
                f.seek(start)
                said = f.read().decode(errors="replace")
            if f"AMQP on 127.0.0.1 port {self.port}" in said:
                return True
            if self.proc.poll() is not None:
                assert "address already in use" in said, said
                return False
            time.sleep(0.02)
        raise AssertionError("broker did not start")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill9()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}"

    def api(self, path: str, method: str = "GET", body: object = None) -> tuple[int, object]:
        """(status, decoded JSON body) of a management API call as guest."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.mgmt_port}{path}", data=data, method=method
        )
        req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.mgmt_port}/metrics", timeout=10) as r:
            return r.read().decode()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def connect(port: int, **params: object) -> pika.BlockingConnection:
    options: dict[str, object] = {"socket_timeout": 10, "blocked_connection_timeout": 30}
    options.update(params)
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, **options))  # type: ignore[arg-type]


def drain(port: int, queue: str) -> list[tuple[bytes, bool]]:
    """Every message of a queue (auto-ack), with its redelivered flag."""
    conn = connect(port)
    ch = conn.channel()
    out = []
    while True:
        method, _, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        out.append((body, method.redelivered))
    conn.close()
    return out


def wait_for(check, timeout: float = 15.0, every: float = 0.05, what: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def _tracers(pid: int) -> set[int]:
    """The TracerPid of every thread of `pid`."""
    out = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status") as f:
                for line in f:
                    if line.startswith("TracerPid:"):
                        out.add(int(line.split()[1]))
        except FileNotFoundError:
            pass
    return out


def require_strace() -> str:
    if STRACE is None:
        pytest.fail("strace is not installed (make test installs Debian's strace)")
    return STRACE


@contextlib.contextmanager
def inject(pid: int, path: str | os.PathLike[str], *rules: str) -> Iterator[subprocess.Popen]:
    """Make system calls of `pid` on `path` fail while the block runs.

    `rules` are strace's: "fdatasync:error=EIO", "pwrite64:error=ENOSPC:when=3+"... Only
    calls whose file argument is `path` are touched (strace -P). The broker is untouched
    before strace has attached to every thread and after it has detached.
    """
    strace = require_strace()
    syscalls = sorted({r.split(":", 1)[0] for r in rules})
    args = [strace, "-f", "-qq", "-o", "/dev/null", "-p", str(pid), "-P", os.fspath(path)]
    args += ["-e", "trace=" + ",".join(syscalls)]
    for rule in rules:
        args += ["-e", f"inject={rule}"]
    tracer = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(
            lambda: _tracers(pid) == {tracer.pid} or tracer.poll() is not None,
            what="strace to attach",
        )
        if tracer.poll() is not None:
            raise AssertionError(f"strace failed: {tracer.stderr.read().decode()}")  # type: ignore[union-attr]
        yield tracer
    finally:
        if tracer.poll() is None:
            tracer.send_signal(signal.SIGINT)  # detaches from every thread and exits
            tracer.wait(10)
        with contextlib.suppress(FileNotFoundError):
            wait_for(lambda: _tracers(pid) == {0}, what="strace to detach")


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `where` (where mounting is not allowed, it needs root:
    the test is skipped saying why, or fails where `make test` runs as root)."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        missing(
            f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}", "ROARMQ_EXPECT_ROOT"
        )
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
