"""Pipeline benchmark: archive routing throughput on Spark, and the archive's cost to the broker.

    .venv/bin/python bench/pipeline.py [--quick] [--json bench/results/pipeline.json]
                                       [--rows N] [--bindings N] [--skip-spark] [--skip-broker]

A benchmark, not a test. Two parts:

1. Routing. Definitions with ``--bindings`` bindings (default 100,000: 60% wildcard patterns on
   one topic exchange, ``s{i}.*.x`` / ``s{i}.#``, 40% keys on one direct exchange, spread over
   1,000 queues) and a generated archive of ``--rows`` rows (default 10 million) over 24 hours,
   in the broker's own file layout and schema. Routing keys come from a pool of ``--keys``
   distinct keys (default 100,000; 5% match nothing), so keys repeat as they do in real traffic
   ("cached routing keys"); 10% of the rows carry a per-message ``trace`` header. The timed job
   is the routing pass (``pipeline.jobs.analyse``: one ``mapInArrow`` task per core reads its
   row groups, groups identical envelopes with Arrow, routes each with the broker's index, and
   Spark sums the counters), run twice per master in a fresh process each: cold (Python
   workers start, indexes are built) and warm; then once more with the traffic table that
   ``report`` adds. Rows routed per second = archive rows / wall time; per core = / cores.
   Also timed in this process: building the routers for the definitions, and routing every
   distinct envelope of the pool through them once (the Python index alone, uncached).
2. Broker cost. A RoarMQ broker with the archive off, then on (alternating, ``--repeat``
   times each, default 5, a fresh broker each run, load started 2 s after it listens so
   start-up work is not counted), pinned to core 0 with ``taskset`` like bench/throughput.py,
   so the archive's writer thread shares the loop's core; a consumer and a publisher from
   bench/lib/amqp_load.py pinned to core 1: direct exchange, one queue, 16-byte bodies, no-ack,
   ``--messages`` per run (default 1M, ~10 s). The archive rolls every ``--roll-minutes``
   (default 0.05 = 3 s), so Parquet conversions run inside the measured window. Reported:
   median msg/s; broker CPU per message (all its threads) during the run and up to its exit
   (SIGTERM: the last partition converted; from wait4's rusage); cost = 1 - on/off. After
   each archive-on run the archived rows are counted from the data files' footers.

``--quick``: 1 million rows, 1 run per broker setting with 100,000 messages; under two minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from lib import LOAD, REPO, RESULTS
from lib.brokers import start_roarmq
from lib.machine import machine_info
from lib.output import write_json
from lib.pipeline_data import key_pool, make_archive, make_definitions
from lib.procs import Procs, pinned

# -- routing -------------------------------------------------------------------------------


def route_worker(args: argparse.Namespace) -> int:
    """In its own process: route the archive twice under one master; print one JSON line."""
    from roarmq.pipeline.definitions import load_definitions
    from roarmq.pipeline.jobs import ALL, analyse
    from roarmq.pipeline.reader import scan_archive
    from roarmq.pipeline.session import get_spark

    defs = load_definitions(args.defs)
    scan = scan_archive(args.archive)
    t0 = time.monotonic()
    spark, _ = get_spark(args.master, conf={"spark.ui.showConsoleProgress": "false"})
    startup = time.monotonic() - t0
    runs = []
    for label in ("cold", "warm"):
        t0 = time.monotonic()
        result = analyse(spark, scan, [defs])
        seconds = time.monotonic() - t0
        runs.append(
            {
                "run": label,
                "seconds": seconds,
                "rows": result.total(ALL, "rows"),
                "agree": result.total(0, "agree"),
                "routed": result.total(0, "routed"),
            }
        )
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="roarmq-bench-traffic-") as traffic_dir:
        report = analyse(spark, scan, [defs], traffic_dir=Path(traffic_dir) / "traffic.parquet")
    traffic_rows = report.traffic_rows  # what report writes
    report_s = time.monotonic() - t0
    spark.stop()
    print(
        json.dumps(
            {
                "master": args.master,
                "startup_s": startup,
                "runs": runs,
                "with_traffic_s": report_s,
                "traffic_rows": traffic_rows,
            }
        ),
        flush=True,
    )
    return 0


def bench_routing(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from roarmq.pipeline.definitions import load_definitions
    from roarmq.pipeline.router import Router
    from roarmq.protocol.tables import encode_table

    defs_path = tmp / "definitions.json"
    defs_path.write_text(json.dumps(make_definitions(args.bindings)))
    archive = tmp / "archive"
    print(
        f"generating {args.rows:,} archive rows, {args.keys:,} distinct keys, "
        f"{args.bindings:,} bindings ...",
        flush=True,
    )
    gen_s = make_archive(archive, args.rows, args.bindings, args.keys)
    size = sum(p.stat().st_size for p in archive.rglob("*.parquet"))
    print(f"  {gen_s:.1f} s, {size / 1e6:.0f} MB of Parquet", flush=True)

    t0 = time.monotonic()
    router = Router(load_definitions(defs_path))
    build_s = time.monotonic() - t0
    exchanges, keys, _ = key_pool(args.bindings, args.keys)
    trace = encode_table({"trace": 1})
    t0 = time.monotonic()
    for i, (x, k) in enumerate(zip(exchanges, keys, strict=True)):
        router.route("/", x, k, trace if i % 10 == 0 else None)
    distinct_s = time.monotonic() - t0
    print(
        f"  routers built in {build_s:.2f} s; {len(keys):,} distinct envelopes routed in "
        f"{distinct_s:.2f} s ({len(keys) / distinct_s:,.0f}/s, one core)",
        flush=True,
    )

    results = []
    for master in ("local[1]", "local[2]"):
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--route-worker",
            "--master",
            master,
            "--archive",
            str(archive),
            "--defs",
            str(defs_path),
        ]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, cwd=REPO, timeout=args.spark_timeout
        )
        line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
        if proc.returncode != 0 or line is None:
            tail = "\n".join(proc.stderr.splitlines()[-5:])
            results.append({"master": master, "error": f"exit {proc.returncode}: {tail}"})
            print(f"  {master}: failed\n{tail}", flush=True)
            continue
        result = json.loads(line)
        cores = int(master[6:-1])
        for run in result["runs"]:
            run["rows_per_s"] = run["rows"] / run["seconds"]
            run["rows_per_s_per_core"] = run["rows_per_s"] / cores
            if run["rows"] != args.rows or run["agree"] != args.rows:
                run["error"] = f"counted {run['rows']:,} rows, {run['agree']:,} agreeing"
            print(
                f"  {master} {run['run']}: {run['rows']:,} rows in {run['seconds']:.1f} s = "
                f"{run['rows_per_s']:,.0f} rows/s ({run['rows_per_s_per_core']:,.0f} per core)"
                + (f"  {run['error']}" if "error" in run else ""),
                flush=True,
            )
        result["cores"] = cores
        results.append(result)
    return {
        "rows": args.rows,
        "bindings": args.bindings,
        "distinct_keys": args.keys,
        "archive_mb": size / 1e6,
        "generate_s": gen_s,
        "router_build_s": build_s,
        "distinct_envelopes_per_s": len(keys) / distinct_s,
        "masters": results,
    }


# -- broker cost ---------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop(proc: subprocess.Popen) -> float | None:
    """SIGTERM (then SIGKILL) the process group; the CPU seconds the process used in all."""
    for sig, wait in ((signal.SIGTERM, 120.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            except ChildProcessError:  # reaped already
                return None
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                return usage.ru_utime + usage.ru_stime
            time.sleep(0.02)
    return None


def one_broker_run(
    tmp: Path, archive_on: bool, messages: int, cpus: tuple, tag: str, roll_minutes: float
) -> dict:
    base = tmp / tag
    base.mkdir()
    extra = ""
    if archive_on:
        extra = (
            f'\n[archive]\nenabled = true\ndir = "{base / "archive"}"\n'
            f"roll_minutes = {roll_minutes}\n"
        )
    # Stopped here, not by Procs: stop() reaps it to read the CPU it used up to its exit.
    running = start_roarmq(Procs(), base, cpus[0], extra_config=extra)
    broker, port = running.proc, running.port
    procs = [broker]
    try:
        time.sleep(2.0)  # start-up work (the archive's one-off pyarrow warm-up) is not traffic
        scenario = json.dumps(
            {
                "exchange": f"bench.pipeline.{tag}",
                "queue": f"bench.pipeline.q.{tag}",
                "exchange_type": "direct",
                "messages": messages,
                "manual_ack": False,
                "prefetch": 0,
                "confirms": False,
                "window": 1000,
                "batch": 200,
                "bindings": 1,
                "topic_keys": 1,
                "timeout": 60.0,
            }
        )
        load = [sys.executable, str(LOAD)]
        consumer = subprocess.Popen(
            pinned(cpus[1], [*load, "consumer", "--port", str(port), "--scenario", scenario]),
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
            start_new_session=True,
        )
        procs.append(consumer)
        ready = json.loads(consumer.stdout.readline() or "{}")
        if not ready.get("ready"):
            raise RuntimeError(f"consumer not ready: {ready}")
        cpu0 = cpu_seconds(broker.pid)
        publisher = subprocess.Popen(
            pinned(cpus[1], [*load, "publisher", "--port", str(port), "--scenario", scenario]),
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
            start_new_session=True,
        )
        procs.append(publisher)
        consumed = json.loads(consumer.stdout.readline() or "{}")
        broker_cpu = cpu_seconds(broker.pid) - cpu0
        publisher.wait(70)
    finally:
        for proc in reversed(procs[1:]):
            stop(proc)
        # The broker stops gracefully: the archive hands over its last batch and converts
        # the open partitions; that work counts in its total CPU.
        total_cpu = stop(broker)
    received = consumed.get("received")
    result = {
        "archive": archive_on,
        "msgs_per_s": consumed.get("msgs_per_s"),
        "received": received,
        "broker_cpu_us_per_msg": broker_cpu / received * 1e6 if received else None,
        "broker_cpu_to_exit_us_per_msg": (total_cpu - cpu0) / received * 1e6
        if received and total_cpu is not None
        else None,
    }
    if archive_on:
        import pyarrow.parquet as pq

        files = list((base / "archive").rglob("part-*.parquet"))
        result["archived_rows"] = sum(pq.read_metadata(f).num_rows for f in files)
        result["archive_files"] = len(files)
        result["archive_bytes"] = sum(f.stat().st_size for f in files)
    shutil.rmtree(base, ignore_errors=True)
    return result


def bench_broker(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    cpus: tuple = (0, 1)
    if shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        print("  warning: no taskset or one CPU: broker and load are not pinned", flush=True)
        cpus = (None, None)
    runs: dict[bool, list[dict]] = {False: [], True: []}
    for i in range(args.repeat):
        for archive_on in (False, True):
            tag = f"r{i}{int(archive_on)}"
            r = one_broker_run(tmp, archive_on, args.messages, cpus, tag, args.roll_minutes)
            runs[archive_on].append(r)
            extra = (
                f", {r['archived_rows']:,} rows archived in {r['archive_files']} files"
                if archive_on
                else ""
            )
            print(
                f"  archive {'on ' if archive_on else 'off'}: {r['msgs_per_s'] or 0:,.0f} msg/s, "
                f"broker {r['broker_cpu_us_per_msg'] or 0:.2f} us/msg CPU during the run, "
                f"{r['broker_cpu_to_exit_us_per_msg'] or 0:.2f} to its exit{extra}",
                flush=True,
            )

    def median(on: bool, key: str) -> float | None:
        values = [r[key] for r in runs[on] if r.get(key)]
        return statistics.median(values) if values else None

    off, on = median(False, "msgs_per_s"), median(True, "msgs_per_s")
    cpu_off, cpu_on = median(False, "broker_cpu_us_per_msg"), median(True, "broker_cpu_us_per_msg")
    exit_off = median(False, "broker_cpu_to_exit_us_per_msg")
    exit_on = median(True, "broker_cpu_to_exit_us_per_msg")
    return {
        "messages": args.messages,
        "repeat": args.repeat,
        "roll_minutes": args.roll_minutes,
        "cpu_to_exit_us_per_msg_off": exit_off,
        "cpu_to_exit_us_per_msg_on": exit_on,
        "cpu_to_exit_cost": exit_on / exit_off - 1 if exit_on and exit_off else None,
        "archive_files_median": median(True, "archive_files"),
        "archive_bytes_per_row": statistics.median(
            r["archive_bytes"] / r["archived_rows"] for r in runs[True] if r.get("archived_rows")
        )
        if any(r.get("archived_rows") for r in runs[True])
        else None,
        "pinned": cpus[0] is not None,
        "msgs_per_s_off": off,
        "msgs_per_s_on": on,
        "cost": 1 - on / off if on and off else None,
        "cpu_us_per_msg_off": cpu_off,
        "cpu_us_per_msg_on": cpu_on,
        "cpu_cost": cpu_on / cpu_off - 1 if cpu_on and cpu_off else None,
        "runs": runs[False] + runs[True],
    }


# -- report --------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    java = "?"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
        java = (out.stderr or out.stdout).splitlines()[0]
    try:
        import pyspark

        spark = pyspark.__version__
    except ImportError:
        spark = None
    import pyarrow

    return machine_info(java=java, spark=spark, pyarrow=pyarrow.__version__)


def table(result: dict[str, Any]) -> str:
    out = ["| measure | result | target |", "|---|---:|---|"]
    routing = result.get("routing")
    if routing:
        out.append(
            f"| archive rows / bindings / distinct keys | {routing['rows']:,} / "
            f"{routing['bindings']:,} / {routing['distinct_keys']:,} | |"
        )
        warm: dict[str, float] = {}
        for m in routing["masters"]:
            if "error" in m:
                out.append(f"| routing {m['master']} | failed | |")
                continue
            for run in m["runs"]:
                target = "≥ 1,000,000 rows/s per core" if run["run"] == "warm" else ""
                out.append(
                    f"| routing {m['master']}, {run['run']} | {run['rows_per_s']:,.0f} rows/s"
                    f" = {run['rows_per_s_per_core']:,.0f} per core ({run['seconds']:.1f} s)"
                    f" | {target} |"
                )
                if run["run"] == "warm":
                    warm[m["master"]] = run["rows_per_s"]
            if "with_traffic_s" in m:
                rate = routing["rows"] / m["with_traffic_s"]
                out.append(
                    f"| routing + traffic table (report's pass) {m['master']} | "
                    f"{rate:,.0f} rows/s ({m['with_traffic_s']:.1f} s, "
                    f"{m['traffic_rows']:,} traffic rows) | |"
                )
        if len(warm) == 2:
            out.append(
                f"| scaling local[1] -> local[2] (warm) | "
                f"{warm['local[2]'] / warm['local[1]']:.2f}x | |"
            )
        out.append(
            f"| routers built (driver, {routing['bindings']:,} bindings) | "
            f"{routing['router_build_s']:.2f} s | |"
        )
        out.append(
            f"| distinct envelopes through the index, uncached, one core | "
            f"{routing['distinct_envelopes_per_s']:,.0f} /s | |"
        )
    broker = result.get("broker")
    if broker:
        out.append(
            f"| broker direct msg/s, archive off (median of {broker['repeat']}) | "
            f"{broker['msgs_per_s_off'] or 0:,.0f} | |"
        )
        out.append(
            f"| broker direct msg/s, archive on (median of {broker['repeat']}) | "
            f"{broker['msgs_per_s_on'] or 0:,.0f} | |"
        )
        cost = broker["cost"]
        out.append(
            f"| archive cost on throughput | {cost:.1%} | ≤ 15% |"
            if cost is not None
            else "| archive cost on throughput | - | ≤ 15% |"
        )
        if broker["cpu_cost"] is not None:
            out.append(
                f"| broker CPU per message during the run, off -> on | "
                f"{broker['cpu_us_per_msg_off']:.2f} -> {broker['cpu_us_per_msg_on']:.2f} us "
                f"({broker['cpu_cost']:+.1%}) | |"
            )
        if broker.get("cpu_to_exit_cost") is not None:
            out.append(
                f"| broker CPU per message up to its exit (last files written), off -> on | "
                f"{broker['cpu_to_exit_us_per_msg_off']:.2f} -> "
                f"{broker['cpu_to_exit_us_per_msg_on']:.2f} us "
                f"({broker['cpu_to_exit_cost']:+.1%}) | |"
            )
        if broker.get("archive_bytes_per_row") is not None:
            out.append(
                f"| archive files per run (roll_minutes {broker['roll_minutes']:g}), bytes a row | "
                f"{broker['archive_files_median']:.0f}, {broker['archive_bytes_per_row']:.1f} | |"
            )
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1M rows, one broker run each; < 2 min")
    p.add_argument("--json", type=Path, default=RESULTS / "pipeline.json")
    p.add_argument("--rows", type=int, default=0, help="archive rows (default 10M, quick 1M)")
    p.add_argument("--bindings", type=int, default=100_000)
    p.add_argument("--keys", type=int, default=100_000, help="distinct routing keys")
    p.add_argument(
        "--messages",
        type=int,
        default=0,
        help="messages per broker run (default 1,000,000, quick 100,000)",
    )
    p.add_argument("--repeat", type=int, default=0, help="broker runs per setting (5, quick 1)")
    p.add_argument(
        "--roll-minutes",
        type=float,
        default=0.05,
        help="the archive's roll_minutes in the broker runs (default 0.05: a Parquet file every "
        "3 s, so conversions happen during the measured window)",
    )
    p.add_argument("--skip-spark", action="store_true")
    p.add_argument("--skip-broker", action="store_true")
    p.add_argument("--spark-timeout", type=float, default=1800.0)
    p.add_argument("--route-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--master", help=argparse.SUPPRESS)
    p.add_argument("--archive", help=argparse.SUPPRESS)
    p.add_argument("--defs", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.route_worker:
        return route_worker(args)
    args.rows = args.rows or (1_000_000 if args.quick else 10_000_000)
    args.messages = args.messages or (100_000 if args.quick else 1_000_000)
    args.repeat = args.repeat or (1 if args.quick else 5)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    started = time.monotonic()
    result: dict[str, Any] = {
        "command": "bench/pipeline.py" + (" --quick" if args.quick else ""),
        "machine": machine(),
    }
    print(
        f"pipeline bench: {'quick' if args.quick else 'full'} run; "
        f"load average {result['machine']['loadavg']}",
        flush=True,
    )
    tmp = Path(tempfile.mkdtemp(prefix="roarbench-pipeline-"))
    try:
        if not args.skip_spark:
            result["routing"] = bench_routing(args, tmp)
        if not args.skip_broker:
            print(
                f"broker cost: {args.messages:,} messages x {args.repeat} per setting", flush=True
            )
            result["broker"] = bench_broker(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["seconds"] = time.monotonic() - started
    print()
    print(table(result))
    write_json(args.json, result)
    print(f"\n{result['seconds']:.0f} s; wrote {args.json}")
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    sys.exit(main())
