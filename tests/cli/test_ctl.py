"""`roarmq ctl` against a real broker: rabbitmqctl's commands over the management API, and
the API endpoints behind them (route explain included)."""

from __future__ import annotations

import json
import time

import pika
import pytest

from roarmq.broker.__main__ import cli
from roarmq.broker.testing import BrokerThread, ephemeral_config

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def b(tmp_path):
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as broker:
        yield broker


def ctl(b, capsys, *args: str) -> tuple[int, str, str]:
    code = cli(["ctl", "--url", b.mgmt_url, *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_lists_as_tables_and_json(b, capsys):
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare("orders")
    ch.queue_bind("orders", "amq.topic", "order.*")
    ch.basic_publish("", "orders", b"x")
    ch.basic_consume("orders", lambda *a: None, consumer_tag="c1")
    code, out, _ = ctl(b, capsys, "list_queues")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["name", "messages"]
    assert lines[1].split()[0] == "orders"
    code, out, _ = ctl(b, capsys, "--format", "json", "list_queues", "name", "consumers")
    assert json.loads(out) == [{"name": "orders", "consumers": 1}]
    code, out, _ = ctl(b, capsys, "list_bindings")
    assert "amq.topic" in out and "order.*" in out
    code, out, _ = ctl(b, capsys, "list_consumers")
    assert "c1" in out and "orders" in out
    code, out, _ = ctl(b, capsys, "list_channels")
    assert "guest" in out
    code, out, _ = ctl(b, capsys, "--format", "json", "list_connections", "user")
    assert json.loads(out) == [{"user": "guest"}]
    code, out, _ = ctl(b, capsys, "status")
    assert "RoarMQ" in out and "queues" in out
    conn.close()


def test_users_vhosts_permissions_policies(b, capsys):
    assert ctl(b, capsys, "add_user", "alice", "s3cret")[0] == 0
    assert ctl(b, capsys, "set_user_tags", "alice", "monitoring", "policymaker")[0] == 0
    assert ctl(b, capsys, "add_vhost", "shop")[0] == 0
    assert ctl(b, capsys, "set_permissions", "-p", "shop", "alice", "^a", ".*", ".*")[0] == 0
    code, out, _ = ctl(b, capsys, "list_permissions", "-p", "shop")
    assert out.splitlines()[1].split() == ["alice", "^a", ".*", ".*"]
    code, out, _ = ctl(b, capsys, "--format", "json", "list_users")
    assert {"name": "alice", "tags": ["monitoring", "policymaker"]} in json.loads(out)
    assert ctl(b, capsys, "change_password", "alice", "n3w")[0] == 0
    assert b.api("GET", "/api/whoami", auth="alice:n3w")[1]["tags"] == [
        "monitoring",
        "policymaker",
    ]
    code, _, _ = ctl(
        b, capsys, "set_policy", "-p", "shop", "--priority", "2", "cap", "^a", '{"max-length": 3}'
    )
    assert code == 0
    code, out, _ = ctl(
        b, capsys, "--format", "json", "list_policies", "-p", "shop", "name", "priority"
    )
    assert json.loads(out) == [{"name": "cap", "priority": 2}]
    assert ctl(b, capsys, "clear_policy", "-p", "shop", "cap")[0] == 0
    assert ctl(b, capsys, "clear_permissions", "-p", "shop", "alice")[0] == 0
    assert ctl(b, capsys, "delete_vhost", "shop")[0] == 0
    assert ctl(b, capsys, "delete_user", "alice")[0] == 0
    code, _, err = ctl(b, capsys, "delete_user", "alice")
    assert code == 67 and 'User "alice" does not exist' in err  # rabbitmqctl's words and code


def test_queues_connections_definitions(b, capsys, tmp_path):
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare("work", durable=True)
    for _ in range(3):
        ch.basic_publish("", "work", b"x")
    assert ctl(b, capsys, "purge_queue", "work")[0] == 0
    assert ch.queue_declare("work", passive=True).method.message_count == 0
    dump = tmp_path / "defs.json"
    assert ctl(b, capsys, "export_definitions", str(dump))[0] == 0
    assert any(q["name"] == "work" for q in json.loads(dump.read_text())["queues"])
    assert ctl(b, capsys, "delete_queue", "work")[0] == 0
    assert "work" not in b.broker.vhosts["/"].queues
    assert ctl(b, capsys, "import_definitions", str(dump))[0] == 0
    assert "work" in b.broker.vhosts["/"].queues
    name = b.api("GET", "/api/connections")[1][0]["name"]
    assert ctl(b, capsys, "close_connection", name, "maintenance")[0] == 0
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        ch.queue_declare("work", passive=True)
    assert info.value.reply_code == 320
    assert "maintenance" in info.value.reply_text


def test_route_explain(b, capsys):
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.exchange_declare("logs", "topic")
    ch.exchange_declare("audit", "fanout")
    ch.exchange_declare("fallback", "fanout")
    ch.exchange_declare("strict", "direct", arguments={"alternate-exchange": "fallback"})
    for q in ("errors", "everything", "audit-q", "lost"):
        ch.queue_declare(q)
    ch.queue_bind("errors", "logs", "*.error")
    ch.queue_bind("everything", "logs", "#")
    ch.exchange_bind("audit", "logs", "app.#")
    ch.queue_bind("audit-q", "audit")
    ch.queue_bind("lost", "fallback")
    ch.basic_publish("logs", "app.error", b"warm the cache")
    status, result = b.api("GET", "/api/route/%2F/logs?routing_key=app.error")
    assert status == 200
    assert result["queues"] == ["audit-q", "errors", "everything"]
    hops = {(r["source"], r["routing_key"], r["destination"]) for r in result["bindings"]}
    assert hops == {
        ("logs", "*.error", "errors"),
        ("logs", "#", "everything"),
        ("logs", "app.#", "audit"),
        ("audit", "audit-q", "audit-q"),  # pika binds with the queue name by default
    }
    assert any("cache hit" in n for n in result["notes"])
    result = b.api("GET", "/api/route/%2F/strict?routing_key=nothing")[1]
    assert result["queues"] == ["lost"]
    assert any("alternate exchange 'fallback'" in n for n in result["notes"])
    body = {"routing_key": "x.info", "headers": {"CC": ["db.error"]}}
    result = b.api("POST", "/api/route/%2F/logs", body)[1]
    assert result["queues"] == ["errors", "everything"]
    result = b.api("GET", "/api/route/%2F/amq.default?routing_key=errors")[1]
    assert result["queues"] == ["errors"]
    assert b.api("GET", "/api/route/%2F/nope?routing_key=x")[0] == 404
    code, out, _ = ctl(b, capsys, "route", "logs", "app.error")
    assert code == 0 and "reaches 3 queue(s): audit-q, errors, everything" in out
    conn.close()


def test_unreachable_api_is_one_line(capsys):
    code = cli(["ctl", "--url", "http://127.0.0.1:1", "list_queues"])
    assert code == 1
    assert capsys.readouterr().err.startswith("Error: cannot reach the management API")


def test_limits_commands(b, capsys):
    assert ctl(b, capsys, "set_vhost_limits", "-p", "/", '{"max-queues": 4}')[0] == 0
    assert b.api("GET", "/api/vhost-limits/%2F")[1][0]["value"] == {"max-queues": 4}
    assert ctl(b, capsys, "clear_vhost_limits", "-p", "/")[0] == 0
    assert b.api("GET", "/api/vhost-limits/%2F")[1] == []
    assert (
        ctl(b, capsys, "set_user_limits", "guest", '{"max-channels": 9, "max-connections": 3}')[0]
        == 0
    )
    assert b.api("GET", "/api/user-limits/guest")[1][0]["value"] == {
        "max-channels": 9,
        "max-connections": 3,
    }
    assert ctl(b, capsys, "clear_user_limits", "guest", "max-channels")[0] == 0
    assert b.api("GET", "/api/user-limits/guest")[1][0]["value"] == {"max-connections": 3}
    assert ctl(b, capsys, "clear_user_limits", "guest", "all")[0] == 0
    assert b.api("GET", "/api/user-limits/guest")[1] == []
    code, _, err = ctl(b, capsys, "set_vhost_limits", "-p", "/", "nope")
    assert code == 2 and "JSON object" in err
    assert b.api("GET", "/api/vhosts/%2F")[1]["name"] == "/"


def test_shovel_commands(b, capsys):
    ch = pika.BlockingConnection(pika.URLParameters(b.url)).channel()
    ch.queue_declare("src", durable=True)
    value = json.dumps(
        {"src-uri": "amqp://", "src-queue": "src", "dest-uri": "amqp://", "dest-queue": "dst"}
    )
    code, out, _ = ctl(b, capsys, "set_parameter", "shovel", "move", value)
    assert code == 0 and 'Setting runtime parameter "move" for component "shovel"' in out
    code, out, _ = ctl(b, capsys, "--format", "json", "list_parameters", "component", "name")
    assert json.loads(out) == [{"component": "shovel", "name": "move"}]
    code, out, err = ctl(b, capsys, "set_parameter", "shovel", "bad", '{"src-uri": "amqp://"}')
    assert code != 0 and "Must specify 'src-exchange' or 'src-queue'" in err
    ch.basic_publish("", "src", b"x", pika.BasicProperties(delivery_mode=2))
    for _ in range(100):
        code, out, _ = ctl(b, capsys, "--format", "json", "shovel_status", "name", "state")
        if json.loads(out) == [{"name": "move", "state": "running"}]:
            break
        time.sleep(0.05)
    assert json.loads(out) == [{"name": "move", "state": "running"}]
    assert ctl(b, capsys, "restart_shovel", "move")[0] == 0
    assert ctl(b, capsys, "clear_parameter", "shovel", "move")[0] == 0
    code, _, err = ctl(b, capsys, "clear_parameter", "shovel", "move")
    assert code != 0 and "Parameter does not exist" in err
    assert ctl(b, capsys, "set_parameter", "shovel", "again", value)[0] == 0
    assert ctl(b, capsys, "delete_shovel", "again")[0] == 0
    code, out, _ = ctl(b, capsys, "--format", "json", "list_parameters")
    assert json.loads(out) == []


def test_federation_status_and_restart(b, capsys, tmp_path):
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "up"))) as up:
        value = json.dumps({"uri": f"amqp://guest:guest@127.0.0.1:{up.port}"})
        assert ctl(b, capsys, "set_parameter", "federation-upstream", "origin", value)[0] == 0
        definition = '{"federation-upstream-set": "all"}'
        assert (
            ctl(b, capsys, "set_policy", "--apply-to", "exchanges", "fed", "^fed", definition)[0]
            == 0
        )
        pika.BlockingConnection(pika.URLParameters(b.url)).channel().exchange_declare(
            "fed.x", "fanout"
        )
        for _ in range(100):
            code, out, _ = ctl(b, capsys, "--format", "json", "federation_status")
            rows = json.loads(out)
            if rows and rows[0]["status"] == "running":
                break
            time.sleep(0.05)
        (row,) = rows
        assert (row["type"], row["exchange"], row["upstream"]) == ("exchange", "fed.x", "origin")
        assert ctl(b, capsys, "restart_federation_link", row["id"])[0] == 0
        code, _, err = ctl(b, capsys, "restart_federation_link", "00000000")
        assert code != 0 and "no federation link '00000000'" in err
        assert ctl(b, capsys, "clear_policy", "fed")[0] == 0
