"""A clustered vhost's log stays near its live data, and durable declares wait for the
in-sync set; three real nodes on a real etcd, pika clients.

* Checkpoints: past `checkpoint_bytes`, the leader rewrites the live state at the log's
  head and every member trims below it; a kill -9 of the leader then recovers exactly the
  messages not acked (nothing acked comes back, nothing confirmed is lost).
* A durable queue.declare is answered only once every in-sync member has the definitions:
  with a follower frozen (SIGSTOP), the answer comes after it left the in-sync set.
"""

from __future__ import annotations

import pika
import pytest
from support.cluster_nodes import (
    PERSISTENT,
    TTL,
    agreed_leader,
    by_name,
    connect,
    drain,
    log_of,
    placement,
    run_ctl,
    the_leader,
    three_nodes,
)
from support.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

BODY = b"x" * 1000


@pytest.fixture
def cluster(etcd, tmp_path):
    keys = "replica_lag_ms = 1000\ncheckpoint_bytes = 262144\n"
    with three_nodes(etcd, tmp_path, keys, storage="segment_size = 1048576\n") as nodes:
        yield nodes


def test_checkpoint_trims_every_copy_and_failover_recovers_exactly_the_unacked(cluster):
    leader = the_leader(cluster)
    leader_name = leader.name
    conn = connect(leader)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("q", durable=True)
    ch.queue_declare("other", durable=True)
    # One publish record for two queues: acked from "fa" before the checkpoint, kept by
    # "fb", which is lazy (its bodies are read back from the log, after the trim too).
    ch.exchange_declare("fan", "fanout", durable=True)
    ch.queue_declare("fa", durable=True)
    ch.queue_declare("fb", durable=True, arguments={"x-queue-mode": "lazy"})
    for name in ("fa", "fb"):
        ch.queue_bind(name, "fan")
    for i in range(50):
        ch.basic_publish("fan", "", b"f%d" % i, PERSISTENT)
    for _ in range(50):
        method, _props, _body = ch.basic_get("fa")
        ch.basic_ack(method.delivery_tag)
    for i in range(3000):
        ch.basic_publish("", "q", b"%06d" % i + BODY, PERSISTENT)
    for i in range(100):
        ch.basic_publish("", "other", b"o%d" % i, PERSISTENT)
    # Ack the first 2700 of q (one by one, as consumers do), keep 300 and all of "other".
    for _ in range(2700):
        method, _props, _body = ch.basic_get("q")
        ch.basic_ack(method.delivery_tag)
    # Leave two delivered-but-unacked messages: they must come back after the failover.
    held = [ch.basic_get("q")[0] for _ in range(2)]
    assert all(held)

    def trimmed_everywhere():
        logs = [log_of(n) for n in cluster]
        return all(lg["first_offset"] > 1 for lg in logs) and logs

    logs = until(trimmed_everywhere, 40, step=0.5)
    assert logs, [log_of(n) for n in cluster]
    assert log_of(leader)["checkpoints"] >= 1
    # 3000 publishes of ~1 KB were written: without trimming the files hold over 3 MB.
    assert all(log_of(n)["bytes"] < 2_500_000 for n in cluster), [log_of(n) for n in cluster]
    # Below the trim, where the lazy queue's bodies were first written, nothing is left:
    # they come from the checkpoint's copies.
    for i in range(10):
        method, _props, body = ch.basic_get("fb")
        assert body == b"f%d" % i
        ch.basic_ack(method.delivery_tag)
    # A confirmed publish after the acks: the log is in order, so the acks are in every
    # in-sync copy once it is confirmed (an ack itself is not confirmed to anyone).
    ch.basic_publish("", "fa", b"after the acks", PERSISTENT)

    leader.kill9()
    survivors = [n for n in cluster if n is not leader]

    def new_leader():
        name = agreed_leader(survivors, size=len(placement(survivors[0])[2]))
        return name if name not in (None, leader_name) else None

    successor = by_name(survivors, until(new_leader, 4 * TTL + 10, step=0.1))
    got = drain(successor, "q")
    assert got == [b"%06d" % i + BODY for i in range(2700, 3000)]
    assert drain(successor, "other") == [b"o%d" % i for i in range(100)]
    assert drain(successor, "fa") == [b"after the acks"]
    assert drain(successor, "fb") == [b"f%d" % i for i in range(10, 50)]
    # Ids named below the checkpoint are not given again: new messages recover too.
    conn = connect(successor)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", "q", b"after", PERSISTENT)
    conn.close()
    assert drain(successor, "q") == [b"after"]


def test_durable_declare_waits_for_the_in_sync_set(cluster, etcd):
    leader = the_leader(cluster)
    leader_name = leader.name
    frozen = next(n for n in cluster if n is not leader)
    conn = connect(leader)
    ch = conn.channel()
    ch.queue_declare("before", durable=True)
    frozen.freeze()
    try:
        ch.queue_declare("during", durable=True)
        # Answered: so every in-sync member had it, and the frozen one could not have.
        # etcd's set itself, read now (the API shows the node's watch-fed copy of it).
        in_sync = etcd.value("/roarmq/vhosts/%2F/isr")
        assert frozen.name not in in_sync and leader_name in in_sync
    finally:
        frozen.thaw()
    ch.queue_declare("during", passive=True)
    conn.close()
    assert until(lambda: frozen.name in leader.api("/api/vhosts/%2F")["in_sync"], 30)


def test_lazy_queue_bodies_page_out_and_come_back_from_the_vhost_store(cluster):
    """A lazy queue keeps no body in memory: deliveries, basic.get and dead-lettering read
    them back from the clustered vhost's own store (not the node's)."""
    leader = the_leader(cluster)
    conn = connect(leader)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("dead", durable=True)
    lazy = {
        "x-queue-mode": "lazy",
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "dead",
    }
    ch.queue_declare("lazy", durable=True, arguments=lazy)
    for i in range(20):
        ch.basic_publish("", "lazy", b"body%d" % i, PERSISTENT)
    got = []
    for _ in range(10):
        method, _props, body = ch.basic_get("lazy")
        got.append(body)
        ch.basic_ack(method.delivery_tag)
    for _ in range(5):  # rejected: dead-lettered with their bodies
        method, _props, _body = ch.basic_get("lazy")
        ch.basic_reject(method.delivery_tag, requeue=False)
    conn.close()
    assert got == [b"body%d" % i for i in range(10)]
    assert drain(leader, "dead") == [b"body%d" % i for i in range(10, 15)]
    assert drain(leader, "lazy") == [b"body%d" % i for i in range(15, 20)]


def test_leadership_away_and_back_in_one_process_recovers_no_duplicates(cluster):
    """A node that led the vhost, lost it (a clean move) and wins it back rebuilds its
    queues from the log alone: what it still held in memory is not added twice."""
    first = the_leader(cluster)
    second = next(n for n in cluster if n is not first)
    conn = connect(first)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("kept", durable=True)
    for i in range(50):
        ch.basic_publish("", "kept", b"%d" % i, PERSISTENT)
    # an exchange-to-exchange binding the vhost drops while `first` is away
    ch.exchange_declare("e1", "fanout", durable=True)
    ch.exchange_declare("e2", "fanout", durable=True)
    ch.exchange_bind("e2", "e1")
    ch.queue_declare("via", durable=True)
    ch.queue_bind("via", "e2")
    conn.close()
    for target in (second, first):
        code, _out, err = run_ctl(target, "move_vhost_leader", "/", target.name)
        assert code == 0, (
            err + "\n\n" + "\n\n".join(f"{n.name}:\n{n.log.read_text()[-4000:]}" for n in cluster)
        )
        assert until(lambda t=target: agreed_leader(cluster) == t.name, 20)
        if target is second:
            conn = connect(second)
            conn.channel().exchange_unbind("e2", "e1")
            conn.close()
    assert drain(first, "kept") == [b"%d" % i for i in range(50)]
    conn = connect(first)
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):  # e1 routes nowhere now
        ch.basic_publish("e1", "", b"x", PERSISTENT, mandatory=True)
    ch.basic_publish("e2", "", b"y", PERSISTENT, mandatory=True)  # e2 -> via still stands
    conn.close()
    assert drain(first, "via") == [b"y"]
