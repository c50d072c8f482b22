"""Replicated vhosts end to end: three real nodes on a real etcd, pika with confirms.

Every message confirmed before a kill -9 of the leader is on the new leader; a follower
killed with kill -9 leaves the in-sync set (the leader keeps confirming) and rejoins it
after catching up on restart."""

from __future__ import annotations

import os
import signal

import pika
import pytest
from test_node import TTL, Node, placement, three_nodes, until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

N = 200
REVOKED = "refuses connections: its process is gone; revoking its lease"
PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.fixture
def cluster(etcd, tmp_path):
    with three_nodes(etcd, tmp_path, "replica_lag_ms = 1000\n") as nodes:
        yield nodes


def agreed_leader(nodes: list[Node], size: int = 3) -> str | None:
    seen = {placement(node) for node in nodes}
    if len(seen) != 1:
        return None
    (leader, _members, in_sync), *_ = seen
    return leader if leader is not None and len(in_sync) == size else None


def connect(node: Node) -> pika.BlockingConnection:
    """A client on the node once it serves the vhost (it answers 530 while recovering)."""

    def attempt():
        try:
            return pika.BlockingConnection(node.params())
        except pika.exceptions.AMQPError:
            return None

    conn = until(attempt, 15, step=0.2)
    assert conn, node.log.read_text()[-3000:]
    return conn


def publish_confirmed(node: Node, queue: str, bodies: list[bytes]) -> list[bytes]:
    conn = connect(node)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(queue, durable=True)
    confirmed = []
    for body in bodies:
        ch.basic_publish("", queue, body, PERSISTENT, mandatory=True)  # raises on nack
        confirmed.append(body)
    conn.close()
    return confirmed


def drain(node: Node, queue: str) -> list[bytes]:
    conn = connect(node)
    ch = conn.channel()
    got = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        got.append(body)
    conn.close()
    return got


def by_name(nodes: list[Node], name: str) -> Node:
    return next(n for n in nodes if n.name == name)


def test_leader_kill9_loses_nothing_confirmed(cluster):
    leader_name = until(lambda: agreed_leader(cluster), 30)
    assert leader_name, [n.log.read_text()[-2000:] for n in cluster]
    leader = by_name(cluster, leader_name)
    confirmed = publish_confirmed(leader, "q", [b"m%d" % i for i in range(N)])
    assert len(confirmed) == N

    leader.kill9()
    survivors = [n for n in cluster if n is not leader]

    def new_leader():
        name = agreed_leader(survivors, size=len(placement(survivors[0])[2]))
        return name if name not in (None, leader_name) else None

    successor_name = until(new_leader, 4 * TTL + 5, step=0.1)
    assert successor_name, [n.log.read_text()[-3000:] for n in survivors]
    successor = by_name(survivors, successor_name)
    other = next(n for n in survivors if n is not successor)
    # The other survivor hands its clients to the successor.
    conn = pika.BlockingConnection(other.params())
    assert conn.channel().queue_declare("q", passive=True).method.message_count >= len(confirmed)
    conn.close()

    more = publish_confirmed(successor, "q", [b"after%d" % i for i in range(50)])
    got = drain(successor, "q")
    lost = set(confirmed) - set(got)
    assert not lost, f"{len(lost)} confirmed messages lost"
    assert got[: len(confirmed)] == confirmed  # in publish order
    assert got[len(confirmed) :] == more
    # The process is gone (its port refuses): a follower revoked its lease, no TTL wait.
    assert any(REVOKED in n.log.read_text() for n in survivors)


def test_a_frozen_leader_is_replaced_by_lease_expiry_not_revoked(cluster):
    """SIGSTOP: the frozen leader's ports still accept connections, so nobody may take it
    for dead and revoke its lease (a live leader confirms until its lease runs out): it is
    replaced when its lease expires, then follows the new leader once thawed."""
    leader_name = until(lambda: agreed_leader(cluster), 30)
    assert leader_name, [n.log.read_text()[-2000:] for n in cluster]
    leader = by_name(cluster, leader_name)
    publish_confirmed(leader, "q", [b"before"])
    os.kill(leader.proc.pid, signal.SIGSTOP)
    survivors = [n for n in cluster if n is not leader]
    try:

        def new_leader():
            name = placement(survivors[0])[0]
            return name if name not in (None, leader_name) else None

        assert until(new_leader, 4 * TTL + 5, step=0.1)
    finally:
        os.kill(leader.proc.pid, signal.SIGCONT)
    assert not any(REVOKED in n.log.read_text() for n in survivors)
    assert until(lambda: agreed_leader(cluster), 30), "the thawed node did not rejoin"
    successor = by_name(cluster, agreed_leader(cluster))
    assert drain(successor, "q") == [b"before"]


def test_follower_kill9_shrinks_then_rejoins(cluster):
    leader_name = until(lambda: agreed_leader(cluster), 30)
    assert leader_name, [n.log.read_text()[-2000:] for n in cluster]
    leader = by_name(cluster, leader_name)
    victim = next(n for n in cluster if n is not leader)
    publish_confirmed(leader, "q", [b"before%d" % i for i in range(50)])

    victim.kill9()
    # Publishing goes on: confirms wait for the dead follower until the ISR shrinks.
    confirmed = publish_confirmed(leader, "q", [b"during%d" % i for i in range(50)])
    assert len(confirmed) == 50
    in_sync = leader.api("/api/vhosts/%2F")["in_sync"]
    assert victim.name not in in_sync and leader_name in in_sync
    # Its port refused: it left at once, not after replica_lag_ms of waiting confirms.
    assert f"in-sync member {victim.name} is not running" in leader.log.read_text()

    victim.start()

    def rejoined():
        return victim.name in leader.api("/api/vhosts/%2F")["in_sync"]

    assert until(rejoined, 20), victim.log.read_text()[-3000:]
    assert len(drain(leader, "q")) == 100
