"""Steady-state throughput and latency, RoarMQ beside RabbitMQ and GarageMQ, measured by the Go
generator.

    .venv/bin/python bench/steady.py [--broker all|both|roarmq|rabbitmq|garagemq]
        [--scenarios direct,confirms,persistent,persistent-w1,fanout,topic,latency] [--warmup 3] [--window 8]
        [--repeat 3] [--broker-cpu 0] [--load-cpu 1] [--json PATH]

The figures README quotes. Each run is a fresh broker pinned to ``--broker-cpu`` (RabbitMQ
with one Erlang scheduler, ``+S 1:1``; GarageMQ's Go runtime sees the one CPU it is pinned
to) and the load generator, ``bench/go`` (Go's standard library, its own AMQP framing, no
code of ours), pinned to ``--load-cpu``. Set-up (declarations, bindings, connections) is not
timed; the generator then runs ``--warmup`` s and counts over the next ``--window`` s only, so a
row is a rate the broker keeps up, not how fast it swallows a burst into its buffers.
``--repeat N`` runs every (scenario, broker) N times, the brokers alternating, and reports
the median and the range. 16-byte bodies throughout.

Scenarios (consumers are counted: a row's msg/s is deliveries per second):
  direct         one publisher flat out (100 messages a write, no confirms) -> one queue ->
                 one no-ack consumer
  confirms       the same with publisher confirms (at most 1,000 unconfirmed) and a
                 consumer acking each message (prefetch 100)
  persistent     as confirms, persistent messages (delivery-mode 2) to a durable queue: each
                 is confirmed once the broker has it on disk (fsync)
  persistent-w1  as persistent with one message unconfirmed at a time (as pika's
                 BlockingConnection publishes): a round trip and an fsync a message
  fanout         a fanout exchange bound to 10 queues, a no-ack consumer on each
  topic          a topic exchange with 1,000 wildcard bindings (s{i}.*.x / s{i}.#) to one
                 queue, the publisher cycling 10,000 distinct keys, a no-ack consumer
  latency        one publisher paced at --rate (10,000) msg/s, one message a write -> one
                 queue -> one no-ack consumer; p50/p99/p99.9 of publish-to-delivery time
                 (the generator stamps each body with its clock as it writes it, and reads
                 it on delivery)

Per row: msg/s (median and range), the broker's CPU per message (its process group's CPU
time over the window / messages delivered), and for latency the percentiles (median run and
range). What else the machine ran is in the JSON (``others_cores``): read rates beside it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lib import REPO, RESULTS
from lib.brokers import LABEL, broker_instance
from lib.golang import Child, build_load_generator
from lib.machine import machine_info
from lib.observe import loadavg, machine_busy_s
from lib.output import markdown_table, settings_of, write_json
from lib.procs import Procs, group_cpu_s


@dataclass
class Scenario:
    name: str
    description: str
    #: The load role's spec for this scenario, given a run tag (names) and the arguments.
    spec: Any = field(repr=False)


def _direct(tag: str, args: argparse.Namespace) -> dict[str, Any]:
    q = f"steady.{tag}"
    return {
        "queues": [q],
        "publishers": [{"group": "p", "queue": q, "batch": 100}],
        "consumers": [{"group": "c", "queue": q, "no_ack": True}],
    }


def _confirms(tag: str, args: argparse.Namespace) -> dict[str, Any]:
    q = f"steady.{tag}"
    return {
        "queues": [q],
        "publishers": [{"group": "p", "queue": q, "batch": 100, "confirm_window": 1000}],
        "consumers": [{"group": "c", "queue": q, "prefetch": 100}],
    }


def _persistent(window: int) -> Any:
    def spec(tag: str, args: argparse.Namespace) -> dict[str, Any]:
        q = f"steady.{tag}"
        publisher = {"group": "p", "queue": q, "batch": 100, "confirm_window": window}
        return {
            "queues": [q],
            "durable": True,
            "publishers": [{**publisher, "persistent": True}],
            "consumers": [{"group": "c", "queue": q, "prefetch": 100}],
        }

    return spec


def _fanout(tag: str, args: argparse.Namespace) -> dict[str, Any]:
    queues = [f"steady.{tag}.{i}" for i in range(10)]
    exchange = f"steady.{tag}.fanout"
    return {
        "queues": queues,
        "exchange": exchange,
        "exchange_type": "fanout",
        "publishers": [{"group": "p", "queue": queues[0], "exchange": exchange, "batch": 100}],
        "consumers": [{"group": "c", "queue": q, "no_ack": True} for q in queues],
    }


def _topic(tag: str, args: argparse.Namespace) -> dict[str, Any]:
    q, exchange = f"steady.{tag}", f"steady.{tag}.topic"
    return {
        "queues": [q],
        "exchange": exchange,
        "topic_bindings": 1000,
        "topic_literals": 0,
        "topic_keys": 10_000,
        "topic_shape": "prefixed",
        "topic_queues": 0,
        "publishers": [{"group": "p", "queue": q, "exchange": exchange, "batch": 100}],
        "consumers": [{"group": "c", "queue": q, "no_ack": True}],
    }


def _latency(tag: str, args: argparse.Namespace) -> dict[str, Any]:
    q = f"steady.{tag}"
    return {
        "queues": [q],
        "publishers": [{"group": "p", "queue": q, "batch": 1, "rate": args.rate}],
        "consumers": [{"group": "c", "queue": q, "no_ack": True}],
    }


SCENARIOS = [
    Scenario("direct", "direct 1->1, no-ack", _direct),
    Scenario("confirms", "direct, confirms (<= 1,000 open) + manual acks, prefetch 100", _confirms),
    Scenario(
        "persistent",
        "persistent, durable queue, confirms (<= 1,000 open) + manual acks",
        _persistent(1000),
    ),
    Scenario(
        "persistent-w1",
        "persistent, durable queue, a publisher that waits for each confirm",
        _persistent(1),
    ),
    Scenario("fanout", "fanout to 10 queues, a no-ack consumer each (deliveries/s)", _fanout),
    Scenario("topic", "topic, 1,000 wildcard bindings, 10,000 keys, no-ack", _topic),
    Scenario("latency", "direct 1->1, no-ack, publisher paced at --rate msg/s", _latency),
]
BY_NAME = {s.name: s for s in SCENARIOS}


def run_once(
    kind: str, scenario: Scenario, procs: Procs, binary: Path, args: argparse.Namespace
) -> dict[str, Any]:
    options: dict[str, Any] = {"src": REPO} if kind == "roarmq" else {}
    if kind == "rabbitmq":
        options["schedulers"] = 1
    spec = {
        "role": "load",
        "warmup_s": args.warmup,
        "window_s": args.window,
        **scenario.spec(uuid.uuid4().hex[:6], args),
    }
    with broker_instance(kind, procs, args.broker_cpu, **options) as running:
        spec["port"] = running.port
        load = Child(procs, binary, spec, args.load_cpu)
        try:
            load.expect("ready", 120)
            time.sleep(args.warmup)
            cpu0, t0, busy0 = group_cpu_s(running.proc.pid), time.monotonic(), machine_busy_s()
            load.expect("window_end", args.window + 30)
            cpu1, t1, busy1 = group_cpu_s(running.proc.pid), time.monotonic(), machine_busy_s()
            # then each queue's depth: slow from a broker that holds a backlog
            result = load.expect("window_s", 180)
        finally:
            load.stop()
        alive = running.proc.poll() is None
        version = running.version
    received = result["groups"]["c"]["received"]
    window = result["window_s"]
    errors = [c["error"] for c in result["consumers"] + result["publishers"] if c["error"]]
    return {
        "broker": kind,
        "version": version,
        "scenario": scenario.name,
        "ok": alive and received > 0 and not errors,
        "msgs_per_s": received / window,
        "published_per_s": result["groups"]["p"]["sent"] / window,
        "broker_cpu_us_per_msg": (cpu1 - cpu0) / max(received, 1) * 1e6,
        "broker_cpu_cores": (cpu1 - cpu0) / (t1 - t0),
        "gen_cpu_cores": result["cpu_s"] / window,
        # what other processes used: the machine's busy time less the broker and generator
        "others_cores": max(0.0, (busy1 - busy0) - (cpu1 - cpu0) - result["cpu_s"]) / (t1 - t0),
        "p50_ms": result["groups"]["c"].get("p50_ms"),
        "p99_ms": result["groups"]["c"].get("p99_ms"),
        "p999_ms": result["groups"]["c"].get("p999_ms"),
        "max_ms": result["groups"]["c"].get("max_ms"),
        "depth": result.get("depth"),
        "loadavg": loadavg(),
        "errors": errors,
    }


def summarise(runs: list[dict[str, Any]], key: str) -> dict[str, float | None]:
    values = [r[key] for r in runs if r["ok"] and r.get(key) is not None]
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def cell(summary: dict[str, float | None], digits: int, scale: float = 1.0) -> str:
    if summary["median"] is None:
        return "failed"
    m, lo, hi = (summary[k] * scale for k in ("median", "min", "max"))  # type: ignore[operator]
    return f"{m:,.{digits}f} ({lo:,.{digits}f}–{hi:,.{digits}f})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument(
        "--broker", choices=("all", "both", "roarmq", "rabbitmq", "garagemq"), default="all"
    )
    p.add_argument("--scenarios", default=",".join(BY_NAME), help="comma-separated subset")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds before the window")
    p.add_argument("--window", type=float, default=8.0, help="seconds counted")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--rate", type=float, default=10_000, help="the latency publisher's msg/s")
    p.add_argument("--broker-cpu", type=int, default=0)
    p.add_argument("--load-cpu", type=int, default=1)
    p.add_argument("--json", type=Path, default=RESULTS / "steady.json")
    args = p.parse_args()
    kinds = {
        "all": ["roarmq", "rabbitmq", "garagemq"],
        "both": ["roarmq", "rabbitmq"],
    }.get(args.broker, [args.broker])
    wanted = [w for w in args.scenarios.split(",") if w]
    unknown = set(wanted) - set(BY_NAME)
    if unknown:
        p.error(f"unknown scenarios {sorted(unknown)}; known: {', '.join(BY_NAME)}")
    procs = Procs()
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {w: {k: [] for k in kinds} for w in wanted}
    with tempfile.TemporaryDirectory(prefix="roar-steady-") as tmp:
        binary, go_version = build_load_generator(Path(tmp), "bench/steady.py")
        try:
            for name in wanted:
                for _ in range(args.repeat):
                    for kind in kinds:
                        row = run_once(kind, BY_NAME[name], procs, binary, args)
                        runs[name][kind].append(row)
                        lat = (
                            f"  p50/p99 {row['p50_ms']:.3f}/{row['p99_ms']:.3f} ms"
                            if name == "latency" and row["p99_ms"] is not None
                            else ""
                        )
                        print(
                            f"{name:9s} {kind:9s} {row['msgs_per_s']:>11,.0f} msg/s  broker "
                            f"{row['broker_cpu_us_per_msg']:6.2f} us/msg{lat}  others "
                            f"{row['others_cores']:.2f} cores  {'' if row['ok'] else 'FAILED'} "
                            f"{row['errors'] or ''}",
                            flush=True,
                        )
        finally:
            procs.stop_all()
    summary: dict[str, dict[str, Any]] = {}
    table = []
    for name in wanted:
        summary[name] = {}
        for kind in kinds:
            got = runs[name][kind]
            s = {
                "msgs_per_s": summarise(got, "msgs_per_s"),
                "broker_cpu_us_per_msg": summarise(got, "broker_cpu_us_per_msg"),
                "p50_ms": summarise(got, "p50_ms"),
                "p99_ms": summarise(got, "p99_ms"),
                "p999_ms": summarise(got, "p999_ms"),
                "version": got[0]["version"] if got else None,
            }
            summary[name][kind] = s
            if name == "latency":
                figure = f"p50 {cell(s['p50_ms'], 3)}; p99 {cell(s['p99_ms'], 3)} ms"
            else:
                figure = f"{cell(s['msgs_per_s'], 0)} msg/s"
            table.append(
                [
                    name,
                    f"{LABEL[kind]} {s['version'] or ''}".strip(),
                    figure,
                    cell(s["broker_cpu_us_per_msg"], 2),
                ]
            )
    print()
    print(
        f"median (range) of {args.repeat} runs, {args.window:g} s windows after {args.warmup:g} s"
    )
    print(markdown_table(["scenario", "broker", "median (range)", "broker CPU µs/msg"], table))
    write_json(
        args.json,
        {
            "machine": machine_info(go=go_version),
            "settings": settings_of(args),
            "summary": summary,
            "runs": runs,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
