"""Three real brokers (`python -m roarmq --cluster-etcd ... --node ...`) on one real etcd:
membership and placement through the API, a node that does not lead handing clients over, and a
kill -9 of the leader followed by another in-sync member leading and confirming."""

from __future__ import annotations

import signal
import socket
import time

import pika
import pytest
from support.cluster_nodes import (
    PERSISTENT,
    TTL,
    Node,
    connect_with,
    placement,
    three_nodes,
)
from support.waiting import free_port, until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


@pytest.fixture
def cluster(etcd, tmp_path):
    with three_nodes(etcd, tmp_path) as nodes:
        yield nodes


def test_three_nodes_one_leader_handoff_and_failover(cluster):
    names = {"n1", "n2", "n3"}

    def all_listed():
        return all(
            {n["name"] for n in node.api("/api/nodes") if n["running"]} == names for node in cluster
        )

    assert until(all_listed, 30), [n.log.read_text()[-2000:] for n in cluster]

    def agreed():
        seen = {placement(node) for node in cluster}
        if len(seen) != 1:
            return None
        (leader, members, in_sync), *_ = seen
        return leader is not None and set(members) == names and set(in_sync) == names

    assert until(agreed, 15), [placement(n) for n in cluster]
    leader_name, members, _ = placement(cluster[0])
    leader = next(n for n in cluster if n.name == leader_name)
    others = [n for n in cluster if n is not leader]
    # /api/nodes: the leader is listed with what it leads and its addresses.
    rows = {n["name"]: n for n in cluster[0].api("/api/nodes")}
    assert "/" in rows[leader_name]["leaders"]
    assert rows[leader_name]["amqp_port"] == leader.port
    assert rows[leader_name]["address"] == "127.0.0.1"
    assert "mem_used" in {n["name"]: n for n in leader.api("/api/nodes")}[leader_name]

    # A client on the leader works; one on another node is told where to go.
    conn = connect_with(leader.params())
    ch = conn.channel()
    ch.queue_declare("q1", durable=True)
    ch.basic_publish("", "q1", b"hello")
    conn.close()
    queue = leader.api("/api/queues/%2F/q1")
    assert queue["node"] == leader_name
    # (handed over to the leader: test_handoff.py)
    conn = connect_with(others[0].params())
    assert conn.channel().queue_declare("q1", passive=True).method.message_count == 1
    conn.close()

    # kill -9 the leader: an in-sync member leads within about 2 x TTL.
    killed_at = time.monotonic()
    leader.kill9()

    def new_leader():
        seen = {placement(node) for node in others}
        if len(seen) != 1:
            return None
        (name, _, in_sync), *_ = seen
        return name if name not in (None, leader_name) and name in in_sync else None

    successor_name = until(new_leader, 4 * TTL + 2, step=0.05)
    took = time.monotonic() - killed_at
    assert successor_name in members, [n.log.read_text()[-2000:] for n in others]
    assert took < 2 * TTL + 1.5, took
    successor = next(n for n in others if n.name == successor_name)
    listed = {n["name"]: n for n in successor.api("/api/nodes")}
    assert listed[leader_name]["running"] is False
    assert "/" in listed[successor_name]["leaders"]

    conn = connect_with(successor.params())
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("q2", durable=True)
    ch.basic_publish(
        "", "q2", b"after failover", pika.BasicProperties(delivery_mode=2), mandatory=True
    )
    assert ch.queue_declare("q2", passive=True).method.message_count == 1
    conn.close()
    # The remaining non-leader now hands its clients to the successor.
    third = next(n for n in others if n is not successor)
    conn = connect_with(third.params())
    assert conn.channel().queue_declare("q2", passive=True).method.message_count == 1
    conn.close()


def test_a_fenced_leader_closes_its_clients_and_refuses_new_ones_until_etcd_answers(etcd, tmp_path):
    """etcd goes away. Once the leader's fencing window closes (lease_ttl after its last
    renewal) it can confirm nothing, and says so rather than holding its clients: they are
    closed with 320 CONNECTION_FORCED and a new one is refused with RabbitMQ's 541 "vhost
    is down", so no publish is left unanswered. When etcd answers again the node gives
    its key back, leads at a new epoch, and confirms."""
    node = Node(tmp_path, "solo", etcd.url).start()
    try:
        assert until(lambda: node.api("/api/vhosts/%2F")["leader"] == "solo", 30)
        conn = connect_with(node.params())
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("q", durable=True)
        ch.basic_publish("", "q", b"before", PERSISTENT)
        etcd.kill()  # no renewal can succeed: fenced after lease_ttl
        killed = time.monotonic()
        answers = []
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            while time.monotonic() - killed < TTL + 15:
                try:
                    ch.basic_publish("", "q", b"during", PERSISTENT)
                    answers.append("ack")
                except pika.exceptions.NackError:
                    answers.append("nack")
        assert closed.value.reply_code == 320, closed.value
        assert "is no longer led by this node" in closed.value.reply_text
        assert time.monotonic() - killed < TTL + 3, answers  # at the window's end, not later
        with pytest.raises(pika.exceptions.AMQPConnectionError) as refused:
            pika.BlockingConnection(node.params())
        said = str(refused.value).replace("\\'", "'")
        assert "(541)" in said and "refused for user 'guest': vhost '/' is down" in said, said
        # Nor does its API name it the leader (its copy of etcd's keys still does).
        assert node.api("/api/vhosts/%2F")["leader"] is None

        etcd.start()  # the lease survives (etcd restarts leases): the key is given back
        assert until(lambda: "leader key of epoch" in node.log.read_text(), 30)

        def admitted():  # once the election that follows has been won again
            try:
                return pika.BlockingConnection(node.params())
            except pika.exceptions.AMQPConnectionError:
                return None

        conn = until(admitted, 30)
        assert conn, node.log.read_text()[-3000:]
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", "q", b"after", PERSISTENT)
        got = []
        while (message := ch.basic_get("q", auto_ack=True))[0] is not None:
            got.append(message[2])
        conn.close()
        assert got[0] == b"before" and got[-1] == b"after"
    finally:
        node.stop()


def stopped_with(node: Node, timeout: float = 20) -> str:
    """The last line a node that could not start logged (it must exit 1)."""
    assert node.proc is not None
    assert node.proc.wait(timeout) == 1, node.log.read_text()[-2000:]
    return node.log.read_text().strip().splitlines()[-1]


def test_a_node_waiting_for_etcd_at_start_stops_on_sigterm_then(tmp_path):
    """A supervisor's SIGTERM while the node waits for etcd (up to join_timeout, here 60 s)
    stops it at once, cleanly: exit 0, saying so."""
    node = Node(tmp_path, "waiting", f"http://127.0.0.1:{free_port()}", keys="join_timeout = 60\n")
    node.start()
    assert until(lambda: "cannot join the cluster yet" in node.log.read_text(), 30)
    node.proc.send_signal(signal.SIGTERM)
    assert node.proc.wait(10) == 0, node.log.read_text()[-2000:]
    said = node.log.read_text()
    assert "stopping: signal received while starting" in said
    assert "RoarMQ stopped" in said


def test_a_node_whose_configuration_cannot_work_stops_at_start_saying_why(etcd, tmp_path):
    """One line each: etcd that does not answer (join_timeout), a node name live under
    another data dir, a replication port in use. The same name from the same data dir
    is the node's own last life: it starts."""
    for sub in "abcd":
        (tmp_path / sub).mkdir()
    nobody = Node(
        tmp_path / "a", "lonely", f"http://127.0.0.1:{free_port()}", keys="join_timeout = 1\n"
    )
    started = time.monotonic()
    line = stopped_with(nobody.start())
    assert "cannot start: [cluster] etcd http://127.0.0.1:" in line, line
    assert "did not answer in 1 s (join_timeout)" in line, line
    assert time.monotonic() - started < 15

    first = Node(tmp_path / "b", "twin", etcd.url).start()
    try:
        assert until(lambda: first.api("/api/vhosts/%2F")["leader"] == "twin", 30)
        second = Node(tmp_path / "c", "twin", etcd.url)
        line = stopped_with(second.start())
        assert "cannot start: [cluster] node 'twin' is already live in the cluster" in line
        first.kill9()  # its last life's lease is still alive: the same data dir restarts
        first.start()
        assert until(lambda: first.api("/api/vhosts/%2F")["leader"] == "twin", 30)
    finally:
        first.stop()

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = Node(tmp_path / "d", "busy", etcd.url)
        busy.repl_port = taken.getsockname()[1]
        line = stopped_with(busy.start())
    assert f"cannot start: [cluster] replication_port {busy.repl_port} on 127.0.0.1" in line
