"""The pipeline end to end at scale: `report` and `whatif` as a user runs them, per stage.

    .venv/bin/python bench/pipeline_scale.py [--rows 100000000] [--keys 1000000] [--zipf 1.1]
        [--bindings 100000] [--masters local[1],local[2],standalone] [--json FILE] [--quick]

A benchmark, not a test. It generates a synthetic archive in the broker's own layout and schema
(bench/lib/pipeline_data.py, bench/pipeline.py's too: ``--bindings`` bindings, 60% topic wildcards and 40% direct
keys over 1,000 queues; ``--rows`` rows over 24 hours; routing keys drawn by Zipf's law over a
pool of ``--keys`` distinct keys, 5% of which match nothing; 10% of rows with a per-message
header), a candidate definitions file (1% of the bindings removed, as many new ones added), and
then runs the real commands, ``python -m roarmq.pipeline report`` and ``whatif``, each in a fresh
process, on every master of ``--masters``: ``local[1]``, ``local[2]``, and ``standalone`` (a
Spark standalone master and two one-core workers started here from the installed pyspark, on
loopback). Reported per run: wall time (process start to exit: JVM start, Parquet read,
grouping, routing, Spark's aggregation, output), rows/s and rows/s per core, and where the time
goes: the seconds the workers spent loading the definitions, reading Parquet, grouping
envelopes, building and writing the traffic table, and routing (``summary.json``'s
``seconds.workers``, added up over the workers), the analysis's wall time, and the output's
(tables, charts, page). Each stage's rate is rows / its worker-seconds, i.e. rows/s on one core.

``--quick``: 2 million rows, 100,000 keys; a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from lib import RESULTS
from lib.machine import machine_info
from lib.output import write_json
from lib.pipeline_data import make_archive, make_definitions
from support.waiting import free_port


def candidate_of(defs: dict[str, Any]) -> dict[str, Any]:
    """The same definitions with 1% of the bindings removed and as many new ones added."""
    rng = random.Random(5)
    bindings = list(defs["bindings"])
    changed = max(1, len(bindings) // 100)
    for i in sorted(rng.sample(range(len(bindings)), changed), reverse=True):
        del bindings[i]
    for i in range(changed):
        bindings.append(
            {
                "source": "bench.topic",
                "vhost": "/",
                "destination": f"q{i % 1000}",
                "destination_type": "queue",
                "routing_key": f"s{i}.#",
                "arguments": {},
            }
        )
    return {**defs, "bindings": bindings}


class Standalone:
    """A standalone master and `workers` one-core workers, started and stopped here."""

    def __init__(self, tmp: Path, workers: int = 2, memory: str = "4g") -> None:
        import pyspark

        spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
        self.env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
        self.env["SPARK_HOME"] = str(spark_class.parent.parent)
        port, ui = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{port}"
        self.procs = []
        self.log = tmp / "standalone.log"
        out = open(self.log, "wb")  # noqa: SIM115 - closed in stop()
        self._out = out
        self.procs.append(
            subprocess.Popen(
                [str(spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
                + ["--port", str(port), "--webui-port", str(ui)],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        )
        for i in range(workers):
            env = {**self.env, "SPARK_WORKER_DIR": str(tmp / f"worker{i}")}
            self.procs.append(
                subprocess.Popen(
                    [str(spark_class), "org.apache.spark.deploy.worker.Worker", self.url]
                    + ["--host", "127.0.0.1", "--cores", "1", "--memory", memory]
                    + ["--webui-port", str(free_port())],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as r:
                    if json.loads(r.read())["aliveworkers"] >= workers:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"standalone cluster did not come up; see {self.log}")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        self._out.close()


def run_command(
    command: str, master: str, archive: Path, defs: Path, candidate: Path, out: Path, timeout: float
) -> dict[str, Any]:
    args = [sys.executable, "-m", "roarmq.pipeline", command, "--archive", str(archive)]
    args += ["--definitions", str(defs), "--out", str(out), "--master", master]
    # Local mode's executors live in the driver's JVM; a cluster's get the workers' memory.
    args += ["--conf", "spark.driver.memory=6g", "--conf", "spark.executor.memory=3g"]
    if command == "whatif":
        args += ["--candidate", str(candidate)]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    started = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        return {"error": "\n".join(proc.stderr.splitlines()[-5:]), "wall_s": wall}
    summary = json.loads((out / "summary.json").read_text())
    return {"wall_s": wall, "rows": summary["rows_read"], "seconds": summary["seconds"]}


def table(result: dict[str, Any]) -> str:
    lines = [
        "| master | command | cores | wall s | rows/s | rows/s per core | setup s | read | group | "
        "traffic | route | analysis s | output s |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in result["runs"]:
        if "error" in r:
            lines.append(f"| {r['master']} | {r['command']} | {r['cores']} | failed: {r['error']}")
            continue
        w = r["seconds"]["workers"]
        rate = {k: (f"{r['rows'] / v / 1e6:.2f}M" if v > 0.01 else "-") for k, v in w.items()}
        lines.append(
            f"| {r['master']} | {r['command']} | {r['cores']} | {r['wall_s']:.1f} | "
            f"{r['rows'] / r['wall_s']:,.0f} | {r['rows'] / r['wall_s'] / r['cores']:,.0f} | "
            f"{w['setup']:.1f} | {rate['read']} | {rate['group']} | {rate['traffic']} | "
            f"{rate['route']} | "
            f"{r['seconds']['analyse']:.1f} | {r['seconds']['output']:.1f} |"
        )
    lines.append("")
    lines.append(
        "setup: seconds the workers spent loading the definitions and building their indexes; "
        "read / group / traffic / route: rows per second of one worker's time in that stage "
        "(rows / worker-seconds)."
    )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=100_000_000)
    p.add_argument("--keys", type=int, default=1_000_000, help="distinct routing keys")
    p.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of key popularity")
    p.add_argument("--bindings", type=int, default=100_000)
    p.add_argument("--masters", default="local[1],local[2],standalone")
    p.add_argument("--commands", default="report,whatif")
    p.add_argument("--quick", action="store_true", help="2M rows, 100k keys")
    p.add_argument("--timeout", type=float, default=3600.0, help="per command, seconds")
    p.add_argument("--keep", type=Path, help="generate the archive here and keep it (reused)")
    p.add_argument("--json", type=Path, default=RESULTS / "pipeline_scale.json")
    args = p.parse_args()
    if args.quick:
        args.rows, args.keys = 2_000_000, 100_000
    tmp = Path(tempfile.mkdtemp(prefix="roarmq-pipeline-scale-"))
    root = args.keep or tmp
    root.mkdir(parents=True, exist_ok=True)
    try:
        defs_path, cand_path, archive = (
            root / "defs.json",
            root / "candidate.json",
            root / "archive",
        )
        defs = make_definitions(args.bindings)
        defs_path.write_text(json.dumps(defs))
        cand_path.write_text(json.dumps(candidate_of(defs)))
        if not archive.exists():
            print(
                f"generating {args.rows:,} rows, {args.keys:,} keys (Zipf {args.zipf}), "
                f"{args.bindings:,} bindings ...",
                flush=True,
            )
            gen_s = make_archive(archive, args.rows, args.bindings, args.keys, zipf=args.zipf)
            print(f"  {gen_s:.0f} s", flush=True)
        size = sum(f.stat().st_size for f in archive.rglob("*.parquet"))
        runs = []
        for master in args.masters.split(","):
            cluster = Standalone(tmp) if master == "standalone" else None
            try:
                url = cluster.url if cluster else master
                cores = 2 if cluster else int(master[6:-1])
                for command in args.commands.split(","):
                    out = tmp / f"out-{command}"
                    shutil.rmtree(out, ignore_errors=True)
                    print(f"{command} on {master} ...", flush=True)
                    r = run_command(command, url, archive, defs_path, cand_path, out, args.timeout)
                    r.update(master=master, command=command, cores=cores)
                    if "error" not in r and r["rows"] != args.rows:
                        r["error"] = f"read {r['rows']:,} rows of {args.rows:,}"
                    print(f"  {json.dumps(r)}", flush=True)
                    runs.append(r)
            finally:
                if cluster:
                    cluster.stop()
        result = {
            "machine": machine_info(),
            "rows": args.rows,
            "keys": args.keys,
            "zipf": args.zipf,
            "bindings": args.bindings,
            "archive_mb": size / 1e6,
            "runs": runs,
        }
        print(table(result))
        write_json(args.json, result)
        return 0 if all("error" not in r for r in runs) else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
