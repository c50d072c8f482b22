"""Fixtures shared by the tests of this directory."""

from __future__ import annotations

import pytest
from rawclient import RawClient

from roarmq.broker.testing import BrokerThread, ephemeral_config


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
