"""The broker the pika tests of the core talk to: `b`, a broker on its own thread with the
management API (tests/conftest.py's `mgmt_broker`), and a blocking connection and channel
to it. A module that needs another broker (a RabbitMQ `target`, a clock of its own)
defines its own fixture of the same name."""

from __future__ import annotations

import pika
import pytest


@pytest.fixture
def b(mgmt_broker):
    return mgmt_broker


@pytest.fixture
def conn(b):
    connection = pika.BlockingConnection(pika.URLParameters(b.url))
    yield connection
    if connection.is_open:
        connection.close()


@pytest.fixture
def ch(conn):
    return conn.channel()
