"""A Jepsen-style fault harness for a RoarMQ cluster: real processes, network and faults.

What it builds (tests/support/netns.py, etcd_cluster.py): a switch, three etcd members and
three RoarMQ nodes, each in a network namespace of its own with its own address; every
node binds AMQP (5672), management (15672) and replication (25672) on its address, and
advertises it. Each node also gets its own hostname (a UTS namespace), so the nodes are
three machines to each other: a client handed from one node to the leader is relayed over
the network, which partitions cut, rather than passed as a file descriptor through the
filesystem, which they do not.

The workload runs in the test process (root namespace) and crosses the switch like any
client: several publishers with publisher confirms, each message persistent, its body a
unique integer id, into durable queues; consumers with manual acks. Clients connect to a
random node, follow a 530's "led by node ... at HOST:PORT", and on any error reconnect
elsewhere (an endpoint that failed is avoided for a few seconds, as a client with a host
list does). Every publish is recorded: when it was sent, its outcome (ack, nack, returned,
blocked, closed, timeout) and when the outcome came. A watchdog shuts a connection whose
publish (or whose set-up) has not been answered after `answer_timeout`: that publish's
outcome is "timeout", i.e. unanswered. A publish that a fault made unanswerable is
*excused*: the node it was sent to, or the vhost's leader then, was frozen (SIGSTOP), or
the path client -> node -> leader was cut by a partition; no broker can answer through a
link that loses every packet, and the client's own timeout is then the only way out.

Faults (`Fault` subclasses; each has `begin` and `end`, and may overlap with others):
kill -9 of a node and its restart, SIGSTOP/SIGCONT, a node isolated, the leader cut off
from the etcd members only, one etcd member cut off from its peers, the leader cut off
from its followers but not from etcd, kill -9 of an etcd member, a node's data dir wiped
(kill -9, rm -rf, restart: a new copy of the log), `roarmq ctl move_vhost_leader`, one-way
drops, a slow link. Targets named "leader" or "follower" are resolved when the fault
begins, from what the nodes' APIs said last.

After the schedule: everything healed and restarted, the cluster waited for whole (every
node agrees on the leader, all three in sync), publishing stopped, the queues drained.
Then the checkers (`JepsenResult`):

* lost: ids whose publish was acked and that no consumer ever received (must be 0);
* phantoms: bodies consumed that no publish sent (must be 0);
* duplicates: deliveries beyond the first (allowed: a redelivery after a failover);
* answers: the longest time any publish waited for its outcome, excused or not, and those
  not excused over the bound the caller gives;
* logs: every node's `/api/vhosts/%2F` `replicated_log` once quiet (the same last offset
  and epoch everywhere), and, after the nodes stopped, each node's
  `data/vhosts/%2F/log` opened with `SegmentRecordStore` (on a copy) and compared record
  by record from the highest first offset on.

Each fault records what it did and what followed (the leader before and the leaders seen
during, a wiped node's copy id before and after), so a test can assert that the fault
took effect rather than assume it. Who led when is what `Monitor` saw: a node whose own
API showed it holding the vhost's replication leader (two at once are reported as
`leader_overlaps`).

The workload and `history_figures` take any `Target` (endpoints, credentials, queue
arguments, queue depth), so bench/jepsen.py runs the same clients and checkers against
RabbitMQ's quorum queues.
"""

from __future__ import annotations

import array
import bisect
import contextlib
import functools
import logging
import random
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, Self

import pika

from .broker_process import BrokerProcess, ClusterOptions
from .etcd_cluster import EtcdCluster
from .netns import CLIENT, Network, Partition

ROOT = Path(__file__).resolve().parents[2]
AMQP_PORT = 5672
MGMT_PORT = 15672
REPLICATION_PORT = 25672
VHOST_LOG = Path("vhosts") / "%2F" / "log"
LED_BY = re.compile(r"led by node '([^']+)' at ([^\s:']+):(\d+)")
PERSISTENT = pika.BasicProperties(delivery_mode=2)

# Publish outcomes (one byte each in the history's arrays).
PENDING, ACK, NACK, RETURNED, BLOCKED, CLOSED, TIMEOUT = range(7)
OUTCOMES = ("pending", "ack", "nack", "returned", "blocked", "closed", "timeout")


@dataclass
class Settings:
    """The cluster's and the workload's knobs."""

    lease_ttl: int = 2
    replica_lag_ms: int = 1000
    min_in_sync: int | None = None  # None: the broker's default (a majority)
    #: The vhost log's checkpoint threshold (None: the broker's 8 MiB). Small values make
    #: the leader trim often, so a follower that falls behind gets a snapshot (RESET).
    checkpoint_bytes: int | None = None
    publishers: int = 4
    consumers_per_queue: int = 1
    queues: int = 2
    prefetch: int = 100
    #: A publish (or a session's set-up) unanswered this long has its socket shut.
    answer_timeout: float = 12.0
    #: A consumer that received nothing this long reconnects elsewhere (a frozen or
    #: deposed node may hold it).
    idle_reconnect: float = 3.0
    #: A failed endpoint is avoided this long while another one is left.
    avoid_failed: float = 3.0
    etcd_heartbeat_ms: int = 100
    etcd_election_ms: int = 1000
    log_level: str = "info"


# -- nodes -------------------------------------------------------------------------------


class RoarNode(BrokerProcess):
    """One `python -m roarmq` node in its namespace (tests/support/broker_process.py,
    started through the namespace's `popen`); signals go to its PID. Stopped with SIGTERM
    (a clean shutdown: the lease revoked, the log synced), SIGKILL after 15 s."""

    STOP_GRACE = 15.0

    def __init__(self, cluster: RoarCluster, name: str) -> None:
        s = cluster.settings
        user, password = cluster.credentials
        keys = f"replica_lag_ms = {s.replica_lag_ms}\n"
        if s.min_in_sync is not None:
            keys += f"min_in_sync = {s.min_in_sync}\n"
        if s.checkpoint_bytes is not None:
            keys += f"checkpoint_bytes = {s.checkpoint_bytes}\n"
        address = cluster.net.addresses[name]
        super().__init__(
            cluster.base / name,
            AMQP_PORT,
            mgmt_port=MGMT_PORT,
            repl_port=REPLICATION_PORT,
            host=address,
            cluster=ClusterOptions(
                cluster.etcd.client_urls, name, advertise=address, lease_ttl=s.lease_ttl, keys=keys
            ),
            extra=(
                f'[[users]]\nname = "{user}"\npassword = "{password}"\n'
                'tags = ["administrator"]\nloopback_only = false\n\n'
                '[[vhosts]]\nname = "/"\n\n'
                f'[[permissions]]\nuser = "{user}"\nvhost = "/"\n'
                'configure = ".*"\nwrite = ".*"\nread = ".*"\n'
            ),
            log_level=s.log_level,
            log=cluster.base / f"{name}.log",
            config=cluster.base / f"{name}.toml",
            launcher=functools.partial(cluster.net.popen, name, own_hostname=True),
            credentials=cluster.credentials,
            api_timeout=1.0,
        )
        self.cluster = cluster
        self.name = name
        self.address = address
        self.starts = 0

    def start(self, wait: bool = False) -> Self:
        """Start it, a line in its log saying when; no wait (a node whose data dir was
        wiped may be refused and exit: Jepsen.start_node starts it again)."""
        if self.running:
            return self
        with open(self.log, "ab") as out:
            out.write(f"--- jepsen: start at {time.time():.3f}\n".encode())
        super().start(wait)
        self.starts += 1
        return self

    def wipe(self) -> None:
        """kill -9, then the whole data dir removed: a replaced disk."""
        self.kill9()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def copy_id(self) -> str | None:
        """The identity of this node's copy of the vhost log (its `COPY` file)."""
        try:
            return (self.data_dir / VHOST_LOG / "COPY").read_text().strip() or None
        except OSError:
            return None


def stopped_state(pid: int, timeout: float = 2.0) -> str:
    """The process's state letter from /proc once it is "T" (stopped), or whatever it is
    after `timeout`: a SIGSTOP is delivered asynchronously."""
    deadline = time.monotonic() + timeout
    state = "?"
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return "gone"
        if state == "T":
            break
        time.sleep(0.01)
    return state


class RoarCluster:
    """The network, etcd's three members and the three nodes (module doc)."""

    def __init__(self, base: Path, settings: Settings, nodes: int = 3) -> None:
        self.base = base
        self.settings = settings
        self.node_names = [f"n{i}" for i in range(1, nodes + 1)]
        self.etcd_names = ["e1", "e2", "e3"]
        self.net = Network([*self.node_names, *self.etcd_names])
        self.credentials = ("jepsen", secrets.token_hex(8))
        self.queue_arguments: dict[str, Any] | None = None  # classic durable queues
        self.etcd: EtcdCluster
        self.nodes: list[RoarNode] = []

    def __enter__(self) -> RoarCluster:
        try:
            self.base.mkdir(parents=True, exist_ok=True)
            self.net.up()
            self.etcd = EtcdCluster(
                self.net,
                self.base / "etcd",
                self.etcd_names,
                heartbeat_ms=self.settings.etcd_heartbeat_ms,
                election_ms=self.settings.etcd_election_ms,
            )
            self.etcd.start()
            self.nodes = [RoarNode(self, name) for name in self.node_names]
            for node in self.nodes:
                node.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Every node and etcd member stopped by PID, the network taken down, whatever
        failed before."""
        try:
            for node in self.nodes:
                with contextlib.suppress(Exception):
                    node.stop(grace=5)
            if hasattr(self, "etcd"):
                with contextlib.suppress(Exception):
                    self.etcd.stop()
        finally:
            self.net.down()

    def node(self, name: str) -> RoarNode:
        return next(n for n in self.nodes if n.name == name)

    def endpoints(self) -> list[tuple[str, int]]:
        return [(n.address, AMQP_PORT) for n in self.nodes]

    def queue_depth(self, queue: str) -> int | None:
        """Messages (ready + unacked) in `queue`, from any node that answers (it forwards
        to the leader); None if none does."""
        for node in self.nodes:
            if not node.running or node.frozen:
                continue
            try:
                return int(node.api(f"/api/queues/%2F/{queue}", 2.0).get("messages", 0))
            except (OSError, ValueError):
                continue
        return None

    def placement(self, node: RoarNode, timeout: float = 1.0) -> tuple | None:
        """(leader, members, in_sync) as `node` says, or None if it does not answer."""
        try:
            row = node.api("/api/vhosts/%2F", timeout)
        except (OSError, ValueError):
            return None
        return row.get("leader"), tuple(row.get("members") or ()), tuple(row.get("in_sync") or ())

    def healthy_leader(self) -> str | None:
        """The leader every node names, once all nodes are members and in sync."""
        seen = set()
        for node in self.nodes:
            if not node.running or node.frozen:
                return None
            p = self.placement(node)
            if p is None:
                return None
            seen.add(p)
        if len(seen) != 1:
            return None
        ((leader, members, in_sync),) = seen
        names = set(self.node_names)
        if leader and set(members) == names and set(in_sync) == names:
            return leader
        return None

    def wait_healthy(self, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.healthy_leader()
            if leader:
                return leader
            time.sleep(0.2)
        return None

    def replicated_logs(self) -> dict[str, dict | None]:
        """Each node's `replicated_log` row (None when it does not answer)."""
        out: dict[str, dict | None] = {}
        for node in self.nodes:
            try:
                out[node.name] = node.api("/api/vhosts/%2F", 2.0).get("replicated_log")
            except (OSError, ValueError):
                out[node.name] = None
        return out

    def ctl(self, *args: str, via: RoarNode | None = None, timeout: float = 60) -> tuple[int, str]:
        """`python -m roarmq ctl ARGS` against `via`'s management API (default: the first
        running node), from the test process: (exit code, output)."""
        node = via or next(n for n in self.nodes if n.running and not n.frozen)
        user, password = self.credentials
        argv = [
            sys.executable,
            "-m",
            "roarmq",
            "ctl",
            "--url",
            f"http://{node.address}:{MGMT_PORT}",
            "-u",
            user,
            "--password",
            password,
            *args,
        ]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return -1, f"ctl {' '.join(args)}: no answer in {timeout} s"
        return done.returncode, (done.stdout + done.stderr).strip()

    def tails(self, chars: int = 2500) -> str:
        return "\n".join(f"--- {n.name}\n{n.tail(chars)}" for n in self.nodes)


# -- what the nodes say, over time -------------------------------------------------------


@dataclass
class Claim:
    """A node leading the vhost, as its own API showed: from the first poll that said so
    to the last (`seen`); `end` when a poll said otherwise, or when another node claimed
    while this one could not be asked (frozen, cut off, dead)."""

    node: str
    epoch: int | None
    start: float
    seen: float
    end: float | None = None


class Monitor:
    """One thread per node asking its `/api/vhosts/%2F` every `period` s: the last row
    each node gave, and when each node led. A node leads when its row names it leader
    *and* shows `member_status` (only a node holding the vhost's replication leader has
    one): the `leader` field alone is the node's cached copy of etcd's key, which a node
    cut off from etcd cannot refresh, so a fenced node that gave the vhost up goes on
    naming itself there."""

    def __init__(self, cluster: RoarCluster, t0: float, period: float = 0.25) -> None:
        self.cluster = cluster
        self.period = period
        self.t0 = t0
        self.last: dict[str, tuple[float, dict]] = {}
        self.claims: list[Claim] = []
        self._open: dict[str, Claim] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._watch, args=(n,), daemon=True, name=f"monitor-{n.name}")
            for n in cluster.nodes
        ]

    def start(self) -> Monitor:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)

    def _watch(self, node: RoarNode) -> None:
        while not self._stop.is_set():
            try:
                row = node.api("/api/vhosts/%2F", 1.0)
            except (OSError, ValueError):
                row = None
            if row is not None:
                self._observe(node.name, row, time.monotonic())
            self._stop.wait(self.period)

    def _observe(self, name: str, row: dict, now: float) -> None:
        leads = row.get("leader") == name and row.get("member_status", ()) is not None
        epoch = (row.get("replicated_log") or {}).get("epoch")
        with self._lock:
            self.last[name] = (now, row)
            mine = self._open.get(name)
            if mine is not None and (not leads or mine.epoch != epoch):
                mine.end = now
                del self._open[name]
                mine = None
            if not leads:
                return
            if mine is not None:
                mine.seen = now
                return
            for other in list(self._open.values()):
                if now - other.seen > 2 * self.period + 1.0:  # not heard: superseded
                    other.end = now
                    del self._open[other.node]
            claim = Claim(name, epoch, now, now)
            self._open[name] = claim
            self.claims.append(claim)

    def leader(self) -> str | None:
        """The node leading now: of the open claims, the highest epoch (then the latest)."""
        with self._lock:
            claims = list(self._open.values())
        if not claims:
            return None
        return max(claims, key=lambda c: (c.epoch or 0, c.start)).node

    def leaders_between(self, t0: float, t1: float) -> set[str]:
        """Nodes that led at some moment of [t0, t1] (as far as the polls saw)."""
        with self._lock:
            return {c.node for c in self.claims if c.start <= t1 and (c.end is None or c.end >= t0)}

    def overlaps(self) -> list[dict]:
        """Two nodes both seen leading at once (each by its own polls)."""
        with self._lock:
            claims = list(self.claims)
        out = []
        for i, a in enumerate(claims):
            for b in claims[i + 1 :]:
                if a.node != b.node and min(a.seen, b.seen) > max(a.start, b.start):
                    out.append(
                        {
                            "nodes": [a.node, b.node],
                            "epochs": [a.epoch, b.epoch],
                            "from": round(max(a.start, b.start) - self.t0, 2),
                            "seconds": round(min(a.seen, b.seen) - max(a.start, b.start), 2),
                        }
                    )
        return out

    def timeline(self) -> list[dict]:
        with self._lock:
            return [
                {
                    "node": c.node,
                    "epoch": c.epoch,
                    "from": round(c.start - self.t0, 2),
                    "seen_until": round(c.seen - self.t0, 2),
                    "ended": None if c.end is None else round(c.end - self.t0, 2),
                }
                for c in self.claims
            ]


# -- the fault state over time (to excuse publishes no broker could answer) ---------------


@dataclass
class FaultState:
    t: float
    frozen: frozenset[str]
    blocked: frozenset[tuple[str, str]]


class FaultTimeline:
    """What was frozen and which directed pairs were cut, from each change on."""

    def __init__(self) -> None:
        self.states: list[FaultState] = [FaultState(time.monotonic(), frozenset(), frozenset())]
        self._lock = threading.Lock()

    def note(self, frozen: Iterable[str], blocked: Iterable[tuple[str, str]]) -> None:
        with self._lock:
            self.states.append(FaultState(time.monotonic(), frozenset(frozen), frozenset(blocked)))

    def during(self, t0: float, t1: float) -> list[FaultState]:
        with self._lock:
            states = list(self.states)
        out = []
        for i, s in enumerate(states):
            end = states[i + 1].t if i + 1 < len(states) else float("inf")
            if s.t <= t1 and end >= t0:
                out.append(s)
        return out


# -- the history of the workload ----------------------------------------------------------


class History:
    """Per publish, by id (the message body): sent, answered (monotonic s), outcome, the
    endpoint (node index) and when its connection opened; per id, how often it was
    consumed. Arrays, not objects: an hour's run records millions of publishes."""

    def __init__(self) -> None:
        self.sent = array.array("d")
        self.answered = array.array("d")
        self.outcome = array.array("b")
        self.endpoint = array.array("b")
        self.opened = array.array("d")
        self.consumed = bytearray()
        self.phantoms: list[bytes] = []
        self.deliveries = 0
        self._acked_unconsumed: set[int] = set()
        self._lock = threading.Lock()

    def begin(self, endpoint: int, opened: float) -> int:
        with self._lock:
            pid = len(self.sent)
            self.sent.append(time.monotonic())
            self.answered.append(0.0)
            self.outcome.append(PENDING)
            self.endpoint.append(endpoint)
            self.opened.append(opened)
            return pid

    def answer(self, pid: int, outcome: int, at: float | None = None) -> None:
        with self._lock:
            self.answered[pid] = time.monotonic() if at is None else at
            self.outcome[pid] = outcome
            if outcome == ACK and not self.was_consumed(pid):
                self._acked_unconsumed.add(pid)

    def consume(self, body: bytes) -> None:
        with self._lock:
            self.deliveries += 1
            try:
                pid = int(body)
            except ValueError:
                pid = -1
            if not 0 <= pid < len(self.sent):
                self.phantoms.append(body[:40])
                return
            if pid >= len(self.consumed):
                self.consumed.extend(bytes(max(pid + 1 - len(self.consumed), 65536)))
            if self.consumed[pid] < 255:
                self.consumed[pid] += 1
            self._acked_unconsumed.discard(pid)

    def was_consumed(self, pid: int) -> bool:
        return pid < len(self.consumed) and self.consumed[pid] > 0

    def lost(self) -> list[int]:
        """Acked ids never consumed."""
        with self._lock:
            return sorted(self._acked_unconsumed)

    def first_ack_after(self, t0: float) -> float | None:
        """When the first publish sent after `t0` was acked (ids are taken in the order
        of their send times, so the search starts at the first one sent after `t0`)."""
        best = None
        with self._lock:
            for i in range(bisect.bisect_left(self.sent, t0), len(self.sent)):
                if best is not None and self.sent[i] > best:
                    break  # sent after the earliest ack found: cannot be acked earlier
                if self.outcome[i] == ACK and (best is None or self.answered[i] < best):
                    best = self.answered[i]
        return best


class _Watchdog:
    """Shuts a client's socket when its deadline passes (a frozen node or a cut link
    would otherwise hold a blocking pika call for good)."""

    def __init__(self) -> None:
        self._armed: dict[str, tuple[float, socket.socket]] = {}
        self._fired: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="watchdog")
        self._thread.start()

    def arm(self, who: str, seconds: float, sock: socket.socket) -> None:
        with self._lock:
            self._armed[who] = (time.monotonic() + seconds, sock)
            self._fired.discard(who)

    def disarm(self, who: str) -> bool:
        """Disarm; True if it fired since it was armed."""
        with self._lock:
            self._armed.pop(who, None)
            fired = who in self._fired
            self._fired.discard(who)
            return fired

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            with self._lock:
                due = [(w, s) for w, (d, s) in self._armed.items() if now > d]
                for who, _ in due:
                    self._armed.pop(who, None)
                    self._fired.add(who)
            for _, sock in due:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


class Target(Protocol):
    """What the workload needs of a broker cluster (RoarCluster here; bench/jepsen.py
    wraps RabbitMQ's in the same shape)."""

    credentials: tuple[str, str]
    queue_arguments: dict[str, Any] | None

    def endpoints(self) -> list[tuple[str, int]]: ...

    def queue_depth(self, queue: str) -> int | None: ...


class Workload:
    """Publishers and consumers in threads of the test process (module doc)."""

    def __init__(self, target: Target, settings: Settings, history: History) -> None:
        self.target = target
        self.settings = settings
        self.history = history
        self.queues = [f"jepsen-{i}" for i in range(settings.queues)]
        self.errors: Counter[str] = Counter()
        self.redirects = 0
        self._failed_at: dict[int, float] = {}
        self._lock = threading.Lock()
        self._dog = _Watchdog()
        self._stop_publishing = threading.Event()
        self._stop = threading.Event()
        self._publishers = [
            threading.Thread(target=self._publisher, args=(i,), daemon=True, name=f"pub-{i}")
            for i in range(settings.publishers)
        ]
        self._consumers = [
            threading.Thread(target=self._consumer, args=(q, j), daemon=True, name=f"con-{q}-{j}")
            for q in self.queues
            for j in range(settings.consumers_per_queue)
        ]

    def start(self) -> Workload:
        # pika logs every nack and every closed connection at WARNING/ERROR: thousands of
        # lines a run, each of them an outcome the history records anyway.
        logging.getLogger("pika").setLevel(logging.CRITICAL)
        for t in (*self._publishers, *self._consumers):
            t.start()
        return self

    def stop_publishing(self) -> None:
        self._stop_publishing.set()
        for t in self._publishers:
            t.join(self.settings.answer_timeout + 10)

    def stop(self) -> None:
        self._stop_publishing.set()
        self._stop.set()
        for t in (*self._publishers, *self._consumers):
            t.join(self.settings.answer_timeout + 10)
        self._dog.stop()

    # -- connections

    def _pick(self) -> int:
        endpoints = self.target.endpoints()
        now = time.monotonic()
        with self._lock:
            failed = {i: self._failed_at.get(i, -1e9) for i in range(len(endpoints))}
        fresh = [i for i in failed if now - failed[i] > self.settings.avoid_failed]
        return random.choice(fresh) if fresh else min(failed, key=failed.__getitem__)

    def _failed(self, index: int) -> None:
        with self._lock:
            self._failed_at[index] = time.monotonic()

    def _connect(self) -> tuple[pika.BlockingConnection, int]:
        """A connection to a random node, following 530s to the leader they name."""
        index = self._pick()
        endpoints = self.target.endpoints()
        host, port = endpoints[index]
        user, password = self.target.credentials
        try:
            for _hop in range(3):
                params = pika.ConnectionParameters(
                    host,
                    port,
                    credentials=pika.PlainCredentials(user, password),
                    connection_attempts=1,
                    socket_timeout=1.0,
                    stack_timeout=3.0,
                    blocked_connection_timeout=2.0,
                    heartbeat=0,
                )
                try:
                    conn = pika.BlockingConnection(params)
                    return conn, endpoints.index((host, port))
                except pika.exceptions.ProbableAccessDeniedError as exc:
                    found = LED_BY.search(str(exc))
                    if found is None:  # no leader at the moment, being recovered, down
                        raise
                    with self._lock:
                        self.redirects += 1
                    host, port = found.group(2), int(found.group(3))
            raise ConnectionError("530 hops did not end")
        except Exception:
            self._failed(index)
            raise

    def _note(self, exc: BaseException) -> None:
        name = type(exc).__name__
        if isinstance(exc, pika.exceptions.ConnectionClosedByBroker):
            name += f"({exc.reply_code})"
        with self._lock:
            self.errors[name] += 1

    def _close(self, who: str, conn: pika.BlockingConnection | None) -> None:
        if conn is None:
            return
        with contextlib.suppress(Exception):
            self._dog.arm(who, 2.0, conn._impl._transport._sock)
        with contextlib.suppress(Exception):
            conn.close()
        self._dog.disarm(who)

    # -- clients

    def _publisher(self, me: int) -> None:
        who = f"pub-{me}"
        s = self.settings
        turn = me
        while not self._stop_publishing.is_set():
            conn = None
            pid: int | None = None
            index = -1
            try:
                conn, index = self._connect()
                opened = time.monotonic()
                sock = conn._impl._transport._sock  # to shut it when an answer hangs
                self._dog.arm(who, s.answer_timeout, sock)
                ch = conn.channel()
                ch.confirm_delivery()
                for q in self.queues:
                    ch.queue_declare(q, durable=True, arguments=self.target.queue_arguments)
                self._dog.disarm(who)
                while not self._stop_publishing.is_set():
                    queue = self.queues[turn % len(self.queues)]
                    turn += 1
                    pid = self.history.begin(index, opened)
                    self._dog.arm(who, s.answer_timeout, sock)
                    try:
                        ch.basic_publish("", queue, b"%d" % pid, PERSISTENT, mandatory=True)
                        outcome = ACK
                    except pika.exceptions.NackError:
                        outcome = NACK
                    except pika.exceptions.UnroutableError:
                        outcome = RETURNED
                    self._dog.disarm(who)
                    self.history.answer(pid, outcome)
                    pid = None
            except Exception as exc:
                fired = self._dog.disarm(who)
                self._note(exc)
                if pid is not None:
                    if fired:
                        outcome = TIMEOUT
                    elif isinstance(exc, pika.exceptions.ConnectionBlockedTimeout):
                        outcome = BLOCKED
                    else:
                        outcome = CLOSED
                    self.history.answer(pid, outcome)
                if index >= 0 and (fired or conn is None or pid is not None):
                    self._failed(index)
                time.sleep(0.05)
            finally:
                self._close(who, conn)

    def _consumer(self, queue: str, j: int) -> None:
        who = f"con-{queue}-{j}"
        s = self.settings
        while not self._stop.is_set():
            conn = None
            index = -1
            try:
                conn, index = self._connect()
                sock = conn._impl._transport._sock
                self._dog.arm(who, s.answer_timeout, sock)
                ch = conn.channel()
                ch.queue_declare(queue, durable=True, arguments=self.target.queue_arguments)
                ch.basic_qos(prefetch_count=s.prefetch)
                last = time.monotonic()
                for method, _props, body in ch.consume(queue, inactivity_timeout=0.25):
                    self._dog.arm(who, s.answer_timeout, sock)
                    if self._stop.is_set():
                        break
                    if method is None:
                        if time.monotonic() - last > s.idle_reconnect:
                            break  # maybe held by a frozen or deposed node: go elsewhere
                        continue
                    last = time.monotonic()
                    self.history.consume(body)
                    ch.basic_ack(method.delivery_tag)
                self._dog.disarm(who)
            except Exception as exc:
                if self._dog.disarm(who) and index >= 0:
                    self._failed(index)
                self._note(exc)
                time.sleep(0.05)
            finally:
                self._close(who, conn)

    def queue_depths(self) -> dict[str, int | None]:
        return {q: self.target.queue_depth(q) for q in self.queues}

    def drain(self, timeout: float) -> bool:
        """Until every acked id was consumed and the queues are empty (twice in a row,
        half a second apart), or `timeout`."""
        deadline = time.monotonic() + timeout
        quiet = 0
        while time.monotonic() < deadline:
            empty = all(d == 0 for d in self.queue_depths().values())
            quiet = quiet + 1 if empty and not self.history.lost() else 0
            if quiet >= 2:
                return True
            time.sleep(0.5)
        return False


# -- faults ------------------------------------------------------------------------------


@dataclass
class FaultRecord:
    """One fault as it happened: times are seconds from the run's start."""

    name: str
    targets: list[str]
    began: float
    ended: float | None = None
    leader_before: str | None = None
    #: Nodes seen leading between begin and end (the one leading at begin included).
    leaders_during: list[str] = field(default_factory=list)
    #: Nodes seen leading in the 2 x lease_ttl + 3 s after the end.
    leaders_after: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)


class Fault:
    """A fault with a `begin` and an `end` (which undoes it: restart, thaw, heal).
    `target` is a node or member name, or "leader" / "follower" (resolved at begin)."""

    kind = "fault"

    def __init__(self, target: str = "leader") -> None:
        self.target = target
        self.record: FaultRecord | None = None
        self.resolved: str = ""

    def begin(self, h: Jepsen) -> None:
        raise NotImplementedError

    def end(self, h: Jepsen) -> None:
        pass


class KillNode(Fault):
    kind = "kill9_node"

    def begin(self, h: Jepsen) -> None:
        h.cluster.node(self.resolved).kill9()

    def end(self, h: Jepsen) -> None:
        h.start_node(h.cluster.node(self.resolved))


class FreezeNode(Fault):
    kind = "sigstop_node"

    def begin(self, h: Jepsen) -> None:
        node = h.cluster.node(self.resolved)
        node.freeze()
        assert self.record is not None and node.proc is not None
        self.record.notes["state"] = stopped_state(node.proc.pid)

    def end(self, h: Jepsen) -> None:
        h.cluster.node(self.resolved).thaw()


class _PartitionFault(Fault):
    def __init__(self, target: str = "leader") -> None:
        super().__init__(target)
        self.token: Partition | None = None

    def cut(self, h: Jepsen) -> Partition:
        raise NotImplementedError

    def begin(self, h: Jepsen) -> None:
        self.token = self.cut(h)
        assert self.record is not None
        self.record.notes["pairs"] = len(self.token.pairs)

    def end(self, h: Jepsen) -> None:
        if self.token is not None:
            h.cluster.net.heal(self.token)


class IsolateNode(_PartitionFault):
    kind = "isolate_node"

    def cut(self, h: Jepsen) -> Partition:
        return h.cluster.net.isolate(self.resolved)


class NodeFromEtcd(_PartitionFault):
    """The node (usually the leader) cut off from every etcd member, and nothing else:
    clients and the other nodes still reach it."""

    kind = "node_cut_from_etcd"

    def cut(self, h: Jepsen) -> Partition:
        return h.cluster.net.cut(self.resolved, h.cluster.etcd_names, name=self.kind)


class NodeFromPeers(_PartitionFault):
    """The node (usually the leader) cut off from the other RoarMQ nodes, not from etcd
    nor from clients."""

    kind = "node_cut_from_peers"

    def cut(self, h: Jepsen) -> Partition:
        others = [n for n in h.cluster.node_names if n != self.resolved]
        return h.cluster.net.cut(self.resolved, others, name=self.kind)


class EtcdFromPeers(_PartitionFault):
    """One etcd member cut off from the other members (nodes and clients still reach
    it: it answers, without a quorum)."""

    kind = "etcd_cut_from_peers"

    def __init__(self, target: str = "e1") -> None:
        super().__init__(target)

    def cut(self, h: Jepsen) -> Partition:
        others = [e for e in h.cluster.etcd_names if e != self.resolved]
        return h.cluster.net.cut(self.resolved, others, name=self.kind)


class DropOutgoing(_PartitionFault):
    kind = "drop_outgoing"

    def cut(self, h: Jepsen) -> Partition:
        return h.cluster.net.drop_outgoing(self.resolved)


class DropIncoming(_PartitionFault):
    kind = "drop_incoming"

    def cut(self, h: Jepsen) -> Partition:
        return h.cluster.net.drop_incoming(self.resolved)


class KillEtcd(Fault):
    kind = "kill9_etcd"

    def __init__(self, target: str = "e1") -> None:
        super().__init__(target)

    def begin(self, h: Jepsen) -> None:
        h.cluster.etcd.member(self.resolved).kill9()

    def end(self, h: Jepsen) -> None:
        h.cluster.etcd.member(self.resolved).start()


class FreezeEtcd(Fault):
    kind = "sigstop_etcd"

    def __init__(self, target: str = "e1") -> None:
        super().__init__(target)

    def begin(self, h: Jepsen) -> None:
        h.cluster.etcd.member(self.resolved).freeze()

    def end(self, h: Jepsen) -> None:
        h.cluster.etcd.member(self.resolved).thaw()


class WipeNode(Fault):
    """kill -9, rm -rf the data dir, and (at `end`) start again: the node comes back with
    a new copy of the vhost log, which must catch up before it counts as in sync."""

    kind = "wipe_node"

    def begin(self, h: Jepsen) -> None:
        node = h.cluster.node(self.resolved)
        assert self.record is not None
        self.record.notes["copy_before"] = node.copy_id()
        node.wipe()

    def end(self, h: Jepsen) -> None:
        node = h.cluster.node(self.resolved)
        before = node.starts
        h.start_node(node)
        assert self.record is not None
        self.record.notes["starts"] = node.starts - before
        deadline = time.monotonic() + 15  # the log's directory is made as the node joins
        while node.copy_id() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        self.record.notes["copy_after"] = node.copy_id()


class SlowNode(Fault):
    """tbf with a deep queue on the node's link (no netem on this kernel: netns.py)."""

    kind = "slow_node"

    def begin(self, h: Jepsen) -> None:
        h.cluster.net.slow(self.resolved)

    def end(self, h: Jepsen) -> None:
        h.cluster.net.unslow(self.resolved)


class MoveLeader(Fault):
    """`roarmq ctl move_vhost_leader / NODE`, asked of a node that is not the target;
    instantaneous (its `end` does nothing). Target "follower": a node in sync now."""

    kind = "move_vhost_leader"

    def __init__(self, target: str = "follower") -> None:
        super().__init__(target)

    def begin(self, h: Jepsen) -> None:
        via = next(
            (n for n in h.cluster.nodes if n.name != self.resolved and n.running and not n.frozen),
            None,
        )
        code, out = h.cluster.ctl("move_vhost_leader", "/", self.resolved, via=via)
        assert self.record is not None
        self.record.notes["ctl_exit"] = code
        self.record.notes["ctl_output"] = out[-400:]


# -- results -----------------------------------------------------------------------------


@dataclass
class LogComparison:
    """Every node's copy of the vhost log, compared."""

    api: dict[str, dict | None]  # replicated_log per node, once quiet
    api_equal: bool  # the same last offset and epoch on every node
    files: dict[str, dict]  # per node: first_offset, last_offset, epoch, copy_id
    compared_from: int
    compared_to: int
    compared: int  # offsets compared
    mismatches: list[int]  # offsets whose records differ (the first 20)
    differing: int  # how many offsets differ
    equal: bool  # no mismatch and the same last offset everywhere


@dataclass
class JepsenResult:
    duration_s: float
    published: int
    outcomes: dict[str, int]
    acked: int
    lost: list[int]
    phantoms: int
    consumed_distinct: int
    deliveries: int
    duplicates: int
    indeterminate_consumed: int  # nacked / closed / timed out, yet delivered (allowed)
    max_answer_s: float  # the longest wait for an outcome, any publish
    max_answer_not_excused_s: float
    unanswered: int  # outcome timeout (the client gave up)
    unanswered_excused: int
    over_bound: list[dict]  # publishes not excused that waited longer than the bound
    over_bound_total: int
    bound_s: float
    faults: list[FaultRecord]
    leaders: list[dict]
    #: Two nodes each showing, in its own API, that it held the vhost's replication
    #: leader at the same time (polls, so within a quarter of a second or so).
    leader_overlaps: list[dict]
    logs: LogComparison | None
    errors: dict[str, int]
    redirects: int
    healthy_after_s: float | None
    drained: bool
    notes: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        o = self.outcomes
        lines = [
            f"{self.duration_s:.1f} s, {self.published} publishes: "
            + ", ".join(f"{k} {v}" for k, v in o.items() if v),
            f"lost {len(self.lost)}, phantoms {self.phantoms}, duplicates {self.duplicates}, "
            f"consumed {self.consumed_distinct} distinct ({self.deliveries} deliveries), "
            f"indeterminate but delivered {self.indeterminate_consumed}",
            f"longest wait for an answer {self.max_answer_s:.2f} s "
            f"(not excused {self.max_answer_not_excused_s:.2f} s, bound {self.bound_s:.1f} s); "
            f"unanswered {self.unanswered} ({self.unanswered_excused} excused); "
            f"over the bound, not excused: {len(self.over_bound)}",
        ]
        if self.leader_overlaps:
            worst = max(self.leader_overlaps, key=lambda o: o["seconds"])
            lines.append(f"two nodes leading at once: {len(self.leader_overlaps)} times, {worst}")
        if self.logs is not None:
            lg = self.logs
            lines.append(
                f"logs: api equal {lg.api_equal}; files equal {lg.equal} "
                f"({lg.compared} offsets {lg.compared_from}..{lg.compared_to}, "
                f"{lg.differing} differ)"
            )
        for f in self.faults:
            end = "-" if f.ended is None else f"{f.ended:.1f}"
            lines.append(
                f"  {f.began:7.1f}..{end:>7} {f.name} {','.join(f.targets)} "
                f"(leader before {f.leader_before}, during {f.leaders_during}, "
                f"after {f.leaders_after}) {f.notes or ''}"
            )
        return "\n".join(lines)


# -- the harness -------------------------------------------------------------------------


class Jepsen:
    """The cluster, the workload, the monitor and the faults of one run.

        with Jepsen(tmp_path, Settings()) as h:
            result = h.run(schedule, bound=7.0)

    `schedule(h)` drives the faults with `h.begin(fault)`, `h.end(fault)`, `h.sleep(s)`
    and `h.wait_healthy()`; everything it leaves undone is undone after it.
    """

    def __init__(self, base: Path, settings: Settings | None = None, *, seed: int = 0) -> None:
        self.settings = settings or Settings()
        self.cluster = RoarCluster(base, self.settings)
        self.rng = random.Random(seed)
        self.history = History()
        self.timeline = FaultTimeline()
        self.monitor: Monitor | None = None
        self.workload: Workload | None = None
        self.faults: list[Fault] = []
        self.t0 = time.monotonic()

    def __enter__(self) -> Jepsen:
        self.cluster.__enter__()
        try:
            leader = self.cluster.wait_healthy(60)
            if leader is None:
                raise RuntimeError(f"cluster not whole after 60 s\n{self.cluster.tails()}")
            self.monitor = Monitor(self.cluster, self.t0).start()
            deadline = time.monotonic() + 10
            while self.monitor.leader() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        except BaseException:
            self.cluster.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.workload is not None:
                self.workload.stop()
            if self.monitor is not None:
                self.monitor.stop()
        finally:
            self.cluster.close()

    # -- time and state

    def now(self) -> float:
        return time.monotonic() - self.t0

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def leader(self) -> str | None:
        return self.monitor.leader() if self.monitor else self.cluster.healthy_leader()

    def wait_leader(
        self, timeout: float, *, other_than: str | None = None, wanted: str | None = None
    ) -> str | None:
        """A leader that a node named in the last polls: not `other_than`, or exactly
        `wanted` (None when none came within `timeout`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader and leader != other_than and wanted in (None, leader):
                return leader
            time.sleep(0.05)
        return None

    def wait_healthy(self, timeout: float = 60) -> str | None:
        return self.cluster.wait_healthy(timeout)

    def _note_state(self) -> None:
        frozen = {n.name for n in self.cluster.nodes if n.frozen}
        frozen |= {m.name for m in self.cluster.etcd.members if m.frozen}
        self.timeline.note(frozen, self.cluster.net.blocked())

    def resolve(self, target: str) -> str:
        names = self.cluster.node_names
        if target in ("leader", "follower"):
            leader = self.leader()
            if target == "leader":
                return leader or self.rng.choice(names)
            followers = [n for n in names if n != leader]
            return self.rng.choice(followers)
        if target == "etcd":
            return self.rng.choice(self.cluster.etcd_names)
        return target

    def start_node(self, node: RoarNode, timeout: float = 30.0) -> None:
        """Start `node`, and start it again while it exits at once: a node whose data dir
        was wiped is a new instance, refused while its last life's key is still live in
        etcd (until that lease expires); the broker then exits saying so."""
        deadline = time.monotonic() + timeout
        while True:
            node.start()
            settle = time.monotonic() + 1.5
            while time.monotonic() < settle and node.running:
                time.sleep(0.1)
            if node.running or time.monotonic() > deadline:
                return
            time.sleep(0.5)

    # -- faults

    def begin(self, fault: Fault) -> Fault:
        fault.resolved = self.resolve(fault.target)
        fault.record = FaultRecord(
            fault.kind, [fault.resolved], round(self.now(), 2), leader_before=self.leader()
        )
        self.faults.append(fault)
        fault.begin(self)
        self._note_state()
        return fault

    def end(self, fault: Fault) -> None:
        if fault.record is None or fault.record.ended is not None:
            return
        fault.end(self)
        fault.record.ended = round(self.now(), 2)
        self._note_state()

    def end_all(self) -> None:
        for fault in self.faults:
            self.end(fault)
        self.cluster.net.heal_all()
        for node in self.cluster.nodes:
            node.thaw()
            if not node.running:
                self.start_node(node)
        for member in self.cluster.etcd.members:
            member.thaw()
            if not member.running:
                member.start()
        self._note_state()

    # -- the run

    def start_workload(self) -> Workload:
        self.workload = Workload(self.cluster, self.settings, self.history).start()
        return self.workload

    def run(
        self,
        schedule: Callable[[Jepsen], None],
        *,
        bound: float,
        warmup: float = 2.0,
        heal_timeout: float = 90.0,
        drain_timeout: float = 60.0,
    ) -> JepsenResult:
        """The workload, `schedule`, healing, draining and every checker."""
        t_start = time.monotonic()
        self.start_workload()
        time.sleep(warmup)
        try:
            schedule(self)
        finally:
            self.end_all()
        healed_at = time.monotonic()
        leader = self.cluster.wait_healthy(heal_timeout)
        healthy_after = None if leader is None else round(time.monotonic() - healed_at, 2)
        time.sleep(1.0)  # a few publishes on the healed cluster
        assert self.workload is not None
        self.workload.stop_publishing()
        drained = self.workload.drain(drain_timeout)
        self.workload.stop()
        self.monitor.stop()  # type: ignore[union-attr]
        logs = self.compare_logs() if leader is not None else None
        result = self._result(bound, time.monotonic() - t_start, logs, healthy_after, drained)
        result.notes["leader_after_heal"] = leader
        return result

    # -- checkers

    def compare_logs(self, quiet_timeout: float = 30.0) -> LogComparison:
        """Wait until every node's API shows the same last offset and epoch for a second,
        then stop the nodes (followers first, so no election writes a new epoch) and
        compare their log files record by record."""
        deadline = time.monotonic() + quiet_timeout
        api: dict[str, dict | None] = {}
        api_equal = False
        previous = None
        while time.monotonic() < deadline:
            api = self.cluster.replicated_logs()
            heads = {(row["last_offset"], row["epoch"]) if row else None for row in api.values()}
            if len(heads) == 1 and None not in heads and heads == previous:
                api_equal = True
                break
            previous = heads
            time.sleep(1.0)
        leader = self.cluster.healthy_leader()
        order = sorted(self.cluster.nodes, key=lambda n: n.name == leader)
        for node in order:
            node.stop()
        return compare_log_files(
            {n.name: n.data_dir / VHOST_LOG for n in self.cluster.nodes},
            self.cluster.base / "log-copies",
            api,
            api_equal,
        )

    def _result(
        self,
        bound: float,
        duration: float,
        logs: LogComparison | None,
        healthy_after: float | None,
        drained: bool,
    ) -> JepsenResult:
        figures = history_figures(
            self.history, bound, self._excuse, self.cluster.node_names, self.t0
        )
        faults = [f.record for f in self.faults if f.record is not None]
        for record in faults:
            began = self.t0 + record.began
            ended = self.t0 + (record.ended if record.ended is not None else self.now())
            assert self.monitor is not None
            record.leaders_during = sorted(self.monitor.leaders_between(began, ended))
            record.leaders_after = sorted(
                self.monitor.leaders_between(ended, ended + 2 * self.settings.lease_ttl + 3)
            )
        return JepsenResult(
            duration_s=round(duration, 1),
            **figures,
            faults=faults,
            leaders=self.monitor.timeline() if self.monitor else [],
            leader_overlaps=self.monitor.overlaps() if self.monitor else [],
            logs=logs,
            errors=dict(self.workload.errors) if self.workload else {},
            redirects=self.workload.redirects if self.workload else 0,
            healthy_after_s=healthy_after,
            drained=drained,
        )

    def _excuse(self, endpoint: str, opened: float, sent: float, answered: float) -> str | None:
        """Why no broker could have answered this publish in time (None: it could): the
        node it was sent to, or a node leading while it waited, was frozen, or the path
        client -> endpoint -> that leader lost its packets."""
        assert self.monitor is not None
        servers = self.monitor.leaders_between(min(opened, sent) - 1.0, answered)
        for state in self.timeline.during(sent, answered):
            if endpoint in state.frozen:
                return f"{endpoint} frozen"
            if (CLIENT, endpoint) in state.blocked or (endpoint, CLIENT) in state.blocked:
                return f"client cut from {endpoint}"
            for server in servers - {endpoint}:
                if server in state.frozen:
                    return f"leader {server} frozen"
                if (endpoint, server) in state.blocked or (server, endpoint) in state.blocked:
                    return f"{endpoint} cut from leader {server}"
        return None


def history_figures(
    h: History,
    bound: float,
    excuse: Callable[[str, float, float, float], str | None],
    names: Sequence[str],
    t0: float,
) -> dict[str, Any]:
    """The workload's checkers over a history: outcomes, lost (acked, never consumed),
    phantoms, duplicates, and the answers: the longest wait for an outcome, the longest
    one `excuse(endpoint, opened, sent, answered)` does not explain, the publishes left
    without an answer, and those not excused that waited longer than `bound`."""
    n = len(h.sent)
    outcomes = Counter(OUTCOMES[h.outcome[i]] for i in range(n))
    lost = h.lost()
    max_any = max_not_excused = 0.0
    unanswered = unanswered_excused = indeterminate = 0
    over: list[dict] = []
    now = time.monotonic()
    for i in range(n):
        outcome = h.outcome[i]
        if outcome != ACK and h.was_consumed(i):
            indeterminate += 1
        answered = h.answered[i] if outcome != PENDING else now
        wait = answered - h.sent[i]
        max_any = max(max_any, wait)
        excused = None
        if wait > 1.0 or outcome in (TIMEOUT, PENDING):
            excused = excuse(names[h.endpoint[i]], h.opened[i], h.sent[i], answered)
        if outcome in (TIMEOUT, PENDING):
            unanswered += 1
            unanswered_excused += bool(excused)
        if not excused:
            max_not_excused = max(max_not_excused, wait)
            if wait > bound:
                over.append(
                    {
                        "id": i,
                        "sent": round(h.sent[i] - t0, 2),
                        "wait": round(wait, 2),
                        "outcome": OUTCOMES[outcome],
                        "endpoint": names[h.endpoint[i]],
                    }
                )
    return {
        "published": n,
        "outcomes": {k: outcomes.get(k, 0) for k in OUTCOMES},
        "acked": outcomes.get("ack", 0),
        "lost": lost[:100],
        "phantoms": len(h.phantoms),
        "consumed_distinct": sum(1 for c in h.consumed if c),
        "deliveries": h.deliveries,
        "duplicates": sum(c - 1 for c in h.consumed if c > 1),
        "indeterminate_consumed": indeterminate,
        "max_answer_s": round(max_any, 3),
        "max_answer_not_excused_s": round(max_not_excused, 3),
        "unanswered": unanswered,
        "unanswered_excused": unanswered_excused,
        "over_bound": over[:50],
        "over_bound_total": len(over),
        "bound_s": bound,
        "notes": {"lost_total": len(lost), "phantom_bodies": [repr(b) for b in h.phantoms[:10]]},
    }


def compare_log_files(
    dirs: dict[str, Path],
    scratch: Path,
    api: dict[str, dict | None] | None = None,
    api_equal: bool = False,
    chunk: int = 4 << 20,
) -> LogComparison:
    """Open each node's log directory (a copy of it, so nothing is written to the node's
    own) with `SegmentRecordStore` and compare the records at every offset that all of
    them hold: from the highest first offset to the lowest last one."""
    from roarmq.broker.replog.records import SegmentRecordStore

    stores = {}
    files: dict[str, dict] = {}
    try:
        for name, directory in dirs.items():
            if not directory.is_dir():
                files[name] = {"missing": str(directory)}
                continue
            copy = scratch / name
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(directory, copy)
            store = SegmentRecordStore(copy)
            stores[name] = store
            files[name] = {
                "first_offset": store.first_offset,
                "last_offset": store.last_offset,
                "epoch": store.last_epoch(),
                "copy_id": store.copy_id,
            }
        start = max((s.first_offset for s in stores.values()), default=1)
        end = min((s.last_offset for s in stores.values()), default=0)
        mismatches: list[int] = []
        differing = compared = 0
        offset = start
        while offset <= end and len(stores) > 1:
            # Each store reads at least one record from `offset` (every one holds it):
            # compare up to the shortest batch's end.
            batches = {name: dict(s.read(offset, chunk)) for name, s in stores.items()}
            upto = min(end, *(max(b) for b in batches.values()))
            for o in range(offset, upto + 1):
                records = {b.get(o) for b in batches.values()}
                if len(records) != 1 or None in records:
                    differing += 1
                    if len(mismatches) < 20:
                        mismatches.append(o)
                compared += 1
            offset = upto + 1
        lasts = {s.last_offset for s in stores.values()}
        equal = len(stores) == len(dirs) and not mismatches and len(lasts) == 1
        return LogComparison(
            api=api or {},
            api_equal=api_equal,
            files=files,
            compared_from=start,
            compared_to=end,
            compared=compared,
            mismatches=mismatches,
            differing=differing,
            equal=equal,
        )
    finally:
        for store in stores.values():
            with contextlib.suppress(Exception):
                store.close()
