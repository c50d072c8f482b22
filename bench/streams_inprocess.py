"""A stream's per-message CPU cost in process, without sockets (bench/hotpath.py's way,
bench/lib/inprocess.py).

    .venv/bin/python bench/streams_inprocess.py publish|fanout|replay [N] [--profile]

publish: N publishes with confirms into one stream (100-byte bodies, persistent, an
x-stream-filter-value header on each), fed to a Connection's data_received; CPU per
message until every offset is committed. fanout / replay: N messages published first,
then 10 consumers (fanout) or 1 (replay) on one channel from `first`, prefetch 1,000,
acked with one multiple ack per 400 deliveries, as a client acks per read; CPU per
delivery. The segment log's writer thread is included (process time).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import tempfile
import time

import uvloop
from lib.inprocess import open_connection

from roarmq.broker.server import Broker
from roarmq.broker.testing import ephemeral_config
from roarmq.protocol import spec
from roarmq.protocol.frames import encode_content, encode_method
from roarmq.protocol.properties import BasicProperties

CHUNK = 1000  # publishes per data_received call


async def publish(broker: Broker, n: int) -> None:
    pub = open_connection(broker)
    args = {"x-queue-type": "stream"}
    pub.data_received(encode_method(1, spec.QueueDeclare(queue="s", durable=True, arguments=args)))
    pub.data_received(encode_method(1, spec.ConfirmSelect()))
    frames = []
    for i in range(CHUNK):
        props = BasicProperties(
            delivery_mode=2, headers={"x-stream-filter-value": "spread" if i % 100 == 0 else "c"}
        )
        method = spec.BasicPublish(exchange="", routing_key="s")
        frames.append(encode_content(1, method, props, b"x" * 100, 131072))
    chunk = b"".join(frames)
    for _ in range(n // CHUNK):
        pub.data_received(chunk)
        while pub._backlog is not None:
            await asyncio.sleep(0)
            if pub._backlog is not None and not pub.flow.reasons:
                pub._continue()
        await asyncio.sleep(0)
    stream = broker.vhosts["/"].queues["s"]
    while stream.committed < n // CHUNK * CHUNK:
        await asyncio.sleep(0.001)


async def consume(broker: Broker, consumers: int, total: int) -> None:
    con = open_connection(broker)
    con.data_received(encode_method(1, spec.BasicQos(prefetch_count=1000)))
    for k in range(consumers):
        args = {"x-stream-offset": "first"}
        con.data_received(
            encode_method(1, spec.BasicConsume(queue="s", consumer_tag=f"c{k}", arguments=args))
        )
    ch = con.channels[1]
    acked = 0
    while ch.delivery_tag < total:
        await asyncio.sleep(0)
        while acked < ch.delivery_tag:
            acked = min(acked + 400, ch.delivery_tag)
            con.data_received(encode_method(1, spec.BasicAck(delivery_tag=acked, multiple=True)))


async def main(mode: str, n: int, profile: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        broker = Broker(ephemeral_config(data_dir=tmp))
        await broker.start(management=False)
        if mode != "publish":
            await publish(broker, n)
        prof = cProfile.Profile() if profile else None
        started = time.process_time()
        if prof:
            prof.enable()
        if mode == "publish":
            await publish(broker, n)
            count = n // CHUNK * CHUNK
        else:
            consumers = 10 if mode == "fanout" else 1
            count = consumers * (n - 1000)  # (the last chunk may still be in flight)
            await consume(broker, consumers, count)
        if prof:
            prof.disable()
        elapsed = time.process_time() - started
        unit = "message" if mode == "publish" else "delivery"
        print(f"{mode}: {elapsed / count * 1e6:.2f} us of CPU a {unit} ({count:,})")
        await broker.stop()
        if prof:
            pstats.Stats(prof).sort_stats("tottime").print_stats(20)


def cli() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("mode", nargs="?", default="publish", choices=("publish", "fanout", "replay"))
    p.add_argument("n", nargs="?", type=int, default=200_000, help="messages (default 200,000)")
    p.add_argument("--profile", action="store_true", help="cProfile the measured part")
    args = p.parse_args()
    uvloop.run(main(args.mode, args.n, args.profile))
    return 0


if __name__ == "__main__":
    sys.exit(cli())
