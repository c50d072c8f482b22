"""One real etcd member on free loopback ports with its own data dir (`.tools/etcd`: `make
tools` extracts it from Debian's etcd-server), started and stopped by its PID, never by name;
and where the binary is. Three members in network namespaces: etcd_cluster.py."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from machine import missing

from .waiting import free_port

ETCD = Path(__file__).resolve().parents[2] / ".tools" / "etcd"


def etcd_binary() -> str | None:
    if ETCD.exists():
        return str(ETCD)
    return shutil.which("etcd")


def etcd_binary_or_skip() -> str:
    """The etcd binary; without one the test fails under `make test` on a machine with
    apt-get (ROARMQ_EXPECT_TOOLS: our Makefile should have extracted it) and skips, saying
    why, elsewhere (`make check`, or a machine without apt-get)."""
    binary = etcd_binary()
    if binary is None:
        missing(
            ".tools/etcd is absent: `make tools` extracts it from Debian's etcd-server",
            "ROARMQ_EXPECT_TOOLS",
        )
    return binary


class Etcd:
    """One etcd member. `kill()` is kill -9; `start()` again reuses its data dir and ports."""

    def __init__(self, binary: str, data_dir: Path) -> None:
        self.binary = binary
        self.data_dir = data_dir
        self.client_port = free_port()
        self.peer_port = free_port()
        self.url = f"http://127.0.0.1:{self.client_port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data_dir.parent / "etcd.log"

    def start(self, timeout: float = 15.0) -> None:
        peer = f"http://127.0.0.1:{self.peer_port}"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    "--name=test",
                    f"--data-dir={self.data_dir}",
                    f"--listen-client-urls={self.url}",
                    f"--advertise-client-urls={self.url}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=test={peer}",
                    "--log-level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited ({self.proc.returncode}); see {self.log}")
            if self.healthy():
                return
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"etcd not healthy after {timeout} s; see {self.log}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=0.5) as resp:
                return b'"true"' in resp.read()
        except OSError:
            return False

    @contextlib.contextmanager
    def stalled_disk(self, longest: float = 30.0) -> Iterator[None]:
        """etcd's disk stalls while the block runs (as a busy machine's can for seconds):
        strace holds each fdatasync of its WAL (`longest` seconds at most), so a write sent
        meanwhile is applied only when the block ends, after a client whose timeout is
        shorter has given up on it, and reads wait behind it, as on a loaded etcd. When the
        block ends strace detaches and the held fsync goes on at once."""
        from .faultlib import inject  # strace; not for bench/lib, which imports this module

        assert self.proc is not None
        wal = sorted((self.data_dir / "member" / "wal").glob("*.wal"))[-1]  # the one written
        with inject(self.proc.pid, wal, f"fdatasync:delay_enter={round(longest * 1e6)}"):
            yield

    def value(self, key: str) -> object:
        """The JSON value etcd holds under `key` now (a linearizable read through our own
        client), or None: what a node's watch-fed cache shows may not have caught up yet."""
        import asyncio

        from roarmq.broker.cluster.etcd import EtcdClient

        async def get() -> object:
            async with EtcdClient([self.url]) as client:
                kv = await client.get(key)
                return json.loads(kv.value) if kv else None

        return asyncio.run(get())

    def kill(self) -> None:
        """kill -9 the etcd this object started, and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None
