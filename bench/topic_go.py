"""Topic routing of unseen keys end to end, RoarMQ against RabbitMQ, with the Go generator.

    .venv/bin/python bench/topic_go.py [--broker both|roarmq|rabbitmq] [--bindings 100000]
        [--literals 1000] [--keys 100000] [--shape prefixed|leading] [--queues N] [--no-ack]
        [--warmup 5] [--window 10] [--repeat 1] [--roarmq-rev REV] [--cache-keys N]
        [--json PATH]

A benchmark, not a test ("100,000 distinct keys over ~101,000 topic bindings"). A topic exchange bound with ``--bindings`` wildcard patterns and ``--literals``
literal ones (``bench/go/overload.go``'s topicTopology: by default ``s{i}.*.x`` /
``s{i}.#`` plus ``lit{i}``, the bindings of ``bench/topic_keys.py``), each binding to a
queue of its own (101,000 queues; ``--queues N`` spreads them round-robin over N queues,
``--queues 1`` binds them all to one); one publisher flat out (no confirms, 100 messages a
write) cycling through ``--keys`` distinct routing keys (each matching one pattern; ten
times RoarMQ's default 10,000-key cache, so most routes are cold), one consumer on every
queue (one channel, manual acks, prefetch 100; ``--no-ack``: auto-ack).
16-byte bodies. The generator is ``bench/go`` (standard library only, built
here with Go), pinned to ``--load-cpu`` (1); each broker pinned to CPU 0, RabbitMQ with one
Erlang scheduler (``+S 1:1``), a fresh instance per run.

Reported per broker: messages consumed per second over the window (after ``--warmup`` s;
set-up, bindings included, is not timed), the broker's CPU per message (its process group's
CPU time over the window / messages consumed), the generator's CPU, what other processes
used (the machine's busy time less those two: on a shared machine, read the rates with it),
and RoarMQ / RabbitMQ.
``--repeat N`` runs each broker N times, alternating, and reports the median by msg/s.
``--probe`` runs RoarMQ with its management API and loop-lag probe on and reports, after the
set-up (declarations and bindings) and at the end, its collector's passes per generation
(count, total and longest pause) and its event-loop stalls of 5 ms or more by what explains
them, the longest few with their causes (GET /api/diagnostics/stalls).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from lib import REPO, RESULTS
from lib.brokers import broker_instance
from lib.golang import Child, build_load_generator
from lib.machine import machine_info
from lib.observe import loadavg, machine_busy_s, stall_log, stall_summary
from lib.output import markdown_table, settings_of, write_json
from lib.procs import Procs, group_cpu_s
from lib.revisions import export_rev


def run_once(kind: str, procs: Procs, binary: Path, args: argparse.Namespace, src: Path) -> dict:
    options: dict[str, Any] = {"src": src} if kind == "roarmq" else {"schedulers": 1}
    if kind == "roarmq" and args.probe:
        options.update(management=True, lag_probe=True)
    if kind == "roarmq" and args.cache_keys is not None:
        options["extra_config"] = f"\n[routing]\ncache_keys = {args.cache_keys}\n"
    logs: dict[str, Any] = {}
    tag = uuid.uuid4().hex[:6]
    queue, exchange = f"topic-go.{tag}.q", f"topic-go.{tag}.x"
    spec = {
        "role": "load",
        "warmup_s": args.warmup,
        "window_s": args.window,
        "queues": [queue],
        "exchange": exchange,
        "topic_bindings": args.bindings,
        "topic_literals": args.literals,
        "topic_keys": args.keys,
        "topic_shape": args.shape,
        "topic_queues": 0 if args.queues == 1 else args.queues,
        "publishers": [{"group": "p", "queue": queue, "exchange": exchange, "batch": 100}],
        "consumers": [{"group": "c", "queue": queue, "prefetch": 100, "no_ack": args.no_ack}],
    }
    with broker_instance(kind, procs, args.broker_cpu, **options) as running:
        spec["port"] = running.port
        load = Child(procs, binary, spec, args.load_cpu)
        try:
            t_setup = time.monotonic()
            load.expect("ready", args.setup_timeout)
            setup_s = time.monotonic() - t_setup
            logs["set-up"] = stall_log(running.mgmt_port)
            time.sleep(args.warmup)
            cpu0, t0, busy0 = group_cpu_s(running.proc.pid), time.monotonic(), machine_busy_s()
            load.expect("window_end", args.window + 30)
            cpu1, t1, busy1 = group_cpu_s(running.proc.pid), time.monotonic(), machine_busy_s()
            result = load.expect("window_s", 60)
            logs["end"] = stall_log(running.mgmt_port)
        finally:
            load.stop()
        alive = running.proc.poll() is None
        version = running.version
    received = result["groups"]["c"]["received"]
    window = result["window_s"]
    return {
        "broker": kind,
        "version": version,
        "status": "ok" if alive and received else "broker exited or nothing consumed",
        "setup_s": round(setup_s, 1),
        "msgs_per_s": received / window,
        "published_per_s": result["groups"]["p"]["sent"] / window,
        "broker_cpu_us_per_msg": (cpu1 - cpu0) / max(received, 1) * 1e6,
        "broker_cpu_cores": (cpu1 - cpu0) / (t1 - t0),
        "gen_cpu_cores": result["cpu_s"] / window,
        # what other processes used: the machine's busy time less the broker and generator
        "others_cores": max(0.0, (busy1 - busy0) - (cpu1 - cpu0) - result["cpu_s"]) / (t1 - t0),
        "p50_ms": result["groups"]["c"].get("p50_ms"),
        "p99_ms": result["groups"]["c"].get("p99_ms"),
        "loadavg": loadavg(),
        "errors": [c["error"] for c in result["consumers"] + result["publishers"] if c["error"]],
        "stall_logs": logs if any(logs.values()) else None,
    }


def probe_report(row: dict[str, Any]) -> list[str]:
    """With --probe: RoarMQ's collector passes and loop stalls after set-up and at the end."""
    out = []
    for phase, log in (row.get("stall_logs") or {}).items():
        if not log:
            continue
        gens = "; ".join(
            f"gen{g['generation']} {g['collections']} passes {g['pause_total_ms']:,.0f} ms, "
            f"longest {g['pause_max_ms']:,.1f} ms"
            for g in log["gc"]["generations"]
        )
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(log["by_kind"].items()))
        out.append(f"  at {phase}: GC {gens}; stalls >= {log['threshold_ms']:g} ms: {kinds}")
    end = (row.get("stall_logs") or {}).get("end")
    for s in sorted(end["stalls"] if end else [], key=lambda s: -s["lag_ms"])[:5]:
        out.append(f"    {stall_summary(s)}")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--broker", choices=("both", "roarmq", "rabbitmq"), default="both")
    p.add_argument("--bindings", type=int, default=100_000)
    p.add_argument("--literals", type=int, default=1_000)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--shape", choices=("prefixed", "leading"), default="prefixed")
    p.add_argument(
        "--queues",
        type=int,
        help="spread the bindings over N queues (default: one queue per binding; 1: one queue)",
    )
    p.add_argument("--no-ack", action="store_true")
    p.add_argument(
        "--cache-keys",
        type=int,
        metavar="N",
        help="RoarMQ's routing-key cache size ([routing] cache_keys; default its own 10,000)",
    )
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--window", type=float, default=10.0)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--setup-timeout", type=float, default=300.0)
    p.add_argument("--broker-cpu", type=int, default=0)
    p.add_argument("--load-cpu", type=int, default=1)
    p.add_argument(
        "--probe",
        action="store_true",
        help="RoarMQ with its loop-lag probe: report its GC passes and loop stalls",
    )
    p.add_argument(
        "--roarmq-rev", help="run RoarMQ from `git archive REV`, compiled (a 'before' figure)"
    )
    p.add_argument("--json", type=Path, default=RESULTS / "topic_go.json")
    args = p.parse_args()
    if args.queues is None:
        args.queues = args.bindings + args.literals
    kinds = ["roarmq", "rabbitmq"] if args.broker == "both" else [args.broker]
    procs = Procs()
    rows: dict[str, list[dict]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory(prefix="topic-go-") as tmp_name:
        tmp = Path(tmp_name)
        binary, go_version = build_load_generator(tmp, "bench/topic_go.py")
        src = REPO
        if args.roarmq_rev:  # built as its make install would (lib/revisions.py)
            src = export_rev(args.roarmq_rev, tmp / "src")
        try:
            for _ in range(args.repeat):
                for kind in kinds:
                    row = run_once(kind, procs, binary, args, src)
                    rows[kind].append(row)
                    print(
                        f"{kind:9s} {row['msgs_per_s']:>10,.0f} msg/s  "
                        f"broker {row['broker_cpu_us_per_msg']:6.1f} us/msg "
                        f"({row['broker_cpu_cores']:.2f} cores)  gen {row['gen_cpu_cores']:.2f} "
                        f"cores  others {row['others_cores']:.2f} cores  set-up {row['setup_s']} s  "
                        f"{row['status']} {row['errors'] or ''}",
                        flush=True,
                    )
                    for line in probe_report(row):
                        print(line, flush=True)
        finally:
            procs.stop_all()
    median = {
        k: sorted(v, key=lambda r: r["msgs_per_s"])[len(v) // 2] for k, v in rows.items() if v
    }
    ratio = None
    if "roarmq" in median and "rabbitmq" in median and median["rabbitmq"]["msgs_per_s"]:
        ratio = median["roarmq"]["msgs_per_s"] / median["rabbitmq"]["msgs_per_s"]
    print()
    head = ["broker", "msg/s", "broker CPU µs/msg", "generator cores", "others, cores"]
    cells = [
        [
            f"{kind} {r['version']}",
            f"{r['msgs_per_s']:,.0f}",
            f"{r['broker_cpu_us_per_msg']:.1f}",
            f"{r['gen_cpu_cores']:.2f}",
            f"{r['others_cores']:.2f}",
        ]
        for kind, r in median.items()
    ]
    print(markdown_table(head, cells, align="lrrrr"))
    if ratio is not None:
        print(f"\nRoarMQ / RabbitMQ: {ratio:.1f}x")
    spread = {k: [round(r["msgs_per_s"]) for r in v] for k, v in rows.items()}
    result = {
        "machine": machine_info(go=go_version),
        "settings": settings_of(args),
        "runs": rows,
        "median": median,
        "ratio": ratio,
        "msgs_per_s_spread": spread,
    }
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
