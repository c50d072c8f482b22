"""Counters and state fields of queues, channels and connections in the management API, each
checked against what RabbitMQ 3.10.8 answered to the same client steps (run with pika
against it; its numbers are the expected values here)."""

from __future__ import annotations

import re
import time
import urllib.request

import pika
import pytest

from roarmq.broker.testing import BrokerThread, ephemeral_config

pytestmark = pytest.mark.timeout(60)

ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00$")


@pytest.fixture
def b(tmp_path):
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as broker:
        sampler = broker.broker._management.rates
        broker.call(sampler.stop)  # sampled by hand: a timer tick between samples would race
        yield broker


def sample(b) -> None:
    b.call(b.broker._management.rates.sample)


def test_message_stats_split_by_ack_mode(b):
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare("split", durable=True)
    for _ in range(5):
        ch.basic_publish("", "split", b"hello", pika.BasicProperties(delivery_mode=2))
    ch.basic_publish("", "split", b"hi")
    ch.basic_get("split", auto_ack=True)
    method, _, _ = ch.basic_get("split")
    ch.basic_nack(method.delivery_tag, requeue=True)
    method, _, _ = ch.basic_get("split")
    assert method.redelivered
    ch.basic_ack(method.delivery_tag)
    ch.basic_consume("split", lambda *a: None, auto_ack=True)
    deadline = time.monotonic() + 10
    while b.api("GET", "/api/queues/%2F/split")[1]["messages"] and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    stats = b.api("GET", "/api/queues/%2F/split")[1]["message_stats"]
    counts = {k: v for k, v in stats.items() if not k.endswith("_details")}
    # RabbitMQ 3.10.8, same steps: the requeue is not an ack, the auto-ack deliveries are
    # not acks, `redeliver` counts the one delivery flagged redelivered.
    assert counts == {
        "ack": 1,
        "deliver": 0,
        "deliver_get": 7,
        "deliver_no_ack": 4,
        "get": 2,
        "get_empty": 0,
        "get_no_ack": 1,
        "publish": 6,
        "redeliver": 1,
    }
    assert "deliver_no_ack_details" in stats and "deliver_details" in stats
    conn.close()


def test_global_acknowledged_and_redelivered(b):
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare("g")
    for _ in range(3):
        ch.basic_publish("", "g", b"x")
    ch.basic_get("g", auto_ack=True)  # settled at once: not an acknowledgement
    method, _, _ = ch.basic_get("g")
    ch.basic_reject(method.delivery_tag, requeue=True)  # requeued, not yet redelivered
    ch.queue_purge("g")  # the requeued message leaves without another delivery
    overview = b.api("GET", "/api/overview")[1]["message_stats"]
    assert overview["ack"] == 0
    with urllib.request.urlopen(b.mgmt_url + "/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    classic = '{protocol="amqp091",queue_type="rabbit_classic_queue"} 0.0'
    assert "rabbitmq_global_messages_acknowledged_total" + classic in metrics
    assert "rabbitmq_global_messages_redelivered_total" + classic in metrics
    conn.close()


def test_persistent_counts_and_bytes(b):
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare("durable_q", durable=True)
    ch.queue_declare("transient_q")
    persistent = pika.BasicProperties(delivery_mode=2)
    for _ in range(5):
        ch.basic_publish("", "durable_q", b"hello", persistent)
        ch.basic_publish("", "transient_q", b"hello", persistent)
    ch.basic_publish("", "durable_q", b"hi")
    ch.basic_get("durable_q")  # one persistent message unacknowledged
    q = b.api("GET", "/api/queues/%2F/durable_q")[1]
    # RabbitMQ 3.10.8: persistent means held by the message store, so a persistent message
    # in a transient queue is not counted; unacknowledged ones are.
    assert (q["messages_persistent"], q["message_bytes_persistent"]) == (5, 25)
    assert (q["message_bytes"], q["message_bytes_ready"]) == (27, 22)
    assert q["message_bytes_unacknowledged"] == 5
    t = b.api("GET", "/api/queues/%2F/transient_q")[1]
    assert (t["messages_persistent"], t["message_bytes_persistent"]) == (0, 0)
    ch.queue_purge("durable_q")
    q = b.api("GET", "/api/queues/%2F/durable_q")[1]
    assert (q["messages_persistent"], q["message_bytes_persistent"]) == (1, 5)
    conn.close()
    q = b.api("GET", "/api/queues/%2F/durable_q")[1]  # the unacknowledged one came back
    assert (q["messages"], q["messages_persistent"], q["message_bytes_persistent"]) == (1, 1, 5)


@pytest.mark.slow  # a restart: not in `make check`
def test_persistent_counts_survive_restart_and_purge(tmp_path):
    cfg = ephemeral_config(data_dir=str(tmp_path / "d"))
    with BrokerThread(cfg, management=True) as b:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("kept", durable=True)
        for i in range(3000):  # enough to be packed behind the head of the queue
            ch.basic_publish("", "kept", b"%05d" % i, pika.BasicProperties(delivery_mode=2))
        conn.close()
    with BrokerThread(cfg, management=True) as b:
        q = b.api("GET", "/api/queues/%2F/kept")[1]
        assert (q["messages_persistent"], q["message_bytes_persistent"]) == (3000, 15000)
        assert b.api("DELETE", "/api/queues/%2F/kept/contents")[0] == 204
        q = b.api("GET", "/api/queues/%2F/kept")[1]
        assert (q["messages_persistent"], q["message_bytes_persistent"]) == (0, 0)


def test_idle_since_and_consumer_utilisation(b):
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare("idle")
    ch.basic_publish("", "idle", b"x")
    sample(b)
    q = b.api("GET", "/api/queues/%2F/idle")[1]
    assert "idle_since" not in q  # busy (or not yet seen still), as RabbitMQ omits it
    assert q["consumer_utilisation"] == 0  # RabbitMQ 3.10.8 says 0 with no consumers
    sample(b)
    q = b.api("GET", "/api/queues/%2F/idle")[1]
    assert ISO_MS.match(q["idle_since"]), q["idle_since"]
    (channel,) = b.api("GET", "/api/channels")[1]
    assert ISO_MS.match(channel["idle_since"])
    ch.basic_consume("idle", lambda *a: None, auto_ack=True)
    conn.process_data_events(time_limit=0.2)
    sample(b)
    q = b.api("GET", "/api/queues/%2F/idle")[1]
    assert "idle_since" not in q
    assert q["consumer_utilisation"] == 1.0  # never short of consumer credit
    conn.close()


def test_utilisation_falls_when_consumers_lack_credit(b):
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare("slow")
    ch.basic_qos(prefetch_count=1)
    ch.basic_consume("slow", lambda *a: None)  # takes one message and never acks it
    for _ in range(3):
        ch.basic_publish("", "slow", b"x")
    conn.process_data_events(time_limit=0.2)
    sample(b)
    time.sleep(0.3)
    sample(b)
    q = b.api("GET", "/api/queues/%2F/slow")[1]
    assert q["consumer_utilisation"] < 0.05  # blocked the whole interval
    conn.close()


def test_connection_octets_and_connected_at(b):
    before = int(time.time() * 1000)
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare("oct")
    sample(b)
    for _ in range(50):
        ch.basic_publish("", "oct", b"x" * 1000)
    ch.queue_declare("oct", passive=True)
    sample(b)
    (row,) = b.api("GET", "/api/connections")[1]
    assert before - 1000 <= row["connected_at"] <= int(time.time() * 1000)
    assert row["recv_oct"] > 50_000 and row["recv_cnt"] >= 1
    assert row["send_oct"] > 0 and row["send_cnt"] >= 1
    assert row["recv_oct_details"]["rate"] > 0
    assert "send_oct_details" in row and row["send_pend"] == 0
    conn.close()
