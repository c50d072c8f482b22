"""Policies as RabbitMQ: matching and priority, x-argument precedence, operator policies,
live re-evaluation, durability, the HTTP API and definitions (texts from RabbitMQ 3.10.8)."""

from __future__ import annotations

import pika
import pytest
from support.waiting import wait_for

from roarmq.broker.testing import BrokerThread, ephemeral_config

pytestmark = pytest.mark.timeout(60)


def put(b, name, definition, pattern="^p\\.", operator=False, **extra):
    kind = "operator-policies" if operator else "policies"
    body = {"pattern": pattern, "definition": definition, **extra}
    return b.api("PUT", f"/api/{kind}/%2F/{name}", body)


def queue_info(b, name):
    return b.api("GET", f"/api/queues/%2F/{name}")[1]


def count(ch, queue) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def test_a_policy_applies_to_existing_and_new_queues_and_goes_away(b, ch):
    ch.queue_declare("p.before")
    for i in range(5):
        ch.basic_publish("", "p.before", b"%d" % i)
    assert put(b, "limit", {"max-length": 2})[0] == 201
    assert count(ch, "p.before") == 2  # drop-head trims at once, as RabbitMQ
    ch.queue_declare("p.after")
    ch.queue_declare("other")
    for q in ("p.after", "other"):
        for _ in range(4):
            ch.basic_publish("", q, b"x")
    assert (count(ch, "p.after"), count(ch, "other")) == (2, 4)
    info = queue_info(b, "p.after")
    assert (info["policy"], info["effective_policy_definition"]) == ("limit", {"max-length": 2})
    assert b.api("DELETE", "/api/policies/%2F/limit")[0] == 204
    for _ in range(3):
        ch.basic_publish("", "p.after", b"x")
    assert count(ch, "p.after") == 5
    assert queue_info(b, "p.after")["policy"] is None


def test_ttl_and_dead_lettering_from_a_policy(b, ch):
    ch.queue_declare("dead")
    ch.queue_bind("dead", "amq.fanout")
    assert put(b, "ttl", {"message-ttl": 30, "dead-letter-exchange": "amq.fanout"})[0] == 201
    ch.queue_declare("p.ttl")
    ch.basic_publish("", "p.ttl", b"soon dead")
    wait_for(lambda: count(ch, "dead") == 1, 5, 0.02, "the dead-lettered message")
    _, props, body = ch.basic_get("dead", auto_ack=True)
    assert body == b"soon dead"
    assert props.headers["x-death"][0]["reason"] == "expired"


def test_the_highest_priority_wins_then_the_first_name(b, ch):
    put(b, "b-low", {"max-length": 1}, priority=1)
    put(b, "c-high", {"max-length": 3}, priority=5)
    ch.queue_declare("p.prio")
    assert queue_info(b, "p.prio")["policy"] == "c-high"
    put(b, "a-high", {"max-length": 2}, priority=5)  # same priority: "a-high" sorts first
    assert queue_info(b, "p.prio")["policy"] == "a-high"


def test_x_arguments_and_policies_combine_as_rabbitmq(b, ch):
    put(b, "p", {"max-length": 5, "dead-letter-exchange": "amq.topic", "message-ttl": 1000})
    ch.queue_declare(
        "p.small", arguments={"x-max-length": 2, "x-dead-letter-exchange": "amq.direct"}
    )
    ch.queue_declare("p.big", arguments={"x-max-length": 10})
    for q in ("p.small", "p.big"):
        for _i in range(8):
            ch.basic_publish("", q, b"x")
    assert (count(ch, "p.small"), count(ch, "p.big")) == (2, 5)  # the smaller number wins
    queue = b.broker.vhosts["/"].queues["p.small"]
    assert queue.dlx == "amq.direct"  # the argument wins for names
    assert queue.message_ttl == 1000  # what only the policy sets applies


def test_overflow_from_a_policy_nacks_publishers(b, ch):
    put(b, "reject", {"max-length": 1, "overflow": "reject-publish"})
    ch.queue_declare("p.full")
    ch.confirm_delivery()
    ch.basic_publish("", "p.full", b"1")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", "p.full", b"2")


def test_operator_policies_cap_what_policies_and_arguments_set(b, ch):
    put(b, "user", {"max-length": 10})
    assert put(b, "cap", {"max-length": 3}, operator=True)[0] == 201
    ch.queue_declare("p.capped", arguments={"x-max-length": 8})
    for _i in range(6):
        ch.basic_publish("", "p.capped", b"x")
    assert count(ch, "p.capped") == 3
    info = queue_info(b, "p.capped")
    assert (info["policy"], info["operator_policy"]) == ("user", "cap")
    assert info["effective_policy_definition"] == {"max-length": 3}
    assert put(b, "op-dlx", {"dead-letter-exchange": "x"}, operator=True) == (
        400,
        {
            "error": "bad_request",
            "reason": "Validation failed\n\n"
            '[{<<"dead-letter-exchange">>,<<"x">>}] are not recognised policy settings\n',
        },
    )
    assert b.api("GET", "/api/operator-policies")[1][0]["name"] == "cap"


def test_alternate_exchange_from_a_policy(b, ch):
    ch.exchange_declare("p.x", "direct")
    ch.queue_declare("unrouted")
    ch.queue_bind("unrouted", "amq.fanout")
    put(b, "ae", {"alternate-exchange": "amq.fanout"}, **{"apply-to": "exchanges"})
    ch.basic_publish("p.x", "nowhere", b"lost?")
    wait_for(lambda: count(ch, "unrouted") == 1, 5, 0.02, "the unrouted message")
    ch.queue_declare("p.q")  # an exchanges-only policy does not apply to queues
    assert queue_info(b, "p.q")["policy"] is None


def test_expires_from_a_policy_deletes_an_idle_queue(b, ch):
    ch.queue_declare("p.idle")
    put(b, "expiry", {"expires": 50})
    wait_for(
        lambda: "p.idle" not in b.broker.vhosts["/"].queues, 5, 0.02, "the idle queue to expire"
    )


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (
            {"pattern": "^p", "definition": {"foo": 1}},
            '[{<<"foo">>,1}] are not recognised policy settings',
        ),
        (
            {"pattern": "^p", "definition": {"message-ttl": "x"}},
            '<<"x">> is not a valid message TTL',
        ),
        ({"pattern": "^p", "definition": {"message-ttl": -1}}, "-1 is not a valid message TTL"),
        ({"pattern": "^p", "definition": {"expires": 0}}, "0 is not a valid queue expiry"),
        (
            {"pattern": "^p", "definition": {"overflow": "bogus"}},
            '<<"bogus">> is not a valid overflow value',
        ),
        (
            {"pattern": "^p", "definition": {"dead-letter-exchange": 5}},
            "5 is not a valid dead letter exchange name",
        ),
        ({"pattern": "^p", "definition": {}}, "no policy provided"),
        (
            {"pattern": "^p", "definition": {"max-length": 1}, "apply-to": "bogus"},
            "apply-to 'bogus' unrecognised; should be 'queues', 'exchanges' or 'all'",
        ),
    ],
)
def test_invalid_policies_are_refused_as_rabbitmq(b, body, reason):
    assert b.api("PUT", "/api/policies/%2F/bad", body) == (
        400,
        {"error": "bad_request", "reason": f"Validation failed\n\n{reason}\n"},
    )


def test_policy_api_rows_auth_durability_and_definitions(tmp_path):
    cfg = ephemeral_config(data_dir=str(tmp_path / "d"))
    row = {
        "vhost": "/",
        "name": "p1",
        "pattern": "^p\\.",
        "apply-to": "all",
        "definition": {"max-length": 5},
        "priority": 0,
    }
    with BrokerThread(cfg, management=True) as b:
        assert put(b, "p1", {"max-length": 5})[0] == 201
        assert put(b, "p1", {"max-length": 5})[0] == 204
        assert b.api("GET", "/api/policies") == (200, [row])
        assert b.api("GET", "/api/policies/%2F") == (200, [row])
        assert b.api("GET", "/api/policies/%2F/p1") == (200, row)
        assert b.api("GET", "/api/policies/%2F/nope")[0] == 404
        assert b.api("DELETE", "/api/policies/%2F/nope")[0] == 404
        for user, tags in (("mg", "management"), ("pm", "policymaker")):
            assert b.api("PUT", f"/api/users/{user}", {"password": "pw", "tags": tags})[0] == 201
            perms = {"configure": ".*", "write": ".*", "read": ".*"}
            assert b.api("PUT", f"/api/permissions/%2F/{user}", perms)[0] in (201, 204)
        body = {"pattern": "^z", "definition": {"max-length": 1}}
        assert b.api("PUT", "/api/policies/%2F/z", body, auth="mg:pw") == (
            401,
            {"error": "not_authorised", "reason": "Not policymaker user"},
        )
        assert b.api("GET", "/api/policies", auth="mg:pw") == (200, [row])
        assert b.api("PUT", "/api/policies/%2F/z", body, auth="pm:pw")[0] == 201
        assert b.api("PUT", "/api/operator-policies/%2F/z", body, auth="pm:pw")[0] == 401
        assert b.api("DELETE", "/api/policies/%2F/z", auth="pm:pw")[0] == 204
        doc = b.api("GET", "/api/definitions")[1]
        assert doc["policies"] == [row]
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        assert b.api("GET", "/api/policies") == (200, [row])  # durable
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.queue_declare("p.restarted")
        for _i in range(7):
            ch.basic_publish("", "p.restarted", b"x")
        assert count(ch, "p.restarted") == 5
        conn.close()
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "fresh")), management=True) as b:
        assert b.api("POST", "/api/definitions", {"policies": [row]})[0] == 204
        assert b.api("GET", "/api/policies") == (200, [row])
