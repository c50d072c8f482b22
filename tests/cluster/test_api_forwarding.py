"""Every node answers the management API for one vhost's objects: a node that does not lead
the vhost forwards the request to its leader (three real nodes, real etcd, real HTTP)."""

from __future__ import annotations

import pika
import pytest
from support.cluster_nodes import PERSISTENT, agreed_leader, by_name, connect, three_nodes
from support.clusterlib import api_call
from support.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


def call(node, method: str, path: str, body=None) -> tuple[int, dict, object]:
    return api_call(node.mgmt_port, method, path, body)


@pytest.fixture
def cluster(etcd, tmp_path):
    with three_nodes(etcd, tmp_path) as nodes:
        yield nodes


def test_one_vhosts_objects_through_a_node_that_does_not_lead_it(cluster):
    leader_name = until(lambda: agreed_leader(cluster), 30)
    assert leader_name, [n.log.read_text()[-2000:] for n in cluster]
    leader = by_name(cluster, leader_name)
    other = next(n for n in cluster if n is not leader)

    status, headers, _ = call(other, "PUT", "/api/queues/%2F/viaapi", {"durable": True})
    assert status == 201 and headers.get("X-RoarMQ-Served-By") == leader_name, (status, headers)
    status, _, _ = call(
        other, "PUT", "/api/exchanges/%2F/x.api", {"type": "topic", "durable": True}
    )
    assert status == 201
    status, _, _ = call(other, "POST", "/api/bindings/%2F/e/x.api/q/viaapi", {"routing_key": "a.#"})
    assert status == 201

    conn = connect(leader)
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("x.api", "a.b", b"m%d" % i, PERSISTENT)
    conn.close()

    status, _, row = call(other, "GET", "/api/queues/%2F/viaapi")
    assert status == 200 and row["messages"] == 3 and row["node"] == leader_name, row
    status, _, bindings = call(other, "GET", "/api/queues/%2F/viaapi/bindings")
    assert any(b["source"] == "x.api" and b["routing_key"] == "a.#" for b in bindings)
    status, _, defs = call(other, "GET", "/api/definitions/%2F")
    assert "viaapi" in {q["name"] for q in defs["queues"]}
    status, _, got = call(
        other,
        "POST",
        "/api/queues/%2F/viaapi/get",
        {"count": 2, "ackmode": "ack_requeue_false", "encoding": "auto"},
    )
    assert status == 200 and [m["payload"] for m in got] == ["m0", "m1"], got
    status, _, routed = call(
        other,
        "POST",
        "/api/exchanges/%2F/x.api/publish",
        {
            "routing_key": "a.c",
            "payload": "via-publish",
            "payload_encoding": "string",
            "properties": {"delivery_mode": 2},
        },
    )
    assert status == 200 and routed["routed"] is True
    status, _, _ = call(other, "DELETE", "/api/queues/%2F/viaapi/contents")
    assert status == 204
    assert call(leader, "GET", "/api/queues/%2F/viaapi")[2]["messages"] == 0
    status, _, _ = call(other, "DELETE", "/api/queues/%2F/viaapi")
    assert status == 204
    assert call(leader, "GET", "/api/queues/%2F/viaapi")[0] == 404
    # The leader itself answers as it always did, unmarked.
    status, headers, _ = call(leader, "GET", "/api/exchanges/%2F/x.api")
    assert status == 200 and "X-RoarMQ-Served-By" not in headers
    pika.BlockingConnection(other.params()).close()  # the node still takes clients
