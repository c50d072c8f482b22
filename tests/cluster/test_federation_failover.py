"""A federated exchange on a cluster: its upstream and policy are operator metadata (set
through any node, in etcd), its link runs only on the vhost's leader, and after a kill -9
of that leader the new leader's link drains what the upstream kept for it meanwhile: every
message published upstream arrives (at least once). Three real nodes on a real etcd, a
fourth broker as the upstream."""

from __future__ import annotations

import pika
import pytest
from support.broker_process import BrokerProcess
from support.cluster_nodes import connect, drain, fail_over, the_leader, three_nodes
from support.federation import federation_keys
from support.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


@pytest.fixture
def cluster(etcd, tmp_path):
    with three_nodes(etcd, tmp_path, "replica_lag_ms = 1000\n") as nodes:
        yield nodes


def links_running_on(nodes) -> list[str]:
    return [
        n.name
        for n in nodes
        if n.running and [r["status"] for r in n.api("/api/federation-links")] == ["running"]
    ]


def publish(port: int, bodies: list[bytes]) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("fed.x", "", body, pika.BasicProperties(delivery_mode=2))
    conn.close()


def test_a_federation_link_runs_on_the_leader_and_moves_on_with_a_failover(cluster, tmp_path):
    upstream = BrokerProcess(tmp_path / "upstream").start()
    try:
        leader = the_leader(cluster)
        follower = next(n for n in cluster if n is not leader)
        value = {"value": {"uri": f"amqp://guest:guest@127.0.0.1:{upstream.port}"}}
        assert follower.call("/api/parameters/federation-upstream/%2F/up", "PUT", value)[0] == 201
        policy = {
            "pattern": "^fed",
            "apply-to": "exchanges",
            "definition": {"federation-upstream": "up"},
        }
        assert follower.call("/api/policies/%2F/fed", "PUT", policy)[0] == 201
        conn = connect(leader)
        ch = conn.channel()
        ch.exchange_declare("fed.x", "fanout", durable=True)
        ch.queue_declare("got", durable=True)
        ch.queue_bind("got", "fed.x")
        conn.close()
        assert until(lambda: links_running_on(cluster) == [leader.name], 20), links_running_on(
            cluster
        )
        on_upstream = lambda: federation_keys(lambda path: upstream.call(path)[1], "fed.x")  # noqa: E731
        assert until(on_upstream, 20), on_upstream()  # "got"'s binding, followed there
        first = [b"a%d" % i for i in range(100)]
        publish(upstream.port, first)
        new = fail_over(cluster, leader)
        second = [b"b%d" % i for i in range(100)]
        publish(upstream.port, second)  # kept upstream for the link until a leader takes it
        survivors = [n for n in cluster if n is not leader]
        assert until(lambda: links_running_on(survivors) == [new.name], 30), links_running_on(
            survivors
        )

        def arrived() -> int:
            c = connect(new)
            try:
                return c.channel().queue_declare("got", passive=True).method.message_count
            finally:
                c.close()

        assert until(lambda: arrived() >= 200, 30), arrived()
        bodies = drain(new, "got")
        assert set(first + second) <= set(bodies)
    finally:
        upstream.stop()
