"""Shovel throughput and federation lag, RoarMQ's beside RabbitMQ's in the same run.

    .venv/bin/python bench/links.py [--messages N] [--body B] [--rate R] [--seconds S]
                                    [--json PATH]

A benchmark, not a test. One RabbitMQ node (its management, shovel and federation plugins)
and one RoarMQ, each unpinned (a shovel is work for both ends), on loopback.

**Shovels**: N persistent messages (default 100,000; B-byte bodies, default 64) are
preloaded, each confirmed, into a durable queue; then a dynamic shovel (`on-confirm`,
prefetch 1000) moves them to a durable queue; reported is the rate between the moments
10% and 90% had arrived (the drain in steady state, not its start or tail), and the whole
time. Four moves: RabbitMQ -> RoarMQ by RoarMQ's shovel and by RabbitMQ's; RoarMQ ->
RoarMQ (one broker's two queues) by RoarMQ's shovel; RabbitMQ -> RabbitMQ by RabbitMQ's.

**Federation lag**: a federated fanout exchange (its upstream another vhost of the same
broker, reached over TCP), a publisher sending R messages a second (default 2,000) for S
seconds (default 10) to the upstream with the send time in the body, a consumer of a
queue bound downstream; reported are the lag's p50, p99 and max (arrival minus send) and
how many arrived. RoarMQ's links, RabbitMQ's links, and RabbitMQ as RoarMQ's upstream.

Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pika
from lib import RESULTS
from lib.brokers import start_rabbitmq, start_roarmq, stop_broker
from lib.management_api import api
from lib.output import markdown_table, write_results
from lib.preload import preload
from lib.procs import Procs

PLUGINS = (
    "rabbitmq_shovel",
    "rabbitmq_shovel_management",
    "rabbitmq_federation",
    "rabbitmq_federation_management",
)


class Broker:
    def __init__(self, kind: str, port: int, mgmt_port: int) -> None:
        self.kind, self.port, self.mgmt_port = kind, port, mgmt_port

    def url(self, vhost: str = "%2F") -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/{vhost}"

    def api(self, method: str, path: str, body: Any = None) -> Any:
        return api(self.mgmt_port, method, path, body)

    def count(self, queue: str, vhost: str = "%2F") -> int:
        conn = pika.BlockingConnection(pika.URLParameters(self.url(vhost)))
        try:
            return conn.channel().queue_declare(queue, passive=True).method.message_count
        except pika.exceptions.ChannelClosedByBroker:
            return 0
        finally:
            conn.close()


def shovel_move(runner: Broker, source: Broker, dest: Broker, n: int, body: int) -> dict:
    """Preload `n` into `source`'s queue, shovel them (run by `runner`) into `dest`'s."""
    tag = f"{runner.kind[:4]}-{source.kind[:4]}-{dest.kind[:4]}"
    src_q, dest_q = f"src-{tag}", f"dst-{tag}"
    asyncio.run(preload(source.url(), src_q, n, body))

    def uri(b: Broker) -> str:
        return "amqp://" if b is runner else b.url()

    value = {
        "src-uri": uri(source),
        "src-queue": src_q,
        "dest-uri": uri(dest),
        "dest-queue": dest_q,
        "src-prefetch-count": 1000,
        "ack-mode": "on-confirm",
    }
    started = time.monotonic()
    runner.api("PUT", f"/api/parameters/shovel/%2F/{tag}", {"value": value})
    marks: dict[float, float] = {}
    while True:
        moved = dest.count(dest_q)
        now = time.monotonic()
        for share in (0.1, 0.9, 1.0):
            if share not in marks and moved >= n * share:
                marks[share] = now
        if 1.0 in marks or now - started > 600:
            break
        time.sleep(0.05)
    runner.api("DELETE", f"/api/parameters/shovel/%2F/{tag}")
    window = marks.get(0.9, 0.0) - marks.get(0.1, 0.0)
    # (None: the move was over within one look, too short to measure: use more messages)
    steady = 0.8 * n / window if window > 0 and 0.1 in marks else None
    return {
        "test": f"shovel {source.kind} -> {dest.kind}",
        "shovel": runner.kind,
        "messages": n,
        "steady_msg_s": round(steady) if steady else None,
        "total_s": round(marks.get(1.0, time.monotonic()) - started, 2),
    }


def federation_lag(down: Broker, up: Broker, rate: int, seconds: float) -> dict:
    """Federate `down`'s exchange from `up`'s vhost `lag-up` (over TCP); measure the lag."""
    tag = f"lag-{up.kind[:4]}-{down.kind[:4]}"
    up.api("PUT", f"/api/vhosts/{tag}")
    up.api("PUT", f"/api/permissions/{tag}/guest", {"configure": ".*", "write": ".*", "read": ".*"})
    value = {"uri": up.url(tag), "prefetch-count": 1000}
    down.api("PUT", f"/api/parameters/federation-upstream/%2F/{tag}", {"value": value})
    policy = {
        "pattern": f"^{tag}$",
        "apply-to": "exchanges",
        "definition": {"federation-upstream": tag},
    }
    down.api("PUT", f"/api/policies/%2F/{tag}", policy)
    dconn = pika.BlockingConnection(pika.URLParameters(down.url()))
    dch = dconn.channel()
    dch.exchange_declare(tag, "fanout")
    dch.queue_declare(tag, auto_delete=True)
    dch.queue_bind(tag, tag)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        links = down.api("GET", "/api/federation-links")
        if any(link.get("exchange") == tag and link["status"] == "running" for link in links):
            break
        time.sleep(0.2)
    time.sleep(0.5)  # (the link's binding made upstream)
    lags: list[float] = []
    done = threading.Event()

    def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
        lags.append(time.time() - float(body))

    dch.basic_consume(tag, on_message, auto_ack=True)

    def publish() -> None:
        conn = pika.BlockingConnection(pika.URLParameters(up.url(tag)))
        ch = conn.channel()
        start = time.monotonic()
        for i in range(int(rate * seconds)):
            due = start + i / rate
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            ch.basic_publish(tag, "", str(time.time()).encode())
        conn.close()
        done.set()

    sender = threading.Thread(target=publish)
    sender.start()
    while not done.is_set():
        dconn.process_data_events(0.01)
    settle = time.monotonic() + 5
    while time.monotonic() < settle and len(lags) < rate * seconds:
        dconn.process_data_events(0.05)
    sender.join()
    dconn.close()
    down.api("DELETE", f"/api/policies/%2F/{tag}")
    down.api("DELETE", f"/api/parameters/federation-upstream/%2F/{tag}")
    ms = sorted(x * 1000 for x in lags) or [float("nan")]
    return {
        "test": f"federation {up.kind} -> {down.kind}",
        "links": down.kind,
        "sent": int(rate * seconds),
        "arrived": len(lags),
        "lag_p50_ms": round(statistics.median(ms), 2),
        "lag_p99_ms": round(ms[int(len(ms) * 0.99) - 1], 2),
        "lag_max_ms": round(ms[-1], 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--body", type=int, default=64, help="bytes (default 64)")
    parser.add_argument("--rate", type=int, default=2000, help="federation msg/s (2000)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", type=Path, default=RESULTS / "links.json")
    args = parser.parse_args()
    procs = Procs()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-links-") as tmp:
        rabbit_run = start_rabbitmq(procs, Path(tmp) / "rabbit", management=True, plugins=PLUGINS)
        roar_run = None
        try:
            (Path(tmp) / "roar").mkdir()
            roar_run = start_roarmq(procs, Path(tmp) / "roar", management=True)
            assert roar_run.mgmt_port is not None and rabbit_run.mgmt_port is not None
            rabbit = Broker("rabbitmq", rabbit_run.port, rabbit_run.mgmt_port)
            roar = Broker("roarmq", roar_run.port, roar_run.mgmt_port)
            n, body = args.messages, args.body
            for runner, source, dest in (
                (roar, rabbit, roar),
                (rabbit, rabbit, roar),
                (roar, roar, roar),
                (rabbit, rabbit, rabbit),
            ):
                rows.append(shovel_move(runner, source, dest, n, body))
                print(json.dumps(rows[-1]), flush=True)
            for down, up in ((roar, roar), (rabbit, rabbit), (roar, rabbit)):
                rows.append(federation_lag(down, up, args.rate, args.seconds))
                print(json.dumps(rows[-1]), flush=True)
        finally:
            if roar_run is not None:
                stop_broker(procs, roar_run)
            stop_broker(procs, rabbit_run)
            procs.stop_all()
    keys = sorted({k for row in rows for k in row}, key=lambda k: (k != "test", k))
    print(markdown_table(keys, [[row.get(k, "") for k in keys] for row in rows]))
    write_results(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
