"""Three real cluster nodes (`python -m roarmq --cluster-etcd ... --node ...`) on one
real etcd, for the tests of tests/cluster: the node process, the trio, and what tests ask of
them (who leads, a connection once the vhost serves, publishing with confirms, draining)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pika

from .waiting import free_port, until

ROOT = Path(__file__).resolve().parents[2]
#: The nodes' lease_ttl (etcd's smallest): a dead leader is replaced within about this.
TTL = 2
PERSISTENT = pika.BasicProperties(delivery_mode=2)


class Node:
    def __init__(self, tmp: Path, name: str, etcd_url: str) -> None:
        self.name = name
        self.port, self.mgmt_port, self.repl_port = free_port(), free_port(), free_port()
        self.data_dir = tmp / name
        self.log = tmp / f"{name}.log"
        self.config = tmp / f"{name}.toml"
        self.config.write_text(
            '[amqp]\nbind = ["127.0.0.1"]\n'
            f'[management]\nenabled = true\nbind = "127.0.0.1"\nport = {self.mgmt_port}\n'
            f"[cluster]\netcd = [{json.dumps(etcd_url)}]\nnode = {json.dumps(name)}\n"
            f"lease_ttl = {TTL}\n"
        )
        self.etcd_url = etcd_url
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, under: list[str] = ()) -> Node:
        """Start the node (`under`: a command to run it under, strace for one)."""
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    *under,
                    sys.executable,
                    "-m",
                    "roarmq",
                    "--config",
                    str(self.config),
                    "--port",
                    str(self.port),
                    "--data-dir",
                    str(self.data_dir),
                    "--cluster-etcd",
                    self.etcd_url,
                    "--node",
                    self.name,
                    "--replication-port",
                    str(self.repl_port),
                    "--log-level",
                    "info",
                ],
                stdout=out,
                stderr=out,
                cwd=ROOT,
            )
        return self

    def api(self, path: str):
        with urllib.request.urlopen(
            urllib.request.Request(
                f"http://127.0.0.1:{self.mgmt_port}{path}",
                headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="},  # guest:guest
            ),
            timeout=2,
        ) as resp:
            return json.loads(resp.read())

    def params(self) -> pika.ConnectionParameters:
        return pika.ConnectionParameters(
            "127.0.0.1", self.port, connection_attempts=1, socket_timeout=3
        )

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill9()


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
def three_nodes(etcd, tmp_path, extra: str = ""):  # type: ignore[no-untyped-def]
    """n1, n2, n3 on `etcd`, `extra` appended to each one's [cluster] section; all
    stopped at the end, a frozen one (SIGSTOP) woken first so that it can stop."""
    nodes = [Node(tmp_path, f"n{i}", etcd.url) for i in (1, 2, 3)]
    for node in nodes:
        if extra:
            with open(node.config, "a") as config:
                config.write(extra)
    try:
        for node in nodes:
            node.start()
        yield nodes
    finally:
        for node in nodes:
            if node.proc is not None and node.proc.poll() is None:
                os.kill(node.proc.pid, signal.SIGCONT)
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


def log_of(node) -> dict:
    return node.api("/api/vhosts/%2F")["replicated_log"]
