"""Many bindings to one queue: bind, bind again, unbind; and the index's bytes per binding.

    .venv/bin/python bench/binds.py [--fanout 100000] [--headers 20000] [--memory 100000]
                                    [--no-socket] [--json bench/results/binds.json]

A benchmark, not a test. Three parts:

  index   ``make_index("fanout")`` in this process with ``--fanout`` bindings of one queue,
          each with its own routing key, and ``make_index("headers")`` with ``--headers``
          bindings of one queue, each with its own arguments (``x-match: all, h: i``, typed
          as they come off the wire); CPU time (``time.process_time``) to bind them all, to
          bind them all again (each a no-op), and to unbind them all (in a shuffled order).
  socket  the same bindings through a RoarMQ broker (bench/lib/brokers.py, its own process):
          ``queue.bind`` pipelined with no-wait, then a passive ``queue.declare`` to know they
          are done; then the same again (no-ops); one publish, which must reach the queue
          once; then every ``queue.unbind`` (no no-wait in AMQP) pipelined, shuffled, every
          unbind-ok awaited. Wall time and the broker's own CPU time.
  memory  the Python heap an index holds per binding (tracemalloc, the keys, destinations
          and arguments made beforehand and not counted; CRoaring's own allocations are
          not seen, so the ids' bitmaps are missing) for ``--memory`` topic, direct and
          fanout bindings and ``--headers`` headers bindings, in two shapes: one binding to each of that many queues, and
          all of them to one queue.

Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from lib import RESULTS
from lib.amqp_client import Client
from lib.brokers import broker_instance
from lib.machine import machine_info
from lib.output import markdown_table, write_json
from lib.procs import Procs, group_cpu_s

from roarmq.broker.routing import make_index
from roarmq.protocol import spec
from roarmq.protocol.frames import encode_content
from roarmq.protocol.properties import BasicProperties


def bindings_of(
    kind: str, n: int, one_queue: bool, plain: bool = False
) -> list[tuple[str, dict | None]]:
    """``n`` distinct ``(key, arguments)`` bindings of an exchange of type ``kind``; the
    arguments typed as the broker decodes them, or ``plain`` for a client to encode."""
    if kind == "headers" and plain:
        return [("", {"x-match": "all", "h": i}) for i in range(n)]
    if kind == "headers":
        return [("", {"x-match": ("S", b"all"), "h": ("I", i)}) for i in range(n)]
    if kind == "topic":
        return [(f"s{i}.*.x" if i % 2 else f"s{i}.#", None) for i in range(n)]
    if kind == "fanout" and not one_queue:
        return [("", None)] * n  # a queue bound once: the key does not matter
    return [(f"k{i}", None) for i in range(n)]


def shuffled(bound: list) -> list:
    """``bound`` in a fixed random order: unbinding in bind order would find each binding
    first in an id-ordered scan, the one order a linear search is quick in."""
    out = list(bound)
    random.Random(1).shuffle(out)
    return out


def in_process(kind: str, n: int) -> dict[str, Any]:
    idx = make_index(kind)
    bound = bindings_of(kind, n, one_queue=True)
    row: dict[str, Any] = {"part": "index", "kind": kind, "bindings": n}
    for step, op, expected in (
        ("bind_s", idx.bind, True),
        ("bind_again_s", idx.bind, False),
        ("unbind_s", idx.unbind, True),
    ):
        todo = shuffled(bound) if op == idx.unbind else bound
        started = time.process_time()
        results = [op(key, "q", args) for key, args in todo]
        row[step] = round(time.process_time() - started, 3)
        assert results == [expected] * n, f"{kind} {step}: not every answer was {expected}"
        if step == "bind_s":
            headers = {"h": ("I", n // 2)}
            assert idx.route("any", headers) == {"q"} and len(idx) == n
    assert len(idx) == 0
    return row


async def through_broker(port: int, pgid: int, kind: str, n: int) -> dict[str, Any]:
    client = await Client.connect(port)
    exchange, queue = f"binds-{kind}", f"binds-{kind}-q"
    client.send(1, spec.ExchangeDeclare(exchange=exchange, type=kind))
    await client.expect(spec.ExchangeDeclareOk)
    client.send(1, spec.QueueDeclare(queue=queue))
    await client.expect(spec.QueueDeclareOk)
    bound = bindings_of(kind, n, one_queue=True, plain=True)
    row: dict[str, Any] = {"part": "socket", "kind": kind, "bindings": n}

    async def timed(step: str, send: Any, done: Any) -> None:
        todo = shuffled(bound) if step == "unbind" else bound
        cpu, wall = group_cpu_s(pgid), time.perf_counter()
        for i, (key, args) in enumerate(todo):
            client.send(1, send(key, args))
            if i % 5000 == 4999:
                await client.writer.drain()
        await done()
        row[step + "_s"] = round(time.perf_counter() - wall, 3)
        row[step + "_broker_cpu_s"] = round(group_cpu_s(pgid) - cpu, 3)

    def bind(key: str, args: dict | None) -> Any:
        return spec.QueueBind(
            queue=queue, exchange=exchange, routing_key=key, no_wait=True, arguments=args or {}
        )

    def unbind(key: str, args: dict | None) -> Any:
        return spec.QueueUnbind(
            queue=queue, exchange=exchange, routing_key=key, arguments=args or {}
        )

    async def synced() -> int:
        client.send(1, spec.QueueDeclare(queue=queue, passive=True))
        return (await client.expect(spec.QueueDeclareOk, timeout=3600)).message_count

    async def unbound() -> None:
        for _ in range(n):
            await client.expect(spec.QueueUnbindOk, timeout=3600)

    await timed("bind", bind, synced)
    await timed("bind_again", bind, synced)
    props = BasicProperties(headers={"h": n // 2})
    method = spec.BasicPublish(exchange=exchange, routing_key="any")
    client.writer.write(encode_content(1, method, props, b"m", client.frame_max))
    assert await synced() == 1, "the publish did not reach the queue"
    await timed("unbind", unbind, unbound)
    client.writer.write(encode_content(1, method, props, b"m", client.frame_max))
    assert await synced() == 1, "a publish still reached the queue"
    await client.close()
    return row


def socket_rows(kinds: list[tuple[str, int]]) -> list[dict[str, Any]]:
    procs = Procs()
    rows = []
    try:
        with broker_instance("roarmq", procs) as broker:
            for kind, n in kinds:
                rows.append(asyncio.run(through_broker(broker.port, broker.proc.pid, kind, n)))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        procs.stop_all()
    return rows


def heap_per_binding(kind: str, n: int, one_queue: bool) -> dict[str, Any]:
    bound = bindings_of(kind, n, one_queue)
    dests = ["q"] * n if one_queue else [f"q{i}" for i in range(n)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    idx = make_index(kind)
    for (key, args), dest in zip(bound, dests, strict=True):
        idx.bind(key, dest, args)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(idx) == n
    shape = "one queue" if one_queue else "a queue each"
    return {"part": "memory", "kind": kind, "bindings": n, "shape": shape, "bytes": held // n}


def table(rows: list[dict[str, Any]]) -> str:
    head = ["part", "exchange", "bindings", "bind", "bind again", "unbind"]
    head.append("broker CPU (bind / again / unbind)")
    timed, memory = [], []
    for r in rows:
        if r["part"] == "memory":
            memory.append([r["kind"], f"{r['bindings']:,}", r["shape"], r["bytes"]])
            continue
        cpu = "-"
        if r["part"] == "socket":
            cpu = " / ".join(
                f"{r[s + '_broker_cpu_s']} s" for s in ("bind", "bind_again", "unbind")
            )
        steps = [f"{r[s + '_s']} s" for s in ("bind", "bind_again", "unbind")]
        timed.append([r["part"], r["kind"], f"{r['bindings']:,}", *steps, cpu])
    heap = ["exchange", "bindings", "shape", "Python heap B per binding"]
    return (
        markdown_table(head, timed, align="llrrrrr")
        + "\n\n"
        + markdown_table(heap, memory, align="lrlr")
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--fanout", type=int, default=100_000)
    p.add_argument("--headers", type=int, default=20_000)
    p.add_argument("--memory", type=int, default=100_000, help="0: no memory rows")
    p.add_argument("--no-socket", action="store_true", help="the index and memory parts only")
    p.add_argument("--json", type=Path, default=RESULTS / "binds.json")
    args = p.parse_args()
    kinds = [("fanout", args.fanout), ("headers", args.headers)]
    rows: list[dict[str, Any]] = []
    for kind, n in kinds:
        rows.append(in_process(kind, n))
        print(json.dumps(rows[-1]), flush=True)
    if not args.no_socket:
        rows += socket_rows(kinds)
    if args.memory:
        for kind in ("topic", "direct", "fanout", "headers"):
            n = args.headers if kind == "headers" else args.memory
            for one_queue in (False, True):
                rows.append(heap_per_binding(kind, n, one_queue))
                print(json.dumps(rows[-1]), flush=True)
    print(table(rows))
    write_json(args.json, {"machine": machine_info(), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
