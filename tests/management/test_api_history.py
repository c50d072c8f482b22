"""The management API's sample history: RabbitMQ's `lengths_age`/`lengths_incr` and
`msg_rates_age`/`msg_rates_incr` on the overview, a queue and an exchange (the shape of
RabbitMQ 3.10's rabbit_mgmt_stats:format_range: `samples` newest first as
{"sample", "timestamp"}, `avg_rate`, `avg`), the history's bounds, and what the web console
asks of the API beyond RabbitMQ's (the argument catalogue, moving messages)."""

from __future__ import annotations

import time

import pika
import pytest

from roarmq.broker.core.queue_arguments import ARGUMENTS
from roarmq.broker.management.rates import History
from roarmq.broker.testing import BrokerThread, ephemeral_config

pytestmark = pytest.mark.timeout(60)

RANGE = "lengths_age=60&lengths_incr=5&msg_rates_age=60&msg_rates_incr=5"


@pytest.fixture
def b(tmp_path):
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as broker:
        broker.call(broker.broker._management.rates.stop)  # sampled by hand
        yield broker


def sampled(b, rounds, publish):
    """`rounds` passes of the sampler, noted 5 s apart and ending now, `publish(i)` before
    each but the first."""
    sampler, start = b.broker._management.rates, time.time() - 5 * rounds
    for i in range(rounds + 1):
        if i:
            publish(i)
        b.call(lambda i=i: sampler.sample(at=start + 5 * i))


def test_queue_overview_and_exchange_samples(b):
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.exchange_declare("hx", "fanout")
    ch.queue_declare("hq")
    ch.queue_bind("hq", "hx")

    def publish(i):
        for _ in range(i):
            ch.basic_publish("hx", "", b"m")

    sampled(b, 4, publish)  # 1 + 2 + 3 + 4 = 10 messages
    q = b.api("GET", "/api/queues/%2F/hq?" + RANGE)[1]
    details = q["messages_details"]
    values = [s["sample"] for s in details["samples"]]
    stamps = [s["timestamp"] for s in details["samples"]]
    assert values[0] == 10 and values[-1] == 0 and values == sorted(values, reverse=True)
    assert all(t % 5000 == 0 for t in stamps) and stamps == sorted(stamps, reverse=True)
    assert stamps[0] - stamps[1] == 5000
    assert set(details) == {"rate", "samples", "avg_rate", "avg"}
    assert details["avg"] == round(sum(values) / len(values), 1)
    assert details["avg_rate"] == round(
        (values[0] - values[-1]) * 1000 / (stamps[0] - stamps[-1]), 1
    )
    assert [s["sample"] for s in q["messages_ready_details"]["samples"]] == values
    assert {s["sample"] for s in q["messages_unacknowledged_details"]["samples"]} == {0}
    publish_samples = q["message_stats"]["publish_details"]["samples"]
    assert [s["sample"] for s in publish_samples] == values  # the counter, not its rate

    o = b.api("GET", "/api/overview?" + RANGE)[1]
    assert o["queue_totals"]["messages_details"]["samples"][0]["sample"] == 10
    assert o["message_stats"]["publish_details"]["samples"][0]["sample"] == 10
    assert "samples" in o["churn_rates"]["queue_declared_details"]

    x = b.api("GET", "/api/exchanges/%2F/hx?msg_rates_age=60&msg_rates_incr=5")[1]
    assert x["message_stats"]["publish_in_details"]["samples"][0]["sample"] == 10
    assert x["message_stats"]["publish_out_details"]["samples"][0]["sample"] == 10
    assert "messages_details" not in x  # lengths are a queue's

    # Without a range (or with half of one) nothing changes: RabbitMQ's "no_range".
    plain = b.api("GET", "/api/queues/%2F/hq?lengths_age=60")[1]
    assert set(plain["messages_details"]) == {"rate"}
    # A queue's page without ranges still answers its rows as before.
    assert b.api("GET", "/api/queues/%2F/hq")[1]["messages"] == 10
    conn.close()


@pytest.mark.parametrize(
    "query", ["lengths_age=x&lengths_incr=5", "msg_rates_age=60&msg_rates_incr=0", "lengths_age=100000&lengths_incr=1"]
)  # fmt: skip
def test_bad_ranges_are_refused(b, query):
    status, body = b.api("GET", "/api/overview?" + query)
    assert status == 400 and "invalid_range_parameters" in body["reason"]


def test_a_queue_looked_at_has_the_last_two_samples_at_once(b):
    """A queue that stood still (so was not kept) gains a history when its page is looked
    at, from the sampler's last two passes."""
    history = b.broker._management.rates.history
    b.api("PUT", "/api/queues/%2F/still", {})
    sampled(b, 3, lambda i: None)
    sampled(b, 1, lambda i: None)  # (its clock goes back: the history starts again)
    key = id(b.broker.vhosts["/"].queues["still"])
    # moved once (created), then still: kept only while room, as any mover
    b.api("GET", "/api/queues/%2F/still")
    assert key in history.rings and history.rings[key].watched >= history.count
    samples = b.api("GET", "/api/queues/%2F/still?" + RANGE)[1]["messages_details"]["samples"]
    assert len(samples) >= 2


class Obj:
    """A stand-in for a queue in a history driven directly."""


def test_the_history_is_bounded():
    from roarmq.broker.management.rates import EXCHANGE_FIELDS, QUEUE_FIELDS

    h = History(passes=4, limit=3)
    objs = [Obj() for _ in range(6)]

    objects = {id(o): o for o in objs}  # the sample keeps them (an id names one object)

    def current(step):
        counts = {id(o): (EXCHANGE_FIELDS, step * (i + 1), 0) for i, o in enumerate(objs)}
        counts["global"] = (("publish",), step)
        return counts

    last = {}
    for step in range(10):
        now = current(step)
        for _ in h.record(now, objects, last, 1000.0 + 5 * step):
            pass
        last = now
    assert len(h.rings) == 3 + 1  # the limit, and the overview's ring
    assert all(len(r.values) == 4 * r.width for r in h.rings.values())
    kept = next(k for k in h.rings if k != "global")
    points = h.series(kept, None, ("publish_in",), 1_000_000, 1_100_000, 5_000)["publish_in"]
    factor = points[-1][1] / 9  # (each object counts by its own step)
    assert [v for _, v in points] == [6 * factor, 7 * factor, 8 * factor, 9 * factor]  # 4 passes
    # a queue's row: every counter but the blocked seconds says whether it moved
    assert QUEUE_FIELDS[-1] == "_blocked"

    # Objects that stop moving for a whole ring give their place to ones that move.
    movers = objs[3:]
    for step in range(10, 20):
        now = {id(o): (EXCHANGE_FIELDS, step * (i + 1), 0) for i, o in enumerate(movers)}
        now.update({id(o): (EXCHANGE_FIELDS, 0, 0) for o in objs[:3]})
        now["global"] = (("publish",), step)
        for _ in h.record(now, objects, last, 1000.0 + 5 * step):
            pass
        last = now
    assert {r.obj for r in h.rings.values() if r.obj is not None} <= set(objs)
    assert any(r.obj in movers for r in h.rings.values())


def test_queue_argument_catalogue_is_the_table(b):
    cat = b.api("GET", "/api/queue-arguments")[1]
    assert [a["argument"] for a in cat["queue"]] == [r.argument for r in ARGUMENTS]
    ttl = next(a for a in cat["queue"] if a["argument"] == "x-message-ttl")
    assert (ttl["type"], ttl["policy_key"], ttl["queue_types"]) == (
        "number",
        "message-ttl",
        ["classic", "quorum"],
    )
    overflow = next(a for a in cat["queue"] if a["argument"] == "x-overflow")
    assert overflow["values"] == ["drop-head", "reject-publish", "reject-publish-dlx"]
    assert cat["queue_types"] == ["classic", "quorum", "stream"]
    assert "alternate-exchange" in [a["argument"] for a in cat["exchange"]]


def test_move_messages(b):
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare("from", durable=True)
    ch.queue_declare("to", durable=True)
    for i in range(5):
        ch.basic_publish(
            "", "from", b"m%d" % i, pika.BasicProperties(delivery_mode=2, headers={"n": i})
        )
    assert b.api("POST", "/api/queues/%2F/from/move", {"destination": "to", "count": 2})[1] == {
        "moved": 2
    }
    assert b.api("POST", "/api/queues/%2F/from/move", {"destination": "to"})[1] == {"moved": 3}
    assert b.api("GET", "/api/queues/%2F/from")[1]["messages"] == 0
    got = [ch.basic_get("to", auto_ack=True) for _ in range(5)]
    assert [body for _, _, body in got] == [b"m%d" % i for i in range(5)]  # in order
    assert [props.headers["n"] for _, props, _ in got] == list(range(5))
    assert all(props.delivery_mode == 2 and m.routing_key == "to" for m, props, _ in got)
    status, body = b.api("POST", "/api/queues/%2F/from/move", {"destination": "nowhere"})
    assert status == 400 and "no queue 'nowhere'" in body["reason"]
    conn.close()
