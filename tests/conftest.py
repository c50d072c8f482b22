"""Shared fixtures: real brokers on ephemeral loopback ports."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.etcd import Etcd, etcd_binary_or_skip
from support.rabbitmq import rabbitmq_node
from support.rawclient import RawClient

from roarmq.broker.ops.clock import VirtualClock
from roarmq.broker.testing import BrokerThread, ephemeral_config, running_broker

pytest_plugins = ["pytester"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The `slow` tests first, in their usual order, then the rest: `make test` shares the
    tests between pytest-xdist workers as each one finishes, and a test of half a minute
    handed out last would leave the other worker idle until it ends."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
async def broker(tmp_path):
    """An in-process broker on the test's event loop (for asyncio clients)."""
    async with running_broker(ephemeral_config(data_dir=str(tmp_path / "data"))) as b:
        yield b


@pytest.fixture
async def vbroker(tmp_path):
    """An in-process broker whose timers run on a VirtualClock the test advances."""
    clock = VirtualClock()
    async with running_broker(ephemeral_config(data_dir=str(tmp_path / "data")), clock=clock) as b:
        b.clock = clock
        yield b


@pytest.fixture
def thread_broker(tmp_path):
    """A broker in its own thread (for blocking clients such as pika and kombu)."""
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "data"))) as b:
        yield b


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory) -> tuple[Path, str]:
    """RoarMQ's wheel and pip's output, built once for the tests that install it (the
    Dockerfile's steps, a user's venv): `pip wheel` compiles the extensions, half a minute
    each time. Built as a user would, with nothing of this environment's import path.
    Under pytest-xdist each worker is its own session: the first to need the wheel builds
    it under a lock in the directory the workers share, the others take that one."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # pytest-of-USER/pytest-N/, above each worker's gwN/
    wheels = shared / "built-wheel"
    with open(shared / "built-wheel.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = sorted(wheels.glob("roarmq-*.whl"))
        if found:
            return found[0], (wheels / "pip-output.txt").read_text()
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env.pop("VIRTUAL_ENV", None)
        root = Path(__file__).resolve().parents[1]
        build = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-w", str(wheels)]
            + [str(root)],
            env=env,
            capture_output=True,
            text=True,
            timeout=540,
        )
        assert build.returncode == 0, build.stdout + build.stderr
        (wheel,) = wheels.glob("roarmq-*.whl")
        (wheels / "pip-output.txt").write_text(build.stdout + build.stderr)
        return wheel, build.stdout + build.stderr


@pytest.fixture
def etcd(tmp_path):
    """A real etcd member of its own (tests/support/etcd.py)."""
    server = Etcd(etcd_binary_or_skip(), tmp_path / "etcd-data")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def raw(broker):
    """A RawClient on the ``broker`` fixture with channel 1 open."""
    client = await RawClient.connect(broker.port)
    await client.open_channel(1)
    yield client
    await client.close()


@pytest.fixture
def mgmt_broker(tmp_path):
    """A broker on its own thread with the management API on (user guest/guest)."""
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        yield b


@pytest.fixture
def mgmt_broker_sampled_by_hand(mgmt_broker):
    """`mgmt_broker` with its rate sampler stopped: the test calls `sample(at=...)` itself,
    so rates and histories are exact."""
    mgmt_broker.call(mgmt_broker.broker._management.rates.stop)
    return mgmt_broker


@pytest.fixture(scope="module")
def rabbitmq(tmp_path_factory):
    """A RabbitMQ 3.10.8 node for a module's parity tests (tests/support/rabbitmq.py)."""
    with rabbitmq_node(tmp_path_factory.mktemp("rabbitmq")) as node:
        yield node


@pytest.fixture(params=["roarmq", pytest.param("rabbitmq", marks=pytest.mark.slow)])
def target(request):
    """The broker a parity test runs against: RoarMQ (a broker thread of the test's own)
    or RabbitMQ 3.10.8 (the module's node); both have `url` and `port`. A directory whose
    tests need more (tests/stream_protocol: the stream plugin) defines its own."""
    if request.param == "rabbitmq":
        return request.getfixturevalue("rabbitmq")
    return request.getfixturevalue("thread_broker")
