"""Paged lists the API answers without building every row: the queues' and exchanges' rate
columns as sort keys (read from the rate sampler's last two passes), and GET /api/bindings
paged in RabbitMQ's order (rows for one page only), each the same as the unpaged answer."""

from __future__ import annotations

import time

import pika
import pytest

from roarmq.broker.management import objects

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def b(mgmt_broker_sampled_by_hand):
    return mgmt_broker_sampled_by_hand


def names(rows):
    return [(r["vhost"], r["name"]) for r in rows]


def test_queues_and_exchanges_sort_by_rate_when_paged(b):
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    counts = {"r0": 0, "r1": 3, "r2": 9, "r3": 1, "r4": 6, "r5": 0}
    for name in counts:
        ch.exchange_declare("x" + name, "fanout")
        ch.queue_declare(name)
        ch.queue_bind(name, "x" + name)
    sampler, start = b.broker._management.rates, time.time() - 10
    b.call(lambda: sampler.sample(at=start))
    for name, n in counts.items():
        for _ in range(n):
            ch.basic_publish("x" + name, "", b"m")
    ch.basic_publish("xr0", "nowhere", b"m")  # routed: fanout ignores the key
    for _ in range(2):  # r4: two basic.gets, acked
        method, _, _ = ch.basic_get("r4")
        ch.basic_ack(method.delivery_tag)
    b.call(lambda: sampler.sample(at=start + 5))

    def paged(path, sort, page, size=2):
        q = f"{path}?page={page}&page_size={size}&sort={sort}&sort_reverse=true"
        status, body = b.api("GET", q)
        assert status == 200, body
        return body

    for path, keys in (
        ("/api/queues", objects.QUEUE_RATE_KEYS),
        ("/api/exchanges", objects.EXCHANGE_RATE_KEYS),
    ):
        for sort in keys:
            whole = b.api("GET", f"{path}?sort={sort}&sort_reverse=true")[1]  # the general path
            pages = [paged(path, sort, p) for p in range(1, (len(whole) + 1) // 2 + 1)]
            assert all(p["total_count"] == len(whole) for p in pages)
            assert [r for p in pages for r in p["items"]] == whole, sort
    top = paged("/api/queues", "message_stats.publish_details.rate", 1, 3)["items"]
    assert [r["name"] for r in top] == ["r2", "r4", "r1"]
    rate = top[0]["message_stats"]["publish_details"]["rate"]
    assert rate > top[1]["message_stats"]["publish_details"]["rate"] > 0
    top = paged("/api/queues", "message_stats.deliver_get_details.rate", 1, 1)["items"]
    assert top[0]["name"] == "r4"
    top = paged("/api/queues", "messages_details.rate", 1, 1)["items"]
    assert top[0]["name"] == "r2"
    top = paged("/api/exchanges", "message_stats.publish_in_details.rate", 1, 2)["items"]
    assert [r["name"] for r in top] == ["xr2", "xr4"]
    # the paged path answered (no row built for the rest): the sort keys are the cheap ones
    key = objects._with_rates(objects.QUEUE_SORT_KEYS, objects.QUEUE_RATE_KEYS, sampler)
    r2 = b.broker.vhosts["/"].queues["r2"]
    assert key["message_stats.publish_details.rate"](r2) == rate
    conn.close()


def test_bindings_paged_are_the_unpaged_sliced(b):
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.exchange_declare("bx", "topic")
    ch.exchange_declare("hx", "headers")
    for i in range(300):
        ch.queue_declare(f"bq{i:03d}")
        if i % 3 == 0:
            ch.queue_bind(f"bq{i:03d}", "bx", f"k.{i % 7}")
        if i % 50 == 0:
            ch.queue_bind(f"bq{i:03d}", "hx", "", {"x-match": "all", "n": i})
    ch.exchange_bind("hx", "bx", "#")
    b.api("PUT", "/api/vhosts/other", {})
    b.api("PUT", "/api/queues/other/oq", {})
    for path in ("/api/bindings", "/api/bindings/%2F"):
        whole = b.api("GET", path)[1]
        assert len(whole) > 400
        for size in (7, 100, 500):
            got, page = [], 1
            while True:
                status, body = b.api("GET", f"{path}?page={page}&page_size={size}")
                assert status == 200, body
                assert body["total_count"] == body["filtered_count"] == len(whole)
                assert body["item_count"] == len(body["items"])
                got += body["items"]
                if page >= body["page_count"]:
                    break
                page += 1
            assert got == whole, (path, size)
        status, body = b.api("GET", f"{path}?page=999&page_size=100")
        assert status == 400 and "page_out_of_range" in str(body)
        # sorted and filtered pages are the general path's, sliced
        for sort in ("source", "destination", "routing_key", "destination_type", "arguments"):
            general = b.api("GET", f"{path}?sort={sort}&sort_reverse=true")[1]
            body = b.api("GET", f"{path}?page=2&page_size=50&sort={sort}&sort_reverse=true")[1]
            assert body["items"] == general[50:100], sort
        body = b.api("GET", f"{path}?page=1&page_size=5&columns=destination,routing_key")[1]
        assert body["items"] == [
            {"destination": r["destination"], "routing_key": r["routing_key"]} for r in whole[:5]
        ]
        body = b.api("GET", f"{path}?page=1&page_size=5&name=bq")[1]
        assert body["filtered_count"] == 0 and body["total_count"] == len(whole)  # as before
    assert {r["vhost"] for r in b.api("GET", "/api/bindings")[1]} == {"/", "other"}
    conn.close()
