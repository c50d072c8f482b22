"""A quorum queue's delivery counts and delayed retries survive a failover, as they survive
a kill -9 on one node (tests/store/test_returns_across_restarts.py): the returned records
are records of the vhost's replicated log, so the new leader's queue counts on from where
the old one was and holds a message a delayed retry holds until its ready time, never
sooner. Three real nodes on a real etcd, pika with confirms."""

from __future__ import annotations

import signal
import time

import pika
import pytest
from support.cluster_nodes import connect, fail_over, the_leader, three_nodes
from support.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

PERSISTENT = pika.BasicProperties(delivery_mode=2)
#: The delayed retry (ms): long enough to outlast the failover.
HOLD_MS = 12000


@pytest.fixture
def cluster(etcd, tmp_path):
    with three_nodes(etcd, tmp_path, "replica_lag_ms = 1000\n") as nodes:
        yield nodes


def test_delivery_counts_and_a_delayed_retry_go_on_after_a_failover(cluster):
    leader = the_leader(cluster)
    conn = connect(leader)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("counted", durable=True, arguments={"x-queue-type": "quorum"})
    retrying = {
        "x-queue-type": "quorum",
        "x-delayed-retry-type": "all",
        "x-delayed-retry-min": HOLD_MS,
        "x-delayed-retry-max": HOLD_MS,
    }
    ch.queue_declare("retrying", durable=True, arguments=retrying)
    ch.basic_publish("", "counted", b"counted", PERSISTENT)
    ch.basic_publish("", "retrying", b"poison", PERSISTENT)
    for n in range(2):
        method, props, _ = ch.basic_get("counted")
        assert props.headers == {"x-delivery-count": n}
        ch.basic_nack(method.delivery_tag, requeue=True)
    method, _props, _ = ch.basic_get("retrying")
    ch.basic_reject(method.delivery_tag, requeue=True)
    ready_at = time.time() + HOLD_MS / 1000
    ch.queue_declare("sync", durable=True)
    ch.basic_publish("", "sync", b"sync", PERSISTENT)  # confirmed: what came before is in
    conn.close()
    new = fail_over(cluster, leader)
    assert leader.proc is not None and leader.proc.wait(10) == -signal.SIGKILL
    conn = connect(new)
    ch = conn.channel()
    assert time.time() < ready_at - 1.0, "the failover took too long to show the hold"
    method, props, body = ch.basic_get("counted")
    assert body == b"counted" and props.headers == {"x-delivery-count": 2}
    ch.basic_ack(method.delivery_tag)
    assert ch.basic_get("retrying")[0] is None  # still held on the new leader
    got: list[tuple[float, pika.BasicProperties]] = []

    def retried() -> bool:
        method, props, _body = ch.basic_get("retrying", auto_ack=True)
        if method is not None:
            got.append((time.time(), props))
        return bool(got)

    assert until(retried, HOLD_MS / 1000 + 15, step=0.01)
    at, props = got[0]
    assert at >= ready_at - 0.1, (at, ready_at)  # never sooner (the nodes share one clock)
    assert props.headers == {"x-delivery-count": 1}
    conn.close()
