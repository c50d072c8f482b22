"""Memory under load: bytes per queued message, and the memory alarm's bound, against RabbitMQ.

    .venv/bin/python bench/memory.py [--messages N] [--skip-rabbitmq] [--scenarios a,b]
                                     [--alarm-seconds S] [--json PATH]

A benchmark, not a test. Two measurements, each on a fresh broker
pinned to CPU 0 (the publisher on CPU 1), started with bench/lib/brokers.py's
``monitored_instance`` (resident memory sampled as bench/overload.py samples it):

  queued-transient   N (default 1,000,000) 16-byte transient messages published to
                     one queue with no consumer; the broker's resident memory (VmRSS
                     over its process group) once the queue holds all N and the RSS has
                     settled (moved < 1% for 3 s, at most 30 s), minus before, per message.
  queued-persistent  the same, delivery-mode 2 into a durable queue.
  recovery-persistent  RoarMQ only: fill N persistent messages as above, stop the broker
                     (SIGTERM, a clean shutdown), start it again on the same data dir;
                     the time until it accepts connections, and its settled resident
                     memory over a fresh broker's, per recovered message.
  alarm-64k          RoarMQ only, `[memory] high_watermark` = 256 MiB: a publisher
                     floods 64 KiB messages into an unconsumed queue for 10 s; the
                     broker's peak resident memory against the watermark, and whether
                     connection.blocked arrived (the bound: at most 10% over).

The publisher is a plain asyncio client on our codec writing pre-encoded frames
(the broker, not the client, is the limit here). Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from lib import REPO, RESULTS
from lib.amqp_client import Client
from lib.brokers import monitored_instance, rabbit_server
from lib.observe import RssSampler, settled_rss
from lib.output import markdown_table, write_results
from lib.procs import Procs

from roarmq.protocol import spec
from roarmq.protocol.frames import encode_content
from roarmq.protocol.properties import BasicProperties

MiB = 1024 * 1024
WATERMARK = 256 * MiB


def publishes(queue: str, body: bytes, count: int, persistent: bool, frame_max: int) -> bytes:
    props = BasicProperties(delivery_mode=2) if persistent else BasicProperties()
    method = spec.BasicPublish(exchange="", routing_key=queue)
    return encode_content(1, method, props, body, frame_max) * count


async def fill(port: int, n: int, persistent: bool) -> float:
    c = await Client.connect(port)
    queue = "mem-p" if persistent else "mem-t"
    c.send(1, spec.QueueDeclare(queue=queue, durable=persistent))
    await c.expect(spec.QueueDeclareOk)
    started = time.monotonic()
    step = 10_000
    chunk = publishes(queue, bytes(16), step, persistent, c.frame_max)
    for _ in range(n // step):
        c.writer.write(chunk)
        await c.writer.drain()
    while await c.count(queue, persistent) < n:
        await asyncio.sleep(0.2)
    elapsed = time.monotonic() - started
    await c.close()
    return elapsed


def queued(kind: str, procs: Procs, n: int, persistent: bool) -> dict[str, Any]:
    with monitored_instance(kind, procs, 0, REPO) as b:
        time.sleep(1.0)
        before = b.rss.samples[-1][1]
        elapsed = asyncio.run(fill(b.running.port, n, persistent))
        after = settled_rss(b.rss)
        return {
            "scenario": "queued-persistent" if persistent else "queued-transient",
            "broker": kind,
            "messages": n,
            "rss_before_mb": round(before / MiB, 1),
            "rss_after_mb": round(after / MiB, 1),
            "bytes_per_message": round((after - before) / n, 1),
            "fill_s": round(elapsed, 1),
        }


def recovery(procs: Procs, n: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="roarbench-recovery-"))
    try:
        with monitored_instance("roarmq", procs, 0, REPO, keep=tmp) as b:
            time.sleep(1.0)
            before = b.rss.samples[-1][1]
            fill_s = asyncio.run(fill(b.running.port, n, True))
        t0 = time.monotonic()  # SIGTERM above: a clean stop
        with monitored_instance("roarmq", procs, 0, REPO, keep=tmp, ready_timeout=900) as b:
            start_s = time.monotonic() - t0
            after = settled_rss(b.rss)
            count = asyncio.run(count_of(b.running.port, "mem-p"))
        return {
            "scenario": "recovery-persistent",
            "broker": "roarmq",
            "messages": count,
            "rss_before_mb": round(before / MiB, 1),
            "rss_after_mb": round(after / MiB, 1),
            "bytes_per_message": round((after - before) / max(count, 1), 1),
            "fill_s": round(fill_s, 1),
            "start_s": round(start_s, 2),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def count_of(port: int, queue: str) -> int:
    c = await Client.connect(port)
    try:
        return await c.count(queue, True)
    finally:
        await c.close()


async def flood(port: int, seconds: float, sampler: RssSampler) -> dict[str, Any]:
    c = await Client.connect(port)
    c.send(1, spec.QueueDeclare(queue="mem-alarm"))
    await c.expect(spec.QueueDeclareOk)
    one = publishes("mem-alarm", bytes(64 * 1024), 1, False, c.frame_max)
    deadline = time.monotonic() + seconds
    sent = 0
    blocked_at = None
    while time.monotonic() < deadline:
        c.writer.write(one * 16)
        sent += 16
        try:
            await asyncio.wait_for(c.writer.drain(), max(0.01, deadline - time.monotonic()))
        except TimeoutError:
            pass
        c.poll()
        if c.blocked and blocked_at is None:
            blocked_at = sent
    c.poll()
    writer_buffered = c.writer.transport.get_write_buffer_size()
    c.writer.transport.abort()
    return {
        "sent": sent,
        "blocked": c.blocked,
        "blocked_after": blocked_at,
        "unsent": writer_buffered,
    }


def alarm(procs: Procs, seconds: float) -> dict[str, Any]:
    extra = f"\n[memory]\nhigh_watermark = {WATERMARK}\n"
    with broker_instance_with(procs, extra) as b:
        t0 = time.monotonic()
        out = asyncio.run(flood(b.running.port, seconds, b.rss))
        t1 = time.monotonic()
        peak = b.rss.peak(t0, t1) or 0
        return {
            "scenario": "alarm-64k",
            "broker": "roarmq",
            "watermark_mb": WATERMARK // MiB,
            "rss_peak_mb": round(peak / MiB, 1),
            "over_watermark_pct": round((peak / WATERMARK - 1) * 100, 1),
            "messages_sent": out["sent"],
            "blocked": out["blocked"],
            "blocked_after_messages": out["blocked_after"],
        }


def broker_instance_with(procs: Procs, extra: str) -> Any:
    return monitored_instance("roarmq", procs, 0, REPO, extra_config=extra)


def table(rows: list[dict[str, Any]]) -> str:
    head = [
        "scenario",
        "broker",
        "messages",
        "RSS before MB",
        "RSS after / peak MB",
        "B per message",
        "notes",
    ]
    cells = []
    for r in rows:
        if r["scenario"].startswith(("queued", "recovery")):
            notes = f"filled in {r['fill_s']} s"
            if r["scenario"] == "recovery-persistent":
                notes += f", restarted and ready in {r['start_s']} s"
            cells.append(
                [
                    r["scenario"],
                    r["broker"],
                    f"{r['messages']:,}",
                    r["rss_before_mb"],
                    r["rss_after_mb"],
                    f"{r['bytes_per_message']:,}",
                    notes,
                ]
            )
        else:
            notes = (
                f"watermark {r['watermark_mb']} MB, peak {r['over_watermark_pct']:+}%; "
                f"connection.blocked: {r['blocked']}"
            )
            sent = f"{r['messages_sent']:,} sent"
            cells.append([r["scenario"], r["broker"], sent, "-", r["rss_peak_mb"], "-", notes])
    return markdown_table(head, cells, align="llrrrr")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--skip-rabbitmq", action="store_true")
    p.add_argument("--alarm-seconds", type=float, default=10.0)
    p.add_argument(
        "--scenarios",
        default="queued-transient,queued-persistent,recovery-persistent,alarm-64k",
        help="comma-separated subset of: queued-transient, queued-persistent, "
        "recovery-persistent, alarm-64k",
    )
    p.add_argument("--json", type=Path, default=RESULTS / "memory.json")
    args = p.parse_args()
    os.sched_setaffinity(0, {1})  # the publisher (this process) on the load core
    kinds = ["roarmq"] + ([] if args.skip_rabbitmq or not rabbit_server() else ["rabbitmq"])
    procs = Procs()
    rows: list[dict[str, Any]] = []
    try:
        chosen = args.scenarios.split(",")
        for persistent in (False, True):
            if ("queued-persistent" if persistent else "queued-transient") not in chosen:
                continue
            for kind in kinds:
                rows.append(queued(kind, procs, args.messages, persistent))
                print(json.dumps(rows[-1]), flush=True)
        if "recovery-persistent" in chosen:
            rows.append(recovery(procs, args.messages))
            print(json.dumps(rows[-1]), flush=True)
        if "alarm-64k" in chosen:
            rows.append(alarm(procs, args.alarm_seconds))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        procs.stop_all()
    print(table(rows))
    write_results(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
