"""RabbitMQ-named Prometheus families (`rabbitmq_*`), as RabbitMQ's Grafana dashboards query
them: totals that only grow, gauges of what is there now, per-queue series on request."""

from __future__ import annotations

import urllib.request

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from roarmq.broker import __version__
from roarmq.broker.testing import BrokerThread, ephemeral_config

pytestmark = pytest.mark.timeout(60)

#: RabbitMQ 3.10's labels: per protocol, and per protocol and queue type.
AMQP = {"protocol": "amqp091"}
CLASSIC = {**AMQP, "queue_type": "rabbit_classic_queue"}


def scrape(b, path="/metrics") -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(b.mgmt_url + path, timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(samples, name, **labels) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_rabbitmq_families(tmp_path):
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("m1")
        ch.queue_declare("m1")
        ch.queue_declare("gone")
        for _ in range(3):
            ch.basic_publish("", "m1", b"x")
        ch.basic_publish("", "gone", b"y")
        ch.basic_publish("amq.direct", "nowhere", b"z")  # dropped
        with pytest.raises(pika.exceptions.UnroutableError):  # returned
            ch.basic_publish("amq.direct", "nowhere", b"z", mandatory=True)
        method, _, _ = ch.basic_get("m1")
        ch.basic_ack(method.delivery_tag)
        ch.basic_get("gone", auto_ack=True)
        ch.queue_delete("gone")  # its counts must not vanish from the totals
        s = scrape(b)
        assert value(s, "rabbitmq_connections") == 1
        assert value(s, "rabbitmq_channels") == 1
        assert value(s, "rabbitmq_queues") == 1
        assert value(s, "rabbitmq_queue_messages_ready") == 2
        assert value(s, "rabbitmq_queues_declared_total") == 3
        assert value(s, "rabbitmq_queues_created_total") == 2
        assert value(s, "rabbitmq_queues_deleted_total") == 1
        assert value(s, "rabbitmq_global_messages_received_total", **AMQP) == 6
        assert value(s, "rabbitmq_global_messages_routed_total", **AMQP) == 4
        assert value(s, "rabbitmq_global_messages_unroutable_dropped_total", **AMQP) == 1
        assert value(s, "rabbitmq_global_messages_unroutable_returned_total", **AMQP) == 1
        assert value(s, "rabbitmq_global_messages_confirmed_total", **AMQP) == 6
        assert value(s, "rabbitmq_global_messages_delivered_total", **CLASSIC) == 2
        # Acks by consumers only, as RabbitMQ: the auto-ack basic.get is not one.
        assert value(s, "rabbitmq_global_messages_acknowledged_total", **CLASSIC) == 1
        assert value(s, "rabbitmq_global_messages_delivered_get_manual_ack_total", **CLASSIC) == 1
        assert value(s, "rabbitmq_global_messages_delivered_get_auto_ack_total", **CLASSIC) == 1
        assert value(s, "rabbitmq_global_messages_delivered_consume_auto_ack_total", **CLASSIC) == 0
        assert value(s, "rabbitmq_connections_opened_total") == 1
        assert value(s, "rabbitmq_channels_opened_total") == 1
        build = [labels for name, labels in s if name == "rabbitmq_build_info"]
        assert ("product_name", "RoarMQ") in build[0]
        assert ("rabbitmq_version", __version__) in build[0]
        assert value(s, "rabbitmq_process_resident_memory_bytes") > 0
        assert value(s, "rabbitmq_process_open_fds") > 0
        conn.close()
        s = scrape(b)
        assert value(s, "rabbitmq_connections_closed_total") == 1
        assert value(s, "rabbitmq_channels_closed_total") == 1
        per = scrape(b, "/metrics/per-object")
        assert value(per, "rabbitmq_queue_messages_ready", vhost="/", queue="m1") == 2
        assert value(per, "rabbitmq_queue_messages_published_total", vhost="/", queue="m1") == 3
        assert ("rabbitmq_queue_messages_ready", ()) not in per


def test_roarmq_families(tmp_path):
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.exchange_declare("t", "topic")
        ch.queue_declare("tq", durable=True)
        ch.queue_bind("tq", "t", "a.*")
        ch.queue_bind("tq", "t", "#.z")
        for _ in range(3):
            ch.basic_publish("t", "a.b", b"x", pika.BasicProperties(delivery_mode=2))
        ch.basic_publish("t", "c.z", b"y")
        s = scrape(b)
        assert value(s, "roarmq_routing_cache_misses_total") == 2  # a.b once, c.z once
        assert value(s, "roarmq_routing_cache_hits_total") == 2  # a.b twice more
        assert value(s, "roarmq_routing_cache_size") == 2
        assert value(s, "roarmq_bindings") == 2
        assert value(s, "roarmq_store_fsync_seconds_count") >= 1  # persistent, confirmed
        assert value(s, "roarmq_store_fsync_seconds_bucket", le="+Inf") == value(
            s, "roarmq_store_fsync_seconds_count"
        )
        per = scrape(b, "/metrics/per-object")
        assert value(per, "roarmq_exchange_bindings", vhost="/", exchange="t") == 2
        assert value(per, "roarmq_exchange_routing_cache_size", vhost="/", exchange="t") == 2
        conn.close()


def test_redelivered_counts_requeues(tmp_path):
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.queue_declare("rq")
        ch.basic_publish("", "rq", b"x")
        method, _, _ = ch.basic_get("rq")
        ch.basic_nack(method.delivery_tag, requeue=True)
        method, _, _ = ch.basic_get("rq")
        assert method.redelivered
        ch.basic_ack(method.delivery_tag)
        assert value(scrape(b), "rabbitmq_global_messages_redelivered_total", **CLASSIC) == 1
        conn.close()
