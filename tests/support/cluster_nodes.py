"""Three real cluster nodes (`python -m roarmq --cluster-etcd ... --node ...`) on one
real etcd, for the tests of tests/cluster: the node process, the trio, and what tests ask of
them (who leads, a connection once the vhost serves, publishing with confirms, draining)."""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Self

import pika

from roarmq.broker.cli import ctl

from .broker_process import BrokerProcess, ClusterOptions
from .waiting import until

#: The nodes' lease_ttl (etcd's smallest): a dead leader is replaced within about this.
TTL = 2
PERSISTENT = pika.BasicProperties(delivery_mode=2)


class Node(BrokerProcess):
    """A cluster node on loopback (tests/support/broker_process.py): `name`.toml and
    `name`.log in `tmp`, lease_ttl TTL. `start()` does not wait: the tests wait on its API
    (a node may be meant to stop at start)."""

    STOP_GRACE = 15.0

    def __init__(
        self,
        tmp: Path,
        name: str,
        etcd_url: str,
        *,
        keys: str = "",
        storage: str = "",
        extra: str = "",
        under: Sequence[str] = (),
    ) -> None:
        """`keys`: further lines of its [cluster] section; `storage`: its [storage]
        section; `extra`: further sections; `under`: a command to run it under (strace)."""
        super().__init__(
            tmp / name,
            cluster=ClusterOptions([etcd_url], name, lease_ttl=TTL, keys=keys),
            storage=storage,
            extra=extra,
            log=tmp / f"{name}.log",
            config=tmp / f"{name}.toml",
            under=under,
            api_timeout=2,
        )
        self.name = name

    def start(self, wait: bool = False) -> Self:
        return super().start(wait)

    def params(self) -> pika.ConnectionParameters:
        return pika.ConnectionParameters(
            "127.0.0.1", self.port, connection_attempts=1, socket_timeout=3
        )


def connect_with(params: pika.ConnectionParameters, timeout: float = 15) -> pika.BlockingConnection:
    """A connection once the vhost serves: a leader just elected answers 530 "is being
    recovered" until its copy of the vhost is recovered."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return pika.BlockingConnection(params)
        except pika.exceptions.ProbableAccessDeniedError as exc:
            if "being recovered" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@contextlib.contextmanager
def three_nodes(etcd, tmp_path, keys: str = "", *, storage: str = ""):  # type: ignore[no-untyped-def]
    """n1, n2, n3 on `etcd`, `keys` appended to each one's [cluster] section, `storage`
    its [storage] section; all stopped at the end (a frozen one woken first)."""
    nodes = [Node(tmp_path, f"n{i}", etcd.url, keys=keys, storage=storage) for i in (1, 2, 3)]
    try:
        for node in nodes:
            node.start()
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def placement(node: Node) -> tuple:
    row = node.api("/api/vhosts/%2F")
    return row["leader"], tuple(row["members"]), tuple(row["in_sync"])


def agreed_leader(nodes: list[Node], size: int = 3) -> str | None:
    seen = {placement(node) for node in nodes}
    if len(seen) != 1:
        return None
    (leader, _members, in_sync), *_ = seen
    return leader if leader is not None and len(in_sync) == size else None


def connect(node: Node) -> pika.BlockingConnection:
    """A client on the node once it serves the vhost (it answers 530 while recovering)."""

    def attempt():
        try:
            return pika.BlockingConnection(node.params())
        except pika.exceptions.AMQPError:
            return None

    conn = until(attempt, 15, step=0.2)
    assert conn, node.log.read_text()[-3000:]
    return conn


def publish_confirmed(node: Node, queue: str, bodies: list[bytes]) -> list[bytes]:
    conn = connect(node)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(queue, durable=True)
    confirmed = []
    for body in bodies:
        ch.basic_publish("", queue, body, PERSISTENT, mandatory=True)  # raises on nack
        confirmed.append(body)
    conn.close()
    return confirmed


def drain(node: Node, queue: str) -> list[bytes]:
    conn = connect(node)
    ch = conn.channel()
    got = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        got.append(body)
    conn.close()
    return got


def by_name(nodes: list[Node], name: str) -> Node:
    return next(n for n in nodes if n.name == name)


def the_leader(cluster):
    """The node every node agrees leads "/" with all three in sync."""
    name = until(lambda: agreed_leader(cluster), 60)
    assert name, "\n\n".join(f"{n.name}:\n{n.log.read_text()[-1500:]}" for n in cluster)
    return by_name(cluster, name)


def run_ctl(node: Node, *args: str) -> tuple[int, str, str]:
    """`roarmq ctl ARGS` against the node's management API, in this process: (exit
    code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = ctl.main(["--url", f"http://127.0.0.1:{node.mgmt_port}", *args])
    return code, out.getvalue(), err.getvalue()


def log_of(node) -> dict:
    return node.api("/api/vhosts/%2F")["replicated_log"]


def fail_over(cluster: list[Node], leader: Node) -> Node:
    """Kill -9 the leader of "/"; the survivor every survivor agrees leads it next."""
    leader.kill9()
    survivors = [n for n in cluster if n is not leader]

    def new_leader():
        name = agreed_leader(survivors, size=len(placement(survivors[0])[2]))
        return name if name not in (None, leader.name) else None

    name = until(new_leader, 4 * TTL + 10, step=0.1)
    assert name, [n.log.read_text()[-3000:] for n in survivors]
    return by_name(survivors, name)
