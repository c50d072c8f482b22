"""Cluster benchmark: fault rounds (0 lost?), the cost of replication and scale-out.

    .venv/bin/python bench/cluster.py [--rounds 100] [--broker roarmq|rabbitmq|both]
                                      [--parts faults,rate,capacity,scale] [--quick]
                                      [--json bench/results/cluster.json]

A benchmark, not a test (the short version of the fault rounds is tests/cluster/test_fault_rounds.py,
whose client load this uses: ``tests/support/clusterlib.py`` ``FaultLoad``).

Fault rounds (`faults`): a 3-node cluster on loopback (bench/lib/clusters.py's
``start_roarmq_cluster``: etcd + n1..n3, ``lease_ttl`` 2 s, ``replica_lag_ms`` 1000;
``start_rabbitmq_cluster``:
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

Cost of replication (`rate`): the same client load without faults for ``--seconds`` s
(``--publishers`` publisher threads) through our 3-node cluster, our single node
(``start_roarmq``), RabbitMQ's 3-node cluster with a quorum queue; msg/s =
confirmed / seconds (and consumed / seconds). One run each. Everything runs on this
machine unpinned (brokers, etcd and the pika client share its cores). The rate part measures
confirm latency (each pika publisher waits for every confirm), not capacity.

Capacity (`capacity`): many confirms in flight. The load generator is bench/go's capacity
role (Debian's golang-go; standard library only): per queue
``--cap-publishers`` connections, each keeping up to ``--cap-window`` persistent messages
(16-byte bodies) unconfirmed, written ``batch`` 100 per write, and ``--cap-consumers``
consumers with manual acks (one basic.ack per delivery) and ``--cap-prefetch``; one
durable queue (RabbitMQ: ``x-queue-type: quorum``). Every client connects to the leader
(ours: the vhost's; RabbitMQ: r1, where the queue is declared, so its Raft leader).
Setups: our 3-node cluster, our single node, RabbitMQ's 3-node cluster. After
``--cap-warmup`` s, a ``--cap-seconds`` window: messages confirmed and consumed, publish
-> deliver latency, and utime + stime of every broker process group from /proc (read when
the generator opens and closes the window), the generator's own CPU, and what every other
process on the machine used (/proc/stat busy time minus ours). ``--repeat`` runs per setup
on fresh brokers; the table shows the median run and every run's rate.

Scale-out (`scale`): two vhosts (``/`` and ``v2``), each with the capacity load, at once: both
on one single-node broker, against a 2-node cluster whose vhosts are led by different
nodes (placement puts ``v2`` on the node not leading ``/``; if not, ``move_vhost_leader``)
with ``--scale-replicas`` copies of each (2: each node also follows the other's vhost;
1: no replication, the pure partitioning). Aggregate confirmed msg/s and broker CPU per
message; the target is 1.7 times the single node's aggregate.

Before each measured window the script waits (``--quiet-wait`` s at most) for the other
processes on the machine to use under 0.3 cores; what they used during the window is in
the table ("others"). Parts not run keep their last results in the JSON file.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lib import RESULTS
from lib.brokers import LABEL, BrokerUnavailable, start_roarmq, stop_broker
from lib.capacity import run_generator, summarise, target
from lib.clusters import LocalCluster, start_rabbitmq_cluster, start_roarmq_cluster
from lib.golang import build_load_generator
from lib.machine import machine_info, tree_state
from lib.management_api import api
from lib.observe import machine_busy_s
from lib.output import read_json, settings_of, write_json
from lib.procs import Procs
from support.clusterlib import FaultLoad

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
        cluster = start_roarmq_cluster(procs, tmp, lease_ttl=args.lease_ttl)
    else:
        cluster = start_rabbitmq_cluster(procs, tmp)
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
        cluster = start_roarmq_cluster(procs, tmp, lease_ttl=args.lease_ttl)
        endpoints, version, stop = cluster.endpoints, cluster.version, cluster.stop
    elif kind == "rabbitmq-cluster":
        cluster = start_rabbitmq_cluster(procs, tmp)
        endpoints, version, stop = cluster.endpoints, cluster.version, cluster.stop
        arguments = QUORUM
    else:
        single = start_roarmq(procs, tmp)
        version = single.version

        def endpoints() -> list[tuple[str, int]]:
            return [("127.0.0.1", single.port)]

        def stop() -> None:
            stop_broker(procs, single)

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


# -- capacity (many confirms in flight) and scale-out -------------------------------------


def wait_for(what: str, check: Any, timeout: float = 60) -> Any:
    """Poll ``check()`` (errors count as not yet) until it is truthy."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except (OSError, ValueError, KeyError) as exc:
            last = exc
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what} (last error: {last})")


def add_vhost(mgmt_ports: list[int], vhost: str) -> None:
    """Create ``vhost`` (on the first port) and give guest every permission on it on each
    node (users and permissions are still each node's own: docs/cluster.md). The cluster is
    ready once one node answers for ``/``: another's API may not be listening yet."""
    wait_for(
        f"vhost {vhost} made on :{mgmt_ports[0]}",
        lambda: api(mgmt_ports[0], "PUT", f"/api/vhosts/{vhost}", {}) or True,
    )
    perms = {"configure": ".*", "write": ".*", "read": ".*"}
    for port in mgmt_ports:
        wait_for(
            f"vhost {vhost} on :{port}",
            lambda port=port: api(port, "PUT", f"/api/permissions/{vhost}/guest", perms) or True,
        )


def wait_quiet(say: Any, limit: float, cores: float = 0.3, wait: float = 180) -> float:
    """Wait (at most ``wait`` s) until the machine's busy time over 2 s is below ``cores``
    (other engineers' jobs share it); the last figure seen."""
    deadline = time.monotonic() + wait
    while True:
        b0 = machine_busy_s()
        time.sleep(2)
        busy = (machine_busy_s() - b0) / 2
        if busy < cores or time.monotonic() > deadline or limit <= 0:
            return round(busy, 2)
        say(f"  machine busy ({busy:.2f} cores used by others): waiting")
        time.sleep(5)


def capacity(kind: str, binary: Path, args: Any, procs: Procs, say: Any) -> dict:
    """One setup under the windowed-confirm load, clients on the (queue's) leader."""
    tmp = Path(tempfile.mkdtemp(prefix=f"roarbench-cap-{kind}-", dir=args.tmp_dir))
    cluster: LocalCluster | None = None
    single = None
    try:
        if kind == "roarmq-single":
            single = start_roarmq(procs, tmp)
            version, port, leader = single.version, single.port, "single"
            pgids = {"single": single.proc.pid}
            arguments = None
        else:
            if kind == "roarmq-cluster":
                cluster = start_roarmq_cluster(procs, tmp, lease_ttl=args.lease_ttl)
                leader = cluster.healthy(60) or "?"
                arguments = None
            else:
                cluster = start_rabbitmq_cluster(procs, tmp)
                leader = cluster.nodes[0].name  # declared there: client-local leader
                arguments = QUORUM
            version = cluster.version
            port = cluster.members[leader].port
            pgids = {m.name: m.proc.pid for m in cluster.nodes if m.proc is not None}
            if cluster.etcd is not None and cluster.etcd.proc is not None:
                pgids["etcd"] = cluster.etcd.proc.pid
        say(f"  capacity {kind} {version}: clients on {leader} (:{port})")
        spec = {
            "role": "capacity",
            "warmup_s": args.cap_warmup,
            "window_s": args.cap_seconds,
            "targets": [target("q", port, "/", args, arguments)],
        }
        quiet = wait_quiet(say, args.quiet_wait, wait=args.quiet_wait)
        res = run_generator(binary, spec, procs, pgids)
        res["others_cores_before"] = quiet
        extra: dict[str, Any] = {"leader": leader}
        if cluster is not None and cluster.kind == "rabbitmq":
            extra["queue_leader"] = cluster.leader()[0]
        row = summarise(kind, version, res, extra)
    finally:
        if cluster is not None:
            cluster.stop()
        if single is not None:
            stop_broker(procs, single)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    say(f"  capacity {row}")
    return row


def scale_out(kind: str, binary: Path, args: Any, procs: Procs, say: Any) -> dict:
    """Two vhosts ("/" and "v2") under load at once: on one single-node broker, or on a
    2-node cluster with each vhost led by a different node (``--scale-replicas`` copies)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"roarbench-scale-{kind}-", dir=args.tmp_dir))
    cluster: LocalCluster | None = None
    single = None
    extra: dict[str, Any] = {}
    try:
        if kind == "roarmq-single":
            single = start_roarmq(procs, tmp, management=True)
            assert single.mgmt_port is not None
            add_vhost([single.mgmt_port], "v2")
            version = single.version
            ports = {"/": single.port, "v2": single.port}
            pgids = {"single": single.proc.pid}
            extra["leaders"] = {"/": "single", "v2": "single"}
        else:
            replicas = int(kind.rsplit("r", 1)[1])  # roarmq-2nodes-r2
            cluster = start_roarmq_cluster(
                procs, tmp, nodes=2, lease_ttl=args.lease_ttl, replicas=replicas
            )
            version = cluster.version
            mgmt = [m.mgmt_port or 0 for m in cluster.nodes]
            add_vhost(mgmt, "v2")
            first = wait_for("a leader of /", lambda: cluster.vhost_row("/").get("leader"))
            other = next(m.name for m in cluster.nodes if m.name != first)

            def placed() -> bool:
                row = cluster.vhost_row("v2")
                return bool(row.get("leader")) and len(row.get("in_sync") or ()) == replicas

            wait_for("v2 led and in sync", placed)
            if cluster.vhost_row("v2")["leader"] != other:
                if other not in cluster.vhost_row("v2")["in_sync"]:
                    raise RuntimeError(f"v2 cannot move to {other}: not in sync")
                api(mgmt[0], "POST", "/api/vhosts/v2/leader", {"node": other}, timeout=30)
                wait_for("v2 moved", lambda: cluster.vhost_row("v2").get("leader") == other)
            leaders = {v: cluster.vhost_row(v)["leader"] for v in ("/", "v2")}
            if leaders["/"] == leaders["v2"]:
                raise RuntimeError(f"both vhosts led by {leaders['/']}")
            extra["leaders"] = leaders
            extra["members"] = {v: cluster.vhost_row(v).get("members") for v in ("/", "v2")}
            ports = {v: cluster.members[n].port for v, n in leaders.items()}
            pgids = {m.name: m.proc.pid for m in cluster.nodes if m.proc is not None}
            if cluster.etcd is not None and cluster.etcd.proc is not None:
                pgids["etcd"] = cluster.etcd.proc.pid
        say(f"  scale-out {kind} {version}: {extra['leaders']}")
        spec = {
            "role": "capacity",
            "warmup_s": args.cap_warmup,
            "window_s": args.cap_seconds,
            "targets": [
                target("a", ports["/"], "/", args),
                target("b", ports["v2"], "v2", args),
            ],
        }
        quiet = wait_quiet(say, args.quiet_wait, wait=args.quiet_wait)
        res = run_generator(binary, spec, procs, pgids)
        res["others_cores_before"] = quiet
        row = summarise(kind, version, res, extra)
    finally:
        if cluster is not None:
            cluster.stop()
        if single is not None:
            stop_broker(procs, single)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    say(f"  scale-out {row}")
    return row


def repeated(kind: str, part: Any, binary: Path, args: Any, procs: Procs, say: Any) -> dict:
    """``--repeat`` runs of one setup, each on a fresh broker: the median run (by confirmed
    msg/s) with every run's figures in ``runs``."""
    runs = []
    for i in range(args.repeat):
        try:
            runs.append(part(kind, binary, args, procs, say))
        except (BrokerUnavailable, RuntimeError, AssertionError) as exc:
            say(f"{kind} run {i + 1} skipped: {exc}")
            if isinstance(exc, BrokerUnavailable):
                break
    if not runs:
        return {"setup": kind, "skipped": "no run completed (see the log above)"}
    ordered = sorted(runs, key=lambda r: r["confirmed_per_s"])
    row = dict(ordered[(len(ordered) - 1) // 2])
    row["runs"] = [
        {
            k: r[k]
            for k in (
                "confirmed_per_s",
                "received_per_s",
                "broker_cores",
                "broker_cpu_us_per_msg",
                "others_cores",
            )
        }
        for r in runs
    ]
    row["failed_runs"] = args.repeat - len(runs)
    return row


CAP_LABEL = {
    "roarmq-cluster": "RoarMQ 3-node cluster (clients on the leader)",
    "roarmq-single": "RoarMQ single node",
    "rabbitmq-cluster": "RabbitMQ 3-node cluster, quorum queue (clients on its leader)",
}


def cap_label(kind: str) -> str:
    if kind in CAP_LABEL:
        return CAP_LABEL[kind]
    replicas = kind.rsplit("r", 1)[1]
    return f"RoarMQ 2 nodes, one vhost led by each, replicas = {replicas}"


def capacity_table(rows: list[dict], scale: bool) -> list[str]:
    """The median run of each setup; every run's confirmed msg/s; the CPU of the brokers
    (per process: n1, n2, ...), the generator and every other process on the machine."""
    head = "| setup | confirmed msg/s (median) | runs | consumed msg/s | latency p50 / p99, ms |"
    head += " broker CPU, cores | broker CPU µs/msg | generator / others, cores |"
    if scale:
        head = head.replace("| setup |", "| setup (2 vhosts at once) |")
        head += " per vhost, confirmed msg/s |"
    lines = [head, "|" + "---|" * head.count(" |")]
    base = None
    for row in rows:
        if "skipped" in row:
            lines.append(f"| {cap_label(row['setup'])} | skipped: {row['skipped'][:80]} |")
            continue
        if scale and row["setup"] == "roarmq-single":
            base = row["confirmed_per_s"]
        cpu = " + ".join(f"{k} {v / row['window_s']:.2f}" for k, v in row["broker_cpu_s"].items())
        runs = ", ".join(f"{r['confirmed_per_s']:,}" for r in row.get("runs", [row]))
        line = (
            f"| {cap_label(row['setup'])} {row['version']} | {row['confirmed_per_s']:,} | "
            f"{runs} | {row['received_per_s']:,} | {row.get('latency_p50_ms', '-')} / "
            f"{row.get('latency_p99_ms', '-')} | {row['broker_cores']} ({cpu}) | "
            f"{row['broker_cpu_us_per_msg']} | {row['generator_cores']} / "
            f"{row['others_cores']} |"
        )
        if scale:
            per = ", ".join(f"`{t['vhost']}` {t['confirmed_per_s']:,}" for t in row["per_target"])
            line += f" {per} |"
        lines.append(line)
    ratios = []
    if scale and base:
        for row in rows:
            if "skipped" not in row and row["setup"] != "roarmq-single":
                ratios.append(
                    f"{cap_label(row['setup'])}: {row['confirmed_per_s'] / base:.2f}× the "
                    "single node's aggregate."
                )
    if not scale:
        by = {r["setup"]: r for r in rows if "skipped" not in r}
        c, one, rq = (by.get(k) for k in ("roarmq-cluster", "roarmq-single", "rabbitmq-cluster"))
        if c and one:
            ratios.append(
                f"Cluster / single node: {c['confirmed_per_s'] / one['confirmed_per_s']:.2f}."
            )
        if c and rq:
            ratios.append(
                f"Cluster / RabbitMQ quorum queue: {c['confirmed_per_s'] / rq['confirmed_per_s']:.2f}."
            )
    if ratios:
        lines += ["", *ratios]
    return lines


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
            f"| {LABEL[kind]} {result['version']} | {round_kind} | {len(rows)} | "
            f"{med} | {worst} | {missing}{extra} |"
        )
    s = result["summary"]
    lines.append(
        f"| {LABEL[kind]} {result['version']} | **all** | {len(result['rounds'])} | "
        f"confirmed {s['confirmed']}, consumed {s['consumed']} | **lost {s['lost']}** | "
        f"duplicated {s['duplicated']}, republished {s['republished']} |"
    )
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--broker", choices=("roarmq", "rabbitmq", "both"), default="both")
    p.add_argument(
        "--parts",
        default="faults,rate,capacity,scale",
        help="comma-separated: faults, rate, capacity, scale (the JSON keeps the others' last run)",
    )
    p.add_argument("--rounds", type=int, default=12, help="fault rounds per broker")
    p.add_argument("--quick", action="store_true", help="4 rounds (RoarMQ), 3 (RabbitMQ), 10 s")
    p.add_argument("--lease-ttl", type=int, default=2)
    p.add_argument("--freeze", type=float, default=8.0, help="SIGSTOP length, s")
    p.add_argument("--etcd-outage", type=float, default=3.0)
    p.add_argument("--seconds", type=float, default=20.0, help="the rate part's run length")
    p.add_argument("--publishers", type=int, default=4)
    p.add_argument("--no-rate", action="store_true")
    p.add_argument(
        "--cap-seconds", type=float, default=20.0, help="capacity and scale: measured window"
    )
    p.add_argument(
        "--cap-warmup", type=float, default=5.0, help="capacity and scale: before the window"
    )
    p.add_argument("--cap-publishers", type=int, default=2, help="per queue (vhost)")
    p.add_argument("--cap-window", type=int, default=1000, help="unconfirmed per publisher")
    p.add_argument("--cap-consumers", type=int, default=2, help="per queue (vhost)")
    p.add_argument("--cap-prefetch", type=int, default=1000)
    p.add_argument(
        "--repeat", type=int, default=3, help="capacity and scale: runs per setup (median)"
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=180,
        help="capacity and scale: wait up to this long for other processes to leave the CPUs idle",
    )
    p.add_argument(
        "--cap-setups",
        default="roarmq-cluster,roarmq-single,rabbitmq-cluster",
        help="capacity: which setups (rabbitmq-cluster only with --broker both/rabbitmq)",
    )
    p.add_argument(
        "--scale-replicas", default="2,1", help="scale: replicas of each vhost, one run each"
    )
    p.add_argument("--tmp-dir", type=Path, default=None)
    p.add_argument("--keep", action="store_true", help="keep data dirs and logs")
    p.add_argument("--json", type=Path, default=RESULTS / "cluster.json")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.seconds = 4, 10.0
        args.cap_seconds, args.cap_warmup = 10.0, 3.0
    parts = set(args.parts.split(","))
    if args.no_rate:
        parts.discard("rate")
    unknown = parts - {"faults", "rate", "capacity", "scale"}
    if unknown:
        p.error(f"unknown parts: {', '.join(sorted(unknown))}")
    brokers = ("roarmq", "rabbitmq") if args.broker == "both" else (args.broker,)
    t_begin = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - t_begin:6.1f}s] {text}", flush=True)

    procs = Procs()
    machine = machine_info(command=" ".join(sys.argv), tree=tree_state())
    settings = settings_of(args)
    result: dict[str, Any] = {
        "machine": machine,
        "settings": settings,
        "faults": {},
        "rate": [],
    }
    work = Path(tempfile.mkdtemp(prefix="roarbench-cluster-gen-", dir=args.tmp_dir))
    try:
        if "faults" in parts:
            for kind in brokers:
                try:
                    rounds = args.rounds if kind == "roarmq" or not args.quick else 3
                    saved = args.rounds
                    args.rounds = rounds
                    result["faults"][kind] = run_faults(kind, args, procs, say)
                    args.rounds = saved
                except (BrokerUnavailable, RuntimeError, AssertionError) as exc:
                    say(f"{kind} fault rounds skipped: {exc}")
                    result["faults"][kind] = {"skipped": str(exc)[:2000]}
        if "rate" in parts:
            kinds = ["roarmq-cluster", "roarmq-single"]
            if "rabbitmq" in brokers:
                kinds.append("rabbitmq-cluster")
            for kind in kinds:
                try:
                    result["rate"].append(rate(kind, args, procs, say))
                except (BrokerUnavailable, RuntimeError, AssertionError) as exc:
                    say(f"{kind} rate skipped: {exc}")
                    result["rate"].append({"broker": kind, "skipped": str(exc)[:2000]})
        if parts & {"capacity", "scale"}:
            binary, go_version = build_load_generator(work, "bench/cluster.py's capacity parts")
            say(f"generator built ({go_version})")
        if "capacity" in parts:
            rows = []
            kinds = [k for k in args.cap_setups.split(",") if k]
            if "rabbitmq" not in brokers:
                kinds = [k for k in kinds if not k.startswith("rabbitmq")]
            for kind in kinds:
                rows.append(repeated(kind, capacity, binary, args, procs, say))
            result["capacity"] = {
                "machine": machine,
                "settings": settings,
                "generator": go_version,
                "rows": rows,
                "table": "\n".join(capacity_table(rows, scale=False)),
            }
        if "scale" in parts:
            rows = []
            kinds = ["roarmq-single"]
            kinds += [f"roarmq-2nodes-r{r}" for r in args.scale_replicas.split(",") if r]
            for kind in kinds:
                rows.append(repeated(kind, scale_out, binary, args, procs, say))
            result["scale_out"] = {
                "machine": machine,
                "settings": settings,
                "generator": go_version,
                "rows": rows,
                "table": "\n".join(capacity_table(rows, scale=True)),
            }
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)

    tables = []
    if parts & {"faults", "rate"}:
        lines = []
        if result["faults"]:
            lines += [
                "| broker | round | n | failover median, s | failover max, s | no confirm in 30 s |",
                "|---|---|---|---|---|---|",
            ]
        for kind, res in result["faults"].items():
            if "skipped" in res:
                lines.append(f"| {LABEL[kind]} | skipped | | | | |")
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
        result["table"] = "\n".join(lines)
        tables.append(result["table"])
    for key in ("capacity", "scale_out"):
        if key in result:
            tables.append(result[key]["table"])
    print("\n" + "\n\n".join(tables))
    # Parts not run this time keep their last figures in the JSON file.
    out = result
    if args.json.exists() and not parts >= {"faults", "rate", "capacity", "scale"}:
        out = read_json(args.json)
        if parts & {"faults", "rate"}:
            for key in ("machine", "settings", "faults", "rate", "table"):
                out[key] = result[key]
        for key in ("capacity", "scale_out"):
            if key in result:
                out[key] = result[key]
    write_json(args.json, out)
    print(f"\nwrote {args.json} ({time.monotonic() - t_begin:.0f} s)")
    lost = sum(r.get("summary", {}).get("lost", 0) for r in result["faults"].values())
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
