"""What a topic route costs by how often its routing key recurs: cached, cold, one-off keys.

    .venv/bin/python bench/topic_keys.py [--bindings 100000] [--routes 200000]
                                         [--json bench/results/topic_keys.json]

A benchmark, not a test. ``TopicIndex`` in this process, with ``--bindings`` wildcard patterns
(``s{i}.*.x`` for even i, ``s{i}.#`` for odd i, as bench/throughput.py binds them) plus 1,000
literal ones, the broker's default 10,000-key cache, and ``--routes`` routes of each traffic
shape, each on a fresh index: 1,000 keys (all cached after their first miss); 100,000 keys
drawn uniformly (ten times the cache: mostly misses); 100,000 keys cycled in a fixed order
(bench/topic_go.py's traffic: a key recurs only after all the others), from an empty cache
and after one whole cycle (the cache full: the steady state); one-off keys that never
repeat; half one-off keys and half 1,000 hot keys; and the walk alone (``cache_keys = 0``).
Reported: CPU time per route (``time.process_time_ns``), and the index's hit and miss counts
over the timed routes.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

from lib import RESULTS
from lib.machine import machine_info
from lib.output import markdown_table, write_json

from roarmq.broker.routing import TopicIndex


def build(bindings: int, cache_keys: int = 10_000) -> TopicIndex:
    index = TopicIndex(cache_keys=cache_keys)
    for i in range(bindings):
        index.bind(f"s{i}.*.x" if i % 2 == 0 else f"s{i}.#", "q")
    for i in range(1000):
        index.bind(f"lit{i}", "q")
    return index


def drawn(routes: int, distinct: int, bindings: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    pool = [f"s{rng.randrange(bindings)}.w{j}.{'x' if j % 2 else 'y'}" for j in range(distinct)]
    return [pool[rng.randrange(distinct)] for _ in range(routes)]


def timed(index: TopicIndex, keys: list[str], warm: list[str]) -> dict[str, float]:
    """CPU time per route of ``keys``, after routing ``warm`` untimed (not counted)."""
    route = index.route
    for key in warm:
        route(key)
    hits, misses = index.hits, index.misses
    started = time.process_time_ns()
    for key in keys:
        route(key)
    spent = time.process_time_ns() - started
    return {
        "us_per_route": spent / len(keys) / 1000,
        "hits": index.hits - hits,
        "misses": index.misses - misses,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bindings", type=int, default=100_000)
    p.add_argument("--routes", type=int, default=200_000)
    p.add_argument("--json", type=Path, default=RESULTS / "topic_keys.json")
    args = p.parse_args()
    n, b = args.routes, args.bindings
    hot = drawn(n, 1000, b, 1)
    one_off = [f"s{i % b}.u{i}.x" for i in range(n)]
    cycle = [f"s{k % b}.w{k // b}.{'y' if k % b % 2 else 'x'}" for k in range(100_000)]
    random.Random(3).shuffle(cycle)  # each key once, in a fixed order, then again
    cycled = [cycle[i % len(cycle)] for i in range(n)]
    shapes = {  # name: (cache_keys, timed keys, keys routed first, untimed)
        "1,000 keys (cached)": (10_000, hot, []),
        "100,000 keys, uniform": (10_000, drawn(n, 100_000, b, 2), []),
        "100,000 keys, cycled": (10_000, cycled, []),
        "100,000 keys, cycled, after one cycle": (10_000, cycled, cycle),
        "one-off keys": (10_000, one_off, []),
        "50% one-off + 50% of 1,000 hot keys": (
            10_000,
            [hot[i] if i % 2 else one_off[i] for i in range(n)],
            [],
        ),
        "no cache (the walk alone)": (0, drawn(n, 100_000, b, 2), []),
    }
    rows = []
    for name, (cache_keys, keys, warm) in shapes.items():
        result = timed(build(b, cache_keys), keys, warm)
        rows.append({"traffic": name, "cache_keys": cache_keys, **result})
        print(
            f"{name:40s} {result['us_per_route']:6.2f} us/route  "
            f"hits {result['hits']:,}  misses {result['misses']:,}",
            flush=True,
        )
    print()
    cells = [
        [r["traffic"], f"{r['us_per_route']:.2f}", f"{r['hits']:,}", f"{r['misses']:,}"]
        for r in rows
    ]
    print(markdown_table(["traffic", "µs per route", "hits", "misses"], cells, align="lrrr"))
    write_json(args.json, {"machine": machine_info(), "bindings": b, "routes": n, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
