"""One broker's CPU a message under bench/cluster.py's capacity load, optionally profiled.

    .venv/bin/python bench/cluster_profile.py [--kind single|cluster] [--nodes N]
        [--replicas R] [--follower] [--seconds S] [--py-spy PATH --out FILE]

A benchmark, not a test. ``single`` is one broker without ``[cluster]``; ``cluster`` is
etcd and ``--nodes`` nodes (``--replicas`` copies of ``/``). The load is the capacity part
of bench/cluster.py for one vhost (2 publishers x 1,000 unconfirmed persistent messages, 2
consumers with manual acks, prefetch 1,000, one durable queue, clients on the leader):
3-s warm-up, then ``--seconds``. It prints one JSON line: confirmed and received msg/s,
each broker's CPU seconds over the window, and broker CPU a message (all brokers).
With ``--py-spy``, that binary samples the leader (``--follower``: a follower) at 200 Hz
in raw format into ``--out``. Why a separate script: it isolates one vhost on one node,
where bench/cluster.py's parts always compare setups (the load and its row are
bench/lib/capacity.py's, shared with bench/cluster.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from lib.brokers import start_roarmq
from lib.capacity import run_generator, summarise, target
from lib.clusters import start_roarmq_cluster
from lib.golang import build_load_generator
from lib.procs import Procs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kind", choices=("single", "cluster"), default="cluster")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--follower", action="store_true", help="profile a follower, not the leader")
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--py-spy", type=Path, help="a py-spy binary: profile while measuring")
    p.add_argument("--out", type=Path, default=Path("cluster_profile.txt"))
    # the capacity part's load (bench/cluster.py --cap-*)
    p.add_argument("--cap-publishers", type=int, default=2)
    p.add_argument("--cap-window", type=int, default=1000)
    p.add_argument("--cap-consumers", type=int, default=2)
    p.add_argument("--cap-prefetch", type=int, default=1000)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="roarbench-profile-"))
    binary, _ = build_load_generator(tmp, "bench/cluster_profile.py")
    procs = Procs()
    try:
        if args.kind == "cluster":
            c = start_roarmq_cluster(procs, tmp, nodes=args.nodes, replicas=args.replicas)
            leader = c.vhost_row("/")["leader"]
            port = c.members[leader].port
            pid = c.members[leader].proc.pid
            if args.follower:
                pid = next(m.proc.pid for m in c.nodes if m.name != leader)
            pgids = {m.name: m.proc.pid for m in c.nodes}
        else:
            single = start_roarmq(procs, tmp, management=True)
            port, pid = single.port, single.proc.pid
            pgids = {"single": pid}
        spec = {
            "role": "capacity",
            "warmup_s": 3,
            "window_s": args.seconds,
            "targets": [target("a", port, "/", args)],
        }
        spy = None
        if args.py_spy:
            spy = subprocess.Popen(
                [str(args.py_spy), "record", "-p", str(pid), "-d", str(int(args.seconds) + 2)]
                + ["-f", "raw", "-o", str(args.out), "-r", "200", "--nonblocking"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        res = run_generator(binary, spec, procs, pgids)
        if spy is not None:
            spy.wait()
        row = summarise(args.kind, "", res, {})
        keys = ("confirmed_per_s", "received_per_s", "broker_cpu_s", "broker_cpu_us_per_msg")
        print(json.dumps({k: row.get(k) for k in (*keys, "latency_p50_ms", "others_cores")}))
    finally:
        procs.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
