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
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pika
from harness import REPO, BrokerUnavailable, Procs, start_rabbitmq, stop_broker

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
    request = urllib.request.Request(
        base + path, headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            return exc.code, json.loads(body)
        except ValueError:
            return exc.code, None


def call(base: str, method: str, path: str, body: Any = None) -> int:
    request = urllib.request.Request(
        base + path,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={
            "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=str(REPO / "bench" / "results" / "api_compare.json"))
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
            for template in ENDPOINTS:
                answers = {}
                for base in (rabbit, roar):
                    path = template.format(node=nodes[base], amqp_port=ports[base])
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
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps(
            {
                "alike": alike,
                "calls": len(rows),
                "shared_fields": shared,
                "rabbitmq_fields": total_r,
                "rows": rows,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
