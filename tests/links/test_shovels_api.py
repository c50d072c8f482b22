"""Dynamic shovels as RabbitMQ's users set and watch them: runtime parameters of component
`shovel` through the management API (201 on create, 204 on update and delete, 404 for a
missing one, 400 with RabbitMQ's reason and nothing stored), GET /api/shovels rows, the
restart endpoint, `src-delete-after` removing its own parameter, the local broker as
`amqp://` (no socket, not listed among connections), a shovel that survives kill -9, and
passwords in no row and no log line."""

from __future__ import annotations

import re
import time

import pika
import pytest
from support.broker_process import BrokerProcess
from support.queues import ready
from support.waiting import until

from roarmq.broker.testing import BrokerThread, ephemeral_config

pytestmark = pytest.mark.timeout(90)

PERSISTENT = pika.BasicProperties(delivery_mode=2)
LOCAL = {"src-uri": "amqp://", "src-queue": "src", "dest-uri": "amqp://", "dest-queue": "dst"}


def channel(port: int):
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port)).channel()


def put(b, name: str, value, vhost: str = "%2F"):
    return b.api("PUT", f"/api/parameters/shovel/{vhost}/{name}", {"value": value})


def test_a_local_shovel_moves_every_message_and_shows_as_rabbitmq_shows_it(mgmt_broker):
    b = mgmt_broker
    ch = channel(b.port)
    ch.queue_declare("src", durable=True)
    for i in range(300):
        ch.basic_publish("", "src", b"m%d" % i, PERSISTENT)
    value = {**LOCAL, "dest-add-forward-headers": True}
    assert put(b, "move", value) == (201, None)
    assert put(b, "move", value) == (204, None)  # the same again: an update
    assert until(lambda: ready(b.port, "dst") == 300, 20), ready(b.port, "dst")
    assert ready(b.port, "src") == 0
    status, rows = b.api("GET", "/api/shovels")
    assert status == 200
    (row,) = rows
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d{1,2}:\d\d:\d\d", row["timestamp"])
    row = {k: v for k, v in row.items() if k != "timestamp"}
    assert row == {
        "node": b.broker.node_name,
        "name": "move",
        "vhost": "/",
        "type": "dynamic",
        "state": "running",
        "src_uri": "amqp://",
        "src_protocol": "amqp091",
        "dest_protocol": "amqp091",
        "dest_uri": "amqp://",
        "src_queue": "src",
        "dest_queue": "dst",
    }
    assert b.api("GET", "/api/shovels/%2F")[1] == rows
    assert b.api("GET", "/api/shovels/vhost/%2F/move")[1] == rows
    assert b.api("GET", "/api/parameters/shovel") == (
        200,
        [{"value": value, "vhost": "/", "component": "shovel", "name": "move"}],
    )
    assert b.api("GET", "/api/parameters/shovel/%2F/move")[1]["value"] == value
    # the shovel's connections to its own broker are not clients' (RabbitMQ lists none)
    assert len(b.api("GET", "/api/connections")[1]) == 1
    _method, props, body = ch.basic_get("dst", auto_ack=True)
    assert body == b"m0" and props.delivery_mode == 2
    assert props.headers["x-shovelled"][0]["shovelled-by"] == b.broker.cluster_name
    metrics = urlopen_text(b.mgmt_url + "/metrics")
    assert re.search(r"^roarmq_shovel_messages_moved_total 300\.0$", metrics, re.M), metrics
    assert 'roarmq_shovels{state="running"} 1.0' in metrics
    # moving goes on while it runs (299 left after the get, and this one)
    ch.basic_publish("", "src", b"late", PERSISTENT)
    assert until(lambda: ready(b.port, "dst") == 300, 10)
    assert b.api("DELETE", "/api/shovels/vhost/%2F/move/restart") == (204, None)
    assert b.api("DELETE", "/api/shovels/vhost/%2F/nope/restart")[0] == 404
    assert b.api("DELETE", "/api/parameters/shovel/%2F/move") == (204, None)
    assert b.api("DELETE", "/api/parameters/shovel/%2F/move")[0] == 404
    assert b.api("GET", "/api/parameters/shovel/%2F/move")[0] == 404
    assert b.api("GET", "/api/shovels") == (200, [])


def urlopen_text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (
            {"src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b"},
            'Key "src-uri" not found in bad',
        ),
        (
            {**LOCAL, "src-uri": "http://x"},
            '"http://x" not a valid URI: {{unexpected_uri_scheme,"http"},"http://x"}',
        ),
        ({**LOCAL, "src-uri": 5}, "src-uri should be list, actually was 5"),
        ({**LOCAL, "foo": 1}, 'Unrecognised terms [{<<"foo">>,1}] in bad'),
        ({**LOCAL, "src-exchange": "x"}, "Cannot specify 'src-exchange' and 'src-queue'"),
        (
            {**LOCAL, "ack-mode": "sometimes"},
            'ack-mode should be one of [<<"no-ack">>,<<"on-publish">>,<<"on-confirm">>], '
            'actually was <<"sometimes">>',
        ),
        (
            {**LOCAL, "src-delete-after": 5, "ack-mode": "no-ack"},
            "Cannot specify 'no-ack' and numerical 'delete-after'",
        ),
    ],
)
def test_a_refused_shovel_is_answered_as_rabbitmq_answers_and_stores_nothing(
    mgmt_broker, value, reason
):
    """RabbitMQ 3.10.8's reasons, probed (its HTML-escaping of them aside)."""
    status, body = put(mgmt_broker, "bad", value)
    assert status == 400
    assert body == {"error": "bad_request", "reason": f"Validation failed\n\n{reason}\n"}
    assert mgmt_broker.api("GET", "/api/parameters/shovel/%2F/bad")[0] == 404
    assert mgmt_broker.api("GET", "/api/shovels") == (200, [])


def test_a_put_without_a_value_or_to_an_unknown_vhost_or_component(mgmt_broker):
    b = mgmt_broker
    assert b.api("PUT", "/api/parameters/shovel/%2F/s", {}) == (
        400,
        {"error": "bad_request", "reason": "[{key_missing,value}]"},
    )
    assert b.api("PUT", "/api/parameters/shovel/nowhere/s", {"value": LOCAL})[0] == 404
    status, body = b.api("PUT", "/api/parameters/nonesuch/%2F/s", {"value": 1})
    assert status == 400 and "component nonesuch not found" in body["reason"]


def test_a_monitoring_user_sees_shovels_a_management_user_may_not_set_them(mgmt_broker):
    b = mgmt_broker
    assert b.api("PUT", "/api/users/watcher", {"password": "pw", "tags": "monitoring"})[0] == 201
    assert b.api("PUT", "/api/users/plain", {"password": "pw", "tags": "management"})[0] == 201
    grant = {"configure": ".*", "write": ".*", "read": ".*"}
    assert b.api("PUT", "/api/permissions/%2F/plain", grant)[0] in (201, 204)
    assert b.api("GET", "/api/shovels", auth="watcher:pw") == (200, [])
    assert b.api("GET", "/api/shovels", auth="plain:pw")[0] == 401
    status, _ = b.api("PUT", "/api/parameters/shovel/%2F/s", {"value": LOCAL}, auth="plain:pw")
    assert status == 401


def test_src_delete_after_queue_length_moves_what_was_there_and_removes_itself(mgmt_broker):
    b = mgmt_broker
    ch = channel(b.port)
    ch.queue_declare("src", durable=True)
    for i in range(3):
        ch.basic_publish("", "src", b"m%d" % i, PERSISTENT)
    assert put(b, "once", {**LOCAL, "src-delete-after": "queue-length"})[0] == 201
    assert until(lambda: b.api("GET", "/api/parameters/shovel")[1] == [], 10)
    assert b.api("GET", "/api/shovels") == (200, [])
    assert ready(b.port, "dst") == 3 and ready(b.port, "src") == 0
    ch.basic_publish("", "src", b"after", PERSISTENT)
    time.sleep(0.3)
    assert ready(b.port, "src") == 1  # nobody moves it now


def test_an_unreachable_end_shows_its_reason_and_no_password_anywhere(mgmt_broker, caplog):
    b = mgmt_broker
    value = {**LOCAL, "src-uri": "amqp://u:secretpw@127.0.0.1:1", "reconnect-delay": 1}
    assert put(b, "away", value)[0] == 201

    def terminated():
        rows = b.api("GET", "/api/shovels")[1]
        return rows if rows and rows[0]["state"] == "terminated" else None

    rows = until(terminated, 10)
    assert rows, b.api("GET", "/api/shovels")
    assert "ECONNREFUSED" in rows[0]["reason"]
    assert until(lambda: b.broker.shovels.reconnects() >= 1, 10)  # retried at reconnect-delay
    assert "secretpw" not in str(b.api("GET", "/api/shovels"))
    assert "secretpw" not in caplog.text
    # the URI is logged without its credentials, as RabbitMQ shows it
    assert "(URI: amqp://127.0.0.1:1)" in caplog.text


def test_a_shovel_survives_kill_9_and_goes_on_moving(tmp_path):
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        ch = channel(broker.port)
        ch.confirm_delivery()
        ch.queue_declare("src", durable=True)
        assert broker.call("/api/parameters/shovel/%2F/move", "PUT", {"value": LOCAL})[0] == 201
        for i in range(50):
            ch.basic_publish("", "src", b"a%d" % i, PERSISTENT)
        assert until(lambda: ready(broker.port, "dst") == 50, 20)
        broker.kill9()
        broker.start()
        ch = channel(broker.port)
        ch.confirm_delivery()
        assert until(lambda: broker.api("/api/shovels")[0]["state"] == "running", 20)
        for i in range(50):
            ch.basic_publish("", "src", b"b%d" % i, PERSISTENT)
        # on-confirm is at least once, as RabbitMQ documents it: a message the destination
        # confirmed whose ack at the source the kill took is moved again; none is lost
        assert until(lambda: ready(broker.port, "src") == 0, 20), ready(broker.port, "src")
        assert until(lambda: ready(broker.port, "dst") >= 100, 20), ready(broker.port, "dst")
        bodies = []
        while (got := ch.basic_get("dst", auto_ack=True))[0] is not None:
            bodies.append(got[2])
        assert {b"a%d" % i for i in range(50)} <= set(bodies)
        assert sorted(x for x in bodies if x.startswith(b"b")) == sorted(
            b"b%d" % i for i in range(50)
        )  # moved after the restart: once each
    finally:
        broker.stop()


def test_definitions_carry_shovels_from_one_broker_to_another(mgmt_broker, tmp_path):
    value = {**LOCAL, "src-prefetch-count": 10}
    assert put(mgmt_broker, "move", value)[0] == 201
    status, doc = mgmt_broker.api("GET", "/api/definitions")
    assert status == 200
    assert {"value": value, "vhost": "/", "component": "shovel", "name": "move"} in doc[
        "parameters"
    ]
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "other")), management=True) as b:
        assert b.api("POST", "/api/definitions", doc)[0] in (200, 201, 204)
        assert b.api("GET", "/api/parameters/shovel/%2F/move")[1]["value"] == value
        ch = channel(b.port)
        ch.queue_declare("src", durable=True)
        ch.basic_publish("", "src", b"x", PERSISTENT)
        assert until(lambda: ready(b.port, "dst") == 1, 10)


def test_a_shovel_reconnects_after_its_source_broker_is_killed_and_restarted(mgmt_broker, tmp_path):
    source = BrokerProcess(tmp_path / "source").start()
    try:
        ch = channel(source.port)
        ch.confirm_delivery()
        ch.queue_declare("src", durable=True)
        value = {
            **LOCAL,
            "src-uri": f"amqp://guest:guest@127.0.0.1:{source.port}",
            "reconnect-delay": 1,
        }
        assert put(mgmt_broker, "remote", value)[0] == 201
        for i in range(20):
            ch.basic_publish("", "src", b"a%d" % i, PERSISTENT)
        assert until(lambda: ready(mgmt_broker.port, "dst") == 20, 20)
        source.kill9()

        def state():
            rows = mgmt_broker.api("GET", "/api/shovels")[1]
            return rows[0]["state"] if rows else None

        assert until(lambda: state() == "terminated", 10), state()
        source.start()
        assert until(lambda: state() == "running", 20), state()
        ch = channel(source.port)
        ch.confirm_delivery()
        for i in range(20):
            ch.basic_publish("", "src", b"b%d" % i, PERSISTENT)
        assert until(lambda: ready(source.port, "src") == 0, 20)
        assert until(lambda: ready(mgmt_broker.port, "dst") >= 40, 20), ready(
            mgmt_broker.port, "dst"
        )
        assert mgmt_broker.broker.shovels.reconnects() >= 1
    finally:
        source.stop()


def test_on_confirm_never_acks_at_the_source_what_the_destination_refused(mgmt_broker):
    """A destination queue full with reject-publish nacks what it cannot take: the source
    keeps it (requeued, tried again), never acked; once there is room it moves."""
    b = mgmt_broker
    ch = channel(b.port)
    ch.queue_declare("src", durable=True)
    full = {"x-max-length": 10, "x-overflow": "reject-publish"}
    ch.queue_declare("dst", durable=True, arguments=full)
    for i in range(50):
        ch.basic_publish("", "src", b"m%d" % i, PERSISTENT)
    assert put(b, "bounded", {**LOCAL, "src-prefetch-count": 5})[0] == 201
    assert until(lambda: ready(b.port, "dst") == 10, 10)
    time.sleep(0.5)
    # the 40 refused are still the source's: ready, or delivered to the shovel and not acked
    status, row = b.api("GET", "/api/queues/%2F/src")
    assert status == 200 and row["messages"] == 40, row["messages"]
    ch.queue_purge("dst")  # room for ten more: they move, the other thirty stay
    assert until(lambda: b.api("GET", "/api/queues/%2F/src")[1]["messages"] == 30, 10)
    assert ready(b.port, "dst") == 10
