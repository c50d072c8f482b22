"""What the management sampler leaves the garbage collector, on a broker of idle queues.

    .venv/bin/python bench/sampler_gc.py [--queues 100000] [--passes 6]
    PYTHONPATH=OTHER_TREE .venv/bin/python bench/sampler_gc.py   # another tree's sampler

A benchmark, not a test. An in-process broker with ``--queues`` queues, its start-up and the
queues frozen out of the collector (as ``broker/ops/gc_schedule.py`` freezes start-up), the
broker's thresholds (20,000, 2, 2,500); then ``--passes`` passes of the sampler
(``broker/management/rates.py``, each over every queue, in one go rather than in its slices), with the
collector's passes that they cause counted and timed per generation (``gc.callbacks``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time

import roarmq
from roarmq.broker.management import rates
from roarmq.broker.server import Broker
from roarmq.broker.testing import ephemeral_config


async def measure(queues: int, passes: int) -> dict[int, list[float]]:
    broker = Broker(ephemeral_config())
    await broker.start(management=False)
    try:
        vhost = broker.vhosts["/"]
        for i in range(queues):
            vhost.declare_queue(f"q{i}", None)
        gc.collect()
        gc.freeze()
        gc.set_threshold(20_000, 2, 2_500)
        took: dict[int, list[float]] = {0: [], 1: [], 2: []}
        started = [0.0]

        def timed(phase: str, info: dict) -> None:
            if phase == "start":
                started[0] = time.perf_counter()
            else:
                took[info["generation"]].append(time.perf_counter() - started[0])

        sampler = rates.RateSampler(broker)
        gc.callbacks.append(timed)
        try:
            for _ in range(passes):
                sampler.sample()
        finally:
            gc.callbacks.remove(timed)
            gc.unfreeze()
        return took
    finally:
        await broker.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--queues", type=int, default=100_000)
    p.add_argument("--passes", type=int, default=6)
    args = p.parse_args()
    took = asyncio.run(measure(args.queues, args.passes))
    print(f"roarmq {roarmq.__file__}: {args.queues:,} queues, {args.passes} sampler passes")
    print("| generation | passes | total ms | longest ms |\n|---|--:|--:|--:|")
    for gen, times in took.items():
        longest = max(times, default=0.0) * 1000
        print(f"| {gen} | {len(times)} | {sum(times) * 1000:.1f} | {longest:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
