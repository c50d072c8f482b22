"""Cluster benchmark: fault rounds (0 lost?) and the cost of replication, RoarMQ vs RabbitMQ.

    .venv/bin/python bench/cluster.py [--rounds 100] [--broker roarmq|rabbitmq|both]
                                      [--quick] [--json bench/results/cluster.json]

A benchmark, not a test (the short version of part 1 is tests/cluster/test_fault_rounds.py,
whose client load this uses: ``tests/cluster/clusterlib.py`` ``FaultLoad``).

Part 1, fault rounds: a 3-node cluster on loopback (``harness.start_roarmq_cluster``: etcd
+ n1..n3, ``lease_ttl`` 2 s, ``replica_lag_ms`` 1000; ``harness.start_rabbitmq_cluster``:
RabbitMQ r1..r3 joined with ``rabbitmqctl join_cluster``, one quorum queue of 3 members).
One publisher (pika, persistent messages, confirms, one at a time, ``mandatory``) and one
consumer (manual acks, prefetch 200) on random nodes, following a 530's "led by node ...
at HOST:PORT", reconnecting on any error and republishing the unconfirmed message; a
publish whose confirm has not come within 2 s has its socket shut (a frozen node). Rounds
cycle through: kill -9 the leader (RabbitMQ: the quorum queue's leader), then restart it
on its data dir; SIGSTOP the leader for ``--freeze`` s, then SIGCONT; kill -9 a follower,
then restart it; (RoarMQ only) kill -9 etcd for ``--etcd-outage`` s, then restart it.
Before each round the cluster must be whole again (every member in sync / online).
failover = fault -> first confirm of a message first published after the fault. At the
end publishing stops, the consumer drains, and lost = confirmed ids never consumed,
duplicated = deliveries beyond the first.

Part 2, cost of replication: the same client load without faults for ``--seconds`` s
(``--publishers`` publisher threads) through our 3-node cluster, our single node
(``harness.start_roarmq``), RabbitMQ's 3-node cluster with a quorum queue; msg/s =
confirmed / seconds (and consumed / seconds). One run each. Everything runs on this
machine unpinned (brokers, etcd and the pika client share its cores).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
from _machine import machine_info
from harness import LocalCluster, Procs

sys.path.insert(0, str(harness.REPO / "tests" / "cluster"))
from clusterlib import FaultLoad  # noqa: E402

QUORUM = {"x-queue-type": "quorum"}
KINDS = {
    "roarmq": ("kill_leader", "freeze_leader", "kill_follower", "kill_etcd"),
    "rabbitmq": ("kill_leader", "freeze_leader", "kill_follower"),
}


def fault_round(kind: str, cluster: LocalCluster, load: FaultLoad, args: Any) -> dict:
    leader_name = cluster.healthy(120)
    if leader_name is None:
        return {"round": kind, "error": "cluster not whole before the round"}
    leader = cluster.members[leader_name]
    follower = next(m for m in cluster.nodes if m is not leader)
    bound = 30.0
    t0 = time.monotonic()
    row: dict[str, Any] = {"round": kind, "leader": leader_name}
    if kind == "kill_leader":
        cluster.kill9(leader)
        took = load.wait_confirm_after(t0, bound)
        cluster.start(leader)
    elif kind == "freeze_leader":
        cluster.freeze(leader)
        time.sleep(args.freeze)
        cluster.thaw(leader)
        took = load.wait_confirm_after(t0, bound)
    elif kind == "kill_follower":
        cluster.kill9(follower)
        took = load.wait_confirm_after(t0, bound)
        cluster.start(follower)
    elif kind == "kill_etcd":
        assert cluster.etcd is not None
        cluster.kill9(cluster.etcd)
        time.sleep(args.etcd_outage)
        back = time.monotonic()
        cluster.start(cluster.etcd)
        took = load.wait_confirm_after(t0, bound)
        restored = load.wait_confirm_after(back, bound)
        row["restored_s"] = None if restored is None else round(restored, 3)
        row["confirmed_while_fenced"] = load.confirmed_between(t0 + args.lease_ttl + 0.3, back)
    else:
        raise AssertionError(kind)
    row["failover_s"] = None if took is None else round(took, 3)
    return row


def run_faults(kind: str, args: Any, procs: Procs, say: Any) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"roarbench-cluster-{kind}-", dir=args.tmp_dir))
    if kind == "roarmq":
        cluster = harness.start_roarmq_cluster(procs, tmp, lease_ttl=args.lease_ttl)
    else:
        cluster = harness.start_rabbitmq_cluster(procs, tmp)
    say(f"{kind} {cluster.version}: 3 nodes up ({tmp})")
    load = FaultLoad(cluster.endpoints, arguments=QUORUM if kind == "rabbitmq" else None)
    rows = []
    try:
        load.start()
        time.sleep(1)
        kinds = KINDS[kind]
        for i in range(args.rounds):
            row = fault_round(kinds[i % len(kinds)], cluster, load, args)
            rows.append(row)
            say(f"  {kind} round {i + 1}/{args.rounds}: {row}")
            if "error" in row:
                break
        cluster.healthy(120)
        load.stop_publishing()
        load.drain(60)
    finally:
        load.stop()
        cluster.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    summary = load.summary()
    say(f"  {kind}: {summary}")
    return {"version": cluster.version, "rounds": rows, "summary": summary}


def rate(kind: str, args: Any, procs: Procs, say: Any) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"roarbench-rate-{kind}-", dir=args.tmp_dir))
    arguments = None
    if kind == "roarmq-cluster":
        cluster = harness.start_roarmq_cluster(procs, tmp, lease_ttl=args.lease_ttl)
        endpoints, version, stop = cluster.endpoints, cluster.version, cluster.stop
    elif kind == "rabbitmq-cluster":
        cluster = harness.start_rabbitmq_cluster(procs, tmp)
        endpoints, version, stop = cluster.endpoints, cluster.version, cluster.stop
        arguments = QUORUM
    else:
        single = harness.start_roarmq(procs, tmp)
        version = single.version

        def endpoints() -> list[tuple[str, int]]:
            return [("127.0.0.1", single.port)]

        def stop() -> None:
            harness.stop_broker(procs, single)

    load = FaultLoad(
        endpoints, queue="rate", arguments=arguments, publishers=args.publishers, confirm_timeout=10
    )
    try:
        load.start()
        time.sleep(2)  # connected and declared
        c0, d0, t0 = len(load.confirmed), len(load.consumed), time.monotonic()
        time.sleep(args.seconds)
        c1, d1, t1 = len(load.confirmed), len(load.consumed), time.monotonic()
        load.stop()
    finally:
        stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    row = {
        "broker": kind,
        "version": version,
        "confirmed_per_s": round((c1 - c0) / (t1 - t0)),
        "consumed_per_s": round((d1 - d0) / (t1 - t0)),
        "errors": dict(load.errors),
    }
    say(f"  rate {row}")
    return row


def fault_table(kind: str, result: dict) -> list[str]:
    lines = []
    by_kind: dict[str, list[dict]] = {}
    for row in result["rounds"]:
        by_kind.setdefault(row["round"], []).append(row)
    for round_kind, rows in by_kind.items():
        times = [r["failover_s"] for r in rows if r.get("failover_s") is not None]
        missing = sum(1 for r in rows if r.get("failover_s") is None)
        med = f"{statistics.median(times):.2f}" if times else "-"
        worst = f"{max(times):.2f}" if times else "-"
        extra = ""
        if round_kind == "kill_etcd":
            fenced = sum(r.get("confirmed_while_fenced", 0) for r in rows)
            restored = [r["restored_s"] for r in rows if r.get("restored_s") is not None]
            extra = f"; confirmed while fenced {fenced}"
            if restored:
                extra += f"; after restart {max(restored):.2f} s max"
        lines.append(
            f"| {harness.LABEL[kind]} {result['version']} | {round_kind} | {len(rows)} | "
            f"{med} | {worst} | {missing}{extra} |"
        )
    s = result["summary"]
    lines.append(
        f"| {harness.LABEL[kind]} {result['version']} | **all** | {len(result['rounds'])} | "
        f"confirmed {s['confirmed']}, consumed {s['consumed']} | **lost {s['lost']}** | "
        f"duplicated {s['duplicated']}, republished {s['republished']} |"
    )
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--broker", choices=("roarmq", "rabbitmq", "both"), default="both")
    p.add_argument("--rounds", type=int, default=12, help="fault rounds per broker")
    p.add_argument("--quick", action="store_true", help="4 rounds (RoarMQ), 3 (RabbitMQ), 10 s")
    p.add_argument("--lease-ttl", type=int, default=2)
    p.add_argument("--freeze", type=float, default=8.0, help="SIGSTOP length, s")
    p.add_argument("--etcd-outage", type=float, default=3.0)
    p.add_argument("--seconds", type=float, default=20.0, help="part 2 run length")
    p.add_argument("--publishers", type=int, default=4)
    p.add_argument("--no-rate", action="store_true")
    p.add_argument("--tmp-dir", type=Path, default=None)
    p.add_argument("--keep", action="store_true", help="keep data dirs and logs")
    p.add_argument("--json", type=Path, default=harness.REPO / "bench" / "results" / "cluster.json")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.seconds = 4, 10.0
    brokers = ("roarmq", "rabbitmq") if args.broker == "both" else (args.broker,)
    t_begin = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - t_begin:6.1f}s] {text}", flush=True)

    procs = Procs()
    result: dict[str, Any] = {
        "machine": machine_info(command=" ".join(sys.argv)),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "faults": {},
        "rate": [],
    }
    try:
        for kind in brokers:
            try:
                rounds = args.rounds if kind == "roarmq" or not args.quick else 3
                saved = args.rounds
                args.rounds = rounds
                result["faults"][kind] = run_faults(kind, args, procs, say)
                args.rounds = saved
            except (harness.BrokerUnavailable, RuntimeError, AssertionError) as exc:
                say(f"{kind} fault rounds skipped: {exc}")
                result["faults"][kind] = {"skipped": str(exc)[:2000]}
        if not args.no_rate:
            kinds = ["roarmq-cluster", "roarmq-single"]
            if "rabbitmq" in brokers:
                kinds.append("rabbitmq-cluster")
            for kind in kinds:
                try:
                    result["rate"].append(rate(kind, args, procs, say))
                except (harness.BrokerUnavailable, RuntimeError, AssertionError) as exc:
                    say(f"{kind} rate skipped: {exc}")
                    result["rate"].append({"broker": kind, "skipped": str(exc)[:2000]})
    finally:
        procs.stop_all()

    lines = [
        "| broker | round | n | failover median, s | failover max, s | no confirm in 30 s |",
        "|---|---|---|---|---|---|",
    ]
    for kind, res in result["faults"].items():
        if "skipped" in res:
            lines.append(f"| {harness.LABEL[kind]} | skipped | | | | |")
        else:
            lines += fault_table(kind, res)
    if result["rate"]:
        lines += ["", "| setup | confirmed msg/s | consumed msg/s |", "|---|---|---|"]
        for row in result["rate"]:
            if "skipped" in row:
                lines.append(f"| {row['broker']} | skipped | |")
            else:
                lines.append(
                    f"| {row['broker']} {row['version']} | {row['confirmed_per_s']} | "
                    f"{row['consumed_per_s']} |"
                )
    table = "\n".join(lines)
    print("\n" + table)
    result["table"] = table
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.json} ({time.monotonic() - t_begin:.0f} s)")
    lost = sum(r.get("summary", {}).get("lost", 0) for r in result["faults"].values())
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
