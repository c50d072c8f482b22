"""Streams in a clustered vhost are replicated with its log: three real nodes on a real
etcd, pika clients.

Every stream message confirmed before a kill -9 of the leader is on the new leader, at
the same offset, with its filter value, and the stream is still a stream bound as before;
offsets go on from there. With a small `checkpoint_bytes` the leader checkpoints and every
member trims its log, and the stream's whole retained history still survives the failover
(a checkpoint copies the streams' retained records)."""

from __future__ import annotations

import pika
import pytest
from support.cluster_nodes import (
    TTL,
    agreed_leader,
    by_name,
    connect,
    fail_over,
    log_of,
    placement,
    run_ctl,
    the_leader,
    three_nodes,
)
from support.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

STREAM = {"x-queue-type": "stream"}
N = 300


@pytest.fixture
def cluster(etcd, tmp_path):
    keys = "replica_lag_ms = 1000\ncheckpoint_bytes = 262144\n"
    with three_nodes(etcd, tmp_path, keys, storage="segment_size = 1048576\n") as nodes:
        yield nodes


def props(i: int) -> pika.BasicProperties:
    return pika.BasicProperties(
        delivery_mode=2, headers={"x-stream-filter-value": "even" if i % 2 == 0 else "odd"}
    )


def publish(node, bodies: list[bytes], start: int) -> None:
    conn = connect(node)
    ch = conn.channel()
    ch.confirm_delivery()
    for i, body in enumerate(bodies, start):
        ch.basic_publish("tx", "a.b", body, props(i), mandatory=True)  # raises on a nack
    conn.close()


def read_stream(node, count: int, arguments: dict | None = None) -> list[tuple[int, bytes]]:
    """(x-stream-offset, body) of the first `count` messages a consumer from `first` gets."""
    conn = connect(node)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=100)
    got: list[tuple[int, bytes]] = []

    def on_message(channel, method, properties, body):
        got.append((properties.headers["x-stream-offset"], body))
        channel.basic_ack(method.delivery_tag)
        if len(got) >= count:
            channel.stop_consuming()

    ch.basic_consume("s", on_message, arguments={"x-stream-offset": "first", **(arguments or {})})
    conn.call_later(20, ch.stop_consuming)
    ch.start_consuming()
    conn.close()
    return got


def declare(leader, arguments: dict | None = None) -> None:
    conn = connect(leader)
    ch = conn.channel()
    ch.exchange_declare("tx", "topic", durable=True)
    ch.queue_declare("s", durable=True, arguments={**STREAM, **(arguments or {})})
    ch.queue_bind("s", "tx", "a.#")
    conn.close()


def test_stream_survives_leader_kill9_at_the_same_offsets(cluster):
    leader = the_leader(cluster)
    declare(leader)
    bodies = [b"m%04d" % i for i in range(N)]
    publish(leader, bodies, 0)
    assert read_stream(leader, N) == list(enumerate(bodies))

    successor = fail_over(cluster, leader)
    row = successor.api("/api/queues/%2F/s")
    assert row["type"] == "stream", row
    assert row["leader"] == successor.name and len(row["members"]) == 3, row
    assert leader.name not in row["online"], row
    bound = successor.api("/api/queues/%2F/s/bindings")
    assert [b["routing_key"] for b in bound if b["source"] == "tx"] == ["a.#"]
    got = read_stream(successor, N)
    assert got == list(enumerate(bodies)), f"{len(got)} of {N} after the failover"
    # offsets go on where the old leader stopped; filtering still knows the old values
    more = [b"n%04d" % i for i in range(50)]
    publish(successor, more, N)
    assert read_stream(successor, N + 50) == list(enumerate(bodies + more))
    odd = read_stream(successor, (N + 50) // 2, {"x-stream-filter": "odd"})
    assert [off for off, _ in odd] == list(range(1, N + 50, 2))


def test_stream_history_survives_checkpoints_and_trimming(cluster):
    """Retention keeps ~400 KB of a stream that takes ~1.5 MB: the log grows past twice
    the live data, checkpoints copy what the stream retains, every member trims; the
    successor holds the newest records at the same offsets, as much of them as retention
    allows (it drops whole segments while over the limit: more than the limit less one
    segment is left)."""
    leader = the_leader(cluster)
    retention = {"x-max-length-bytes": 400_000, "x-stream-max-segment-size-bytes": 100_000}
    declare(leader, retention)
    bodies = [b"%06d" % i + b"x" * 1000 for i in range(1500)]
    for start in range(0, len(bodies), 300):
        publish(leader, bodies[start : start + 300], start)

    def trimmed_everywhere():
        logs = [log_of(n) for n in cluster]
        return all(lg["first_offset"] > 1 for lg in logs) and logs

    assert until(trimmed_everywhere, 40, step=0.5), [log_of(n) for n in cluster]
    assert log_of(leader)["checkpoints"] >= 1
    assert leader.api("/api/queues/%2F/s")["first_offset"] > 0  # retention dropped some
    successor = fail_over(cluster, leader)
    row = successor.api("/api/queues/%2F/s")
    assert row["last_offset"] == len(bodies) - 1, row
    got = read_stream(successor, len(bodies) - row["first_offset"])
    assert [off for off, _ in got] == list(range(row["first_offset"], len(bodies)))
    assert [body for _, body in got] == bodies[row["first_offset"] :]
    assert 300_000 < row["message_bytes"] <= 400_000, row


def test_frozen_leader_thaws_follows_and_leads_its_stream_again(cluster):
    """SIGSTOP the leader past its lease: a follower takes the stream over and appends to
    it; the old leader wakes, follows, and when it leads again (a clean move) in the same
    process it serves the stream as the log has it, not as its own files had it."""
    leader = the_leader(cluster)
    declare(leader)
    first = [b"a%03d" % i for i in range(100)]
    publish(leader, first, 0)
    leader.freeze()
    survivors = [n for n in cluster if n is not leader]
    try:

        def new_leader():
            name = placement(survivors[0])[0]
            return name if name not in (None, leader.name) else None

        name = until(new_leader, 4 * TTL + 10, step=0.1)
        assert name, [n.log.read_text()[-3000:] for n in survivors]
        successor = by_name(survivors, name)
        second = [b"b%03d" % i for i in range(50)]
        publish(successor, second, 100)
    finally:
        leader.thaw()
    assert until(lambda: agreed_leader(cluster) == successor.name, 30), "no rejoin"
    code, _out, err = run_ctl(successor, "move_vhost_leader", "/", leader.name)
    assert code == 0, err
    assert until(lambda: agreed_leader(cluster) == leader.name, 30)
    assert read_stream(leader, 150) == list(enumerate(first + second))
    publish(leader, [b"c"], 150)
    assert read_stream(leader, 151)[-1] == (150, b"c")
