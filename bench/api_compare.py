"""The management API against RabbitMQ's: the same scenario on both, the same GETs, and how
many answer alike (status) and which fields each returns.

    .venv/bin/python bench/api_compare.py [--json PATH] [--show-missing N]

Starts its own RabbitMQ (Debian's rabbitmq-server, management plugin on, own ports and data
dir, stopped at the end) and an in-process RoarMQ; builds one scenario on each through AMQP
and the API (a vhost, a topic exchange, queues with arguments and bindings, messages, a
consumer, a policy, a user with permissions, a topic permission and a vhost limit); then GETs
each endpoint of the list below on both. A field is a JSON path (list items merged); an
endpoint "answers alike" when the status codes are equal. Prints a table and the fields
RoarMQ lacks most often; writes JSON (default bench/results/api_compare.json).

Then the parity checks, each a value both brokers must give alike:
connection and channel names (RabbitMQ's "client -> server" form), channel and vhost
`message_stats` (keys and counts), vhost octets and rate details, exclusive queues left out
of definitions, the statuses of permission and topic-permission PUTs (made, then changed),
`properties_key` of bindings with and without arguments (made over AMQP and over the API),
`amq.rabbitmq.trace` and the firehose's copies (routing keys, headers). Prints each check
as "same" or the two values, and exits 1 when any differ.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pika
from lib import RESULTS
from lib.brokers import BrokerUnavailable, start_rabbitmq, stop_broker
from lib.management_api import AUTH
from lib.output import write_json
from lib.procs import Procs

from roarmq.broker.testing import BrokerThread, ephemeral_config

ENDPOINTS = [
    "/api/overview",
    "/api/nodes",
    "/api/nodes/{node}",
    "/api/extensions",
    "/api/whoami",
    "/api/connections",
    "/api/channels",
    "/api/consumers",
    "/api/consumers/cmp",
    "/api/exchanges",
    "/api/exchanges/cmp",
    "/api/exchanges/cmp/cx",
    "/api/exchanges/cmp/amq.rabbitmq.trace",
    "/api/connections/{conn}",
    "/api/connections/{conn}/channels",
    "/api/channels/{channel}",
    "/api/exchanges/cmp/cx/bindings/source",
    "/api/exchanges/cmp/cx/bindings/destination",
    "/api/queues",
    "/api/queues/cmp",
    "/api/queues/cmp/cq",
    "/api/queues/cmp/cq/bindings",
    "/api/bindings",
    "/api/bindings/cmp",
    "/api/bindings/cmp/e/cx/q/cq",
    "/api/vhosts",
    "/api/vhosts/cmp",
    "/api/vhosts/cmp/permissions",
    "/api/vhosts/cmp/topic-permissions",
    "/api/users",
    "/api/users/cmpuser",
    "/api/users/cmpuser/permissions",
    "/api/users/cmpuser/topic-permissions",
    "/api/permissions",
    "/api/permissions/cmp/cmpuser",
    "/api/topic-permissions",
    "/api/topic-permissions/cmp/cmpuser",
    "/api/policies",
    "/api/policies/cmp",
    "/api/policies/cmp/cmp-policy",
    "/api/operator-policies",
    "/api/parameters",
    "/api/global-parameters",
    "/api/vhost-limits",
    "/api/vhost-limits/cmp",
    "/api/user-limits",
    "/api/definitions",
    "/api/definitions/cmp",
    "/api/aliveness-test/cmp",
    "/api/health/checks/alarms",
    "/api/health/checks/local-alarms",
    "/api/health/checks/virtual-hosts",
    "/api/health/checks/port-listener/{amqp_port}",
    "/api/health/checks/protocol-listener/amqp",
    "/api/queues?page=1&page_size=10",
    "/api/exchanges?page=1&page_size=10&name=cx",
    "/api/queues?columns=name,messages",
    "/api/queues/cmp/nope",
    "/api/exchanges/cmp/nope",
    "/api/users/nope",
]


def get(base: str, path: str) -> tuple[int, Any]:
    request = urllib.request.Request(base + path, headers={"Authorization": AUTH})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            return exc.code, json.loads(body)
        except ValueError:
            return exc.code, None


def q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def call(base: str, method: str, path: str, body: Any = None) -> int:
    request = urllib.request.Request(
        base + path,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={
            "Authorization": AUTH,
            "Content-Type": "application/json",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def fields(value: Any, prefix: str = "") -> set[str]:
    out: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            path = f"{prefix}.{k}" if prefix else k
            out.add(path)
            out |= fields(v, path)
    elif isinstance(value, list):
        for item in value:
            out |= fields(item, prefix + "[]")
    return out


def scenario(base: str, amqp_port: int) -> None:
    call(base, "PUT", "/api/vhosts/cmp")
    call(
        base, "PUT", "/api/permissions/cmp/guest", {"configure": ".*", "write": ".*", "read": ".*"}
    )
    call(base, "PUT", "/api/users/cmpuser", {"password": "pw", "tags": "monitoring"})
    call(
        base,
        "PUT",
        "/api/permissions/cmp/cmpuser",
        {"configure": "^c", "write": ".*", "read": ".*"},
    )
    call(
        base,
        "PUT",
        "/api/topic-permissions/cmp/cmpuser",
        {"exchange": "cx", "write": ".*", "read": ".*"},
    )
    call(base, "PUT", "/api/vhost-limits/cmp/max-queues", {"value": 100})
    call(
        base,
        "PUT",
        "/api/policies/cmp/cmp-policy",
        {"pattern": "^cq$", "definition": {"max-length": 50}, "apply-to": "queues"},
    )
    params = pika.ConnectionParameters(
        "127.0.0.1", amqp_port, "cmp", pika.PlainCredentials("guest", "guest")
    )
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.exchange_declare("cx", "topic", durable=True)
    ch.queue_declare("cq", durable=True, arguments={"x-message-ttl": 600000})
    ch.queue_declare("cq2")
    ch.queue_bind("cq", "cx", "a.*")
    ch.queue_bind("cq2", "cx", "#")
    for i in range(5):
        ch.basic_publish("cx", "a.b", b"m%d" % i, pika.BasicProperties(delivery_mode=2))
    ch.basic_consume("cq2", lambda *a: None, consumer_tag="cmp-consumer")
    conn.process_data_events(0.5)
    return conn


NAME = re.compile(r"^\d+\.\d+\.\d+\.\d+:\d+ -> \d+\.\d+\.\d+\.\d+:\d+$")


def _counts(stats: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (stats or {}).items() if not k.endswith("_details")}


def _details(row: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """Which of `keys` the row has, and which of their `_details` carry a rate."""
    return {k: (k in row, "rate" in (row.get(f"{k}_details") or {})) for k in keys}


def parity(base: str, amqp_port: int) -> dict[str, Any]:
    """The parity checks on one broker: what it answers, in values comparable across brokers
    (no ports, node names or times)."""
    out: dict[str, Any] = {}
    call(base, "PUT", "/api/vhosts/par")
    perms = {"configure": ".*", "write": ".*", "read": ".*"}
    out["PUT permission (made)"] = call(base, "PUT", "/api/permissions/par/guest", perms)
    out["PUT permission (changed)"] = call(base, "PUT", "/api/permissions/par/guest", perms)
    topic = {"exchange": "amq.topic", "write": ".*", "read": ".*"}
    out["PUT topic-permission (made)"] = call(
        base, "PUT", "/api/topic-permissions/par/guest", topic
    )
    out["PUT topic-permission (changed)"] = call(
        base, "PUT", "/api/topic-permissions/par/guest", topic
    )
    call(base, "DELETE", "/api/topic-permissions/par/guest")
    conn = pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1", amqp_port, "par", pika.PlainCredentials("guest", "guest")
        )
    )
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("q1")
    ch.queue_declare("", exclusive=True)
    ch.queue_declare("exq", exclusive=True)
    ch.queue_bind("exq", "amq.topic", "ex.#")
    ch.exchange_declare("hx", "headers")
    ch.exchange_declare("tx", "topic")
    ch.queue_bind("q1", "hx", "", arguments={"x-match": "all", "a": "b"})
    ch.queue_bind("q1", "hx", "rk", arguments={"x-match": "any", "n": 5})
    ch.queue_bind("q1", "hx", "", arguments={"b": True})
    ch.queue_bind("q1", "tx", "k", arguments={"z": 1, "a": "s", "big": 2**40, "t": {"y": 1}})
    ch.queue_bind("q1", "amq.topic", "a.b c/~d")
    ch.queue_bind("q1", "amq.direct", "")
    call(
        base,
        "POST",
        "/api/bindings/par/e/tx/q/q1",
        {"routing_key": "api", "arguments": {"n": 5, "f": 1.5, "m": {"z": 1, "a": 2}, "l": [1]}},
    )
    _, rows = get(base, "/api/bindings/par")
    out["properties_key of each binding"] = sorted(
        (
            r["source"],
            r["routing_key"],
            json.dumps(r["arguments"], sort_keys=True),
            r["properties_key"],
        )
        for r in rows
        if not r["destination"].startswith("amq.gen")
    )
    _, defs = get(base, "/api/definitions/par")
    out["definitions/{vhost} queues"] = sorted(x["name"] for x in defs["queues"])
    out["definitions/{vhost} bindings"] = sorted(
        (x["source"], x["destination"], x["routing_key"]) for x in defs["bindings"]
    )
    _, defs = get(base, "/api/definitions")
    out["definitions queues (vhost par)"] = sorted(
        x["name"] for x in defs["queues"] if x["vhost"] == "par"
    )
    for _ in range(10):
        ch.basic_publish("", "q1", b"x" * 10)
    ch.basic_publish("amq.direct", "nowhere", b"y")
    m = ch.basic_get("q1")
    ch.basic_ack(m[0].delivery_tag)
    ch.basic_get("q1", auto_ack=True)
    m = ch.basic_get("q1")
    ch.basic_nack(m[0].delivery_tag, requeue=True)
    ch2 = conn.channel()
    got: list[int] = []

    def on_message(chan: Any, method: Any, props: Any, body: bytes) -> None:
        got.append(1)
        chan.basic_ack(method.delivery_tag)

    ch2.basic_consume("q1", on_message)
    deadline = time.monotonic() + 10
    while len(got) < 8 and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    conn.channel()  # never used
    conn.process_data_events(0.2)
    time.sleep(6)  # one statistics interval on both
    conn.process_data_events(0.1)
    _, conns = get(base, "/api/connections")
    (row,) = [c for c in conns if c["vhost"] == "par"]
    name = row["name"]
    out["connection name form"] = bool(NAME.match(name)) and name == (
        f"{row['peer_host']}:{row['peer_port']} -> {row['host']}:{row['port']}"
    )
    out["GET /api/connections/{name}"] = get(base, f"/api/connections/{q(name)}")[0]
    _, chans = get(base, f"/api/connections/{q(name)}/channels")
    chans.sort(key=lambda c: c["number"])
    out["channel names"] = [c["name"].replace(name, "<conn>") for c in chans]
    out["GET /api/channels/{name}"] = get(base, f"/api/channels/{q(chans[0]['name'])}")[0]
    for c in chans:
        out[f"channel {c['number']} message_stats"] = _counts(c.get("message_stats"))
        stats = c.get("message_stats") or {}
        out[f"channel {c['number']} rate details"] = sorted(
            k for k, v in stats.items() if k.endswith("_details") and "rate" in v
        )
    _, vhost = get(base, "/api/vhosts/par")
    out["vhost message_stats keys"] = list(_counts(vhost.get("message_stats")))
    counts = _counts(vhost.get("message_stats"))
    out["vhost message_stats (publish side)"] = {
        k: counts.get(k) for k in ("publish", "confirm", "drop_unroutable", "get", "get_no_ack")
    }
    out["vhost octets and depths"] = _details(
        vhost, ["recv_oct", "send_oct", "messages", "messages_ready", "messages_unacknowledged"]
    )
    out["vhost recv_oct and send_oct counted"] = (
        vhost.get("recv_oct", 0) > 0 and vhost.get("send_oct", 0) > 0
    )
    # the firehose
    _, x = get(base, "/api/exchanges/par/amq.rabbitmq.trace")
    out["amq.rabbitmq.trace"] = {
        k: x.get(k) for k in ("type", "durable", "internal", "auto_delete")
    }
    out["PUT vhost tracing"] = call(base, "PUT", "/api/vhosts/par", {"tracing": True})
    out["vhost tracing"] = get(base, "/api/vhosts/par")[1].get("tracing")
    ch.queue_declare("tr", exclusive=True)
    ch.queue_bind("tr", "amq.rabbitmq.trace", "#")
    ch.queue_declare("q3")
    ch.queue_bind("q3", "amq.direct", "q3k")
    props = pika.BasicProperties(
        content_type="text/plain", headers={"h": 1}, delivery_mode=2, message_id="m1"
    )
    ch.basic_publish("amq.direct", "q3k", b"hello", props)
    m = ch.basic_get("q3")
    ch.basic_nack(m[0].delivery_tag, requeue=True)
    ch.basic_get("q3", auto_ack=True)
    ch.basic_publish("", "q3", b"cc", pika.BasicProperties(headers={"CC": ["q3"]}))
    time.sleep(0.5)
    copies = []
    while True:
        method, props_, body = ch.basic_get("tr", auto_ack=True)
        if method is None:
            break
        headers = dict(props_.headers or {})
        headers["connection"] = NAME.match(str(headers.get("connection", ""))) is not None
        headers["node"] = bool(headers.get("node"))
        copies.append((method.routing_key, body.decode(), headers))
    out["firehose copies"] = copies
    call(base, "PUT", "/api/vhosts/par", {"tracing": False})
    out["vhost tracing off"] = get(base, "/api/vhosts/par")[1].get("tracing")
    conn.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, default=RESULTS / "api_compare.json")
    p.add_argument("--show-missing", type=int, default=40)
    args = p.parse_args()
    procs = Procs()
    tmp = Path(tempfile.mkdtemp(prefix="roarmq-api-"))
    rows = []
    try:
        try:
            rabbitmq = start_rabbitmq(procs, tmp, management=True, nodename="roarapi")
        except BrokerUnavailable as exc:
            raise SystemExit(f"RabbitMQ: {exc}") from None
        r_port, r_mgmt = rabbitmq.port, rabbitmq.mgmt_port
        rabbit = f"http://127.0.0.1:{r_mgmt}"
        with BrokerThread(ephemeral_config(data_dir=str(tmp / "roar")), management=True) as b:
            roar = b.mgmt_url
            conns = [scenario(rabbit, r_port), scenario(roar, b.port)]
            time.sleep(6)  # one statistics interval on both
            nodes = {rabbit: get(rabbit, "/api/overview")[1]["node"], roar: b.broker.cluster_name}
            ports = {rabbit: r_port, roar: b.port}
            names = {}
            for base in (rabbit, roar):
                first = get(base, "/api/connections")[1][0]["name"]
                names[base] = {"conn": q(first), "channel": q(first + " (1)")}
            for template in ENDPOINTS:
                answers = {}
                for base in (rabbit, roar):
                    path = template.format(node=nodes[base], amqp_port=ports[base], **names[base])
                    answers[base] = get(base, path)
                (rs, rbody), (os_, obody) = answers[rabbit], answers[roar]
                rf, of = fields(rbody), fields(obody)
                rows.append(
                    {
                        "endpoint": template,
                        "rabbitmq_status": rs,
                        "roarmq_status": os_,
                        "alike": rs == os_,
                        "rabbitmq_fields": len(rf),
                        "roarmq_fields": len(of),
                        "shared_fields": len(rf & of),
                        "missing": sorted(rf - of),
                    }
                )
            for c in conns:
                c.close()
            seen = {base: parity(base, port) for base, port in ((rabbit, r_port), (roar, b.port))}
        stop_broker(procs, rabbitmq)
    finally:
        procs.stop_all()
    alike = sum(r["alike"] for r in rows)
    total_r = sum(r["rabbitmq_fields"] for r in rows)
    shared = sum(r["shared_fields"] for r in rows)
    width = max(len(r["endpoint"]) for r in rows)
    print(f"{'endpoint'.ljust(width)}  status R/Q  fields R  shared")
    for r in rows:
        print(
            f"{r['endpoint'].ljust(width)}  {r['rabbitmq_status']}/{r['roarmq_status']}"
            f"{'' if r['alike'] else ' *'}".ljust(width + 14)
            + f"  {r['rabbitmq_fields']:>8}  {r['shared_fields']:>6}"
        )
    print(
        f"\n{alike} of {len(rows)} calls answer alike; {shared} of {total_r} RabbitMQ fields returned"
    )
    counts: dict[str, int] = {}
    for r in rows:
        for f in r["missing"]:
            leaf = f.split(".")[-1]
            counts[leaf] = counts.get(leaf, 0) + 1
    top = sorted(counts.items(), key=lambda kv: -kv[1])[: args.show_missing]
    print("most often missing:", ", ".join(f"{k} ({n})" for k, n in top))
    checks = []
    print("\nparity: RabbitMQ 3.10.8 against RoarMQ")
    for key, theirs in seen[rabbit].items():
        ours = seen[roar].get(key)
        checks.append({"check": key, "rabbitmq": theirs, "roarmq": ours, "same": theirs == ours})
        print(f"  {'same     ' if theirs == ours else 'DIFFERENT'}  {key}")
        if theirs != ours:
            print(f"      RabbitMQ: {json.dumps(theirs, default=str)}")
            print(f"      RoarMQ:   {json.dumps(ours, default=str)}")
    differ = sum(not c["same"] for c in checks)
    print(f"{len(checks) - differ} of {len(checks)} checks the same")
    result = {
        "alike": alike,
        "calls": len(rows),
        "shared_fields": shared,
        "rabbitmq_fields": total_r,
        "rows": rows,
        "parity_checks": checks,
    }
    write_json(args.json, result)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
