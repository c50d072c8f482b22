"""The broker a stream-protocol test talks to: RoarMQ (the in-process `broker`), or, for
the tests parametrized with `target`, also RabbitMQ 3.10.8 with its rabbitmq_stream plugin
(one node for the module, marked `slow`), so that what the test expects is what RabbitMQ
does. Tests of what 3.10.8 lacks (super streams, filtering, single active consumer: 3.11+)
run against RoarMQ alone and follow RabbitMQ's documentation for the version that has it."""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.rabbitmq import BENCH, VERSION


@dataclass(frozen=True)
class RabbitStreams:
    port: int
    stream_port: int

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"


@contextlib.contextmanager
def rabbitmq_with_streams(tmp: Path) -> Iterator[RabbitStreams]:
    if str(BENCH) not in sys.path:
        sys.path.append(str(BENCH))
    from lib.brokers import rabbit_server, start_rabbitmq, stop_broker
    from lib.procs import Procs

    if rabbit_server() is None:
        pytest.skip("rabbitmq-server is not installed")
    procs = Procs()
    running = start_rabbitmq(procs, tmp, nodename=f"roarstream{os.getpid()}", streams=True)
    try:
        if running.version != VERSION:
            pytest.skip(f"RabbitMQ {running.version} here; the expectations are {VERSION}'s")
        assert running.stream_port is not None
        yield RabbitStreams(running.port, running.stream_port)
    finally:
        stop_broker(procs, running)


@pytest.fixture(scope="module")
def rabbitmq(tmp_path_factory):
    with rabbitmq_with_streams(tmp_path_factory.mktemp("rabbitmq")) as node:
        yield node


@pytest.fixture(params=["roarmq", pytest.param("rabbitmq", marks=pytest.mark.slow)])
def target(request):
    """RoarMQ (an in-process broker of the test's own) or RabbitMQ 3.10.8 (the module's
    node): both have `url`, `port` and `stream_port`."""
    if request.param == "rabbitmq":
        return request.getfixturevalue("rabbitmq")
    return request.getfixturevalue("broker")


@pytest.fixture
def name() -> str:
    """A stream name of the test's own (the RabbitMQ node serves the whole module)."""
    return "s" + uuid.uuid4().hex[:12]
