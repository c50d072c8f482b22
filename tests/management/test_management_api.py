"""The management API's RabbitMQ shapes: object writes, publish/get, list parameters
(columns, sort, name, pages), health checks and the smaller endpoints (RabbitMQ 3.10.8's
answers, checked against it)."""

from __future__ import annotations

import base64
import json

import pytest

from roarmq.broker.testing import BrokerThread, ephemeral_config

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def b(tmp_path):
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as broker:
        yield broker


def test_declare_publish_get_and_bindings(b):
    assert b.api("PUT", "/api/exchanges/%2F/shop", {"type": "topic"})[0] == 201
    assert b.api("PUT", "/api/exchanges/%2F/shop", {"type": "topic"})[0] == 204
    status, body = b.api("PUT", "/api/exchanges/%2F/shop", {"type": "direct"})
    assert status == 400 and "inequivalent arg 'type'" in body["reason"]
    assert b.api("PUT", "/api/queues/%2F/orders", {"durable": True})[0] == 201
    assert b.api("PUT", "/api/queues/%2F/orders", {"durable": False})[0] == 400
    status, _ = b.api(
        "POST",
        "/api/bindings/%2F/e/shop/q/orders",
        {"routing_key": "order.*", "arguments": {"x-note": "a"}},
    )
    assert status == 201
    rows = b.api("GET", "/api/bindings/%2F/e/shop/q/orders")[1]
    assert [(r["routing_key"], r["arguments"]) for r in rows] == [("order.*", {"x-note": "a"})]
    assert b.api("GET", "/api/queues/%2F/orders/bindings")[1][-1]["source"] == "shop"
    assert b.api("GET", "/api/exchanges/%2F/shop/bindings/source")[1][0]["destination"] == "orders"
    assert b.api("GET", "/api/exchanges/%2F/shop")[1]["type"] == "topic"

    publish = {
        "routing_key": "order.new",
        "payload": "hello",
        "payload_encoding": "string",
        "properties": {"delivery_mode": 2, "headers": {"k": "v"}},
    }
    assert b.api("POST", "/api/exchanges/%2F/shop/publish", publish) == (200, {"routed": True})
    miss = {**publish, "routing_key": "nothing"}
    assert b.api("POST", "/api/exchanges/%2F/shop/publish", miss) == (200, {"routed": False})
    raw = {
        "routing_key": "orders",
        "payload": base64.b64encode(b"\xff\x00").decode(),
        "payload_encoding": "base64",
        "properties": {},
    }
    assert b.api("POST", "/api/exchanges/%2F/amq.default/publish", raw)[1] == {"routed": True}

    get = {"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto", "truncate": 3}
    msgs = b.api("POST", "/api/queues/%2F/orders/get", get)[1]
    assert [(m["payload"], m["payload_bytes"], m["payload_encoding"]) for m in msgs] == [
        ("hel", 5, "string"),
        (base64.b64encode(b"\xff\x00").decode(), 2, "base64"),
    ]
    assert msgs[0]["properties"] == {"delivery_mode": 2, "headers": {"k": "v"}}
    assert msgs[0]["message_count"] == 1 and not msgs[0]["redelivered"]
    taken = b.api(
        "POST",
        "/api/queues/%2F/orders/get",
        {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"},
    )[1]
    assert taken[0]["redelivered"] is True
    assert b.api("GET", "/api/queues/%2F/orders")[1]["messages"] == 1
    assert b.api("POST", "/api/queues/%2F/orders/get", {"count": 1, "ackmode": "bogus"})[0] == 400

    key = rows[0]["properties_key"]
    assert b.api("DELETE", f"/api/bindings/%2F/e/shop/q/orders/{key}")[0] == 204
    assert b.api("GET", "/api/bindings/%2F/e/shop/q/orders")[1] == []
    assert b.api("DELETE", "/api/exchanges/%2F/shop")[0] == 204
    assert b.api("GET", "/api/exchanges/%2F/shop")[0] == 404


def test_list_parameters_as_rabbitmq(b):
    for name in ("Orders1", "orders2", "misc"):
        assert b.api("PUT", f"/api/queues/%2F/{name}", {})[0] == 201
    status, page = b.api("GET", "/api/queues?page=1&page_size=2&name=orders&columns=name")
    assert page == {
        "filtered_count": 2,
        "item_count": 2,
        "items": [{"name": "Orders1"}, {"name": "orders2"}],
        "page": 1,
        "page_count": 1,
        "page_size": 2,
        "total_count": 3,
    }
    # Without page, name does not filter (RabbitMQ's behaviour).
    assert len(b.api("GET", "/api/queues?name=orders&columns=name")[1]) == 3
    page = b.api(
        "GET", "/api/queues?page=1&name=^O&use_regex=true&columns=name&sort=name&sort_reverse=true"
    )[1]
    assert [i["name"] for i in page["items"]] == ["orders2", "Orders1"]
    names = [q["name"] for q in b.api("GET", "/api/queues?columns=name&sort=name")[1]]
    assert names == ["Orders1", "misc", "orders2"]  # by bytes, as RabbitMQ
    assert b.api("GET", "/api/queues?page=9&page_size=2") == (
        400,
        {"error": "page_out_of_range", "reason": "Page out of range, page: 9 page size: 2, len: 3"},
    )
    only = b.api("GET", "/api/queues/%2F/misc?columns=name,message_stats.publish")[1]
    assert only == {"name": "misc", "message_stats": {"publish": 0}}


def test_health_checks_and_small_endpoints(b):
    assert b.api("GET", "/api/aliveness-test/%2F") == (200, {"status": "ok"})
    assert b.api("GET", "/api/health/checks/alarms")[1]["status"] == "ok"
    assert b.api("GET", "/api/health/checks/local-alarms")[1]["status"] == "ok"
    assert b.api("GET", "/api/health/checks/virtual-hosts") == (200, {"status": "ok"})
    port = b.broker.port
    assert b.api("GET", f"/api/health/checks/port-listener/{port}")[1]["status"] == "ok"
    assert b.api("GET", "/api/health/checks/port-listener/1")[0] == 503
    assert b.api("GET", "/api/health/checks/protocol-listener/amqp")[0] == 200
    assert b.api("GET", "/api/health/checks/protocol-listener/stomp")[0] == 503
    assert b.api("GET", "/api/extensions") == (200, [])
    node = b.api("GET", "/api/nodes")[1][0]
    assert node["running"] is True and node["mem_used"] > 0
    assert b.api("GET", f"/api/nodes/{node['name']}")[1]["name"] == node["name"]
    overview = b.api("GET", "/api/overview")[1]
    assert overview["rabbitmq_version"] and overview["node"] == node["name"]
    assert b.api("PUT", "/api/vhosts/v2")[0] == 201
    assert b.api("PUT", "/api/queues/v2/q2", {})[0] == 201
    assert b.api("PUT", "/api/vhost-limits/v2/max-queues", {"value": 9})[0] == 204
    doc = b.api("GET", "/api/definitions/v2")[1]
    assert [q["name"] for q in doc["queues"]] == ["q2"]
    assert "users" not in doc and "vhost" not in doc["queues"][0]
    params = b.api("GET", "/api/parameters/vhost-limits")[1]
    assert params == [
        {"value": {"max-queues": 9}, "vhost": "v2", "component": "vhost-limits", "name": "limits"}
    ]
    assert b.api("GET", "/api/global-parameters")[1][0]["name"] == "cluster_name"


def test_message_rates_sampled_off_the_message_path(b):
    import pika

    sampler = b.broker._management.rates
    b.call(sampler.stop)  # driven by hand here: a timer tick between samples would race
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare("rated")
    b.call(sampler.sample)  # a queue's rate is measured from the sample after it exists
    for _ in range(10):
        ch.basic_publish("", "rated", b"x")
    ch.queue_declare("rated", passive=True)  # the publishes have been handled
    b.call(sampler.sample)
    queue = b.api("GET", "/api/queues/%2F/rated")[1]["message_stats"]
    assert queue["publish"] == 10 and queue["publish_details"]["rate"] > 0
    assert queue["deliver_get_details"] == {"rate": 0.0}
    overview = b.api("GET", "/api/overview")[1]["message_stats"]
    assert overview["publish"] == 10 and overview["publish_details"]["rate"] > 0
    assert set(overview) >= {
        "confirm",
        "deliver_get",
        "ack",
        "return_unroutable",
        "drop_unroutable",
    }
    exchange = b.api("GET", "/api/exchanges/%2F/amq.default")[1]["message_stats"]
    assert exchange["publish_in"] == 10 and exchange["publish_in_details"]["rate"] > 0
    conn.close()


def test_one_queue_shows_consumers_and_bytes(b):
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare("detailed")
    ch.basic_publish("", "detailed", b"12345")
    ch.basic_publish("", "detailed", b"123")
    ch.basic_qos(prefetch_count=1)
    ch.basic_consume("detailed", lambda *a: None, consumer_tag="watcher")
    conn.process_data_events(0.2)
    q = b.api("GET", "/api/queues/%2F/detailed")[1]
    assert q["state"] == "running"
    assert [c["consumer_tag"] for c in q["consumer_details"]] == ["watcher"]
    assert q["consumer_details"][0]["prefetch_count"] == 1
    assert (q["message_bytes_ready"], q["message_bytes_unacknowledged"], q["message_bytes"]) == (
        3,
        5,
        8,
    )
    conn.close()


def test_the_sampler_runs_on_its_timer_in_slices(b, monkeypatch):
    import time

    from roarmq.broker.management import rates

    monkeypatch.setattr(rates, "SLICE", 2)  # five queues: three slices a pass
    for i in range(5):
        b.api("PUT", f"/api/queues/%2F/s{i}", {})
    sampler = rates.RateSampler(b.broker, interval=0.05)
    b.call(sampler.start)
    try:
        first = sampler._at
        deadline = time.monotonic() + 5
        while sampler._at == first or sampler._elapsed is None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        queue = b.broker.vhosts["/"].queues["s4"]
        assert id(queue) in sampler._last and id(queue) in sampler._before
    finally:
        b.call(sampler.stop)


def test_every_part_of_a_sampler_pass_is_sliced(b, monkeypatch):
    """A pass yields the loop every SLICE queues, and every SLICE objects when it looks for
    idle ones and when it frees the pass before last: with 100,000 queues those two were a
    140 ms stall in one go (the stall ring named it: 'management sampler ran ...')."""
    from roarmq.broker.management import rates

    monkeypatch.setattr(rates, "SLICE", 2)
    for i in range(5):
        b.api("PUT", f"/api/queues/%2F/sl{i}", {})
    sampler = rates.RateSampler(b.broker, interval=3600)
    b.call(sampler.sample)
    b.call(sampler.sample)
    before_last = len(sampler._before)

    def one_pass() -> int:
        return sum(1 for _ in sampler._steps())

    turns = b.call(one_pass)
    objects = len(sampler._last)  # queues, exchanges, the vhost, the totals
    assert turns >= 5 // 2 + objects // 2 + before_last // 2


def test_a_sampler_pass_leaves_nothing_for_the_collector_to_scan(b):
    """A sample's entries hold strings and numbers only (the objects are kept in one dict
    beside them), so a young collection untracks them instead of promoting them: with
    100,000 queues the entries that held their queue made generation-1 passes of 21 ms."""
    import gc

    from roarmq.broker.management import rates

    for i in range(50):
        b.api("PUT", f"/api/queues/%2F/gc{i}", {})
    sampler = rates.RateSampler(b.broker, interval=3600)
    b.call(sampler.sample)
    gc.collect()  # what the first pass kept is old now (its names tuples among it)
    b.call(sampler.sample)
    gc.collect(0)  # one young pass
    queue = b.broker.vhosts["/"].queues["gc7"]
    assert id(queue) in sampler._last
    assert not any(gc.is_tracked(entry) for entry in sampler._last.values())
    assert not any(gc.is_tracked(entry) for entry in sampler._before.values())
    assert sampler._last_objects[id(queue)] is queue  # what keeps the id this queue's
    assert sampler.rate(queue, "publish") == 0.0 and "idle_since" in sampler.idle_since(queue)


def test_one_connection_and_its_channels(b):
    import urllib.parse

    import pika

    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    conn.channel()
    conn.channel()
    row = b.api("GET", "/api/connections")[1][0]
    assert row["protocol"] == "AMQP 0-9-1" and row["peer_host"] == "127.0.0.1"
    assert row["port"] == b.broker.port and row["channel_max"] > 0
    name = urllib.parse.quote(row["name"], safe="")
    assert b.api("GET", f"/api/connections/{name}")[1]["name"] == row["name"]
    channels = b.api("GET", f"/api/connections/{name}/channels")[1]
    assert [c["number"] for c in channels] == [1, 2]
    one = urllib.parse.quote(channels[1]["name"], safe="")
    assert b.api("GET", f"/api/channels/{one}")[1]["number"] == 2
    assert b.api("GET", "/api/connections/nope")[0] == 404
    conn.close()


def test_overview_churn_exchange_types_and_listeners(b):
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    conn.channel().queue_declare("churned")
    conn.close()
    o = b.api("GET", "/api/overview")[1]
    churn = o["churn_rates"]
    assert (churn["connection_created"], churn["connection_closed"]) == (1, 1)
    assert (churn["channel_created"], churn["queue_created"]) == (1, 1)
    assert "rate" in churn["queue_declared_details"]
    assert [t["name"] for t in o["exchange_types"]] == [
        "direct",
        "fanout",
        "headers",
        "topic",
        "x-delayed-message",
    ]
    protocols = {(x["protocol"], x["port"]) for x in o["listeners"]}
    assert ("amqp", b.broker.port) in protocols and ("http", b.broker.mgmt_port) in protocols


def test_one_vhost_definitions_round_trip(b):
    assert b.api("PUT", "/api/vhosts/src")[0] == 201
    assert b.api("PUT", "/api/vhosts/dst")[0] == 201
    assert b.api("PUT", "/api/exchanges/src/x", {"type": "fanout"})[0] == 201
    assert b.api("PUT", "/api/queues/src/q", {})[0] == 201
    assert b.api("POST", "/api/bindings/src/e/x/q/q", {"routing_key": ""})[0] == 201
    doc = b.api("GET", "/api/definitions/src")[1]
    assert b.api("POST", "/api/definitions/dst", doc)[0] == 204
    dst = b.broker.vhosts["dst"]
    assert "q" in dst.queues and "x" in dst.exchanges
    assert b.api("GET", "/api/bindings/dst/e/x/q/q")[1][0]["destination"] == "q"


def test_depth_rates_and_publish_out(b):
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare("deep-rate")
    sampler = b.broker._management.rates
    b.call(sampler.stop)  # driven by hand here: a timer tick between samples would race
    b.call(sampler.sample)
    for _ in range(4):
        ch.basic_publish("", "deep-rate", b"x")
    ch.basic_publish("amq.direct", "nowhere", b"x")
    ch.queue_declare("deep-rate", passive=True)
    b.call(sampler.sample)
    q = b.api("GET", "/api/queues/%2F/deep-rate")[1]
    assert q["messages_ready_details"]["rate"] > 0
    assert q["messages_details"]["rate"] == q["messages_ready_details"]["rate"]
    assert b.api("GET", "/api/overview")[1]["queue_totals"]["messages_details"]["rate"] > 0
    direct = b.api("GET", "/api/exchanges/%2F/amq.direct")[1]["message_stats"]
    assert (direct["publish_in"], direct["publish_out"]) == (1, 0)
    conn.close()


def test_get_counters(b):
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare("gets")
    ch.basic_get("gets")  # empty
    ch.basic_publish("", "gets", b"1")
    ch.basic_publish("", "gets", b"2")
    method, _, _ = ch.basic_get("gets")
    ch.basic_nack(method.delivery_tag, requeue=True)
    ch.basic_get("gets", auto_ack=True)
    stats = b.api("GET", "/api/queues/%2F/gets")[1]["message_stats"]
    assert (stats["get"], stats["get_no_ack"], stats["get_empty"], stats["redeliver"]) == (
        1,
        1,
        1,
        1,
    )
    conn.close()


def test_errors_in_rabbitmq_shapes(b):
    import urllib.error
    import urllib.request

    assert b.api("POST", "/api/overview") == (405, None)
    assert b.api("GET", "/api/nonexistent") == (
        404,
        {"error": "Object Not Found", "reason": "Not Found"},
    )
    request = urllib.request.Request(
        b.mgmt_url + "/api/queues/%2F/x",
        method="PUT",
        data=b"not json",
        headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q=", "Content-Type": "application/json"},
    )
    try:
        urllib.request.urlopen(request, timeout=10)
        raise AssertionError("accepted")
    except urllib.error.HTTPError as exc:
        assert exc.code == 400
        assert json.loads(exc.read()) == {"error": "bad_request", "reason": "not_json"}


def test_vhost_rows(b):
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare("vq")
    ch.basic_publish("", "vq", b"x")
    ch.queue_declare("vq", passive=True)
    row = b.api("GET", "/api/vhosts/%2F")[1]
    assert (row["messages"], row["message_stats"]["publish"]) == (1, 1)
    assert row["default_queue_type"] == "classic" and row["metadata"] == {
        "description": "",
        "tags": [],
    }
    conn.close()


def test_vhost_metadata_and_cluster_name_survive_a_restart(tmp_path):
    cfg = ephemeral_config(data_dir=str(tmp_path / "d"))
    body = {"description": "Staging, EU", "tags": "a,b", "default_queue_type": "quorum"}
    with BrokerThread(cfg, management=True) as b:
        assert b.api("PUT", "/api/vhosts/staging", body)[0] == 201
        assert b.api("PUT", "/api/cluster-name", {"name": "shop-prod"})[0] == 204
        status, refused = b.api("PUT", "/api/vhosts/staging", {**body, "tracing": "yes"})
        assert status == 400 and "tracing" in refused["reason"]
        assert b.api("PUT", "/api/vhosts/staging", {**body, "tracing": True})[0] == 204
        assert b.api("GET", "/api/vhosts/staging")[1]["tracing"] is True
        exported = b.api("GET", "/api/definitions")[1]["vhosts"]
    assert {"name": "staging", "description": "Staging, EU", "tags": ["a", "b"]}.items() <= next(
        v for v in exported if v["name"] == "staging"
    ).items()
    with BrokerThread(cfg, management=True) as b:
        row = b.api("GET", "/api/vhosts/staging")[1]
        assert (row["description"], row["tags"], row["default_queue_type"]) == (
            "Staging, EU",
            ["a", "b"],
            "quorum",
        )
        assert row["metadata"] == {"description": "Staging, EU", "tags": ["a", "b"]}
        assert row["tracing"] is False  # the running node's, as RabbitMQ's: not stored
        assert b.api("GET", "/api/cluster-name")[1] == {"name": "shop-prod"}
        overview = b.api("GET", "/api/overview")[1]
        assert overview["cluster_name"] == "shop-prod" and overview["node"] != "shop-prod"
        # As RabbitMQ 3.10.8: a PUT replaces the description and tags, absent ones too.
        assert b.api("PUT", "/api/vhosts/staging", {})[0] == 204
        row = b.api("GET", "/api/vhosts/staging")[1]
        assert (row["description"], row["tags"]) == ("", [])
