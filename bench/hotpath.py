"""The broker's per-message CPU cost, in process, without sockets.

Feeds pre-encoded publishes straight into a Connection's data_received and
lets deliveries fall into a null transport, so the number is the broker's own
work per message (parse, route, enqueue, deliver, encode) with no kernel, no
load generator and no other process in the way. Use it before and after a
change to the hot path; bench/throughput.py measures the whole system.

    .venv/bin/python bench/hotpath.py [--messages N] [--json FILE] [--profile SCENARIO]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import pstats
import random
import sys
import tempfile
import time
from pathlib import Path

from lib import RESULTS
from lib.inprocess import open_connection
from lib.output import markdown_table, write_json

from roarmq.broker.amqp.connection import Connection
from roarmq.broker.server import Broker
from roarmq.broker.testing import ephemeral_config
from roarmq.protocol import spec
from roarmq.protocol.frames import encode_content, encode_method
from roarmq.protocol.properties import BasicProperties

CHUNK = 2000  # publishes per data_received call, like a busy socket read


#: topic-unseen: bench/topic_go.py's shape, in process: wildcard bindings
#: ``s{i}.*.x`` / ``s{i}.#`` and 1,000 literal ones, each to a queue of its own with a consumer
#: that acks, and 100,000 distinct keys (ten times the routing-key cache) in a fixed shuffle.
UNSEEN_BINDINGS, UNSEEN_LITERALS, UNSEEN_KEYS = 100_000, 1_000, 100_000
UNSEEN_CACHE: int | None = None  # --unseen-cache; None: UNSEEN_KEYS / 10


def setup_topic_unseen(consumer: Connection, publisher: Connection) -> list[bytes]:
    send = consumer.data_received
    queues = UNSEEN_BINDINGS + UNSEEN_LITERALS
    send(encode_method(1, spec.ExchangeDeclare(exchange="t", type="topic")))
    for i in range(queues):
        name = f"q{i}"
        key = f"lit{i - UNSEEN_BINDINGS}" if i >= UNSEEN_BINDINGS else f"s{i}.*.x"
        if i < UNSEEN_BINDINGS and i % 2:
            key = f"s{i}.#"
        send(
            encode_method(1, spec.QueueDeclare(queue=name))
            + encode_method(1, spec.BasicConsume(queue=name, consumer_tag=name))
            + encode_method(1, spec.QueueBind(queue=name, exchange="t", routing_key=key))
        )
    keys = [
        f"s{i}.w{k // UNSEEN_BINDINGS}.x" if i % 2 == 0 else f"s{i}.w{k // UNSEEN_BINDINGS}.y"
        for k in range(UNSEEN_KEYS)
        for i in (k % UNSEEN_BINDINGS,)
    ]
    random.Random(1).shuffle(keys)
    props = BasicProperties(content_type="application/octet-stream")
    publishes = [
        encode_content(
            1, spec.BasicPublish(exchange="t", routing_key=key), props, b"x" * 16, 131072
        )
        for key in keys
    ]
    return [b"".join(publishes[at : at + CHUNK]) for at in range(0, len(publishes), CHUNK)]


def setup(broker: Broker, scenario: str) -> tuple[Connection, Connection, list[bytes]]:
    """(publisher, consumer, chunks of pre-encoded publishes, sent in turn) for ``scenario``."""
    consumer, publisher = open_connection(broker), open_connection(broker)
    if scenario == "topic-unseen":
        return publisher, consumer, setup_topic_unseen(consumer, publisher)
    send = consumer.data_received
    exchange, key = "", "q0"
    queues = 3 if scenario == "fanout-3" else 1
    for i in range(queues):
        send(encode_method(1, spec.QueueDeclare(queue=f"q{i}")))
        no_ack = scenario != "acks"
        send(
            encode_method(1, spec.BasicConsume(queue=f"q{i}", consumer_tag=f"c{i}", no_ack=no_ack))
        )
    if scenario.startswith("topic"):
        exchange, key = "t", "s500.w1.x"
        send(encode_method(1, spec.ExchangeDeclare(exchange="t", type="topic")))
        for i in range(1000):
            pattern = f"s{i}.*.x" if i % 2 == 0 else f"s{i}.#"
            send(encode_method(1, spec.QueueBind(queue="q0", exchange="t", routing_key=pattern)))
    elif scenario == "fanout-3":
        exchange, key = "amq.fanout", ""
        for i in range(queues):
            send(encode_method(1, spec.QueueBind(queue=f"q{i}", exchange="amq.fanout")))
    if scenario in ("confirms", "acks"):
        publisher.data_received(encode_method(1, spec.ConfirmSelect()))
    props = BasicProperties(content_type="application/octet-stream")
    one = encode_content(
        1, spec.BasicPublish(exchange=exchange, routing_key=key), props, b"x" * 16, 131072
    )
    return publisher, consumer, [one * CHUNK]


async def measure(scenario: str, messages: int, profile: bool) -> dict:
    """Broker CPU (all threads) per message. ``direct+archive`` is ``direct`` with the traffic
    archive on; its figure includes the writer thread's work up to the closed Parquet files."""
    archive = scenario.endswith("+archive")
    with tempfile.TemporaryDirectory(prefix="roarmq-hotpath-") as tmp:
        overrides: dict = {"archive": {"enabled": True, "dir": tmp}} if archive else {}
        if scenario == "topic-unseen":  # the ratio: ten keys for each the cache holds
            cache = UNSEEN_KEYS // 10 if UNSEEN_CACHE is None else UNSEEN_CACHE
            overrides["routing"] = {"cache_keys": cache}
        broker = Broker(ephemeral_config(**overrides))
        await broker.start(management=False)
        return await _measure(broker, scenario.removesuffix("+archive"), messages, profile)


async def _measure(broker: Broker, scenario: str, messages: int, profile: bool) -> dict:
    publisher, consumer, chunks = setup(broker, scenario)
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 100)
    profiler = cProfile.Profile() if profile else None
    rounds = max(1, messages // CHUNK)
    acks = None
    if scenario in ("acks", "topic-unseen"):  # one basic.ack per delivery, pre-encoded
        acks = [
            b"".join(
                encode_method(1, spec.BasicAck(delivery_tag=tag))
                for tag in range(r * CHUNK + 1, (r + 1) * CHUNK + 1)
            )
            for r in range(rounds)
        ]
    started = time.process_time()
    loop_started = time.thread_time()
    if profiler:
        profiler.enable()
    for r in range(rounds):
        publisher.data_received(chunks[r % len(chunks)])
        broker._flush_dirty()  # what the loop does once per iteration
        while getattr(publisher, "_backlog", None) is not None:  # next turns: READ_BUDGET each
            publisher._continue()
            broker._flush_dirty()
        if acks is not None:
            consumer.data_received(acks[r])
            broker._flush_dirty()
            while getattr(consumer, "_backlog", None) is not None:
                consumer._continue()
                broker._flush_dirty()
    loop_elapsed = time.thread_time() - loop_started
    archive = broker.archive
    if archive is not None:
        archive.close()  # its writer's share: journal, then the Parquet file at the roll
    if profiler:
        profiler.disable()
    elapsed = time.process_time() - started
    await broker.stop()
    gc.unfreeze()
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)
    n = rounds * CHUNK
    return {
        "scenario": scenario + ("+archive" if archive is not None else ""),
        "messages": n,
        "ns_per_msg": round(elapsed / n * 1e9),
        "loop_ns_per_msg": round(loop_elapsed / n * 1e9),
        "msgs_per_cpu_s": round(n / elapsed),
    }


def main() -> int:
    global UNSEEN_BINDINGS, UNSEEN_LITERALS, UNSEEN_KEYS, UNSEEN_CACHE  # --unseen sets them
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--json", type=Path, default=RESULTS / "hotpath.json")
    parser.add_argument("--profile", metavar="SCENARIO", help="cProfile one scenario instead")
    parser.add_argument(
        "--scenarios",
        default="direct,direct+archive,confirms,acks,fanout-3,topic-1000-cached",
        help="comma-separated, run in this order",
    )
    parser.add_argument("--repeat", type=int, default=1, help="run the list this many times")
    parser.add_argument(
        "--unseen",
        type=int,
        default=UNSEEN_BINDINGS,
        metavar="N",
        help="topic-unseen's wildcard bindings and keys (literals: N/100, routing-key cache: "
        "N/10); a smaller N fits callgrind's cache simulation (docs/benchmarks.md, 'Cold "
        "topic routes')",
    )
    parser.add_argument(
        "--unseen-cache",
        type=int,
        metavar="N",
        help="topic-unseen's routing-key cache size (default: a tenth of its keys; 0: none)",
    )
    args = parser.parse_args()
    UNSEEN_BINDINGS, UNSEEN_LITERALS, UNSEEN_KEYS = args.unseen, args.unseen // 100, args.unseen
    UNSEEN_CACHE = args.unseen_cache
    scenarios = args.scenarios.split(",") * args.repeat
    if args.profile:
        asyncio.run(measure(args.profile, args.messages, True))
        return 0
    try:
        import uvloop
    except ImportError:
        uvloop = None
    rows = []
    for scenario in scenarios:
        runner = uvloop.run if uvloop else asyncio.run
        rows.append(runner(measure(scenario, args.messages, False)))
    head = ["scenario", "messages", "broker CPU ns/msg", "of which event loop"]
    head.append("msgs per CPU-second")
    keys = ("messages", "ns_per_msg", "loop_ns_per_msg", "msgs_per_cpu_s")
    cells = [[r["scenario"], *(f"{r[k]:,}" for k in keys)] for r in rows]
    print(markdown_table(head, cells, align="lrrrr"))
    write_json(args.json, {"rows": rows, "python": sys.version.split()[0], "nproc": os.cpu_count()})
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
