"""The stream protocol on a cluster: what a stream-protocol client had confirmed, a named
publisher's sequence and its stored offsets are on the vhost's next leader after the
leader is killed -9 (the records and the offsets are in the vhost's replicated log)."""

from __future__ import annotations

import asyncio

import pytest
from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    OffsetType,
    Producer,
    schema,
)
from rstream.client import Client
from support.cluster_nodes import agreed_leader, by_name, fail_over, three_nodes
from support.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


@pytest.fixture
def cluster(etcd, tmp_path):
    with three_nodes(etcd, tmp_path, "replica_lag_ms = 1000\n") as nodes:
        yield nodes


async def _client(node) -> Client:
    client = Client("127.0.0.1", node.stream_port, frame_max=1 << 20, heartbeat=60)
    await client.start()
    await client.authenticate(vhost="/", username="guest", password="guest")
    return client


async def _publish_confirmed(node, ids: range) -> list[int]:
    client = await _client(node)
    await client.create_stream("events")
    await client.declare_publisher("events", "app", 1)
    confirmed: list[int] = []

    async def on_confirm(frame: schema.PublishConfirm) -> None:
        confirmed.extend(frame.publishing_ids)

    client.add_handler(schema.PublishConfirm, on_confirm)
    await client.send_frame(
        schema.Publish(
            publisher_id=1,
            messages=[schema.Message(i, None, bytes(AMQPMessage(body=b"%d" % i))) for i in ids],
        )
    )
    for _ in range(200):
        if len(confirmed) == len(ids):
            break
        await asyncio.sleep(0.05)
    await client.store_offset("events", "reader", 41)
    await asyncio.sleep(0.5)  # the offsets' write (store-offset has no answer) reaches the log
    await client.close()
    return confirmed


async def _state(node) -> tuple[int, int, int]:
    """(the publisher's sequence, the stored offset, messages read from first)."""
    client = await _client(node)
    sequence = await client.query_publisher_sequence("events", "app")
    offset = await client.query_offset("events", "reader")
    entries = 0
    done = asyncio.Event()

    async def on_deliver(frame: schema.Deliver) -> None:
        nonlocal entries
        entries += frame.num_entries
        if entries >= 100:
            done.set()

    client.add_handler(schema.Deliver, on_deliver, name="1")
    await client.run_queue_listener_task(1, on_deliver)
    await client.subscribe("events", subscription_id=1, initial_credit=100)
    await asyncio.wait_for(done.wait(), 20)
    await client.close()
    return sequence, offset, entries


def test_a_stream_protocol_publisher_and_its_offsets_survive_a_leader_kill9(cluster):
    leader_name = until(lambda: agreed_leader(cluster), 60)
    assert leader_name
    leader = by_name(cluster, leader_name)
    confirmed = asyncio.run(_publish_confirmed(leader, range(1, 101)))
    assert sorted(confirmed) == list(range(1, 101))

    successor = fail_over(cluster, leader)
    state = until(lambda: _try(lambda: asyncio.run(_state(successor))), 30, step=0.5)
    assert state == (100, 41, 100), state


def _try(call):
    try:
        return call()
    except Exception:  # noqa: BLE001 - the successor still recovering: ask again
        return None


def test_a_client_pointed_at_a_follower_works_through_it(cluster):
    """rstream's producer and consumer given a node that does not lead the vhost: that node
    relays their connections to the leader (metadata then names the leader, where they
    publish and read), as a client pointed at any node of a RabbitMQ cluster works."""
    leader_name = until(lambda: agreed_leader(cluster), 60)
    assert leader_name
    follower = next(n for n in cluster if n.name != leader_name)
    leader = by_name(cluster, leader_name)

    async def run() -> list[int]:
        kw = {"port": follower.stream_port, "username": "guest", "password": "guest"}
        async with Producer("127.0.0.1", **kw) as producer:
            await producer.create_stream("via-follower")
            for i in range(20):
                await producer.send_wait("via-follower", AMQPMessage(body=b"%d" % i))
        consumer = Consumer("127.0.0.1", **kw)
        await consumer.start()
        got: list[int] = []
        done = asyncio.Event()

        async def on_message(message, context) -> None:
            got.append(context.offset)
            if len(got) == 20:
                done.set()

        offset = ConsumerOffsetSpecification(OffsetType.FIRST)
        await consumer.subscribe("via-follower", on_message, offset_specification=offset)
        await asyncio.wait_for(done.wait(), 20)
        await consumer.close()
        return got

    assert asyncio.run(run()) == list(range(20))
    assert leader.api("/api/queues/%2F/via-follower")["messages"] == 20
    assert "relayed to the node serving its vhost" in follower.log.read_text()
