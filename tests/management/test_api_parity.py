"""Management API fields and statuses that tools read, as RabbitMQ 3.10.8 answers them (issue
26, item 5): connection names, channel and vhost `message_stats`, vhost octets, exclusive
queues out of definitions, 204 on a permission PUT, `properties_key`, and the firehose
(`amq.rabbitmq.trace`, `ctl trace_on`). The expected values are RabbitMQ's own answers to the
same pika steps (bench/api_compare.py checks the fields against a live RabbitMQ)."""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
import time
import urllib.parse

import pika
import pytest
from machine import missing

from roarmq.broker.cli import ctl
from roarmq.broker.core.erlang import ApiArguments, Atom, args_hash, phash2

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def b(mgmt_broker_sampled_by_hand):
    return mgmt_broker_sampled_by_hand


def sample(b) -> None:
    b.call(b.broker._management.rates.sample)


def q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def run_ctl(b, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = ctl.main(["--url", b.mgmt_url, *args])
    return code, out.getvalue()


# -- connection names ---------------------------------------------------------------------


def test_connection_and_channel_names_are_rabbitmqs(b):
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare("named")
    ch.basic_consume("named", lambda *a: None, consumer_tag="c1")
    local = conn._impl._transport._sock.getsockname()  # the client's end
    _, rows = b.api("GET", "/api/connections")
    (row,) = rows
    name = f"127.0.0.1:{local[1]} -> 127.0.0.1:{b.port}"
    assert row["name"] == name
    assert (row["peer_port"], row["port"]) == (local[1], b.port)
    status, one = b.api("GET", f"/api/connections/{q(name)}")
    assert status == 200 and one["name"] == name
    status, chans = b.api("GET", f"/api/connections/{q(name)}/channels")
    assert status == 200 and [c["name"] for c in chans] == [f"{name} (1)"]
    assert chans[0]["connection_details"]["name"] == name
    status, chan = b.api("GET", f"/api/channels/{q(name + ' (1)')}")
    assert status == 200 and chan["number"] == 1
    _, consumers = b.api("GET", "/api/consumers")
    assert consumers[0]["channel_details"]["connection_name"] == name
    assert consumers[0]["channel_details"]["name"] == f"{name} (1)"
    _, queue = b.api("GET", "/api/queues/%2F/named")
    assert queue["consumer_details"][0]["channel_details"]["connection_name"] == name
    # closed by that name, from the API (what the UI does) and from ctl
    status, _ = b.api("DELETE", f"/api/connections/{q(name)}")
    assert status == 204
    with pytest.raises(pika.exceptions.ConnectionClosed):
        for _ in range(50):
            conn.process_data_events(0.1)
    other = pika.BlockingConnection(pika.URLParameters(b.url))
    _, rows = b.api("GET", "/api/connections")
    code, out = run_ctl(b, "close_connection", rows[0]["name"], "go away")
    assert code == 0 and rows[0]["name"] in out and " -> " in rows[0]["name"]
    with pytest.raises(pika.exceptions.ConnectionClosed):
        for _ in range(50):
            other.process_data_events(0.1)


def test_connection_name_formats_addresses_as_rabbitmq():
    from roarmq.broker.amqp.connection import connection_name

    assert connection_name(("127.0.0.1", 5), ("127.0.0.1", 5672)) == "127.0.0.1:5 -> 127.0.0.1:5672"
    assert connection_name(("::1", 7), ("::1", 5672, 0, 0)) == "[::1]:7 -> [::1]:5672"
    assert connection_name(("::ffff:10.0.0.1", 7), ("::ffff:10.0.0.2", 1)) == (
        "10.0.0.1:7 -> 10.0.0.2:1"
    )


# -- channel and vhost message_stats --------------------------------------------------------

# RabbitMQ 3.10.8's channel counters after the steps of `_traffic` (a publisher in confirm
# mode that also gets, and a consumer channel that takes the rest and acks it).
PUBLISHER = {
    "publish": 11, "confirm": 11, "return_unroutable": 0, "drop_unroutable": 1,
    "get": 2, "get_no_ack": 1, "deliver": 0, "deliver_no_ack": 0, "redeliver": 0,
    "ack": 1, "deliver_get": 3, "get_empty": 0,
}  # fmt: skip
CONSUMER = {
    "get": 0, "get_no_ack": 0, "deliver": 8, "deliver_no_ack": 0, "redeliver": 1,
    "ack": 8, "deliver_get": 8, "get_empty": 0,
}  # fmt: skip


def _traffic(b) -> tuple[pika.BlockingConnection, list[int]]:
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("q1")
    for _ in range(10):
        ch.basic_publish("", "q1", b"x" * 10)
    ch.basic_publish("amq.direct", "nowhere", b"y")  # unroutable, not mandatory: dropped
    m = ch.basic_get("q1")
    ch.basic_ack(m[0].delivery_tag)
    ch.basic_get("q1", auto_ack=True)
    m = ch.basic_get("q1")
    ch.basic_nack(m[0].delivery_tag, requeue=True)
    ch2 = conn.channel()
    got: list[int] = []
    ch2.basic_qos(prefetch_count=5)

    def on_message(chan, method, props, body):
        got.append(1)
        chan.basic_ack(method.delivery_tag)

    ch2.basic_consume("q1", on_message)
    deadline = time.monotonic() + 10
    while len(got) < 8 and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    ch3 = conn.channel()  # opened, never used: no message_stats, as RabbitMQ
    assert ch3.is_open
    return conn, got


def test_channel_message_stats_as_rabbitmq(b):
    conn, got = _traffic(b)
    assert len(got) == 8
    sample(b)
    conn.process_data_events(0.2)
    sample(b)
    _, chans = b.api("GET", "/api/channels")
    by_number = {c["number"]: c for c in chans}
    stats = by_number[1]["message_stats"]
    assert {k: v for k, v in stats.items() if not k.endswith("_details")} == PUBLISHER
    assert all(stats[f"{k}_details"] == {"rate": 0.0} for k in PUBLISHER)
    stats = by_number[2]["message_stats"]
    assert {k: v for k, v in stats.items() if not k.endswith("_details")} == CONSUMER
    assert "message_stats" not in by_number[3]
    # one channel's page has them too
    _, one = b.api("GET", f"/api/channels/{q(by_number[2]['name'])}")
    assert one["message_stats"]["deliver"] == 8
    conn.close()


def test_channel_rates(b):
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare("r")
    sample(b)
    for _ in range(40):
        ch.basic_publish("", "r", b"m")
    conn.process_data_events(0.2)
    sample(b)
    _, (chan,) = b.api("GET", "/api/channels")
    assert chan["message_stats"]["publish"] == 40
    assert chan["message_stats"]["publish_details"]["rate"] > 0
    _, vhost = b.api("GET", "/api/vhosts/%2F")
    assert vhost["message_stats"]["publish_details"]["rate"] > 0
    assert vhost["messages_ready_details"]["rate"] > 0
    conn.close()


def test_vhost_message_stats_and_octets(b):
    conn, _ = _traffic(b)
    sample(b)
    _, vhost = b.api("GET", "/api/vhosts/%2F")
    want = {k: PUBLISHER[k] + CONSUMER.get(k, 0) for k in PUBLISHER}
    stats = vhost["message_stats"]
    assert list(k for k in stats if not k.endswith("_details")) == list(PUBLISHER)  # RabbitMQ's
    assert {k: v for k, v in stats.items() if not k.endswith("_details")} == want
    _, (row,) = b.api("GET", "/api/connections")
    assert vhost["recv_oct"] == row["recv_oct"] > 0
    assert vhost["send_oct"] == row["send_oct"] > 0
    for key in ("recv_oct_details", "send_oct_details", "messages_details"):
        assert set(vhost[key]) == {"rate"}
    # the counts outlive the channels and the connection, as RabbitMQ's
    conn.close()
    time.sleep(0.2)
    _, vhost = b.api("GET", "/api/vhosts")
    (slash,) = [v for v in vhost if v["name"] == "/"]
    assert {k: v for k, v in slash["message_stats"].items() if not k.endswith("_details")} == want
    assert slash["recv_oct"] == 0  # octets are the open connections'


# -- definitions -----------------------------------------------------------------------------


def test_definitions_leave_out_exclusive_queues(b):
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare("kept", durable=True)
    ch.queue_bind("kept", "amq.topic", "k.#")
    named = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(named, "amq.topic", "ex.#")
    ch.queue_declare("exdur", exclusive=True, durable=True)
    ch.queue_bind("exdur", "amq.fanout", "")
    for path in ("/api/definitions", "/api/definitions/%2F"):
        _, doc = b.api("GET", path)
        assert [x["name"] for x in doc["queues"]] == ["kept"]
        assert [(x["source"], x["destination"]) for x in doc["bindings"]] == [("amq.topic", "kept")]
        assert "amq.rabbitmq.trace" not in [x["name"] for x in doc["exchanges"]]
    conn.close()


# -- permission statuses -------------------------------------------------------------------


def test_permission_puts_answer_as_rabbitmq(b):
    perms = {"configure": ".*", "write": ".*", "read": ".*"}
    assert b.api("PUT", "/api/users/pat", {"password": "p", "tags": ""})[0] == 201
    assert b.api("PUT", "/api/permissions/%2F/pat", perms)[0] == 204  # made: 204 (3.10.8)
    assert b.api("PUT", "/api/permissions/%2F/pat", perms)[0] == 204  # changed
    topic = {"exchange": "amq.topic", "write": ".*", "read": ".*"}
    assert b.api("PUT", "/api/topic-permissions/%2F/pat", topic)[0] == 201
    assert b.api("PUT", "/api/topic-permissions/%2F/pat", topic)[0] == 204
    other = {**topic, "exchange": "amq.direct"}
    assert b.api("PUT", "/api/topic-permissions/%2F/pat", other)[0] == 204


# -- properties_key ---------------------------------------------------------------------------


def test_properties_key_is_rabbitmqs_hash(b):
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare("pk")
    ch.exchange_declare("hx", "headers")
    ch.exchange_declare("tx", "topic")
    ch.queue_bind("pk", "hx", "", arguments={"x-match": "all", "a": "b"})
    ch.queue_bind("pk", "hx", "rk", arguments={"x-match": "any", "n": 5})
    ch.queue_bind("pk", "hx", "", arguments={"b": True})
    ch.queue_bind("pk", "tx", "k", arguments={"z": 1, "a": "s"})
    args = {"big": 2**40, "neg": -3, "t": {"y": 1, "b": "c"}, "arr": [1, "a", True]}
    ch.queue_bind("pk", "tx", "k2", arguments=args)
    ch.queue_bind("pk", "amq.topic", "a.b c/~d")
    ch.queue_bind("pk", "amq.direct", "")
    made = {"routing_key": "api", "arguments": {"n": 5, "x-match": "any"}}
    assert b.api("POST", "/api/bindings/%2F/e/tx/q/pk", made)[0] == 201
    made = {
        "routing_key": "api2",
        "arguments": {"f": 1.5, "l": [1, "a"], "m": {"z": 1, "a": 2}, "b": True, "s": "x"},
    }
    assert b.api("POST", "/api/bindings/%2F/e/tx/q/pk", made)[0] == 201
    _, rows = b.api("GET", "/api/queues/%2F/pk/bindings")
    keys = {(r["source"], r["routing_key"]): r["properties_key"] for r in rows}
    # RabbitMQ 3.10.8's answers for the same bindings
    assert keys == {
        ("", "pk"): "pk",
        ("amq.direct", ""): "~",
        ("amq.topic", "a.b c/~d"): "a.b+c%2F%7Ed",
        ("hx", ""): keys[("hx", "")],  # two bindings: below
        ("hx", "rk"): "rk~dI3-FA",
        ("tx", "k"): "k~VWhnQA",
        ("tx", "k2"): "k2~mcVSPw",
        ("tx", "api"): "api~GdhmNA",
        ("tx", "api2"): "api2~7rMtJQ",
    }
    assert sorted(
        r["properties_key"] for r in rows if r["source"] == "hx" and not r["routing_key"]
    ) == [
        "~H5SAuw",
        "~_sQtSA",
    ]
    # a binding is found, and deleted, by that key
    path = "/api/bindings/%2F/e/hx/q/pk/" + q("~H5SAuw")
    status, row = b.api("GET", path)
    assert status == 200 and row["arguments"] == {"x-match": "all", "a": "b"}
    assert b.api("DELETE", path)[0] == 204
    assert b.api("GET", path)[0] == 404
    conn.close()


def test_phash2_matches_erlang():
    # erlang:phash2(Term, 1 bsl 32) as OTP computes it (values from erl)
    term = [(b"a", Atom("longstr"), b"b"), (b"x-match", Atom("longstr"), b"all")]
    assert phash2(term) == 0x1F9480BB
    assert args_hash({"x-match": "any", "n": 5}) == "dI3-FA"
    assert args_hash(ApiArguments({"n": 5, "x-match": "any"})) == "GdhmNA"


def test_phash2_matches_erlang_itself():
    """The same function against OTP's own, on terms of every kind it hashes."""
    erl = shutil.which("erl")
    if erl is None:
        missing("erl is not installed (Debian's erlang-base)", "ROARMQ_EXPECT_PACKAGES")
    terms = {
        "[]": [],
        "[1,2,3]": [1, 2, 3],
        "{a,<<>>,-1}": (Atom("a"), b"", -1),
        '[{<<"k">>,long,1099511627776},1.5,-0.0,-134217729]': [
            (b"k", Atom("long"), 2**40),
            1.5,
            -0.0,
            -134217729,
        ],
        '<<"the quick brown fox jumps">>': b"the quick brown fox jumps",
    }
    expr = ",".join(f"erlang:phash2({t}, 1 bsl 32)" for t in terms)
    out = subprocess.run(
        [erl, "-noshell", "-eval", f'io:format("~w", [[{expr}]]), halt().'],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert [int(x) for x in out.strip("[]").split(",")] == [phash2(t) for t in terms.values()]


# -- the firehose ---------------------------------------------------------------------------


def _drain(ch, queue: str) -> list[tuple[str, bytes, dict]]:
    out = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            if out:
                break
            time.sleep(0.05)
            continue
        out.append((method.routing_key, body, props.headers))
    return out


def test_trace_exchange_in_every_vhost(b):
    assert b.api("PUT", "/api/vhosts/other")[0] == 201
    for vhost in ("%2F", "other"):
        status, x = b.api("GET", f"/api/exchanges/{vhost}/amq.rabbitmq.trace")
        assert status == 200
        assert (x["type"], x["durable"], x["internal"], x["auto_delete"]) == (
            "topic",
            True,
            True,
            False,
        )
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        ch.basic_publish("amq.rabbitmq.trace", "x", b"x")
        ch.queue_declare("", exclusive=True)  # the refusal arrives before this answer
    assert refused.value.reply_code == 403
    conn.close()


def test_firehose_on_off(b):
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare("tr", exclusive=True)
    ch.queue_bind("tr", "amq.rabbitmq.trace", "#")
    ch.queue_declare("q3")
    ch.queue_bind("q3", "amq.direct", "q3k")
    ch.basic_publish("amq.direct", "q3k", b"before")  # tracing off: no copy
    assert b.api("PUT", "/api/vhosts/%2F", {"description": "mine", "tags": ["t"]})[0] == 204
    code, out = run_ctl(b, "trace_on")
    assert code == 0 and out.strip() == 'Starting tracing for vhost "/" ...'
    _, vhost = b.api("GET", "/api/vhosts/%2F")
    assert vhost["tracing"] is True and (vhost["description"], vhost["tags"]) == ("mine", ["t"])
    props = pika.BasicProperties(
        content_type="text/plain", headers={"h": 1}, delivery_mode=2, message_id="m2"
    )
    ch.basic_publish("amq.direct", "q3k", b"hello2", props)
    ch.basic_get("q3", auto_ack=True)  # "before"
    m = ch.basic_get("q3")
    ch.basic_nack(m[0].delivery_tag, requeue=True)
    ch.basic_get("q3", auto_ack=True)
    copies = _drain(ch, "tr")
    local = conn._impl._transport._sock.getsockname()
    name = f"127.0.0.1:{local[1]} -> 127.0.0.1:{b.port}"
    who = {"vhost": "/", "connection": name, "channel": 1, "user": "guest"}
    shown = {
        "message_id": "m2",
        "delivery_mode": 2,
        "headers": {"h": 1},
        "content_type": "text/plain",
    }
    node = b.broker.node_name
    published = {
        "exchange_name": "amq.direct",
        "routing_keys": ["q3k"],
        "properties": shown,
        "node": node,
        **who,
        "routed_queues": ["q3"],
    }
    assert [(k, body) for k, body, _ in copies] == [
        ("publish.amq.direct", b"hello2"),
        ("deliver.q3", b"before"),
        ("deliver.q3", b"hello2"),
        ("deliver.q3", b"hello2"),
    ]
    assert copies[0][2] == published
    delivered = {k: v for k, v in published.items() if k != "routed_queues"}
    delivered = {**delivered, "redelivered": 0}
    assert copies[1][2] == {**delivered, "properties": {}}
    assert copies[2][2] == {**delivered, "redelivered": 0}
    assert copies[3][2] == {**delivered, "redelivered": 1}
    assert list(copies[3][2]) == [
        "exchange_name", "routing_keys", "properties", "node", "redelivered",
        "vhost", "connection", "channel", "user",
    ]  # fmt: skip
    # a consumer's deliveries too, and the default exchange with CC keys
    ch.basic_publish("", "q3", b"direct", pika.BasicProperties(headers={"CC": ["q3"]}))
    tag = ch.basic_consume("q3", lambda c, m, p, body: c.basic_ack(m.delivery_tag))
    conn.process_data_events(0.3)
    ch.basic_cancel(tag)
    copies = _drain(ch, "tr")
    assert [k for k, _, _ in copies] == ["publish.", "deliver.q3"]
    assert copies[0][2]["routing_keys"] == ["q3", "q3"]
    assert copies[0][2]["exchange_name"] == ""
    # off, from the API as RabbitMQ's PUT /api/vhosts takes it; a PUT without it keeps it
    assert b.api("PUT", "/api/vhosts/%2F", {"tracing": False})[0] == 204
    assert b.api("GET", "/api/vhosts/%2F")[1]["tracing"] is False
    ch.basic_publish("amq.direct", "q3k", b"after")
    ch.basic_get("q3", auto_ack=True)
    conn.process_data_events(0.2)
    assert ch.basic_get("tr", auto_ack=True)[0] is None
    assert b.api("PUT", "/api/vhosts/%2F", {"tracing": True})[0] == 204
    assert b.api("PUT", "/api/vhosts/%2F", {"description": "d"})[0] == 204
    assert b.api("GET", "/api/vhosts/%2F")[1]["tracing"] is True
    code, out = run_ctl(b, "trace_off", "-p", "/")
    assert code == 0 and out.strip() == 'Stopping tracing for vhost "/" ...'
    assert b.api("GET", "/api/vhosts/%2F")[1]["tracing"] is False
    conn.close()
