"""Federation between two RoarMQ brokers over real sockets, set up as RabbitMQ's users set
it up (`federation-upstream` parameters, a policy with `federation-upstream-set`):
exchange federation with bindings that follow, `x-received-from`, `max-hops` stopping a
loop between two brokers federating each other, the link rows, clean-up upstream when
the link goes; queue federation that moves messages only while the downstream queue has
consumers; and refusals in RabbitMQ's words."""

from __future__ import annotations

import re
import time
import urllib.request

import pika
import pytest
from support.federation import federation_keys
from support.queues import ready
from support.waiting import until

from roarmq.broker.testing import BrokerThread, ephemeral_config

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def pair(tmp_path):
    """(upstream, downstream): two brokers with the management API, named apart."""
    cfg = {"management": True}
    with (
        BrokerThread(ephemeral_config(data_dir=str(tmp_path / "up")), **cfg) as up,
        BrokerThread(ephemeral_config(data_dir=str(tmp_path / "down")), **cfg) as down,
    ):
        assert up.api("PUT", "/api/cluster-name", {"name": "up-cluster"})[0] == 204
        assert down.api("PUT", "/api/cluster-name", {"name": "down-cluster"})[0] == 204
        yield up, down


def channel(b):
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port)).channel()


def federate(down, up, pattern: str = "^fed", apply_to: str = "exchanges", **settings) -> None:
    value = {"uri": f"amqp://guest:guest@127.0.0.1:{up.port}", **settings}
    assert down.api("PUT", "/api/parameters/federation-upstream/%2F/up", {"value": value})[0] in (
        201,
        204,
    )
    policy = {
        "pattern": pattern,
        "apply-to": apply_to,
        "definition": {"federation-upstream-set": "all"},
    }
    assert down.api("PUT", "/api/policies/%2F/fed", policy)[0] in (201, 204)


def upstream_keys(upstream) -> set[str]:
    return federation_keys(lambda path: upstream.api("GET", path)[1], "fed.x")


def running(b, n: int = 1):
    def check():
        rows = b.api("GET", "/api/federation-links")[1]
        return rows if len(rows) == n and all(r["status"] == "running" for r in rows) else None

    rows = until(check, 15)
    assert rows, b.api("GET", "/api/federation-links")
    return rows


def test_an_exchange_receives_what_its_upstream_gets_and_bindings_follow(pair):
    up, down = pair
    federate(down, up)
    ch = channel(down)
    ch.exchange_declare("fed.x", "topic", durable=True)
    ch.queue_declare("mine")
    ch.queue_bind("mine", "fed.x", "a.*")
    (row,) = running(down)
    assert until(lambda: upstream_keys(up) == {"a.*"}, 10)
    assert row == {
        "node": down.broker.node_name,
        "exchange": "fed.x",
        "upstream_exchange": "fed.x",
        "type": "exchange",
        "vhost": "/",
        "upstream": "up",
        "id": row["id"],
        "status": "running",
        "local_connection": f"Federation link {row['id']}",
        "uri": f"amqp://127.0.0.1:{up.port}",
        "timestamp": row["timestamp"],
    }
    upstream = channel(up)
    # the upstream's exchange was declared like the downstream's, and its link queue named
    # as RabbitMQ names it
    upstream.exchange_declare("fed.x", "topic", durable=True, passive=True)
    link_queue = "federation: fed.x -> down-cluster"
    assert upstream.queue_declare(link_queue, passive=True).method.consumer_count == 1
    for i in range(10):
        upstream.basic_publish("fed.x", "a.b", b"m%d" % i)
    upstream.basic_publish("fed.x", "z.b", b"not bound downstream")
    assert until(lambda: ready(down.port, "mine") == 10, 10), ready(down.port, "mine")
    _method, props, body = ch.basic_get("mine", auto_ack=True)
    assert body == b"m0"
    rest = [ch.basic_get("mine", auto_ack=True)[2] for _ in range(9)]
    assert rest == [b"m%d" % i for i in range(1, 10)]  # exactly what its bindings select, in order
    for i in range(10, 19):
        upstream.basic_publish("fed.x", "a.b", b"m%d" % i)
    assert props.headers == {
        "x-received-from": [
            {
                "uri": f"amqp://127.0.0.1:{up.port}",
                "exchange": "fed.x",
                "redelivered": False,
                "cluster-name": "up-cluster",
                "vhost": "/",
            }
        ]
    }
    assert ready(up.port, link_queue) == 0  # the unbound key never left the upstream
    metrics = urllib.request.urlopen(down.mgmt_url + "/metrics", timeout=10).read().decode()
    assert 'roarmq_federation_links{status="running"} 1.0' in metrics
    moved = re.search(r"^roarmq_federation_link_messages_moved_total (\S+)$", metrics, re.M)
    assert moved and float(moved.group(1)) >= 10, moved
    ch.queue_bind("mine", "fed.x", "z.*")  # a new binding is made upstream too
    assert until(lambda: upstream_keys(up) == {"a.*", "z.*"}, 10)
    upstream.basic_publish("fed.x", "z.c", b"bound now")
    assert until(lambda: ready(down.port, "mine") == 10, 10), ready(down.port, "mine")
    ch.queue_unbind("mine", "fed.x", "a.*")
    assert until(lambda: upstream_keys(up) == {"z.*"}, 10)
    upstream.basic_publish("fed.x", "a.b", b"unbound now")
    time.sleep(0.5)
    assert ready(down.port, "mine") == 10
    assert down.api("DELETE", "/api/policies/%2F/fed")[0] == 204
    assert until(lambda: down.api("GET", "/api/federation-links")[1] == [], 10)
    assert until(lambda: ready(up.port, link_queue) == -1, 10), "the link queue stayed upstream"


def test_max_hops_stops_a_loop_between_two_brokers_federating_each_other(pair):
    a, b = pair
    for here, there in ((a, b), (b, a)):
        federate(here, there)
        channel(here).exchange_declare("fed.x", "fanout", durable=True)
    for here in (a, b):
        ch = channel(here)
        ch.queue_declare("got")
        ch.queue_bind("got", "fed.x")
        running(here)
    for there in (a, b):  # each link's binding follows "got"'s upstream: once made, a loop
        assert until(lambda there=there: upstream_keys(there), 15)
    channel(a).basic_publish("fed.x", "", b"once")
    assert until(lambda: ready(b.port, "got") == 1, 10)
    time.sleep(1.0)  # had it come back, it would be here by now
    assert ready(a.port, "got") == 1 and ready(b.port, "got") == 1


def test_a_federated_queue_fetches_only_while_it_has_consumers(pair):
    up, down = pair
    federate(down, up, pattern="^work$", apply_to="queues")
    upstream = channel(up)
    upstream.queue_declare("work", durable=True)
    for i in range(20):
        upstream.basic_publish("", "work", b"w%d" % i)
    ch = channel(down)
    ch.queue_declare("work", durable=True)
    (row,) = running(down)
    assert row["type"] == "queue" and row["queue"] == "work" and row["upstream_queue"] == "work"
    time.sleep(0.5)
    assert ready(up.port, "work") == 20  # no consumer downstream: nothing moves
    got = []
    ch.basic_consume("work", lambda c, m, p, body: got.append(body), auto_ack=True)
    until(lambda: ch.connection.process_data_events(0.05) or len(got) == 20, 15)
    assert sorted(got) == sorted(b"w%d" % i for i in range(20))
    assert ready(up.port, "work") == 0


@pytest.mark.parametrize(
    ("component", "value", "reason"),
    [
        (
            "federation-upstream",
            {"uri": "x://", "max-hops": "a"},
            'max-hops should be a number, actually was <<"a">>\n'
            '"x://" not a valid URI: {{unexpected_uri_scheme,"x"},"x://"}',
        ),
        (
            "federation-upstream",
            {"uri": "amqp://", "zzz": 1},
            'Unrecognised terms [{<<"zzz">>,1}] in up3',
        ),
    ],
)
def test_bad_upstreams_are_refused_in_rabbitmqs_words(mgmt_broker, component, value, reason):
    """As RabbitMQ 3.10.8 answered them (probed; its HTML escaping aside)."""
    status, body = mgmt_broker.api("PUT", f"/api/parameters/{component}/%2F/up3", {"value": value})
    assert (status, body) == (
        400,
        {"error": "bad_request", "reason": f"Validation failed\n\n{reason}\n"},
    )
    assert mgmt_broker.api("GET", f"/api/parameters/{component}/%2F/up3")[0] == 404


def test_a_policy_naming_an_upstream_and_a_set_is_refused(mgmt_broker):
    policy = {
        "pattern": "^x",
        "definition": {"federation-upstream-set": "all", "federation-upstream": "up"},
    }
    status, body = mgmt_broker.api("PUT", "/api/policies/%2F/both", policy)
    assert status == 400
    assert body["reason"] == (
        "Validation failed\n\ncannot specify federation-upstream and federation-upstream-set together\n"
    )
    status, body = mgmt_broker.api(
        "PUT", "/api/policies/%2F/bad", {"pattern": "^x", "definition": {"federation-upstream": 5}}
    )
    assert status == 400 and "5 is not a valid federation upstream name" in body["reason"]


def test_an_upstream_that_is_not_there_or_refuses_the_login_shows_why(mgmt_broker, tmp_path):
    """The link's error as RabbitMQ 3.10.8's status shows it (probed: `econnrefused`)."""
    b = mgmt_broker
    value = {"uri": "amqp://guest:guest@127.0.0.1:1", "reconnect-delay": 1}
    assert b.api("PUT", "/api/parameters/federation-upstream/%2F/gone", {"value": value})[0] == 201
    policy = {"pattern": "^fed", "definition": {"federation-upstream": "gone"}}
    assert b.api("PUT", "/api/policies/%2F/fed", policy)[0] == 201
    b.api("PUT", "/api/exchanges/%2F/fed.x", {"type": "fanout"})

    def errored():
        rows = b.api("GET", "/api/federation-links/%2F/state/down")[1]
        return rows[0] if rows and rows[0]["status"] == "error" else None

    row = until(errored, 10)
    assert row and row["error"] == "econnrefused", b.api("GET", "/api/federation-links")
    assert row["uri"] == "amqp://127.0.0.1:1"
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "up"))) as up:
        value = {"uri": f"amqp://guest:wrong@127.0.0.1:{up.port}", "reconnect-delay": 1}
        b.api("PUT", "/api/parameters/federation-upstream/%2F/gone", {"value": value})

        def refused():
            found = errored()
            return found if found and "auth_failure" in found["error"] else None

        row = until(refused, 10)
        assert row, b.api("GET", "/api/federation-links")
        assert row["error"] == (
            '{auth_failure,"ACCESS_REFUSED - Login was refused using authentication '
            'mechanism PLAIN. For details see the broker logfile."}'
        )
        assert "wrong" not in str(b.api("GET", "/api/federation-links")[1])
