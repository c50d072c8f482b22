"""Shared fixtures: real brokers on ephemeral loopback ports."""

from __future__ import annotations

import pytest

from roarmq.broker.clock import VirtualClock
from roarmq.broker.testing import BrokerThread, ephemeral_config, running_broker

pytest_plugins = ["pytester"]


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
