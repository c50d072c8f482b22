"""Overload benchmark: RoarMQ against RabbitMQ when publishers outrun consumers, in one run.

    .venv/bin/python bench/overload.py [--quick] [--scenarios a,b,...] [--skip-rabbitmq]
                                       [--brokers roarmq,rabbitmq,garagemq]
                                       [--window S] [--roarmq-rev REV] [--json PATH]

A benchmark, not a test. Each scenario runs against RoarMQ and
RabbitMQ (apt-installed; ``bench/lib/brokers.py`` starts it on its own loopback
ports and data dir), the broker pinned to one core (``taskset -c 0``) and
everything else -- load generator, probe and this script -- to the other
(``--load-cpu``, default 1). 16-byte transient bodies, published to the default
exchange with the queue's name as routing key.

The load generator is ``bench/go`` (its overload roles), built here with Debian's
``golang-go`` into a temporary directory (standard library only). Python was
measured first: ``bench/lib/amqp_load.py``'s publisher and auto-ack consumer took
~69% of their core at 117k msg/s (RoarMQ, direct) with the broker's core
saturated, leaving no room for 4 publishers + 4 consumers + a 1 kHz probe. The
Go generator moves the same 100k+ msg/s in ~3% of its core (RabbitMQ's smaller
writes cost it more per message: ~20-30% at 20-60k msg/s, the probe included);
its CPU use is in every row.

Scenarios (publishers "flat out" write as fast as TCP lets them, no confirms;
consumers ack manually, one basic.ack per message, prefetch 100, unless said):

  workq-p100          1 publisher flat out, 1 consumer
  workq-p1000         the same, prefetch 1,000
  confirm-ack-w100    1 publisher with confirms, at most 100 unconfirmed, 1 consumer
  confirm-ack-w1000   ... at most 1,000 unconfirmed
  confirm-ack-w10000  ... at most 10,000 unconfirmed
  direct-autoack      1 publisher flat out, 1 auto-ack consumer (reference)
  2p2c, 4p4c          2 (4) publishers flat out, 2 (4) consumers, one queue
  slow-consumer       1 publisher flat out; 2 fast consumers and a slow one (acks each
                      message 1 ms after the previous ack, prefetch 10) on one queue;
                      notes give each consumer's rate
  noisy-neighbour     queue A: 1 publisher flat out + 1 consumer; queue B: 200 msg/s
                      + 1 consumer. Latency columns are B's; notes give A's rates
  bad-get-recover     a queue holds one 1 MiB message; a client writes ~73 KB of
                      basic.get + basic.recover(requeue) pairs and never reads its
                      socket for one window. Notes: the broker's RSS growth
  bad-nack-ascending  20,000 messages taken with basic.get (no-ack off), then
                      basic.nack(requeue) one by one in ascending tag order. Notes:
                      time until a queue.declare sent behind the nacks is answered
  bad-bind-cache      a topic exchange's routing-key cache filled with 10,000 distinct
                      121-word keys (all routed by a "*.a.#" binding), then 20 binds of
                      "#.zzN.#" sent in one write. Notes: time per bind (the gaps
                      between bind-oks), and the longest a new client (one every
                      20 ms) waited for connection.start

Columns:

  consumed/s, published/s  messages received by all consumers / written by all
           publishers in the window (``--window`` s, after ``--warmup`` s), per second
  p50/p99  publish -> receive latency of messages received in the window (the send
           time is in the body; publisher and consumer share one process and clock).
           Behind a flat-out publisher it is mostly time spent in socket buffers and
           the queue: latency under saturation, not an idle broker's
  peak RSS the broker's resident memory (VmRSS summed over its process group, sampled
           every 50 ms), highest from the load's start to the window's end (a bad
           phase shorter than 1 s, e.g. RabbitMQ's binds, is watched for 1 s)
  probe max  the longest round trip of a probe: its own connection sends a passive
           queue.declare of its own queue, waits for the reply, repeats 1 ms after the
           previous send (~600-900 a second); one still unanswered counts until the end
  loop lag RoarMQ's own ``roarmq_event_loop_lag_max_seconds`` (the longest stall of
           a 1 ms timer since the previous scrape; ``[diagnostics] loop_lag_probe_ms
           = 1``, set where the version has it) from the management port's /metrics,
           read before the load starts and at the window's end (the second read is
           shown: the load's set-up and window); blank if the broker has no such gauge
  broker CPU, gen CPU  CPU time over the window / its length: the broker's process
           group; the load generator plus the probe (both on the load core)

The bad-input rows have no rates: their window is the bad phase (hold, nacks,
binds) and their result is in the notes.

A full run starts a fresh broker instance per scenario and broker (so RSS and the
loop-lag maximum belong to that scenario) and takes about 10 minutes; ``--quick``
(3 s windows, smaller bad cases, one instance per broker) about 3. Every phase is
bounded in time; all processes started here are stopped on every exit path.
``--roarmq-rev REV`` runs RoarMQ from ``git archive REV``, compiled (e.g. HEAD, for the
"before" figures while the work tree changes) instead of the work tree. Results
go to a table and to ``bench/results/overload.json`` (``overload-quick.json``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lib import REPO, RESULTS
from lib.brokers import (
    ALL_BROKERS,
    BROKERS,
    LABEL,
    BrokerUnavailable,
    Monitored,
    monitored_instance,
)
from lib.golang import Child, build_load_generator
from lib.machine import machine_info
from lib.observe import loadavg, loop_lag_ms
from lib.output import command_line, fmt, markdown_table, write_json
from lib.procs import Procs, group_cpu_s
from lib.revisions import export_rev

PROBE_INTERVAL_MS = 1.0
CONNECT_EVERY_MS = 20.0
MIN_PHASE_S = 1.0


# -- scenarios -----------------------------------------------------------------------


def pub(queue: str = "a", group: str = "p", **kw: Any) -> dict[str, Any]:
    """A publisher on ``queue``: flat out unless ``rate``; ``confirm_window`` for confirms."""
    return {"group": group, "queue": queue, "batch": 100, **kw}


def cons(queue: str = "a", group: str = "c", prefetch: int = 100, **kw: Any) -> dict[str, Any]:
    """A consumer of ``queue``: manual acks unless ``no_ack``; ``ack_delay_us`` per message."""
    return {"group": group, "queue": queue, "prefetch": prefetch, **kw}


@dataclass
class Scenario:
    name: str
    description: str
    role: str = "load"  # or one of the generator's bad-input roles
    queues: tuple[str, ...] = ("a",)
    publishers: tuple[dict[str, Any], ...] = ()
    consumers: tuple[dict[str, Any], ...] = ()
    latency_group: str = "all"  # whose latency the p50/p99 columns show
    connect_probe: bool = False  # also time connection.start of a new client every 20 ms
    bad: dict[str, Any] = field(default_factory=dict)  # bad-input settings (full run)
    bad_quick: dict[str, Any] = field(default_factory=dict)  # overrides with --quick


def _confirms(window: int) -> Scenario:
    return Scenario(
        f"confirm-ack-w{window}",
        f"confirms (at most {window:,} unconfirmed) + manual ack, prefetch 100",
        publishers=(pub(confirm_window=window),),
        consumers=(cons(),),
    )


SCENARIOS = [
    Scenario(
        "workq-p100",
        "1 publisher flat out, 1 consumer, manual ack, prefetch 100",
        publishers=(pub(),),
        consumers=(cons(),),
    ),
    Scenario(
        "workq-p1000",
        "1 publisher flat out, 1 consumer, manual ack, prefetch 1,000",
        publishers=(pub(),),
        consumers=(cons(prefetch=1000),),
    ),
    _confirms(100),
    _confirms(1000),
    _confirms(10_000),
    Scenario(
        "direct-autoack",
        "1 publisher flat out, 1 auto-ack consumer (reference)",
        publishers=(pub(),),
        consumers=(cons(prefetch=0, no_ack=True),),
    ),
    Scenario(
        "2p2c",
        "2 publishers flat out, 2 consumers on one queue, manual ack, prefetch 100",
        publishers=(pub(),) * 2,
        consumers=(cons(),) * 2,
    ),
    Scenario(
        "4p4c",
        "4 publishers flat out, 4 consumers on one queue, manual ack, prefetch 100",
        publishers=(pub(),) * 4,
        consumers=(cons(),) * 4,
    ),
    Scenario(
        "slow-consumer",
        "1 publisher flat out; 2 fast consumers + 1 slow (1 ms per ack, prefetch 10), one queue",
        publishers=(pub(),),
        consumers=(
            cons(group="fast"),
            cons(group="fast"),
            cons(group="slow", prefetch=10, ack_delay_us=1000),
        ),
    ),
    Scenario(
        "noisy-neighbour",
        "queue A flooded (1 publisher flat out, 1 consumer); queue B at 200 msg/s: B's latency",
        queues=("a", "b"),
        publishers=(pub("a", "A"), pub("b", "B", rate=200)),
        consumers=(cons("a", "A"), cons("b", "B")),
        latency_group="B",
    ),
    Scenario(
        "bad-get-recover",
        "1 MiB message; ~73 KB of basic.get + basic.recover(requeue) pairs, socket never read",
        role="bad-get-recover",
        bad={"body_bytes": 1 << 20, "request_bytes": 73_000},
    ),
    Scenario(
        "bad-nack-ascending",
        "20,000 messages taken by basic.get, then basic.nack(requeue) one by one, ascending",
        role="bad-nack",
        bad={"n": 20_000},
        bad_quick={"n": 5_000},
    ),
    Scenario(
        "bad-bind-cache",
        "topic cache filled with 10,000 121-word keys, then 20 binds of #.zzN.# in one write",
        role="bad-bind",
        connect_probe=True,
        bad={"keys": 10_000, "words": 121, "binds": 20},
        bad_quick={"binds": 5},
    ),
]


# -- one scenario --------------------------------------------------------------------


def generator_spec(
    sc: Scenario, args: argparse.Namespace, port: int, tag: str, cleanup: bool
) -> dict[str, Any]:
    def qname(q: str) -> str:
        return f"ovl.{sc.name}.{tag}.{q}"

    spec: dict[str, Any] = {"role": sc.role, "port": port, "cleanup": cleanup}
    spec["window_s"] = args.window
    if sc.role == "load":
        spec.update(
            warmup_s=args.warmup,
            queues=[qname(q) for q in sc.queues],
            publishers=[{**p, "queue": qname(p["queue"])} for p in sc.publishers],
            consumers=[{**c, "queue": qname(c["queue"])} for c in sc.consumers],
        )
    else:
        spec.update(
            timeout_s=args.bad_timeout,
            queue=qname("a"),
            queue2=qname("b"),
            exchange=f"ovl.{sc.name}.{tag}.topic",
        )
        spec.update(sc.bad)
        if args.quick:
            spec.update(sc.bad_quick)
    return spec


def run_scenario(
    procs: Procs, broker: Monitored, binary: Path, sc: Scenario, args: argparse.Namespace
) -> dict[str, Any]:
    """Probe and load against a running broker; the measured figures of one row."""
    running = broker.running
    cleanup = args.reuse_broker  # a fresh broker per scenario needs no clean-up
    spec = generator_spec(sc, args, running.port, uuid.uuid4().hex[:6], cleanup)
    probe_spec = {"role": "probe", "port": running.port, "interval_ms": PROBE_INTERVAL_MS}
    if sc.connect_probe:
        probe_spec["connect_every_ms"] = CONNECT_EVERY_MS
    phase_s = args.warmup + args.window if sc.role == "load" else max(args.window, args.bad_timeout)
    out: dict[str, Any] = {"status": "ok", "loadavg": loadavg()}
    probe = load = None
    try:
        probe = Child(procs, binary, probe_spec, args.load_cpu)
        probe.expect("ready", 60)
        lag_before = loop_lag_ms(broker.mgmt_port)  # while the broker is idle
        load = Child(procs, binary, spec, args.load_cpu)
        load.expect("ready", 120)  # set-up done: connections, queues, pre-published messages
        t0 = time.monotonic()
        probe.tell("start")
        cpu0, harness0 = group_cpu_s(running.proc.pid), _own_cpu_s()
        load.expect("window_end", phase_s + 30)
        # a phase shorter than MIN_PHASE_S (RabbitMQ's binds) is measured for that long,
        # so that the probes and the RSS sampler see it at least a few times
        time.sleep(max(0.0, t0 + MIN_PHASE_S - time.monotonic()))
        t1 = time.monotonic()
        cpu1, harness1 = group_cpu_s(running.proc.pid), _own_cpu_s()
        probe.tell(None)
        lag = loop_lag_ms(broker.mgmt_port)
        result = load.expect("window_s", 90)
        probed = probe.expect("round_trip", 30)
    except RuntimeError as exc:
        out["status"] = f"error: {exc}"
        return out
    finally:
        for child in (load, probe):
            if child is not None:
                child.stop()
    if running.proc.poll() is not None:
        out["status"] = f"broker exited with {running.proc.returncode}"
    base, peak = broker.rss.at(t0), broker.rss.peak(t0, t1)
    gen_cpu = result.get("cpu_s", 0.0) / max(result["window_s"], 1e-9)
    probe_cpu = probed["cpu_s"] / max(probed["wall_s"], 1e-9)
    out.update(
        {
            "elapsed_s": t1 - t0,
            "rss_start_mb": base / 2**20 if base else None,
            "rss_peak_mb": peak / 2**20 if peak else None,
            "probe": probed["round_trip"],
            "probe_max_ms": probed["round_trip"]["max_ms"],
            "connection_start": probed.get("connection_start"),
            "loop_lag_ms": lag,
            "loop_lag_at_start_ms": lag_before,
            "broker_cpu_pct": 100 * (cpu1 - cpu0) / (t1 - t0),
            "generator_cpu_pct": 100 * gen_cpu,
            "probe_cpu_pct": 100 * probe_cpu,
            "gen_cpu_pct": 100 * (gen_cpu + probe_cpu),
            "harness_cpu_pct": 100 * (harness1 - harness0) / (t1 - t0),
            "generator": result,
        }
    )
    out.update(summarize(sc, result, out))
    return out


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def summarize(sc: Scenario, r: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """The scenario's rates, latency and notes from the generator's result."""
    window = r["window_s"]
    if sc.role != "load":
        return {"notes": bad_notes(sc, r, row), "status": _status(r)}
    groups = r["groups"]
    lat = groups.get(sc.latency_group, {})
    consumed = groups["all"]["received"] / window  # "all": every consumer and publisher
    published = groups["all"]["sent"] / window
    notes = []
    backlog = sum(n for n in r["depth"].values() if n is not None)
    if sc.name == "slow-consumer":
        rates = {c["group"]: [] for c in r["consumers"]}
        for c in r["consumers"]:
            rates[c["group"]].append(fmt(c["received"] / window, 0))
        notes.append(f"slow {', '.join(rates['slow'])}/s; fast {', '.join(rates['fast'])}/s")
    if sc.name == "noisy-neighbour":
        a, b = groups["A"], groups["B"]
        notes.append(
            f"B {fmt(b['received'] / window, 0)}/s of {fmt(b['sent'] / window, 0)}/s; "
            f"A {fmt(a['received'] / window, 0)}/s of {fmt(a['sent'] / window, 0)}/s, "
            f"A p99 {fmt(a['p99_ms'], 1)} ms"
        )
    confirmed = sum(p["confirmed"] for p in r["publishers"])
    if any(p.get("confirm_window") for p in sc.publishers):
        notes.append(f"confirmed {fmt(confirmed / window, 0)}/s")
    notes.append(f"queued at end {backlog:,}")
    if blocked := sum(p["blocked"] for p in r["publishers"]):
        notes.append(f"connection.blocked x{blocked}")
    return {
        "consumed_per_s": consumed,
        "published_per_s": published,
        "p50_ms": lat.get("p50_ms"),
        "p99_ms": lat.get("p99_ms"),
        "queued_at_end": backlog,
        "notes": "; ".join(notes),
        "status": _status(r),
    }


def _status(r: dict[str, Any]) -> str:
    errors = [e for c in (*r.get("publishers", ()), *r.get("consumers", ())) if (e := c["error"])]
    if r.get("error"):
        errors.insert(0, r["error"])
    if r.get("timed_out"):
        errors.insert(0, "timed out")
    return "ok" if not errors else "; ".join(sorted(set(errors)))[:200]


def bad_notes(sc: Scenario, r: dict[str, Any], row: dict[str, Any]) -> str:
    if sc.role == "bad-get-recover":
        start, peak = row["rss_start_mb"], row["rss_peak_mb"]
        growth = f"+{fmt(peak - start, 0)} MB" if start and peak else "?"
        return (
            f"RSS {growth} ({fmt(start, 0)} -> {fmt(peak, 0)} MB) from {r['pairs']:,} pairs, "
            f"{r['written_bytes'] / 1000:,.0f} of {r['request_bytes'] / 1000:,.0f} KB written"
        )
    if sc.role == "bad-nack":
        done = "timed out after " if r.get("timed_out") else ""
        return f"{r['n']:,} nacks: {done}{r['nack_s']:.2f} s (the gets: {r['get_s']:.2f} s)"
    binds = r["bind_ms"] or []
    connect = row.get("connection_start") or {}
    total = sum(binds)
    each = total / len(binds) if binds else None
    return (
        f"{len(binds)} of {r['binds']} binds in {total / 1000:.2f} s ({fmt(each, 1)} ms a bind); "
        f"new client waits for connection.start up to {fmt(connect.get('max_ms'), 0)} ms"
    )


# -- report --------------------------------------------------------------------------

COLUMNS = [
    ("consumed/s", "consumed_per_s", 0),
    ("published/s", "published_per_s", 0),
    ("p50 ms", "p50_ms", 1),
    ("p99 ms", "p99_ms", 1),
    ("peak RSS MB", "rss_peak_mb", 0),
    ("probe max ms", "probe_max_ms", 1),
    ("loop lag ms", "loop_lag_ms", 1),
    ("broker CPU %", "broker_cpu_pct", 0),
    ("gen CPU %", "gen_cpu_pct", 0),
]


def table(rows: list[dict[str, Any]]) -> str:
    head = ["scenario", "broker", *(c[0] for c in COLUMNS), "notes"]
    out = []
    for r in rows:
        cells = [r["scenario"], LABEL[r["broker"]]]
        for _, key, digits in COLUMNS:
            value = r.get(key)
            cells.append("" if key == "loop_lag_ms" and value is None else fmt(value, digits))
        notes = r.get("notes", "")
        if r.get("status", "ok") != "ok":
            notes = f"{r['status']}; {notes}" if notes else r["status"]
        cells.append(notes)
        out.append(cells)
    return markdown_table(head, out, align="ll" + "r" * len(COLUMNS))


# -- main ----------------------------------------------------------------------------


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main() -> int:
    p = argparse.ArgumentParser(description="RoarMQ vs RabbitMQ under overload.")
    p.add_argument("--quick", action="store_true", help="3 s windows, smaller bad cases")
    p.add_argument(
        "--scenarios",
        default=",".join(s.name for s in SCENARIOS),
        help="comma-separated subset of: " + ", ".join(s.name for s in SCENARIOS),
    )
    p.add_argument("--skip-rabbitmq", action="store_true", help="RoarMQ only")
    p.add_argument(
        "--brokers",
        default=",".join(BROKERS),
        help=f"comma-separated, in this order, of: {', '.join(ALL_BROKERS)} (GarageMQ: "
        "Debian's garagemq, for the direct and work-queue rows of docs/benchmarks.md)",
    )
    p.add_argument("--window", type=float, default=0.0, help="seconds measured (10, quick 3)")
    p.add_argument("--warmup", type=float, default=-1.0, help="seconds before (1, quick 0.5)")
    p.add_argument(
        "--bad-timeout",
        type=float,
        default=0.0,
        help="bound on a bad-input case's nacks or binds, s (60, quick 20)",
    )
    p.add_argument("--roarmq-rev", help="run RoarMQ from `git archive REV` (default: work tree)")
    p.add_argument(
        "--reuse-broker",
        action="store_true",
        help="one broker instance per broker for all scenarios (default with --quick)",
    )
    p.add_argument("--json", type=Path, help="default bench/results/overload[-quick].json")
    p.add_argument("--broker-cpu", type=int, default=0)
    p.add_argument("--load-cpu", type=int, default=1)
    args = p.parse_args()
    args.window = args.window or (3.0 if args.quick else 10.0)
    args.warmup = args.warmup if args.warmup >= 0 else (0.5 if args.quick else 1.0)
    args.bad_timeout = args.bad_timeout or (20.0 if args.quick else 60.0)
    args.reuse_broker = args.reuse_broker or args.quick
    name = "overload-quick.json" if args.quick else "overload.json"
    args.json = args.json or RESULTS / name
    chosen = [s for s in SCENARIOS if s.name in args.scenarios.split(",")]
    unknown = set(args.scenarios.split(",")) - {s.name for s in SCENARIOS}
    if not chosen or unknown:
        p.error(f"unknown or no scenarios: {', '.join(sorted(unknown)) or '(none)'}")
    brokers = ("roarmq",) if args.skip_rabbitmq else tuple(args.brokers.split(","))
    if set(brokers) - set(ALL_BROKERS):
        p.error(f"unknown brokers: {', '.join(sorted(set(brokers) - set(ALL_BROKERS)))}")
    if shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        print("warning: no taskset or a single CPU: broker and load are NOT pinned", flush=True)
        args.broker_cpu = args.load_cpu = None
    else:  # this script's own threads (RSS sampler, readers) stay off the broker's core
        os.sched_setaffinity(0, {args.load_cpu})

    signal.signal(signal.SIGTERM, _interrupt)
    procs = Procs()
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    versions: dict[str, str] = {}
    work = Path(tempfile.mkdtemp(prefix="roarbench-overload-"))
    binary, go_version = build_load_generator(work, "bench/overload.py")
    src = export_rev(args.roarmq_rev, work / "roarmq") if args.roarmq_rev else REPO
    print(
        f"overload: brokers {', '.join(brokers)}; scenarios {', '.join(s.name for s in chosen)}; "
        f"{args.window:g} s windows; RoarMQ from {args.roarmq_rev or 'the work tree'}; "
        f"{go_version}; load average {loadavg():.2f}",
        flush=True,
    )

    def record(kind: str, sc: Scenario, row: dict[str, Any]) -> None:
        row = {"scenario": sc.name, "broker": kind, **row}
        rows[(sc.name, kind)] = row
        cells = [f"{label} {fmt(row.get(key), digits)}" for label, key, digits in COLUMNS]
        print(f"  {kind:8} {sc.name:18} " + "  ".join(cells), flush=True)
        print(f"  {'':8} {'':18} {row['status']}; {row.get('notes', '')}", flush=True)

    def attempt(kind: str, sc: Scenario, broker: Monitored) -> None:
        versions[kind] = broker.running.version
        record(kind, sc, run_scenario(procs, broker, binary, sc, args))

    def unavailable(kind: str, exc: Exception) -> dict[str, Any]:
        text = str(exc) if isinstance(exc, BrokerUnavailable) else f"error: {exc}".splitlines()[0]
        print(f"{kind}: {exc}", file=sys.stderr, flush=True)
        return {"status": text}

    try:
        if args.reuse_broker:  # one instance per broker, restarted if it dies
            for kind in brokers:
                pending = list(chosen)
                while pending:
                    try:
                        with monitored_instance(kind, procs, args.broker_cpu, src) as broker:
                            while pending and broker.running.proc.poll() is None:
                                attempt(kind, pending.pop(0), broker)
                    except (BrokerUnavailable, RuntimeError) as exc:
                        row = unavailable(kind, exc)
                        for sc in pending:
                            record(kind, sc, row)
                        pending = []
        else:  # a fresh instance per scenario, brokers alternating
            for sc in chosen:
                for kind in brokers:
                    try:
                        with monitored_instance(kind, procs, args.broker_cpu, src) as broker:
                            attempt(kind, sc, broker)
                    except (BrokerUnavailable, RuntimeError) as exc:
                        record(kind, sc, unavailable(kind, exc))
    except KeyboardInterrupt:
        print("interrupted: stopping everything", file=sys.stderr, flush=True)
        return 130
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)

    ordered = [rows[(s.name, k)] for s in chosen for k in brokers if (s.name, k) in rows]
    print()
    print(table(ordered))
    result = {
        "benchmark": "overload",
        "quick": args.quick,
        "command": command_line(),
        "machine": machine_info(
            go=go_version,
            roarmq_source=args.roarmq_rev or "work tree",
            **{f"{k}_version": v for k, v in versions.items()},
        ),
        "settings": {
            "scenarios": [asdict(s) for s in chosen],
            "body_bytes": 16,
            "window_s": args.window,
            "warmup_s": args.warmup,
            "bad_timeout_s": args.bad_timeout,
            "probe_interval_ms": PROBE_INTERVAL_MS,
            "connect_probe_every_ms": CONNECT_EVERY_MS,
            "fresh_broker_per_scenario": not args.reuse_broker,
            "broker_cpu": args.broker_cpu,
            "load_cpu": args.load_cpu,
        },
        "results": ordered,
    }
    write_json(args.json, result)
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
