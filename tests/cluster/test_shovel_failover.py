"""A dynamic shovel on a cluster: its parameter is operator metadata (set through any node,
kept in etcd), it runs only on its vhost's leader, and after a kill -9 of that leader the
new leader runs it on from what the source still holds: every confirmed message reaches
the destination (at least once, RabbitMQ's on-confirm guarantee). Three real nodes on a
real etcd, pika with confirms."""

from __future__ import annotations

import signal

import pika
import pytest
from support.broker_process import BrokerProcess
from support.cluster_nodes import (
    by_name,
    connect,
    drain,
    fail_over,
    publish_confirmed,
    the_leader,
    three_nodes,
)
from support.queues import ready as ready_at
from support.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

SHOVEL = {"src-uri": "amqp://", "src-queue": "src", "dest-uri": "amqp://", "dest-queue": "dst"}


@pytest.fixture
def cluster(etcd, tmp_path):
    with three_nodes(etcd, tmp_path, "replica_lag_ms = 1000\n") as nodes:
        yield nodes


def ready(node, queue: str) -> int:
    conn = connect(node)
    try:
        return conn.channel().queue_declare(queue, durable=True).method.message_count
    finally:
        conn.close()


def running_on(cluster) -> list[str]:
    """The nodes that report the shovel running (each node reports its own)."""
    return [
        n.name
        for n in cluster
        if n.running and [r["state"] for r in n.api("/api/shovels")] == ["running"]
    ]


def test_a_shovel_runs_on_the_leader_and_moves_on_with_a_failover(cluster):
    leader = the_leader(cluster)
    follower = next(n for n in cluster if n is not leader)
    status, _ = follower.call("/api/parameters/shovel/%2F/move", "PUT", {"value": SHOVEL})
    assert status == 201
    for node in cluster:  # every node knows it, through etcd
        assert until(lambda n=node: n.api("/api/parameters/shovel"), 10), node.name
    first = publish_confirmed(leader, "src", [b"a%d" % i for i in range(200)])
    assert until(lambda: ready(leader, "dst") == 200, 30), ready(leader, "dst")
    assert running_on(cluster) == [leader.name]
    second = publish_confirmed(leader, "src", [b"b%d" % i for i in range(300)])
    new = fail_over(cluster, leader)  # while it may still be moving the second lot
    assert leader.proc is not None and leader.proc.wait(10) == -signal.SIGKILL
    survivors = [n for n in cluster if n is not leader]
    assert until(lambda: running_on(survivors) == [new.name], 30), running_on(survivors)
    assert until(lambda: ready(new, "src") == 0, 30), ready(new, "src")
    bodies = drain(new, "dst")
    assert set(first + second) <= set(bodies), set(first + second) - set(bodies)
    assert len(bodies) - len(first + second) <= 300, "more moved twice than were in flight"
    # and it goes on moving after the failover
    publish_confirmed(new, "src", [b"c"])
    assert until(lambda: ready(new, "dst") == 1, 20)
    assert by_name(cluster, new.name).call("/api/parameters/shovel/%2F/move", "DELETE")[0] == 204
    assert until(lambda: running_on(survivors) == [], 10)


def test_a_shovel_reaches_a_roarmq_cluster_through_any_node_and_through_its_failover(
    cluster, tmp_path
):
    """The cluster as a shovel's source, reached by a broker outside it through the URIs of
    its three nodes (any of them hands the connection to the leader): when the leader dies
    the shovel reconnects and goes on, and every confirmed message is moved."""
    leader = the_leader(cluster)
    outside = BrokerProcess(tmp_path / "outside").start()
    try:
        value = {
            "src-uri": [f"amqp://guest:guest@127.0.0.1:{n.port}" for n in cluster],
            "src-queue": "src",
            "src-prefetch-count": 20,
            "dest-uri": "amqp://",
            "dest-queue": "moved",
            "reconnect-delay": 1,
        }
        assert outside.call("/api/parameters/shovel/%2F/in", "PUT", {"value": value})[0] == 201
        first = publish_confirmed(leader, "src", [b"a%d" % i for i in range(200)])
        assert until(lambda: ready_at(outside.port, "moved") >= 100, 30)
        new = fail_over(cluster, leader)
        second = publish_confirmed(new, "src", [b"b%d" % i for i in range(200)])
        assert until(lambda: ready(new, "src") == 0, 40), ready(new, "src")
        assert until(lambda: ready_at(outside.port, "moved") >= 400, 20)
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", outside.port))
        ch = conn.channel()
        bodies = []
        while (got := ch.basic_get("moved", auto_ack=True))[0] is not None:
            bodies.append(got[2])
        conn.close()
        assert set(first + second) <= set(bodies)
        assert outside.api("/api/shovels")[0]["state"] == "running"
    finally:
        outside.stop()
