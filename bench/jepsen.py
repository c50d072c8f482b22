"""Jepsen-style run: random, overlapping faults from the kernel against a 3-node cluster.

    .venv/bin/python bench/jepsen.py [--minutes 60] [--seed 1] [--broker roarmq|rabbitmq]
                                     [--faults kill9_node,sigstop_node,...] [--overlap 0.5]
                                     [--json bench/results/jepsen.json]

A benchmark, not a test: the short, scripted version is tests/cluster/test_jepsen.py, and
both run tests/support/jepsen.py's harness (as root: it makes network namespaces).

RoarMQ (`--broker roarmq`, the default): three etcd members and three nodes, each in a
network namespace of its own behind one switch (tests/support/netns.py), `lease_ttl` 2 s,
`replica_lag_ms` 1000; 4 publishers with confirms (persistent messages, each body a
unique id) into 2 durable queues, 2 consumers with manual acks, all in this process,
crossing the switch. Then episodes until `--minutes` have passed: a fault drawn from a
seeded RNG (`--seed`), and with probability `--overlap` a second one begun while the first
lasts (on another node), each lasting 2 to `--max-fault` s; everything healed, the cluster
waited for whole (every node in sync), a pause, the next episode. Faults: kill -9 of a node
(the leader or a follower) and its restart; SIGSTOP/SIGCONT; a node isolated; the leader
cut off from the etcd members only; the leader cut off from its followers only; one etcd
member cut off from its peers; kill -9 and SIGSTOP of an etcd member; a node's data dir
wiped (kill -9, rm -rf, restart); one-way drops (a node's outgoing or incoming packets);
a slow link (tbf with a deep queue: this kernel has no netem); `roarmq ctl
move_vhost_leader`. At the end: healed, drained, and the checkers: lost (acked, never
consumed), phantoms, duplicates, the longest wait for an answer (and those over
`--bound`, default 2 x lease_ttl + 3 s, not excused by a frozen or cut-off path), every
node's copy of the vhost log compared record by record.

RabbitMQ (`--broker rabbitmq`): Debian's rabbitmq-server (3.10.8; installed with apt-get
when absent), three nodes on loopback (bench/lib/clusters.py's `start_rabbitmq_cluster`: own
epmd, node names, ports and dirs, joined with `rabbitmqctl join_cluster`), the same
workload on quorum queues (`x-queue-type: quorum`). Erlang distribution names nodes by
host, and three nodes in three namespaces would each need a resolvable name and its own
epmd for the CLI to reach them: they stay on loopback, so the faults are limited to kill -9
(and restart) and SIGSTOP/SIGCONT of the quorum queues' leader or a follower; no
partitions, no log comparison.

Prints a table per fault kind and the checkers' figures; writes JSON to `--json` (the other
broker's last figures are kept).
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pika
from lib import RESULTS
from lib.brokers import BrokerUnavailable
from lib.clusters import LocalCluster, start_rabbitmq_cluster
from lib.machine import machine_info, tree_state
from lib.output import read_json, settings_of, write_json
from lib.procs import Procs
from support import netns
from support.etcd import etcd_binary
from support.jepsen import (
    DropIncoming,
    DropOutgoing,
    EtcdFromPeers,
    Fault,
    FaultTimeline,
    FreezeEtcd,
    FreezeNode,
    History,
    IsolateNode,
    Jepsen,
    KillEtcd,
    KillNode,
    MoveLeader,
    NodeFromEtcd,
    NodeFromPeers,
    Settings,
    SlowNode,
    WipeNode,
    Workload,
    history_figures,
)

NODE_FAULTS = {
    "kill9_node": KillNode,
    "sigstop_node": FreezeNode,
    "isolate_node": IsolateNode,
    "node_cut_from_etcd": NodeFromEtcd,
    "node_cut_from_peers": NodeFromPeers,
    "wipe_node": WipeNode,
    "drop_outgoing": DropOutgoing,
    "drop_incoming": DropIncoming,
    "slow_node": SlowNode,
}
ETCD_FAULTS = {
    "etcd_cut_from_peers": EtcdFromPeers,
    "kill9_etcd": KillEtcd,
    "sigstop_etcd": FreezeEtcd,
}
INSTANT_FAULTS = {"move_vhost_leader": MoveLeader}
ALL_FAULTS = [*NODE_FAULTS, *ETCD_FAULTS, *INSTANT_FAULTS]
#: Faults aimed at the leader more often than at a follower: they are the interesting ones.
LEADER_FIRST = {"node_cut_from_etcd", "node_cut_from_peers", "kill9_node", "sigstop_node"}
RABBIT_FAULTS = ["kill9_node", "sigstop_node"]


def say(t0: float, text: str) -> None:
    print(f"[{time.monotonic() - t0:7.1f}s] {text}", flush=True)


# -- RoarMQ -------------------------------------------------------------------------------


def make_fault(kind: str, rng: random.Random, h: Jepsen, avoid: set[str]) -> Fault:
    """A fault of `kind` on a target not in `avoid` (the other fault's), resolved now."""
    if kind in ETCD_FAULTS:
        members = [m for m in h.cluster.etcd_names if m not in avoid] or h.cluster.etcd_names
        return ETCD_FAULTS[kind](rng.choice(members))
    leader = h.leader()
    nodes = [n for n in h.cluster.node_names if n not in avoid] or h.cluster.node_names
    if kind in INSTANT_FAULTS:
        followers = [n for n in h.cluster.node_names if n != leader]
        return MoveLeader(rng.choice(followers))
    if leader in nodes and (kind in LEADER_FIRST and rng.random() < 0.7 or rng.random() < 0.4):
        return NODE_FAULTS[kind](leader)
    followers = [n for n in nodes if n != leader] or nodes
    return NODE_FAULTS[kind](rng.choice(followers))


def random_schedule(args: Any, rng: random.Random, episodes: list[dict], t0: float):  # type: ignore[no-untyped-def]
    kinds = [k for k in args.faults.split(",") if k]
    deadline = time.monotonic() + args.minutes * 60

    def schedule(h: Jepsen) -> None:
        while time.monotonic() < deadline:
            first_kind = rng.choice(kinds)
            first = h.begin(make_fault(first_kind, rng, h, set()))
            began = time.monotonic()
            lasts = rng.uniform(2.0, args.max_fault)
            faults = [(first, began + lasts)]
            if first_kind not in INSTANT_FAULTS and rng.random() < args.overlap:
                h.sleep(rng.uniform(0.3, lasts * 0.8))
                second_kind = rng.choice(kinds)
                second = h.begin(make_fault(second_kind, rng, h, {first.resolved}))
                faults.append((second, time.monotonic() + rng.uniform(2.0, args.max_fault)))
            for fault, until in sorted(faults, key=lambda f: f[1]):
                h.sleep(max(0.0, until - time.monotonic()))
                h.end(fault)
            ended = time.monotonic()
            leader = h.wait_healthy(args.heal_timeout)
            whole = time.monotonic()
            first_ack = h.history.first_ack_after(began)
            row = {
                "faults": [f.kind for f, _ in faults],
                "targets": [f.resolved for f, _ in faults],
                "began": round(began - h.t0, 1),
                "healthy_after_s": None if leader is None else round(whole - ended, 2),
                "first_ack_s": None if first_ack is None else round(first_ack - began, 2),
                "notes": [f.record.notes for f, _ in faults if f.record and f.record.notes],
            }
            episodes.append(row)
            say(t0, f"episode {len(episodes)}: {row}")
            if leader is None:
                say(t0, "not whole after the episode: healing everything and waiting again")
                h.end_all()
                h.wait_healthy(args.heal_timeout)
            h.sleep(rng.uniform(1.0, 3.0))

    return schedule


def run_roarmq(args: Any, t0: float) -> dict[str, Any]:
    lacking = netns.unavailable()
    if lacking:
        return {"skipped": lacking[0]}
    if etcd_binary() is None:
        return {"skipped": "no etcd: `make tools` extracts it into .tools/etcd"}
    settings = Settings(
        lease_ttl=args.lease_ttl,
        replica_lag_ms=args.replica_lag_ms,
        publishers=args.publishers,
        queues=args.queues,
    )
    rng = random.Random(args.seed)
    episodes: list[dict] = []
    base = Path(tempfile.mkdtemp(prefix="roarbench-jepsen-", dir=args.tmp_dir))
    try:
        with Jepsen(base, settings, seed=args.seed) as h:
            say(t0, f"cluster up on {h.cluster.net.subnet}, leader {h.leader()}")
            result = h.run(random_schedule(args, rng, episodes, t0), bound=args.bound)
            tails = h.cluster.tails(4000)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    out = result.as_dict()
    out["episodes"] = episodes
    out["version"] = "RoarMQ (this tree)"
    if (
        result.lost
        or result.over_bound
        or result.healthy_after_s is None
        or (result.logs and not result.logs.equal)
    ):
        out["log_tails"] = tails
    print("\n" + result.summary(), flush=True)
    return out


# -- RabbitMQ -----------------------------------------------------------------------------


class RabbitTarget:
    """RabbitMQ's loopback cluster in the shape the workload wants (support.jepsen.Target)."""

    credentials = ("guest", "guest")
    queue_arguments = {"x-queue-type": "quorum"}

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.frozen: set[str] = set()

    def endpoints(self) -> list[tuple[str, int]]:
        return self.cluster.endpoints()

    def queue_depth(self, queue: str) -> int | None:
        """Ready messages (a passive declare on a running, unfrozen node)."""
        for m in self.cluster.nodes:
            if m.name in self.frozen or m.proc is None or m.proc.poll() is not None:
                continue
            try:
                conn = pika.BlockingConnection(
                    pika.ConnectionParameters("127.0.0.1", m.port, socket_timeout=2)
                )
                try:
                    ok = conn.channel().queue_declare(queue, passive=True)
                    return ok.method.message_count
                finally:
                    conn.close()
            except Exception:
                continue
        return None


def run_rabbitmq(args: Any, t0: float) -> dict[str, Any]:
    procs = Procs()
    base = Path(tempfile.mkdtemp(prefix="roarbench-jepsen-rabbit-", dir=args.tmp_dir))
    rng = random.Random(args.seed)
    episodes: list[dict] = []
    kinds = [k for k in args.faults.split(",") if k in RABBIT_FAULTS] or RABBIT_FAULTS
    try:
        try:
            cluster = start_rabbitmq_cluster(procs, base)
        except (BrokerUnavailable, RuntimeError) as exc:
            return {"skipped": str(exc)[:2000]}
        say(t0, f"RabbitMQ {cluster.version} cluster up")
        target = RabbitTarget(cluster)
        settings = Settings(publishers=args.publishers, queues=args.queues)
        history = History()
        timeline = FaultTimeline()
        leaders: list[tuple[float, str]] = []
        names = [m.name for m in cluster.nodes]
        stop = threading.Event()

        def watch_leader() -> None:  # rabbitmqctl takes a second or two a call
            while not stop.is_set():
                leader, _ = cluster.leader()
                if leader and (not leaders or leaders[-1][1] != leader):
                    leaders.append((time.monotonic(), leader))
                stop.wait(1.0)

        watcher = threading.Thread(target=watch_leader, daemon=True)
        watcher.start()
        workload = Workload(target, settings, history).start()
        t_start = time.monotonic()
        deadline = t_start + args.minutes * 60
        faults: list[dict] = []
        try:
            time.sleep(3.0)
            while time.monotonic() < deadline:
                leader = leaders[-1][1] if leaders else None
                kind = rng.choice(kinds)
                victim = (
                    leader
                    if leader and rng.random() < 0.7
                    else rng.choice([n for n in names if n != leader])
                )
                member = cluster.members[victim]
                began = time.monotonic()
                lasts = rng.uniform(2.0, args.max_fault)
                if kind == "kill9_node":
                    cluster.kill9(member)
                    time.sleep(lasts)
                    cluster.start(member)
                else:
                    cluster.freeze(member)
                    target.frozen.add(victim)
                    timeline.note(target.frozen, ())
                    time.sleep(lasts)
                    cluster.thaw(member)
                    target.frozen.discard(victim)
                    timeline.note(target.frozen, ())
                ended = time.monotonic()
                whole = cluster.healthy(args.heal_timeout)
                first_ack = history.first_ack_after(began)
                row = {
                    "faults": [kind],
                    "targets": [victim],
                    "leader_before": leader,
                    "began": round(began - t_start, 1),
                    "healthy_after_s": None
                    if whole is None
                    else round(time.monotonic() - ended, 2),
                    "first_ack_s": None if first_ack is None else round(first_ack - began, 2),
                }
                episodes.append(row)
                faults.append(row)
                say(t0, f"episode {len(episodes)}: {row}")
                time.sleep(rng.uniform(1.0, 3.0))
            workload.stop_publishing()
            drained = workload.drain(120)
        finally:
            workload.stop()
            stop.set()
            watcher.join(5)

        def excuse(endpoint: str, opened: float, sent: float, answered: float) -> str | None:
            during = [n for t, n in leaders if t <= answered]
            servers = {during[-1]} if during else set()
            servers |= {n for t, n in leaders if sent <= t <= answered}
            for state in timeline.during(sent, answered):
                for node in {endpoint, *servers}:
                    if node in state.frozen:
                        return f"{node} frozen"
            return None

        figures = history_figures(history, args.bound, excuse, names, t_start)
        out: dict[str, Any] = {
            "duration_s": round(time.monotonic() - t_start, 1),
            **figures,
            "episodes": episodes,
            "errors": dict(workload.errors),
            "drained": drained,
            "version": f"RabbitMQ {cluster.version}",
            "faults_note": "loopback only: kill -9 and SIGSTOP (no partitions)",
        }
        print(
            f"\n{out['duration_s']} s, {out['published']} publishes: "
            + ", ".join(f"{k} {v}" for k, v in out["outcomes"].items() if v)
            + f"\nlost {len(out['lost'])}, phantoms {out['phantoms']}, duplicates "
            f"{out['duplicates']}; longest wait {out['max_answer_s']} s (not excused "
            f"{out['max_answer_not_excused_s']} s), over the bound {out['over_bound_total']}",
            flush=True,
        )
        return out
    finally:
        procs.stop_all()
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


# -- the table ------------------------------------------------------------------------------


def table(broker: str, res: dict[str, Any]) -> list[str]:
    if "skipped" in res:
        return [f"| {broker} | skipped: {res['skipped'][:100]} |"]
    lines = [
        f"**{res.get('version', broker)}**, {res['duration_s'] / 60:.1f} min, "
        f"{len(res['episodes'])} episodes",
        "",
        "| fault | n | first ack of a publish sent after it began, s (median / max; never: "
        "none before the cluster was whole again) | whole again after it ended, s "
        "(median / max) |",
        "|---|---|---|---|",
    ]
    by: dict[str, list[dict]] = {}
    for ep in res["episodes"]:
        for kind in ep["faults"]:
            by.setdefault(kind, []).append(ep)
    for kind in sorted(by):
        rows = by[kind]

        def stat(key: str, rows: list[dict] = rows) -> str:
            values = [r[key] for r in rows if r.get(key) is not None]
            missing = len(rows) - len(values)
            text = f"{statistics.median(values):.2f} / {max(values):.2f}" if values else "-"
            return text + (f" ({missing} never)" if missing else "")

        lines.append(
            f"| {kind} | {len(rows)} | {stat('first_ack_s')} | {stat('healthy_after_s')} |"
        )
    o = res["outcomes"]
    lines += [
        "",
        "| figure | value |",
        "|---|---|",
        f"| publishes | {res['published']:,} |",
        "| outcomes | " + ", ".join(f"{k} {v:,}" for k, v in o.items() if v) + " |",
        f"| **acked and lost** | **{res['notes'].get('lost_total', len(res['lost']))}** |",
        f"| phantoms (consumed, never published) | {res['phantoms']} |",
        f"| duplicates (deliveries beyond the first) | {res['duplicates']:,} |",
        f"| nacked/closed/timed out yet delivered | {res['indeterminate_consumed']:,} |",
        f"| longest wait for an answer, s | {res['max_answer_s']} |",
        f"| longest not excused (frozen or cut-off path), s | {res['max_answer_not_excused_s']} |",
        f"| publishes over {res['bound_s']} s, not excused | {res['over_bound_total']} |",
        f"| unanswered (client timeout) / excused | {res['unanswered']} / {res['unanswered_excused']} |",
        f"| drained at the end | {res['drained']} |",
    ]
    if res.get("healthy_after_s", 0) is None:
        lines.append("| **whole again after healing** | **no** (see the log tails in the JSON) |")
    if not res["drained"]:
        lines.append("| (not drained: acked messages still queued would count as lost) | |")
    logs = res.get("logs")
    if logs:
        lines.append(
            f"| vhost logs equal (API / files) | {logs['api_equal']} / {logs['equal']} "
            f"({logs['compared']:,} offsets, {logs['differing']} differ) |"
        )
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--broker", choices=("roarmq", "rabbitmq"), default="roarmq")
    p.add_argument("--faults", default=",".join(ALL_FAULTS), help="comma-separated kinds")
    p.add_argument("--overlap", type=float, default=0.5, help="chance of a second fault")
    p.add_argument("--max-fault", type=float, default=12.0, help="longest fault, s")
    p.add_argument("--lease-ttl", type=int, default=2)
    p.add_argument("--replica-lag-ms", type=int, default=1000)
    p.add_argument("--publishers", type=int, default=4)
    p.add_argument("--queues", type=int, default=2)
    p.add_argument("--bound", type=float, default=None, help="default 2 x lease_ttl + 3 s")
    p.add_argument("--heal-timeout", type=float, default=120.0)
    p.add_argument("--tmp-dir", type=Path, default=None)
    p.add_argument("--keep", action="store_true", help="keep data dirs and logs")
    p.add_argument("--json", type=Path, default=RESULTS / "jepsen.json")
    args = p.parse_args()
    if args.bound is None:
        args.bound = 2 * args.lease_ttl + 3.0
    unknown = set(args.faults.split(",")) - set(ALL_FAULTS) - {""}
    if unknown:
        p.error(f"unknown faults: {', '.join(sorted(unknown))} (known: {', '.join(ALL_FAULTS)})")
    t0 = time.monotonic()
    res = run_roarmq(args, t0) if args.broker == "roarmq" else run_rabbitmq(args, t0)
    lines = table(args.broker, res)
    print("\n" + "\n".join(lines))
    out = read_json(args.json)  # the other broker's last figures are kept
    out[args.broker] = {
        "machine": machine_info(command=" ".join(sys.argv), tree=tree_state()),
        "settings": settings_of(args),
        "result": res,
        "table": "\n".join(lines),
    }
    write_json(args.json, out, default=str)
    print(f"\nwrote {args.json} ({time.monotonic() - t0:.0f} s)")
    bad = "skipped" not in res and (
        res["notes"].get("lost_total", 0)
        or res["phantoms"]
        or res["over_bound_total"]
        or res.get("healthy_after_s", 0) is None
        or (res.get("logs") and not res["logs"]["equal"])
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
