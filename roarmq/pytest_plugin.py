"""pytest plugin, registered when RoarMQ is installed: a real broker for any project's tests.

    def test_orders(amqp_broker):             # a fresh broker for this test
        pika.BlockingConnection(pika.URLParameters(amqp_broker))

    def test_reports(amqp_broker_session):    # one broker shared by the whole session
        ...

Each fixture yields the broker's URL (amqp://guest:guest@127.0.0.1:PORT, an ephemeral port).
The broker runs in its own thread, so blocking and asyncio clients both work. This module
loads in every pytest run of the environment, so it imports nothing of the broker until a
test asks for one of the fixtures.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


def _serve(data_dir: Path) -> Iterator[str]:
    from roarmq.broker.testing import BrokerThread, ephemeral_config

    with BrokerThread(ephemeral_config(data_dir=str(data_dir))) as broker:
        yield broker.url


@pytest.fixture
def amqp_broker(tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh broker, stopped after the test (its data dir is the test's tmp_path)."""
    yield from _serve(tmp_path / "roarmq-data")


@pytest.fixture(scope="session")
def amqp_broker_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of one broker shared by every test of the session: faster, but tests see each
    other's queues and exchanges, so give them distinct names."""
    yield from _serve(tmp_path_factory.mktemp("roarmq-session"))
