"""Three-node clusters on one machine (bench/cluster.py, cluster_profile.py, jepsen.py).

``LocalCluster`` holds the members (each a ``Member``: a process restartable with the same
command, env and data) and puts faults on one member's process group only; the starters build
RoarMQ's (an etcd, ``tests/support/etcd.py``'s binary, and nodes n1..) and RabbitMQ's (nodes
r1.. joined with ``rabbitmqctl join_cluster``), each on free loopback ports.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

from support.etcd import etcd_binary
from support.waiting import free_port

from lib import REPO
from lib.brokers import (
    BrokerUnavailable,
    amqp_probe,
    ensure_rabbitmq,
    log_tail,
    rabbitmq_env,
    roarmq_command,
    wait_ready,
)
from lib.management_api import api
from lib.procs import Procs, sweep


@dataclass
class Member:
    """One process of a local cluster, restartable with the same command, env and data."""

    name: str
    port: int  # AMQP (etcd: client port)
    cmd: list[str]
    env: dict[str, str]
    log: Path
    cwd: Path = REPO
    mgmt_port: int | None = None
    proc: subprocess.Popen | None = None
    instance: str = ""


class LocalCluster:
    """Three broker nodes (and, for RoarMQ, an etcd) on loopback, each in its own process
    group; faults go to a member's group only: ``kill9``, ``freeze`` (SIGSTOP), ``thaw``
    (SIGCONT), ``start`` again on the same data dir. ``stop`` stops every PID started here."""

    def __init__(self, kind: str, procs: Procs) -> None:
        self.kind = kind
        self.procs = procs
        self.members: dict[str, Member] = {}
        self.etcd: Member | None = None
        self.version = "?"
        self.helpers: list[subprocess.Popen] = []  # epmd

    @property
    def nodes(self) -> list[Member]:
        return list(self.members.values())

    def endpoints(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", m.port) for m in self.nodes]

    def start(self, member: Member) -> None:
        member.instance = uuid.uuid4().hex
        with open(member.log, "ab") as out:
            member.proc = self.procs.start(
                member.cmd,
                instance=member.instance,
                env=member.env,
                cwd=member.cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def _signal(self, member: Member, sig: int) -> None:
        assert member.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(member.proc.pid, sig)

    def kill9(self, member: Member) -> None:
        self._signal(member, signal.SIGKILL)
        assert member.proc is not None
        member.proc.wait(10)
        if member.proc in self.procs.live:
            self.procs.live.remove(member.proc)
        sweep(member.instance)

    def freeze(self, member: Member) -> None:
        self._signal(member, signal.SIGSTOP)

    def thaw(self, member: Member) -> None:
        self._signal(member, signal.SIGCONT)

    def leader(self) -> tuple[str | None, int]:
        """(the leader's node name, how many members are in sync / online)."""
        if self.kind == "roarmq":
            for m in self.nodes:
                try:
                    row = api(m.mgmt_port or 0, "GET", "/api/vhosts/%2F", timeout=1)
                except (OSError, ValueError):
                    continue
                if row:
                    return row.get("leader"), len(row.get("in_sync") or ())
            return None, 0
        for m in self.nodes:  # RabbitMQ: the quorum queue's leader, from any live node
            out = rabbitmqctl(m, "list_queues", "name", "leader", "online", "--formatter", "json")
            try:
                rows = json.loads(out or "")
            except ValueError:
                continue
            for row in rows:
                online = row.get("online") or []
                leader = str(row.get("leader", "")).split("@")[0] or None
                return leader, len(online)
            return None, 0
        return None, 0

    def healthy(self, timeout: float, in_sync: int | None = None) -> str | None:
        """The leader, once every member (or ``in_sync`` of them) is in sync (RabbitMQ:
        online), or None."""
        want = len(self.members) if in_sync is None else in_sync
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader, synced = self.leader()
            if leader and synced == want:
                return leader
            time.sleep(0.2)
        return None

    def vhost_row(self, vhost: str) -> dict:
        """RoarMQ's GET /api/vhosts/VHOST (its leader, members, in sync) from the first node
        that answers, or {}."""
        quoted = urllib.request.quote(vhost, safe="")
        for m in self.nodes:
            try:
                return api(m.mgmt_port or 0, "GET", f"/api/vhosts/{quoted}", timeout=2) or {}
            except (OSError, ValueError):
                continue
        return {}

    def stop(self) -> None:
        for m in [*self.nodes, *([self.etcd] if self.etcd else [])]:
            if m.proc is not None and m.proc.poll() is None:
                self.thaw(m)
                self.procs.stop(m.proc, grace=15)
            if m.instance:
                sweep(m.instance)
        for proc in self.helpers:
            self.procs.stop(proc, grace=3)


def start_roarmq_cluster(
    procs: Procs,
    tmp: Path,
    *,
    nodes: int = 3,
    lease_ttl: int = 2,
    replica_lag_ms: int = 1000,
    ready_timeout: float = 60,
    replicas: int | None = None,
) -> LocalCluster:
    """etcd (``.tools/etcd``) and ``nodes`` RoarMQ nodes n1.. on free loopback ports with
    ``[cluster]`` (``lease_ttl``, ``replica_lag_ms``, ``replicas`` when given, else the
    default 3); ready once one node leads ``/`` with every member in sync (all ``nodes``, or
    ``replicas`` of them)."""
    etcd = etcd_binary()
    if etcd is None:
        raise BrokerUnavailable("skipped: no etcd (`make tools` extracts it into .tools/etcd)")
    cluster = LocalCluster("roarmq", procs)
    client, peer = free_port(), free_port()
    url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    cluster.etcd = Member(
        "etcd",
        client,
        [
            etcd,
            "--name=e1",
            f"--data-dir={tmp / 'etcd-data'}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=e1={peer_url}",
            "--log-level=warn",
        ],
        dict(os.environ),
        tmp / "etcd.log",
    )
    cluster.start(cluster.etcd)
    deadline = time.monotonic() + 15
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=0.5) as resp:
                if b'"true"' in resp.read():
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            cluster.stop()
            raise RuntimeError(f"etcd not healthy; log tail:\n{log_tail(tmp / 'etcd.log')}")
        time.sleep(0.05)
    for i in range(1, nodes + 1):
        name = f"n{i}"
        port, mgmt, repl = free_port(), free_port(), free_port()
        cfg = tmp / f"{name}.toml"
        cfg.write_text(
            f'[amqp]\nbind = ["127.0.0.1"]\nport = {port}\n'
            f'[management]\nenabled = true\nbind = "127.0.0.1"\nport = {mgmt}\n'
            f'[cluster]\netcd = ["{url}"]\nnode = "{name}"\nreplication_port = {repl}\n'
            f"lease_ttl = {lease_ttl}\nreplica_lag_ms = {replica_lag_ms}\n"
            + (f"replicas = {replicas}\n" if replicas is not None else "")
        )
        cmd = roarmq_command(cfg, tmp / name, port=port, log_level="info")
        member = Member(name, port, cmd, dict(os.environ), tmp / f"{name}.log", mgmt_port=mgmt)
        cluster.members[name] = member
        cluster.start(member)
    if cluster.healthy(ready_timeout, min(nodes, replicas or nodes)) is None:
        tails = "\n".join(f"--- {m.name}\n{log_tail(m.log)}" for m in cluster.nodes)
        cluster.stop()
        raise RuntimeError(f"RoarMQ cluster not ready after {ready_timeout:.0f} s\n{tails}")
    props = amqp_probe(cluster.nodes[0].port) or {}
    cluster.version = str(props.get("version", "?"))
    return cluster


RABBITMQCTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"


def rabbitmqctl(member: Member, *args: str, timeout: float = 30) -> str | None:
    """``rabbitmqctl -n NODE args`` with the member's environment; stdout, or None."""
    try:
        done = subprocess.run(
            [RABBITMQCTL, "-n", f"{member.name}@localhost", *args],
            env=member.env,
            capture_output=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None
    return done.stdout.decode(errors="replace") if done.returncode == 0 else None


def start_rabbitmq_cluster(
    procs: Procs, tmp: Path, *, nodes: int = 3, ready_timeout: float = 120
) -> LocalCluster:
    """RabbitMQ nodes r1.. (Debian's rabbitmq-server) on one machine: one epmd of our own,
    one Erlang cookie, distinct node names, AMQP and distribution ports and dirs; r2.. join
    r1 with ``rabbitmqctl join_cluster``. Never the system service."""
    server = ensure_rabbitmq()
    cluster = LocalCluster("rabbitmq", procs)
    epmd_port = free_port()
    epmd = procs.start(
        ["epmd", "-port", str(epmd_port), "-address", "127.0.0.1"],
        instance=uuid.uuid4().hex,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    cluster.helpers.append(epmd)
    cookie = uuid.uuid4().hex.upper()
    try:
        for i in range(1, nodes + 1):
            name = f"r{i}"
            base = tmp / name
            base.mkdir(parents=True)
            (base / ".erlang.cookie").write_text(cookie)
            (base / ".erlang.cookie").chmod(0o400)
            port = free_port()
            env = rabbitmq_env(base, port, nodename=name)
            env["ERL_EPMD_PORT"] = str(epmd_port)
            member = Member(name, port, [server], env, base / "stdout.log")
            cluster.members[name] = member
            cluster.start(member)
        for member in cluster.nodes:
            assert member.proc is not None
            wait_ready(member.proc, lambda m=member: m.port, member.log, ready_timeout)
        first = cluster.nodes[0]
        for member in cluster.nodes[1:]:
            for args in (
                ("stop_app",),
                ("join_cluster", f"{first.name}@localhost"),
                ("start_app",),
            ):
                if rabbitmqctl(member, *args, timeout=90) is None:
                    raise RuntimeError(f"rabbitmqctl {' '.join(args)} failed on {member.name}")
            assert member.proc is not None
            wait_ready(member.proc, lambda m=member: m.port, member.log, ready_timeout)
        props = amqp_probe(first.port) or {}
        cluster.version = str(props.get("version", "?"))
        return cluster
    except BaseException:
        cluster.stop()
        raise
