"""pytest plugin: the `amqp_broker` fixture, a real RoarMQ broker per test.

Installed with the roarmq package (entry point `pytest11`), so any project can
write `def test_x(amqp_broker): pika.BlockingConnection(pika.URLParameters(amqp_broker))`.
The broker runs in its own thread, so blocking and asyncio clients both work.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from . import BrokerThread, ephemeral_config


@pytest.fixture
def amqp_broker(tmp_path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """The URL (amqp://guest:guest@127.0.0.1:PORT) of a fresh broker, stopped after the test."""
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "roarmq-data"))) as broker:
        yield broker.url
