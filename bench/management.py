"""The management side at scale: what an operator's view costs the broker's event loop.

    .venv/bin/python bench/management.py [--queues N] [--json PATH]

A benchmark, not a test. An in-process broker (in its own thread) with N queues
(default 100,000) in one vhost; each row is the wall time of one call, which runs on
the broker's event loop and so holds every connection for that long:

  queues page         GET /api/queues?page=1&page_size=100&sort=name (the web UI's list)
  queues page+filter  the same with name=q0999
  overview            GET /api/overview
  metrics             GET /metrics (aggregated families; per-queue series are on
                      /metrics/per-object)
  rate sample         one pass of the 5 s message-rate sampler, run in one go here;
                      on its timer it runs in slices of 5,000 queues
Prints a table, writes JSON (default bench/results/management.json).
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.request
from pathlib import Path

from lib import RESULTS
from lib.output import write_json

from roarmq.broker.management import rates
from roarmq.broker.testing import BrokerThread, ephemeral_config


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queues", type=int, default=100_000)
    p.add_argument("--json", type=Path, default=RESULTS / "management.json")
    args = p.parse_args()
    results: dict[str, float] = {}
    with BrokerThread(ephemeral_config(), management=True) as b:

        def make() -> None:
            vhost = b.broker.vhosts["/"]
            for i in range(args.queues):
                vhost.declare_queue(f"q{i:06d}", None)

        b.call(make, timeout=600)

        def timed(label: str, fn) -> None:
            best = min(_time(fn) for _ in range(3))
            results[label] = best

        for label, path in (
            ("queues page", "/api/queues?page=1&page_size=100&sort=name"),
            ("queues page+filter", "/api/queues?page=1&page_size=100&name=q0999&sort=name"),
            ("overview", "/api/overview"),
        ):
            timed(label, lambda path=path: b.api("GET", path))
        timed("metrics", lambda: urllib.request.urlopen(b.mgmt_url + "/metrics").read())
        sampler = rates.RateSampler(b.broker)
        timed("rate sample", lambda: b.call(sampler.sample))
    width = max(map(len, results))
    print(f"{f'call ({args.queues:,} queues)'.ljust(width + 12)}  seconds")
    for label, seconds in results.items():
        print(f"{label.ljust(width + 12)}  {seconds:.3f}")
    write_json(args.json, {"queues": args.queues, "seconds": results})
    return 0


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    sys.exit(main())
