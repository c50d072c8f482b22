"""RabbitMQ's own CLI, `rabbitmqadmin` (a single Python file RabbitMQ's management plugin
ships), run unmodified against RoarMQ's management API for its everyday commands.

`make test` extracts it from Debian's rabbitmq-server package into .tools/ (without
installing RabbitMQ); a machine without apt says so here instead of running it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pika
import pytest
from machine import missing

from roarmq.broker.testing import BrokerThread, ephemeral_config

# slow (rabbitmqadmin processes): `make check` leaves it out
pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def find_rabbitmqadmin() -> str | None:
    for candidate in (
        os.environ.get("ROARMQ_RABBITMQADMIN"),
        str(REPO / ".tools" / "rabbitmqadmin"),
        shutil.which("rabbitmqadmin"),
    ):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


ADMIN = find_rabbitmqadmin()


@pytest.fixture
def admin(tmp_path):
    if ADMIN is None:
        missing(
            "rabbitmqadmin not found: `make tools` extracts it from Debian's package",
            "ROARMQ_EXPECT_TOOLS",
        )
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:

        def run(*args: str, ok: bool = True) -> str:
            cmd = [sys.executable, ADMIN, "-H", "127.0.0.1", "-P", str(b.broker.mgmt_port), *args]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            if ok:
                assert done.returncode == 0, (args, done.stdout, done.stderr)
            return done.stdout + done.stderr

        run.broker = b  # type: ignore[attr-defined]
        yield run


def rows(out: str) -> list[dict]:
    return json.loads(out)


def test_everyday_commands(admin, tmp_path):
    b = admin.broker
    # declare: exchange, queue, binding, vhost, user, permission, policy
    admin("declare", "exchange", "name=shop", "type=topic")
    admin("declare", "queue", "name=orders", "durable=true")
    admin("declare", "binding", "source=shop", "destination=orders", "routing_key=order.*")
    admin("declare", "vhost", "name=staging")
    admin("declare", "user", "name=ann", "password=pw", "tags=monitoring")
    admin(
        "declare", "permission", "vhost=staging", "user=ann", "configure=.*", "write=.*", "read=.*"
    )
    admin("declare", "policy", "name=cap", "pattern=^orders$", 'definition={"max-length": 100}')
    # list (JSON, so the test reads values, not layout) and the default table
    fmt = ("-f", "raw_json")
    assert {"name": "orders"}.items() <= rows(admin(*fmt, "list", "queues"))[0].items()
    assert "shop" in [x["name"] for x in rows(admin(*fmt, "list", "exchanges"))]
    binding = next(r for r in rows(admin(*fmt, "list", "bindings")) if r["source"] == "shop")
    assert (binding["destination"], binding["routing_key"]) == ("orders", "order.*")
    assert {"ann", "guest"} <= {u["name"] for u in rows(admin(*fmt, "list", "users"))}
    assert {"/", "staging"} <= {v["name"] for v in rows(admin(*fmt, "list", "vhosts"))}
    assert any(p["user"] == "ann" for p in rows(admin(*fmt, "list", "permissions")))
    assert rows(admin(*fmt, "list", "policies"))[0]["name"] == "cap"
    assert rows(admin(*fmt, "list", "nodes"))[0]["running"] is True
    assert "orders" in admin("list", "queues")
    overview = rows(admin(*fmt, "show", "overview"))[0]
    assert overview["product_name"] == "RoarMQ"
    assert overview["queue_totals"]["messages"] == 0
    # publish, get, purge
    assert "Message published" in admin(
        "publish", "exchange=shop", "routing_key=order.new", "payload=hello"
    )
    got = rows(admin(*fmt, "get", "queue=orders", "ackmode=ack_requeue_true"))
    assert got[0]["payload"] == "hello" and got[0]["routing_key"] == "order.new"
    assert b.broker.vhosts["/"].queues["orders"].message_count() == 1  # requeued
    got = rows(admin(*fmt, "get", "queue=orders", "ackmode=ack_requeue_false"))
    assert got[0]["redelivered"] is True
    assert b.broker.vhosts["/"].queues["orders"].message_count() == 0
    admin("publish", "exchange=shop", "routing_key=order.new", "payload=again")
    admin("purge", "queue", "name=orders")
    assert b.broker.vhosts["/"].queues["orders"].message_count() == 0
    # connections: list and close
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    channel = conn.channel()
    name = rows(admin(*fmt, "list", "connections"))[0]["name"]
    assert rows(admin(*fmt, "list", "channels"))[0]["number"] == 1
    admin("close", "connection", f"name={name}")
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        channel.queue_declare("orders", passive=True)
    # definitions out and back in
    dump = tmp_path / "defs.json"
    admin("export", str(dump))
    doc = json.loads(dump.read_text())
    assert "orders" in [q["name"] for q in doc["queues"]]
    # delete: binding, queue, exchange, policy, permission, user, vhost
    admin(
        "delete",
        "binding",
        "source=shop",
        "destination_type=queue",
        "destination=orders",
        "properties_key=order.*",
    )
    assert not [r for r in rows(admin(*fmt, "list", "bindings")) if r["source"] == "shop"]
    admin("delete", "queue", "name=orders")
    admin("delete", "exchange", "name=shop")
    admin("delete", "policy", "name=cap")
    admin("delete", "permission", "vhost=staging", "user=ann")
    admin("delete", "user", "name=ann")
    admin("delete", "vhost", "name=staging")
    assert "orders" not in b.broker.vhosts["/"].queues
    admin("import", str(dump))
    assert "orders" in b.broker.vhosts["/"].queues
    assert "staging" in b.broker.vhosts
    # a refusal is RabbitMQ's message, and a non-zero exit
    out = admin("declare", "queue", "name=orders", "durable=false", ok=False)
    assert "inequivalent arg 'durable'" in out
