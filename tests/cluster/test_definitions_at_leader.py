"""A clustered vhost's definitions have one home, its leader's replicated log: whichever
node the management API is asked, declares, deletes and definitions imports go there and
are answered once the in-sync set holds them; a vhost without a leader answers 503, not
a node's stale copy. Three real nodes on a real etcd, real HTTP."""

from __future__ import annotations

import pytest
from support.cluster_nodes import (
    TTL,
    agreed_leader,
    by_name,
    drain,
    publish_confirmed,
    three_nodes,
)
from support.clusterlib import api_call
from support.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture
def cluster(etcd, tmp_path):
    with three_nodes(etcd, tmp_path, "replica_lag_ms = 1000\n") as nodes:
        yield nodes


def test_a_definitions_import_on_a_follower_reaches_the_leaders_log(cluster):
    """POST /api/definitions on a node that does not lead "/": its queue is declared by
    the leader (in the vhost's log), so it survives the leader's kill -9."""
    leader_name = until(lambda: agreed_leader(cluster), 30)
    assert leader_name, [n.log.read_text()[-2000:] for n in cluster]
    leader = by_name(cluster, leader_name)
    follower = next(n for n in cluster if n is not leader)
    doc = {"queues": [{"name": "imported", "vhost": "/", "durable": True, "arguments": {}}]}
    status, _, body = api_call(follower.mgmt_port, "POST", "/api/definitions", doc)
    assert status == 204, body
    status, _, row = api_call(leader.mgmt_port, "GET", "/api/queues/%2F/imported")
    assert status == 200 and row["durable"], row
    publish_confirmed(leader, "imported", [b"kept"])
    leader.kill9()
    survivors = [n for n in cluster if n is not leader]

    def new_leader():
        name = agreed_leader(survivors, size=2)
        return name if name not in (None, leader_name) else None

    successor = until(new_leader, 4 * TTL + 10, step=0.1)
    assert successor, [n.log.read_text()[-3000:] for n in survivors]
    assert drain(by_name(survivors, successor), "imported") == [b"kept"]


def test_an_api_declare_is_answered_once_durable_or_503(cluster):
    """With both followers frozen the leader cannot get a declare into a second copy
    (min_in_sync 2 of 3): the API does not answer 201 for what a failover would lose."""
    leader_name = until(lambda: agreed_leader(cluster), 30)
    assert leader_name, [n.log.read_text()[-2000:] for n in cluster]
    leader = by_name(cluster, leader_name)
    status, _, _ = api_call(leader.mgmt_port, "PUT", "/api/queues/%2F/before", {"durable": True})
    assert status == 201
    frozen = [n for n in cluster if n is not leader]
    for node in frozen:
        node.freeze()
    try:
        status, _, body = api_call(
            leader.mgmt_port, "PUT", "/api/queues/%2F/lonely", {"durable": True}
        )
    finally:
        for node in frozen:
            node.thaw()
    assert status == 503, body
    assert "was not confirmed by its in-sync copies" in body["reason"], body


def test_a_vhost_without_a_leader_answers_503_not_a_stale_copy(etcd, tmp_path):
    """replicas = 1: "/" lives on its leader alone. Frozen, its lease expires and nobody
    else may lead: every other node answers 503 with the reason for its objects."""
    with three_nodes(etcd, tmp_path, "replicas = 1\n") as nodes:
        leader_name = until(lambda: agreed_leader(nodes, size=1), 30)
        assert leader_name, [n.log.read_text()[-2000:] for n in nodes]
        leader = by_name(nodes, leader_name)
        status, _, _ = api_call(leader.mgmt_port, "PUT", "/api/queues/%2F/q", {"durable": True})
        assert status == 201
        other = next(n for n in nodes if n is not leader)
        leader.freeze()
        try:
            assert until(lambda: other.api("/api/vhosts/%2F")["leader"] is None, 4 * TTL + 5)
            status, _, body = api_call(other.mgmt_port, "GET", "/api/queues/%2F/q")
        finally:
            leader.thaw()
        assert status == 503, body
        assert body["reason"] == "vhost '/' has no leader at the moment (an election is under way)"
