"""The `x-delayed-message` exchange over real sockets with pika: declared and refused as
the delayed-message plugin, routed after the delay exactly as an undelayed exchange of its
underlying type, never early, in publish order, with the plugin's header and mandatory."""

from __future__ import annotations

import asyncio
import time

import pika
import pytest
from support.waiting import wait_for

from roarmq.broker.testing import BrokerThread, ephemeral_config

pytestmark = pytest.mark.timeout(60)

DELAYED = "x-delayed-message"


def delayed(ch, name, underlying="direct", **kw):
    ch.exchange_declare(name, DELAYED, arguments={"x-delayed-type": underlying}, **kw)


def publish(ch, exchange, key, body, headers=None, **props):
    ch.basic_publish(exchange, key, body, pika.BasicProperties(headers=headers, **props))


def drain(ch, queue):
    """Every message ready in `queue`, as (body, headers)."""
    got = []
    while True:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append((body, props.headers))


def count(ch, queue) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


# -- declaring -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        (
            {},
            "PRECONDITION_FAILED - Invalid argument, 'x-delayed-type' must be an existing exchange type",
        ),
        (
            {"x-delayed-type": 1},
            "PRECONDITION_FAILED - Invalid argument, 'x-delayed-type' must be an existing exchange type",
        ),
        (
            {"x-delayed-type": DELAYED},
            "PRECONDITION_FAILED - Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'",
        ),
    ],
)
def test_x_delayed_type_missing_not_a_string_or_delayed_is_406(conn, arguments, text):
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.exchange_declare("d", DELAYED, arguments=arguments)
    assert (closed.value.reply_code, closed.value.reply_text) == (406, text)
    assert conn.is_open


def test_an_unknown_underlying_type_is_an_unknown_exchange_type(conn):
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        ch.exchange_declare("d", DELAYED, arguments={"x-delayed-type": "nope"})
    assert (closed.value.reply_code, closed.value.reply_text) == (
        503,
        "COMMAND_INVALID - unknown exchange type 'nope'",
    )


def test_redeclare_is_checked_and_the_api_shows_the_type(b, ch):
    delayed(ch, "d", "topic", durable=True)
    delayed(ch, "d", "topic", durable=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        delayed(ch, "d", "fanout", durable=True)
    assert closed.value.reply_code == 406
    status, row = b.api("GET", "/api/exchanges/%2F/d")
    assert (status, row["type"], row["arguments"]) == (200, DELAYED, {"x-delayed-type": "topic"})
    types = {
        t["name"]: t["description"] for t in b.api("GET", "/api/overview")[1]["exchange_types"]
    }
    assert types[DELAYED] == "Delayed Message Exchange."


# -- routing ---------------------------------------------------------------------------

#: Per underlying type: bindings (key, arguments) and publishes (key, headers).
CASES = {
    "direct": (
        [("a", None), ("b", None), ("a", None)],
        [("a", {}), ("b", {}), ("c", {}), ("", {})],
    ),
    "fanout": ([("", None), ("x", None)], [("any", {}), ("", {})]),
    "topic": (
        [("a.*", None), ("#.z", None), ("a.b", None), ("#", None)],
        [("a.b", {}), ("a.c.z", {}), ("q", {}), ("a.z", {}), ("", {})],
    ),
    "headers": (
        [("", {"x-match": "all", "k": 1, "j": "v"}), ("", {"x-match": "any", "k": 1, "m": 2})],
        [("", {"k": 1, "j": "v"}), ("", {"m": 2}), ("", {"k": 2}), ("", {"j": "v"})],
    ),
}


@pytest.mark.parametrize("underlying", sorted(CASES))
def test_routes_after_the_delay_as_an_undelayed_exchange_of_its_type(ch, underlying):
    """The same bindings on a delayed exchange and an ordinary one, queue for queue; the
    same publishes to both (the delayed one with x-delay): each queue of the delayed
    exchange ends up with what its twin got, exchange-to-exchange bindings included."""
    bindings, publishes = CASES[underlying]
    delayed(ch, "dx", underlying)
    ch.exchange_declare("px", underlying)
    # an exchange bound to each, and a queue behind it (e2e, through the type's rules)
    for side, x in (("d", "dx"), ("p", "px")):
        ch.exchange_declare(f"{side}-down", "fanout")
        ch.queue_declare(f"{side}-e2e")
        ch.queue_bind(f"{side}-e2e", f"{side}-down")
        ch.exchange_bind(f"{side}-down", x, bindings[0][0], arguments=bindings[0][1])
        for i, (key, args) in enumerate(bindings):
            ch.queue_declare(f"{side}{i}")
            ch.queue_bind(f"{side}{i}", x, key, arguments=args)
    for n, (key, headers) in enumerate(publishes):
        publish(ch, "px", key, b"%d" % n, headers)
        publish(ch, "dx", key, b"%d" % n, {**headers, "x-delay": 150})
    names = [str(i) for i in range(len(bindings))] + ["-e2e"]
    # nothing is there before the delay: every message published so far is held
    assert all(count(ch, f"d{name}") == 0 for name in names)
    plain = {name: sorted(body for body, _ in drain(ch, f"p{name}")) for name in names}
    assert any(plain.values()), "the cases route something"
    total = sum(len(v) for v in plain.values())
    wait_for(lambda: sum(count(ch, f"d{name}") for name in names) >= total, timeout=10)
    got = {name: drain(ch, f"d{name}") for name in names}
    assert {name: sorted(body for body, _ in v) for name, v in got.items()} == plain
    for v in got.values():
        for _, headers in v:
            assert headers["x-delay"] == -150  # as the plugin leaves it


def test_none_early_in_order_and_lateness_measured(ch, conn):
    """Each message is received no earlier than its delay after it was sent; equal delays
    leave in publish order; lateness is printed (bench/ measures p99 on an idle broker)."""
    delayed(ch, "dx")
    ch.queue_declare("q")
    ch.queue_bind("q", "dx", "k")
    sent: dict[bytes, tuple[float, int]] = {}
    delays = [300, 100, 200, 100, 250, 100, 150] + [200] * 50
    for n, delay in enumerate(delays):
        body = b"%d" % n
        sent[body] = (time.time(), delay)
        publish(ch, "dx", "k", body, {"x-delay": delay})
    received: list[tuple[bytes, float]] = []

    def on_message(channel, method, props, body):
        received.append((body, time.time()))

    ch.basic_consume("q", on_message, auto_ack=True)
    deadline = time.monotonic() + 20
    while len(received) < len(delays) and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    assert len(received) == len(delays)
    lateness = []
    for body, at in received:
        t0, delay = sent[body]
        assert at - t0 >= delay / 1000, (
            f"message {body!r} came {delay / 1000 - (at - t0):.4f} s early"
        )
        lateness.append((at - t0) * 1000 - delay)
    order = [int(body) for body, _ in received]
    equal = [n for n in order if delays[n] == 200]
    assert equal == sorted(equal), "equal delays leave in publish order"
    assert order.index(1) < order.index(0)  # a shorter delay overtakes a longer one
    lateness.sort()
    print(f"lateness ms: p50 {lateness[len(lateness) // 2]:.1f} max {lateness[-1]:.1f}")
    assert lateness[-1] < 1000  # late by a loaded machine's turn at most, never by a delay


def test_header_edge_cases_delay_or_route_at_once_as_the_plugin(ch):
    """What is delayed leaves with x-delay = -delay; what is routed at once keeps its
    header as it was sent (and arrives before the delayed ones)."""
    delayed(ch, "dx", "fanout")
    ch.queue_declare("q")
    ch.queue_bind("q", "dx")
    cases = [
        ("int", 200, -200),
        ("string", "200", -200),
        ("zero", 0, 0),
        ("negative", -200, -200),
        ("too long", 2**32, 2**32),
        ("not a number", "soon", "soon"),
        ("a float string", "2.5", "2.5"),
        ("bool", True, True),
    ]
    for name, value, _ in cases:
        publish(ch, "dx", "", name.encode(), {"x-delay": value, "case": name})
    publish(ch, "dx", "", b"none", {"case": "none"})
    publish(ch, "dx", "", b"the longest", {"x-delay": 2**32 - 1})
    at_once = {name for name, value, left in cases if left == value} | {"none"}
    wait_for(lambda: count(ch, "q") >= len(at_once), timeout=10)
    first = drain(ch, "q")
    assert {h["case"] for _, h in first} == at_once
    for _, h in first:
        expected = {name: left for name, _, left in cases}.get(h["case"])
        assert h.get("x-delay") == expected
    wait_for(lambda: count(ch, "q") >= len(cases) - len(at_once) + 1, timeout=10)
    later = drain(ch, "q")
    assert {h["case"]: h["x-delay"] for _, h in later} == {
        name: left for name, value, left in cases if left != value
    }
    assert count(ch, "q") == 0  # the longest is held, 49 days away


async def test_floats_are_truncated_as_the_plugin(broker):
    """(pika cannot send a float header; aio-pika can.)"""
    import aio_pika

    connection = await aio_pika.connect(broker.url)
    async with connection:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(
            "dx", DELAYED, arguments={"x-delayed-type": "fanout"}
        )
        queue = await channel.declare_queue("q")
        await queue.bind(exchange)
        for value in (0.5, 120.75):
            await exchange.publish(aio_pika.Message(b"%r" % value, headers={"x-delay": value}), "")
        first = await queue.get(timeout=5)
        assert (first.body, first.headers["x-delay"]) == (b"0.5", 0.5)  # truncated to 0: at once
        await first.ack()
        async with queue.iterator() as messages:
            got = await asyncio.wait_for(messages.__anext__(), 10)
        assert (got.body, got.headers["x-delay"]) == (b"120.75", -120)


def test_mandatory_is_answered_as_the_plugin_and_the_message_still_comes(conn):
    """The plugin's route finds no queue for a delayed message at publish time: a mandatory
    publish comes back (312 NO_ROUTE), and the message is routed when due all the same."""
    ch = conn.channel()
    returned = []
    ch.add_on_return_callback(
        lambda c, method, props, body: returned.append((method.reply_code, body))
    )
    delayed(ch, "dx")
    ch.queue_declare("q")
    ch.queue_bind("q", "dx", "k")
    ch.basic_publish(
        "dx", "k", b"late", pika.BasicProperties(headers={"x-delay": 100}), mandatory=True
    )
    ch.basic_publish("dx", "k", b"now", pika.BasicProperties(headers={}), mandatory=True)
    ch.basic_publish("dx", "nowhere", b"lost", pika.BasicProperties(headers={}), mandatory=True)
    wait_for(lambda: conn.process_data_events(0.01) or len(returned) == 2, timeout=10)
    assert sorted(returned) == [(312, b"late"), (312, b"lost")]
    wait_for(lambda: count(ch, "q") == 2, timeout=10)
    assert sorted(body for body, _ in drain(ch, "q")) == [b"late", b"now"]


def test_dead_letters_into_a_delayed_exchange_are_delayed(ch):
    """Dead-lettering routes through the delayed exchange's rules, x-delay and all."""
    delayed(ch, "dx")
    ch.queue_declare("out")
    ch.queue_bind("out", "dx", "k")
    ch.queue_declare(
        "in",
        arguments={
            "x-dead-letter-exchange": "dx",
            "x-dead-letter-routing-key": "k",
            "x-message-ttl": 0,
        },
    )
    publish(ch, "", "in", b"m", {"x-delay": 200})
    assert count(ch, "out") == 0
    wait_for(lambda: count(ch, "out") == 1, timeout=10)
    ((body, headers),) = drain(ch, "out")
    assert headers["x-delay"] == -200 and headers["x-death"][0]["queue"] == "in"


def test_deleting_the_exchange_drops_what_it_held(ch):
    delayed(ch, "dx")
    delayed(ch, "marker")
    ch.queue_declare("q")
    ch.queue_bind("q", "dx", "k")
    ch.queue_bind("q", "marker", "k")
    publish(ch, "dx", "k", b"dropped", {"x-delay": 100})
    ch.exchange_delete("dx")
    delayed(ch, "dx")
    ch.queue_bind("q", "dx", "k")
    publish(ch, "marker", "k", b"marker", {"x-delay": 400})  # due after the dropped one
    wait_for(lambda: count(ch, "q") == 1, timeout=10)
    assert [body for body, _ in drain(ch, "q")] == [b"marker"]


def test_a_confirmed_delayed_publish_is_acked_before_it_is_due(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    delayed(ch, "dx")
    ch.queue_declare("q")
    ch.queue_bind("q", "dx", "k")
    started = time.monotonic()
    ch.basic_publish("dx", "k", b"m", pika.BasicProperties(headers={"x-delay": 5000}))
    assert time.monotonic() - started < 2.5  # the confirm came, long before the due time
    assert count(ch, "q") == 0


# -- seen and managed ------------------------------------------------------------------


def test_the_api_row_counts_messages_delayed_and_the_next_due_time(b, ch):
    delayed(ch, "dx")
    ch.queue_declare("q")
    ch.queue_bind("q", "dx", "k")
    row = b.api("GET", "/api/exchanges/%2F/dx")[1]
    assert (row["messages_delayed"], row["messages_delayed_next_due"]) == (0, None)
    before = time.time() * 1000
    publish(ch, "dx", "k", b"far", {"x-delay": 60_000})
    publish(ch, "dx", "k", b"near", {"x-delay": 300})
    row = b.api("GET", "/api/exchanges/%2F/dx")[1]
    assert row["messages_delayed"] == 2
    assert before + 300 <= row["messages_delayed_next_due"] <= time.time() * 1000 + 301
    assert "messages_delayed" not in b.api("GET", "/api/exchanges/%2F/amq.direct")[1]
    wait_for(lambda: count(ch, "q") == 1, timeout=10)
    row = b.api("GET", "/api/exchanges/%2F/dx")[1]
    assert row["messages_delayed"] == 1 and row["messages_delayed_next_due"] > before + 60_000
    listed = {x["name"]: x for x in b.api("GET", "/api/exchanges/%2F")[1]}
    assert listed["dx"]["messages_delayed"] == 1


def test_a_put_without_x_delayed_type_is_400_and_with_it_201(b):
    status, body = b.api("PUT", "/api/exchanges/%2F/dx", {"type": DELAYED})
    assert status == 400
    assert body["reason"] == "Invalid argument, 'x-delayed-type' must be an existing exchange type"
    assert b.api("GET", "/api/exchanges/%2F/dx")[0] == 404
    status, _ = b.api(
        "PUT", "/api/exchanges/%2F/dx", {"type": DELAYED, "arguments": {"x-delayed-type": "topic"}}
    )
    assert status == 201
    assert b.api("GET", "/api/exchanges/%2F/dx")[1]["messages_delayed"] == 0


def test_prometheus_shows_what_is_held_what_was_routed_and_how_late(b, ch):
    import urllib.request

    delayed(ch, "dx")
    ch.queue_declare("q")
    ch.queue_bind("q", "dx", "k")
    for n in range(5):
        publish(ch, "dx", "k", b"%d" % n, {"x-delay": 100})
    publish(ch, "dx", "k", b"far", {"x-delay": 60_000})
    wait_for(lambda: count(ch, "q") == 5, timeout=10)
    with urllib.request.urlopen(b.mgmt_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    lines = dict(
        line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("roarmq_delayed")
    )
    assert float(lines['roarmq_delayed_messages{exchange="dx",vhost="/"}']) == 1
    assert float(lines["roarmq_delayed_routed_total"]) == 5
    assert float(lines["roarmq_delayed_lateness_seconds_count"]) == 5
    assert float(lines['roarmq_delayed_lateness_seconds_bucket{le="+Inf"}']) == 5
    assert 0 <= float(lines["roarmq_delayed_lateness_seconds_sum"]) < 5


def test_definitions_export_and_import_keep_the_exchange_not_its_messages(b, ch, tmp_path):
    delayed(ch, "dx", "headers", durable=True)
    publish(ch, "dx", "", b"held", {"x-delay": 60_000})
    status, defs = b.api("GET", "/api/definitions")
    assert status == 200
    (x,) = [x for x in defs["exchanges"] if x["name"] == "dx"]
    assert (x["type"], x["arguments"]) == (DELAYED, {"x-delayed-type": "headers"})
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "other")), management=True) as other:
        assert other.api("POST", "/api/definitions", defs)[0] in (200, 201, 204)
        row = other.api("GET", "/api/exchanges/%2F/dx")[1]
        assert (row["type"], row["arguments"], row["messages_delayed"]) == (
            DELAYED,
            {"x-delayed-type": "headers"},
            0,
        )


def test_deleting_the_vhost_drops_what_its_delayed_exchanges_held(b):
    assert b.api("PUT", "/api/vhosts/v", {})[0] in (201, 204)
    assert b.api(
        "PUT", "/api/permissions/v/guest", {"configure": ".*", "write": ".*", "read": ".*"}
    )[0] in (201, 204)
    conn = pika.BlockingConnection(pika.URLParameters(b.url.rstrip("/") + "/v"))
    ch = conn.channel()
    delayed(ch, "dx", durable=True)
    ch.queue_declare("q", durable=True)
    ch.queue_bind("q", "dx", "k")
    publish(ch, "dx", "k", b"held", {"x-delay": 60_000}, delivery_mode=2)
    publish(ch, "dx", "k", b"held too", {"x-delay": 60_000})
    (schedule,) = b.broker.vhosts["v"].schedules()
    wait_for(lambda: schedule.message_count() == 2, timeout=10)
    assert b.api("DELETE", "/api/vhosts/v")[0] == 204
    assert schedule.deleted and schedule.message_count() == 0 and schedule._timer is None
    assert b.broker.store.index.count == 0  # its stored message settled, as a queue's


def test_lavinmqs_form_an_exchange_declared_with_x_delayed_exchange_true(b, ch):
    """LavinMQ's argument makes an exchange of any type delayed (its type stays)."""
    ch.exchange_declare("lx", "topic", arguments={"x-delayed-exchange": True})
    ch.exchange_declare("plain", "topic", arguments={"x-delayed-exchange": False})
    for x in ("lx", "plain"):
        ch.queue_declare(f"q-{x}")
        ch.queue_bind(f"q-{x}", x, "a.*")
        publish(ch, x, "a.b", b"m", {"x-delay": 200})
    assert count(ch, "q-plain") == 1 and count(ch, "q-lx") == 0
    row = b.api("GET", "/api/exchanges/%2F/lx")[1]
    assert (row["type"], row["messages_delayed"]) == ("topic", 1)
    wait_for(lambda: count(ch, "q-lx") == 1, timeout=10)
    ((_, headers),) = drain(ch, "q-lx")
    assert headers["x-delay"] == -200


def test_lavinmqs_policy_key_makes_an_exchange_delayed_while_it_applies(b, ch):
    """LavinMQ's policy key `delayed-message: true` makes the exchanges it applies to
    delayed, their type unchanged; when the policy goes, new messages route at once and
    what the exchange holds still comes when due, never early."""
    policy = {"pattern": "^px", "apply-to": "exchanges", "definition": {"delayed-message": True}}
    assert b.api("PUT", "/api/policies/%2F/delay", policy)[0] == 201
    ch.exchange_declare("px-late", "direct")  # declared under the policy
    ch.exchange_declare("other", "direct")  # not matched
    published = time.monotonic()  # before the broker sees the publish: due after this + 0.6
    for x in ("px-late", "other"):
        ch.queue_declare(f"q-{x}")
        ch.queue_bind(f"q-{x}", x, "k")
        publish(ch, x, "k", b"held", {"x-delay": 600})
    assert count(ch, "q-other") == 1 and count(ch, "q-px-late") == 0
    row = b.api("GET", "/api/exchanges/%2F/px-late")[1]
    assert (row["type"], row["policy"], row["messages_delayed"]) == ("direct", "delay", 1)
    assert "messages_delayed" not in b.api("GET", "/api/exchanges/%2F/other")[1]
    assert b.api("DELETE", "/api/policies/%2F/delay")[0] == 204
    publish(ch, "px-late", "k", b"now", {"x-delay": 600})  # no policy: at once
    assert [body for body, _ in drain(ch, "q-px-late")] == [b"now"]
    wait_for(lambda: count(ch, "q-px-late") == 1, timeout=10, step=0.005)
    assert time.monotonic() >= published + 0.6  # never early
    ((body, headers),) = drain(ch, "q-px-late")
    assert body == b"held" and headers["x-delay"] == -600
    # a policy made afterwards applies to an exchange declared before it
    policy["pattern"] = "^other$"
    assert b.api("PUT", "/api/policies/%2F/later", policy)[0] == 201
    publish(ch, "other", "k", b"later", {"x-delay": 200})
    assert count(ch, "q-other") == 1  # only the first, undelayed message
    wait_for(lambda: count(ch, "q-other") == 2, timeout=10)
    bad = {**policy, "definition": {"delayed-message": "yes"}}
    status, body = b.api("PUT", "/api/policies/%2F/bad", bad)
    assert status == 400 and "is not a valid delayed message setting" in body["reason"], body


def _colliding_names() -> tuple[str, str]:
    """Two exchange names whose schedules would get the same message store id in "/"."""
    from roarmq.broker.core.delayed import schedule_store_id

    seen: dict[int, str] = {}
    n = 0
    while True:
        name = f"x{n}"
        store_id = schedule_store_id("/", name)
        if store_id in seen:
            return seen[store_id], name
        seen[store_id] = name
        n += 1


def test_two_durable_delayed_exchanges_never_share_a_store_id(conn):
    first, second = _colliding_names()
    ch = conn.channel()
    delayed(ch, first, durable=True)
    delayed(ch, second + "-transient")  # nothing of a transient one is stored
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        delayed(ch, second, durable=True)
    assert closed.value.reply_code == 406
    assert f"would share its message store id with '{first}'" in closed.value.reply_text
