"""A dynamic shovel on a cluster: its parameter is operator metadata (set through any node,
kept in etcd), it runs only on its vhost's leader, and after a kill -9 of that leader the
new leader runs it on from what the source still holds: every confirmed message reaches
the destination (at least once, RabbitMQ's on-confirm guarantee). Three real nodes on a
real etcd, pika with confirms."""

from __future__ import annotations

import signal

import pytest
from support.cluster_nodes import (
    by_name,
    connect,
    drain,
    fail_over,
    publish_confirmed,
    the_leader,
    three_nodes,
)
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
