"""`roarmq cluster-demo` (and so `make cluster`): a real etcd and three real nodes start, a
client on any node publishes and consumes, and `stop` stops exactly what was started."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys

import pika
import pytest
from support.etcd import etcd_binary_or_skip

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

CLI = "import sys; from roarmq.broker.__main__ import cli; sys.exit(cli(sys.argv[1:]))"


def free_run(count: int) -> int:
    """A base port with `count` free ports from it (the demo numbers its nodes' ports so)."""
    rng = random.Random()
    while True:
        base = rng.randrange(30000, 60000)
        try:
            sockets = []
            for port in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()


def demo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CLI, "cluster-demo", *args],
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_cluster_demo_starts_serves_and_stops(tmp_path):
    etcd_binary_or_skip()  # the demo finds it itself
    where = tmp_path / "demo"
    ports = [
        f"--etcd-port={free_run(2)}",
        f"--amqp-port={(amqp := free_run(3))}",
        f"--management-port={free_run(3)}",
        f"--replication-port={free_run(3)}",
        f"--dir={where}",
    ]
    started = demo(*ports)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert "vhost / is led by n" in started.stdout, started.stdout
        pids = {f.stem: int(f.read_text()) for f in where.glob("*.pid")}
        assert set(pids) == {"etcd", "n1", "n2", "n3"}
        for port in (amqp, amqp + 1, amqp + 2):  # any node: handed to the leader
            conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare("demo", durable=True)
            ch.basic_publish("", "demo", b"%d" % port, pika.BasicProperties(delivery_mode=2))
            method, _props, body = ch.basic_get("demo", auto_ack=True)
            assert body == b"%d" % port
            conn.close()
        again = demo(*ports)
        assert again.returncode == 1 and "already running" in again.stderr
    finally:
        stopped = demo("stop", f"--dir={where}")
    assert stopped.returncode == 0, stopped.stderr
    for name, pid in pids.items():
        assert f"stopped {name} (pid {pid})" in stopped.stdout
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not list(where.glob("*.pid"))
