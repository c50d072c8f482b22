"""Any node, any client: a client of a node that does not lead its vhost is handed to the
leader (a relay over the replication port, broker/cluster/handoff.py) and notices nothing.

Three real nodes on a real etcd; pika on a non-leader: a durable queue, 100 persistent
messages with confirms, consumed with manual acks, and the queue is the leader's;
heartbeats through the relay; closing the client closes the leader's connection; a kill -9
of the leader closes the relayed client, which reconnects to any node and reaches the new
leader."""

from __future__ import annotations

import time

import pika
import pytest
from test_node import TTL, Node, placement, three_nodes, until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


@pytest.fixture
def cluster(etcd, tmp_path):
    with three_nodes(etcd, tmp_path) as nodes:
        yield nodes


def agreed_leader(nodes: list[Node]) -> str | None:
    seen = {placement(node) for node in nodes}
    if len(seen) != 1:
        return None
    (leader, members, in_sync), *_ = seen
    return leader if leader is not None and len(in_sync) == len(nodes) else None


def connections_on(node: Node) -> list[dict]:
    return [c for c in node.api("/api/connections") if c.get("vhost") == "/"]


def test_client_on_a_non_leader_is_handed_to_the_leader(cluster):
    leader_name = until(lambda: agreed_leader(cluster), 40)
    assert leader_name, [n.log.read_text()[-2000:] for n in cluster]
    leader = next(n for n in cluster if n.name == leader_name)
    relay, third = [n for n in cluster if n is not leader]

    # Publish 100 persistent messages with confirms through a node that does not lead.
    conn = pika.BlockingConnection(relay.params())
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("handed", durable=True)
    bodies = [b"m%03d" % i for i in range(100)]
    for body in bodies:
        ch.basic_publish("", "handed", body, pika.BasicProperties(delivery_mode=2), mandatory=True)
    # The queue and the connection are the leader's.
    row = leader.api("/api/queues/%2F/handed")
    assert row["node"] == leader_name and row["durable"] is True
    assert until(lambda: row_count(leader) == 100, 5)
    assert len(connections_on(leader)) == 1
    # (the relay keeps none of its own; a merged cluster-wide list names the leader)
    assert all(c.get("node", leader_name) == leader_name for c in connections_on(relay))
    # Consume them with manual acks, in order.
    got = []
    for _ in range(100):
        method, _props, body = ch.basic_get("handed", auto_ack=False)
        assert method is not None
        got.append(body)
        ch.basic_ack(method.delivery_tag)
    assert got == bodies
    assert ch.queue_declare("handed", passive=True).method.message_count == 0
    # Closing the client closes the leader's side.
    conn.close()
    assert until(lambda: connections_on(leader) == [], 5), connections_on(leader)

    # Heartbeats pass through (the leader sends them, the relay copies them).
    params = relay.params()
    params.heartbeat = 2
    hb = pika.BlockingConnection(params)
    hb.sleep(5)
    assert hb.is_open
    assert hb.channel().queue_declare("handed", passive=True).method.message_count == 0

    # kill -9 of the leader: the relayed client is closed; it reconnects to any node and
    # reaches the new leader (a 530 while the election runs).
    leader.kill9()
    deadline = time.monotonic() + 5
    while hb.is_open and time.monotonic() < deadline:
        try:
            hb.process_data_events(0.2)
        except pika.exceptions.AMQPError:
            break
    assert not hb.is_open

    def reconnect():
        try:
            c = pika.BlockingConnection(third.params())
        except pika.exceptions.AMQPError:
            return None
        return c

    again = until(reconnect, 4 * TTL + 10, step=0.2)
    assert again, [n.log.read_text()[-3000:] for n in (relay, third)]
    ch = again.channel()
    ch.confirm_delivery()
    ch.basic_publish("", "handed", b"after", pika.BasicProperties(delivery_mode=2))
    assert ch.queue_declare("handed", passive=True).method.message_count == 1
    new_leader = placement(third)[0]
    assert new_leader in (relay.name, third.name)
    again.close()


def row_count(node: Node) -> int:
    return node.api("/api/queues/%2F/handed").get("messages", -1)


async def test_relay_backpressure_both_ways():
    """A leader that does not read: the relay stops reading the client once its buffer
    towards the leader is over HIGH_WATER (bounded memory), and everything arrives once the
    leader reads again. Closing one side closes the other."""
    import asyncio

    from roarmq.broker.cluster import handoff

    loop = asyncio.get_running_loop()
    received = bytearray()
    leader_side: list[asyncio.Transport] = []

    class Leader(asyncio.Protocol):
        def connection_made(self, transport):
            transport.pause_reading()  # a slow leader
            leader_side.append(transport)

        def data_received(self, data):
            received.extend(data)

    class Holder(asyncio.Protocol):
        def connection_made(self, transport):
            accepted.set_result(transport)

    accepted = loop.create_future()
    leader_server = await loop.create_server(Leader, "127.0.0.1", 0)
    front = await loop.create_server(Holder, "127.0.0.1", 0)
    owner = type("Owner", (), {"relays": set()})()
    relay = handoff._Relay(owner)
    await loop.create_connection(
        lambda: relay.leader, "127.0.0.1", leader_server.sockets[0].getsockname()[1]
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", front.sockets[0].getsockname()[1])
    client_transport = await accepted
    client_transport.pause_reading()  # as Connection.detach leaves it
    relay.attach(client_transport, b"")
    chunk = b"x" * (1 << 20)
    total = 64 * len(chunk)  # 64 MiB: past the kernel buffers and HIGH_WATER
    for _ in range(64):
        writer.write(chunk)
    drained = asyncio.ensure_future(writer.drain())
    await asyncio.sleep(0.5)
    # Bounded: the relay holds at most HIGH_WATER plus one read towards the leader.
    assert relay.leader.transport.get_write_buffer_size() <= handoff.HIGH_WATER + 262144
    assert not client_transport.is_reading()
    leader_side[0].resume_reading()
    deadline = loop.time() + 10
    while len(received) < total and loop.time() < deadline:
        await asyncio.sleep(0.05)
    assert len(received) == total and set(received) == {ord("x")}
    await drained
    assert client_transport.is_reading()
    # The leader closes: the client's socket is closed too.
    leader_side[0].close()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    assert relay.closed and not owner.relays
    writer.close()
    leader_server.close()
    front.close()
