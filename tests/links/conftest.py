"""One RabbitMQ 3.10.8 node for the tests of broker/links (a worker's, for the package):
with its management, shovel and federation plugins, as the parity tests compare its
answers with ours and the federation tests have it federate from RoarMQ; the others use
it as any RabbitMQ. Their queues and exchanges have names
of their own, so one node serves them all (a node's start is ~5 s)."""

from __future__ import annotations

import pytest
from support.rabbitmq import rabbitmq_node

PLUGINS = (
    "rabbitmq_shovel",
    "rabbitmq_shovel_management",
    "rabbitmq_federation",
    "rabbitmq_federation_management",
)


@pytest.fixture(scope="package")
def rabbitmq(tmp_path_factory):
    with rabbitmq_node(
        tmp_path_factory.mktemp("rabbitmq"), management=True, plugins=PLUGINS
    ) as node:
        yield node
