"""A durable delayed exchange's persistent messages live in the vhost's replicated log:
after a kill -9 of the leader, the new leader routes every confirmed one exactly once, and
none before its due time. Three real nodes on a real etcd, pika with confirms."""

from __future__ import annotations

import signal
import time

import pika
import pytest
from support.cluster_nodes import connect, fail_over, the_leader, three_nodes
from support.delayed import delayed_direct_to_queue
from support.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


@pytest.fixture
def cluster(etcd, tmp_path):
    with three_nodes(etcd, tmp_path, "replica_lag_ms = 1000\n") as nodes:
        yield nodes


def _publish(ch, n: int, delay: int) -> float:
    sent = time.time()
    ch.basic_publish(
        "dx",
        "k",
        b"%d" % n,
        pika.BasicProperties(delivery_mode=2, headers={"x-delay": delay}),
        mandatory=False,
    )
    return sent


def test_failover_neither_loses_nor_duplicates_nor_delivers_early(cluster):
    leader = the_leader(cluster)
    conn = connect(leader)
    ch = conn.channel()
    ch.confirm_delivery()
    delayed_direct_to_queue(ch)
    due: dict[int, float] = {}
    for n in range(100):  # due around the failover, and well after it
        delay = 1500 if n < 50 else 9000
        due[n] = _publish(ch, n, delay) + delay / 1000
    conn.close()
    new = fail_over(cluster, leader)
    assert leader.proc is not None and leader.proc.wait(10) == -signal.SIGKILL
    assert new is not leader
    conn = connect(new)
    ch = conn.channel()
    ch.confirm_delivery()
    # Due after every one of them: once it is in, any second copy would be too.
    marker_due = _publish(ch, 1000, 10_000) + 10.0
    got: list[tuple[int, float]] = []

    def on_message(channel, method, props, body):
        got.append((int(body), time.time()))
        channel.basic_ack(method.delivery_tag)

    ch.basic_consume("q", on_message)
    until(lambda: conn.process_data_events(0.05) or any(n == 1000 for n, _ in got), 40)
    numbers = [n for n, _ in got]
    assert sorted(numbers) == list(range(100)) + [1000], numbers  # none lost, none twice
    early = [(n, due[n] - at) for n, at in got if n < 100 and at < due[n]]
    assert early == []
    assert dict(got)[1000] >= marker_due
    conn.close()
