"""The capacity load (bench/go's ``capacity`` role: publishers keeping many persistent
messages unconfirmed, consumers acking each) against one broker or a cluster's leader, and the
row it makes: rates, latency, and the CPU of every broker process group, the generator and
whatever else ran (bench/cluster.py's capacity and scale parts, bench/cluster_profile.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from lib.observe import loadavg, machine_busy_s
from lib.procs import Procs, group_cpu_s


def target(name: str, port: int, vhost: str, args: Any, arguments: dict | None = None) -> dict:
    """One queue's share of the load, on ``port`` and ``vhost``: ``args`` carries the
    ``--cap-publishers``, ``--cap-window``, ``--cap-consumers`` and ``--cap-prefetch``
    settings; ``arguments`` the queue's (RabbitMQ: ``x-queue-type: quorum``)."""
    return {
        "name": name,
        "port": port,
        "vhost": vhost,
        "queue": f"cap-{name}",
        "arguments": arguments or {},
        "persistent": True,
        "publishers": args.cap_publishers,
        "confirm_window": args.cap_window,
        "batch": 100,
        "consumers": args.cap_consumers,
        "prefetch": args.cap_prefetch,
    }


def cpu_of(pgids: dict[str, int]) -> dict[str, float]:
    """utime + stime (s) so far of each named process group (/proc/PID/stat), and the
    whole machine's busy time (``"_machine"``: /proc/stat, every CPU, idle and iowait
    excluded), so that what other processes used during the window can be told."""
    out = {name: group_cpu_s(pgid) for name, pgid in pgids.items()}
    out["_machine"] = machine_busy_s()
    return out


def run_generator(binary: Path, spec: dict, procs: Procs, pgids: dict[str, int]) -> dict:
    """Run the generator; the brokers' CPU times are read when it says the window opens
    and closes. Its result plus ``broker_cpu_s`` (per process group) and ``loadavg``."""
    proc = procs.start(
        [str(binary), json.dumps(spec)],
        instance="cluster-load",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    cpu0: dict[str, float] = {}
    cpu1: dict[str, float] = {}
    result: dict[str, Any] = {}
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            msg = json.loads(line)
            if msg.get("window_start"):
                cpu0 = cpu_of(pgids)
            elif msg.get("window_end"):
                cpu1 = cpu_of(pgids)
            elif "ready" not in msg:
                result = msg
        proc.wait(30)
    finally:
        procs.stop(proc, grace=3)
    if "error" in result or not cpu1:
        err = proc.stderr.read() if proc.stderr else ""
        raise RuntimeError(f"generator failed: {result} {err[-2000:]}")
    busy = cpu1.pop("_machine") - cpu0.pop("_machine")
    result["broker_cpu_s"] = {k: round(cpu1[k] - cpu0[k], 3) for k in cpu0}
    ours = sum(result["broker_cpu_s"].values()) + result["cpu_s"]
    result["others_cores"] = round(max(0.0, busy - ours) / result["window_s"], 2)
    result["loadavg"] = loadavg()
    return result


def summarise(kind: str, version: str, res: dict, extra: dict) -> dict:
    """A row: rates over the window, broker CPU per message received."""
    window = res["window_s"]
    confirmed = sum(t["confirmed"] for t in res["targets"])
    received = sum(t["received"] for t in res["targets"])
    brokers = {k: v for k, v in res["broker_cpu_s"].items() if k != "etcd"}
    broker_cpu = sum(brokers.values())
    row = {
        "setup": kind,
        "version": version,
        "window_s": round(window, 2),
        "confirmed_per_s": round(confirmed / window),
        "received_per_s": round(received / window),
        "per_target": [
            {
                "name": t["name"],
                "vhost": t["vhost"],
                "port": t["port"],
                "confirmed_per_s": round(t["confirmed"] / window),
                "received_per_s": round(t["received"] / window),
                "latency_p50_ms": t["p50_ms"],
                "latency_p99_ms": t["p99_ms"],
                "errors": t["errors"],
                "blocked": t["blocked"],
            }
            for t in res["targets"]
        ],
        "broker_cpu_s": res["broker_cpu_s"],
        "broker_cores": round(broker_cpu / window, 2),
        "broker_cpu_us_per_msg": round(1e6 * broker_cpu / received, 1) if received else None,
        "generator_cores": round(res["cpu_s"] / window, 2),
        "others_cores": res["others_cores"],
        "others_cores_before": res.get("others_cores_before"),
        "loadavg_after": res["loadavg"],
        **extra,
    }
    lat = [t for t in res["targets"] if t.get("p50_ms") is not None]
    if lat:
        row["latency_p50_ms"] = round(max(t["p50_ms"] for t in lat), 1)
        row["latency_p99_ms"] = round(max(t["p99_ms"] for t in lat), 1)
    return row
