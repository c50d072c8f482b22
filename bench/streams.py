"""Streams benchmark: RoarMQ vs RabbitMQ 3.10.8 streams, over AMQP 0-9-1 and over the
stream protocol.

    .venv/bin/python bench/streams.py [--broker roarmq|rabbitmq|both] [--quick]
                                      [--messages N] [--json bench/results/streams.json]

A benchmark, not a test. Each broker runs fresh (bench/lib/brokers.py's ``start_roarmq`` /
``start_rabbitmq``) pinned to core 0; the load runs in this process (uvloop, the client of
``bench/lib/amqp_load.py`` on our ``protocol/`` codec) pinned to core 1. One stream
``bench.s``; N messages of 100-byte bodies, each with an ``x-stream-filter-value`` header:
``spread`` on every 100th message (1% spread over the whole stream), ``block`` on a
contiguous run of N/100 messages in the middle (1% in one place), ``common`` otherwise.

Rows:

* publish: one connection, confirms, at most 1,000 unconfirmed, batches of 100 writes;
  msg/s = N / (last confirm - first write).
* replay 1: one consumer from ``first`` (prefetch 1,000, one multiple-ack per received
  batch) until it has all N; msg/s.
* fan-out 10: ten consumers on one channel, each from ``first``: deliveries/s (10 N).
* filtered 1% spread / 1% block (RoarMQ only: RabbitMQ 3.10 has no filtering, 3.13's
  Bloom filter would need a client-side pass): ``x-stream-filter`` = the value; delivered
  messages/s (= N/100 / time to the last) and the stream's ``filter_chunks_skipped`` read
  from the management API before and after (``-`` if the row does not show it).
* stream protocol publish / consume (row ``protocol``; RabbitMQ with its rabbitmq_stream
  plugin): a second stream ``bench.sp``; N messages of one 100-byte data section, publish
  frames of 100 messages with at most 10,000 unconfirmed, first write to last confirm; then
  steady-state consuming: subscriptions from ``first`` with 10 chunks of credit (one more
  per chunk), each to the N-th message, one after another, one as a warm-up and then for
  8 s; messages/s over those 8 s (bench/lib/stream_load.py: the same bytes to both).
* RSS: the broker's process group, idle before publishing and with N retained (after the
  reads).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lib import RESULTS, stream_load
from lib.amqp_load import CHANNEL, connect
from lib.brokers import STARTERS, Running, broker_instance, stop_broker
from lib.machine import machine_info
from lib.management_api import api, metric
from lib.observe import group_rss
from lib.output import write_json
from lib.procs import Procs

from roarmq.protocol import spec
from roarmq.protocol.frames import encode_content, encode_method
from roarmq.protocol.properties import BasicProperties

QUEUE = "bench.s"
BODY = 100
WINDOW = 1000
BATCH = 100
#: Seconds without a confirm (or with the socket unwritable) before a publish run is given
#: up: RabbitMQ 3.10.8 once paused over 30 s about 35M messages into a 100M run.
STALL_S = 120


def value_of(i: int, n: int) -> str:
    if i % 100 == 0:
        return "spread"
    if n // 2 <= i < n // 2 + n // 100:
        return "block"
    return "common"


async def publish(port: int, n: int) -> dict[str, Any]:
    c = await connect(port)
    await c.call(
        spec.QueueDeclare(queue=QUEUE, durable=True, arguments={"x-queue-type": "stream"}),
        spec.QueueDeclareOk,
    )
    c.expect_confirms(n)
    await c.call(spec.ConfirmSelect(), spec.ConfirmSelectOk)
    frames = {}
    for value in ("spread", "block", "common"):
        props = BasicProperties(delivery_mode=2, headers={"x-stream-filter-value": value})
        method = spec.BasicPublish(exchange="", routing_key=QUEUE)
        frames[value] = encode_content(CHANNEL, method, props, b"x" * BODY, c.frame_max)
    sent = 0
    t0 = time.perf_counter()
    while sent < n:
        if c.lost.done():
            raise RuntimeError(c.error)
        room = WINDOW - (sent - c.confirmed)
        if room <= 0:
            await asyncio.wait_for(c.confirm_progress(), STALL_S)
            continue
        if c.paused:
            await asyncio.wait_for(c.writable(), STALL_S)
            continue
        count = min(BATCH, room, n - sent)
        c.transport.write(b"".join(frames[value_of(i, n)] for i in range(sent, sent + count)))
        sent += count
        await asyncio.sleep(0)
    while c.confirmed < n:
        await asyncio.wait_for(c.confirm_progress(), 60)
    elapsed = time.perf_counter() - t0
    await c.close()
    return {"messages": n, "seconds": elapsed, "msg_per_s": n / elapsed, "nacked": c.nacked}


async def consume(
    port: int, consumers: int, expect: int, arguments: dict, timeout: float
) -> dict[str, Any]:
    c = await connect(port)
    await c.call(spec.BasicQos(prefetch_count=1000), spec.BasicQosOk)
    got = [0]
    done = asyncio.get_running_loop().create_future()
    t0 = time.perf_counter()
    last = [t0]
    first = [0.0]

    def on_deliveries(batch: list, _now: int) -> None:
        got[0] += len(batch)
        last[0] = time.perf_counter()
        if not first[0]:
            first[0] = last[0]
        tag = batch[-1].method.delivery_tag
        c.transport.write(encode_method(CHANNEL, spec.BasicAck(delivery_tag=tag, multiple=True)))
        if got[0] >= expect and not done.done():
            done.set_result(None)

    c.on_deliveries = on_deliveries
    for k in range(consumers):
        args = {"x-stream-offset": "first", **arguments}
        await c.call(
            spec.BasicConsume(queue=QUEUE, consumer_tag=f"c{k}", arguments=args),
            spec.BasicConsumeOk,
        )
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done, timeout)
    await asyncio.sleep(0.2)  # anything beyond `expect` shows up now
    await c.close()
    elapsed = last[0] - t0
    return {
        "delivered": got[0],
        "expected": expect,
        "seconds": elapsed,
        "msg_per_s": got[0] / elapsed if elapsed > 0 else 0.0,
        "first_delivery_ms": (first[0] - t0) * 1000 if first[0] else None,
    }


def skipped(broker: Running) -> int | None:
    if not broker.mgmt_port:
        return None
    try:
        row = api(broker.mgmt_port, "GET", f"/api/queues/%2F/{QUEUE}")
    except (OSError, ValueError):
        return None
    return (row or {}).get("filter_chunks_skipped")


def file_bytes(broker: Running) -> tuple[float, float] | None:
    """RoarMQ's chunk bytes sent so far from their files by sendfile, and read into memory
    instead (a socket that did not take them at once): how much of a consume row took the
    zero-copy path."""
    if broker.kind != "roarmq" or not broker.mgmt_port:
        return None
    samples = metric(broker.mgmt_port, "roarmq_stream_chunk_file_bytes_total")
    return samples.get('how="sendfile"', 0.0), samples.get('how="read"', 0.0)


def rss(broker: Running) -> int:
    return group_rss(broker.proc.pid)


async def run(broker: Running, n: int, rows: set[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"broker": broker.kind, "version": broker.version}
    out["rss_idle"] = rss(broker)
    out["publish"] = await publish(broker.port, n)
    out["rss_published"] = rss(broker)
    timeout = max(60.0, n / 5000)
    if "replay" in rows:
        out["replay_1"] = await consume(broker.port, 1, n, {}, timeout)
    if "fanout" in rows:
        out["fanout_10"] = await consume(broker.port, 10, 10 * n, {}, timeout)
    if broker.kind == "roarmq" and "filtered" in rows:
        for value in ("spread", "block"):
            count = sum(1 for i in range(n) if value_of(i, n) == value)
            before = skipped(broker)
            row = await consume(broker.port, 1, count, {"x-stream-filter": value}, timeout)
            after = skipped(broker)
            row["chunks_skipped"] = None if before is None else after - before  # type: ignore[operator]
            out[f"filtered_{value}"] = row
    if "protocol" in rows and broker.stream_port:
        await stream_load.create_stream(broker.stream_port, "bench.sp")
        seconds = await stream_load.publish(broker.stream_port, "bench.sp", n)
        out["stream_publish"] = {"msg_per_s": n / seconds}
        before = file_bytes(broker)
        out["stream_consume"] = await stream_load.consume_steady(broker.stream_port, "bench.sp", n)
        after = file_bytes(broker)
        if before and after:
            sent, copied = after[0] - before[0], after[1] - before[1]
            moved = sent + copied
            out["stream_consume"]["sendfile_share"] = sent / moved if moved else None
    out["rss_retained"] = rss(broker)
    return out


async def restarted(procs: Procs, kind: str, tmp: Path, n: int) -> dict[str, Any]:
    """The same broker started again on its data: seconds until it serves AMQP, a consumer
    from `first`'s time to its first delivery, RSS."""
    t0 = time.perf_counter()
    options = {"management": True} if kind == "roarmq" else {}
    broker = STARTERS[kind](procs, tmp, 0, **options)
    try:
        ready = time.perf_counter() - t0
        first = await consume(broker.port, 1, min(n, 1000), {}, 60)
        return {
            "start_s": ready,
            "first_ms": first["first_delivery_ms"],
            "rss_mib": rss(broker) / 2**20,
        }
    finally:
        stop_broker(procs, broker)


def fmt(x: float | None, unit: str = "") -> str:
    return "-" if x is None else f"{x:,.0f}{unit}"


def table(results: list[dict[str, Any]], n: int) -> str:
    lines = [
        f"| row (N = {n:,}) | "
        + " | ".join(f"{r['broker']} {r['version']}" for r in results)
        + " |",
        "|---|" + "---:|" * len(results),
    ]

    def row(label: str, get: Any) -> None:
        lines.append(f"| {label} | " + " | ".join(get(r) for r in results) + " |")

    def get(r: dict, key: str, field: str = "msg_per_s", digits: int = 0) -> str:
        value = r.get(key, {}).get(field)
        return "-" if value is None else f"{value:,.{digits}f}"

    row("publish, confirms (msg/s)", lambda r: fmt(r["publish"]["msg_per_s"]))
    row("replay 1 consumer from first (msg/s)", lambda r: get(r, "replay_1"))
    row(
        "replay: first delivery after basic.consume (ms)",
        lambda r: get(r, "replay_1", "first_delivery_ms"),
    )
    row("fan-out 10 consumers from first (deliveries/s)", lambda r: get(r, "fanout_10"))
    for value, label in (("spread", "1% spread"), ("block", "1% in one block")):
        key = f"filtered_{value}"
        row(
            f"filtered consumer, {label} (delivered/s)",
            lambda r, k=key: fmt(r[k]["msg_per_s"]) if k in r else "n/a (no filtering)",
        )
        row(
            f"filtered consumer, {label}: delivered / chunks skipped",
            lambda r, k=key: (
                f"{r[k]['delivered']:,} / {fmt(r[k]['chunks_skipped'])}" if k in r else "n/a"
            ),
        )
    row("stream protocol: publish, confirms (msg/s)", lambda r: get(r, "stream_publish"))
    row(
        "stream protocol: consume from first, 8 s of passes (msg/s)",
        lambda r: get(r, "stream_consume"),
    )
    row(
        "stream protocol: consume, slowest / fastest pass (msg/s)",
        lambda r: (
            f"{get(r, 'stream_consume', 'slowest_pass_msg_per_s')} / "
            f"{get(r, 'stream_consume', 'fastest_pass_msg_per_s')}"
        ),
    )
    row(
        "stream protocol: consume, chunk bytes sent by sendfile (%)",
        lambda r: (
            "n/a"
            if r.get("stream_consume", {}).get("sendfile_share") is None
            else f"{100 * r['stream_consume']['sendfile_share']:.1f}"
        ),
    )
    row("RSS idle (MiB)", lambda r: f"{r['rss_idle'] / 2**20:,.0f}")
    row("RSS with N published (MiB)", lambda r: f"{r['rss_published'] / 2**20:,.0f}")
    row("RSS with N retained, after the reads (MiB)", lambda r: f"{r['rss_retained'] / 2**20:,.0f}")
    if any("restart" in r for r in results):
        how = next(r["restart"]["after"] for r in results if "restart" in r)
        row(
            f"restart after {'a kill -9' if how == 'kill-9' else 'a clean stop'}: seconds "
            "until AMQP is served",
            lambda r: get(r, "restart", "start_s", 2),
        )
        row("restart: first delivery from first (ms)", lambda r: get(r, "restart", "first_ms"))
        row("restart: RSS (MiB)", lambda r: get(r, "restart", "rss_mib"))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--broker", choices=("roarmq", "rabbitmq", "both"), default="both")
    ap.add_argument("--quick", action="store_true", help="N = 100,000 (default 2,000,000)")
    ap.add_argument("--messages", type=int, default=0)
    ap.add_argument("--json", type=Path, default=RESULTS / "streams.json")
    ap.add_argument(
        "--rows",
        default="replay,fanout,filtered,protocol",
        help="what to run after publishing (comma-separated: replay, fanout, filtered, protocol)",
    )
    ap.add_argument(
        "--restart",
        nargs="?",
        const="clean",
        choices=("clean", "kill-9"),
        help="then restart the broker on its data (start-up time, first delivery, RSS), "
        "after a clean stop (the default) or a kill -9",
    )
    args = ap.parse_args()
    rows = set(args.rows.split(",")) if args.rows else set()
    n = args.messages or (100_000 if args.quick else 2_000_000)
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, {1})
    kinds = ["roarmq", "rabbitmq"] if args.broker == "both" else [args.broker]
    procs = Procs()
    results, skipped_brokers = [], {}
    try:
        for kind in kinds:
            options = {"management": True} if kind == "roarmq" else {"streams": True}
            keep = Path(tempfile.mkdtemp(prefix=f"roarbench-{kind}-"))
            try:
                with broker_instance(kind, procs, 0, keep=keep, **options) as broker:
                    results.append(asyncio.run(run(broker, n, rows)))
                    if args.restart == "kill-9" and kind == "roarmq":
                        os.killpg(broker.proc.pid, signal.SIGKILL)
                        broker.proc.wait(10)
                if args.restart and kind == "roarmq":  # (a RabbitMQ node's dirs are per start)
                    results[-1]["restart"] = asyncio.run(restarted(procs, kind, keep, n))
                    results[-1]["restart"]["after"] = args.restart
            except Exception as exc:  # noqa: BLE001 - a broker that did not come up: say so
                skipped_brokers[kind] = repr(exc)
                print(f"{kind}: skipped: {exc!r}", file=sys.stderr)
            finally:
                shutil.rmtree(keep, ignore_errors=True)
    finally:
        procs.stop_all()
    text = table(results, n) if results else "(no results)"
    print(text)
    for kind, why in skipped_brokers.items():
        print(f"\n{kind} skipped: {why}")
    result = {
        "machine": machine_info(),
        "messages": n,
        "results": results,
        "skipped": skipped_brokers,
        "table": text,
    }
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
