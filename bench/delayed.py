"""The delayed exchange: memory per scheduled message, publish rate, lateness.

    .venv/bin/python bench/delayed.py [--messages N] [--lateness-messages M] [--json PATH]

A benchmark, not a test. Each scenario on a fresh RoarMQ pinned to CPU 0 (the client on
CPU 1), started with bench/lib/brokers.py's ``monitored_instance``:

  scheduled   N (default 1,000,000) persistent 16-byte messages with `x-delay` one hour
              into a durable `x-delayed-message` exchange (direct), published as fast as
              the broker takes them (pre-encoded frames, no confirms); the publish rate
              (N over the time until the exchange's `messages_delayed` is N) and the
              broker's settled resident memory over before, per message.
  lateness    M (default 2,000) persistent messages with delays spread over 0.2-3 s on an
              otherwise idle broker, consumed as they come: for each, its receipt time
              minus (its send time + its delay); p50, p99 and max, and how many came early
              (the broker must never route one early; a client's clock is the same one),
              and the share the broker routed within 10 ms of its due time (its own
              histogram: the client's receipt adds its own delays under load).

Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
import urllib.request
from base64 import b64encode
from pathlib import Path
from typing import Any

from lib import REPO, RESULTS
from lib.amqp_client import Client
from lib.brokers import monitored_instance
from lib.observe import settled_rss
from lib.output import markdown_table, write_results
from lib.procs import Procs

from roarmq.protocol import spec
from roarmq.protocol.frames import encode_content
from roarmq.protocol.properties import BasicProperties

HOUR_MS = 3_600_000
MiB = 1024 * 1024


def api(port: int, path: str) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        headers={"Authorization": "Basic " + b64encode(b"guest:guest").decode()},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())


async def declare(c: Client) -> None:
    c.send(
        1,
        spec.ExchangeDeclare(
            exchange="dx",
            type="x-delayed-message",
            durable=True,
            arguments={"x-delayed-type": "direct"},
        ),
    )
    await c.expect(spec.ExchangeDeclareOk)
    c.send(1, spec.QueueDeclare(queue="dq", durable=True))
    await c.expect(spec.QueueDeclareOk)
    c.send(1, spec.QueueBind(queue="dq", exchange="dx", routing_key="k"))
    await c.expect(spec.QueueBindOk)


def delayed_publish(delay: int, body: bytes, frame_max: int) -> bytes:
    props = BasicProperties(delivery_mode=2, headers={"x-delay": delay})
    return encode_content(
        1, spec.BasicPublish(exchange="dx", routing_key="k"), props, body, frame_max
    )


async def fill(port: int, mgmt: int, n: int) -> float:
    c = await Client.connect(port)
    await declare(c)
    step = 10_000
    chunk = delayed_publish(HOUR_MS, bytes(16), c.frame_max) * step
    started = time.monotonic()
    for _ in range(n // step):
        c.writer.write(chunk)
        await c.writer.drain()
    while api(mgmt, "/api/exchanges/%2F/dx")["messages_delayed"] < n // step * step:
        await asyncio.sleep(0.2)
    elapsed = time.monotonic() - started
    await c.close()
    return elapsed


def scheduled(procs: Procs, n: int) -> dict[str, Any]:
    with monitored_instance("roarmq", procs, 0, REPO) as b:
        time.sleep(1.0)
        before = b.rss.samples[-1][1]
        assert b.mgmt_port is not None
        elapsed = asyncio.run(fill(b.running.port, b.mgmt_port, n))
        after = settled_rss(b.rss)
        return {
            "scenario": "scheduled",
            "messages": n,
            "publish_per_s": round(n / elapsed),
            "rss_before_mb": round(before / MiB, 1),
            "rss_after_mb": round(after / MiB, 1),
            "bytes_per_message": round((after - before) / n, 1),
        }


async def measure_lateness(port: int, m: int) -> list[float]:
    import aio_pika

    rng = random.Random(7)
    connection = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
    async with connection:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(
            "lx", "x-delayed-message", durable=True, arguments={"x-delayed-type": "fanout"}
        )
        queue = await channel.declare_queue("lq", durable=True)
        await queue.bind(exchange)
        sent: dict[bytes, float] = {}
        late: list[float] = []
        done = asyncio.get_running_loop().create_future()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            at = time.time()
            late.append(at * 1000 - sent[message.body])
            await message.ack()
            if len(late) == m and not done.done():
                done.set_result(None)

        await queue.consume(on_message)
        for i in range(m):
            delay = rng.randrange(200, 3000)
            body = b"%d" % i
            sent[body] = time.time() * 1000 + delay
            await exchange.publish(
                aio_pika.Message(body, headers={"x-delay": delay}, delivery_mode=2), ""
            )
        await asyncio.wait_for(done, 60)
        return late


def routed_within(mgmt: int, bound: str) -> float:
    """The share of delayed messages the broker routed at most `bound` seconds after their
    due time (its own histogram, `roarmq_delayed_lateness_seconds`)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{mgmt}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    values = dict(
        line.rsplit(" ", 1)
        for line in text.splitlines()
        if line.startswith("roarmq_delayed_lateness")
    )
    within = float(values[f'roarmq_delayed_lateness_seconds_bucket{{le="{bound}"}}'])
    return within / float(values["roarmq_delayed_lateness_seconds_count"])


def lateness(procs: Procs, m: int) -> dict[str, Any]:
    with monitored_instance("roarmq", procs, 0, REPO) as b:
        late = sorted(asyncio.run(measure_lateness(b.running.port, m)))
        assert b.mgmt_port is not None
        return {
            "scenario": "lateness",
            "messages": m,
            "early": sum(1 for x in late if x < 0),
            "late_p50_ms": round(late[len(late) // 2], 2),
            "late_p99_ms": round(late[int(len(late) * 0.99)], 2),
            "late_max_ms": round(late[-1], 2),
            "broker_routed_within_10ms_pct": round(100 * routed_within(b.mgmt_port, "0.01"), 2),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--lateness-messages", type=int, default=2000)
    parser.add_argument("--json", type=Path, default=RESULTS / "delayed.json")
    args = parser.parse_args()
    os.sched_setaffinity(0, {1})  # the client (this process) on the other core
    procs = Procs()
    rows: list[dict[str, Any]] = []
    try:
        rows.append(scheduled(procs, args.messages))
        print(json.dumps(rows[-1]), flush=True)
        rows.append(lateness(procs, args.lateness_messages))
        print(json.dumps(rows[-1]), flush=True)
    finally:
        procs.stop_all()
    for row in rows:
        keys = list(row)
        print(markdown_table(keys, [[row[k] for k in keys]]))
        print()
    write_results(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
