"""Fixtures shared by the raw-socket tests of this directory."""

from __future__ import annotations

import pytest
from rawclient import RawClient


@pytest.fixture
async def raw(broker):
    """A RawClient on the ``broker`` fixture with channel 1 open."""
    client = await RawClient.connect(broker.port)
    await client.open_channel(1)
    yield client
    await client.close()
