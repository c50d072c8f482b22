"""The broker a stream-protocol test talks to: RoarMQ (the in-process `broker`), or, for
the tests parametrized with `target`, also RabbitMQ 3.10.8 with its rabbitmq_stream plugin
(one node for the module, marked `slow`), so that what the test expects is what RabbitMQ
does. Tests of what 3.10.8 lacks (super streams, filtering, single active consumer: 3.11+)
run against RoarMQ alone and follow RabbitMQ's documentation for the version that has it."""

from __future__ import annotations

import uuid

import pytest
from support.rabbitmq import rabbitmq_node


@pytest.fixture(scope="module")
def rabbitmq(tmp_path_factory):
    with rabbitmq_node(tmp_path_factory.mktemp("rabbitmq"), streams=True) as node:
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
