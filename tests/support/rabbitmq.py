"""A RabbitMQ node of a test's own, to hold RoarMQ's answers against RabbitMQ's.

RoarMQ follows RabbitMQ 3.10.8's observable behaviour; a parity test runs the same client
steps against both and asserts the same answers, so the expectation is proven on the real
thing and not only written down. The node is bench/lib/brokers.py's `start_rabbitmq` (one
launcher for the benchmarks and the tests): its own node name, Erlang cookie, data and log
under a temp dir, AMQP, distribution and epmd on free loopback ports, every process it
spawned in one process group that `stop_broker` ends by its id. Skips when RabbitMQ is not
installed here (fails instead where `make test` installs it: tests/machine.py's rule), or
is another version than the one the expectations were probed on.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from machine import missing

BENCH = Path(__file__).resolve().parents[2] / "bench"
#: The version RoarMQ's expectations were probed on.
VERSION = "3.10.8"


@dataclass(frozen=True)
class RabbitNode:
    port: int
    version: str
    stream_port: int | None = None  # with its rabbitmq_stream plugin, when asked for
    mgmt_port: int | None = None  # with its management plugin, when asked for
    running: Any = None  # bench/lib/brokers.py's Running: what `ctl` needs

    def ctl(self, *args: str) -> str:
        """`rabbitmqctl ARGS` against this node (stop_app, start_app, ...)."""
        from lib.brokers import rabbitmqctl

        return rabbitmqctl(self.running, *args)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"


@contextlib.contextmanager
def rabbitmq_node(
    tmp: Path,
    *,
    version: str = VERSION,
    streams: bool = False,
    management: bool = False,
    plugins: tuple[str, ...] = (),
) -> Iterator[RabbitNode]:
    """A running RabbitMQ node, stopped (its whole process group) on exit; `streams`: with
    its stream plugin on a port of its own (`stream_port`); `management`: its HTTP API
    (`mgmt_port`); `plugins`: more plugins enabled."""
    if str(BENCH) not in sys.path:
        sys.path.append(str(BENCH))  # after everything else: bench's scripts shadow nothing
    from lib.brokers import rabbit_server, start_rabbitmq, stop_broker
    from lib.procs import Procs

    if rabbit_server() is None:
        missing("rabbitmq-server is not installed", "ROARMQ_EXPECT_PACKAGES")
    procs = Procs()
    running = start_rabbitmq(
        procs,
        tmp,
        nodename=f"roartest{os.getpid()}",
        streams=streams,
        management=management,
        plugins=plugins,
    )
    try:
        if running.version != version:
            pytest.skip(f"RabbitMQ {running.version} here; the expectations are {version}'s")
        yield RabbitNode(
            running.port, running.version, running.stream_port, running.mgmt_port, running
        )
    finally:
        stop_broker(procs, running)
