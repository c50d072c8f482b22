"""`roarmq cluster-demo`: a local cluster to try (docs/cluster.md), and `make cluster`.

    roarmq cluster-demo [--dir cluster-demo]          start etcd and nodes n1..n3
    roarmq cluster-demo stop [--dir cluster-demo]     stop exactly what it started

etcd on 127.0.0.1:2479 (peer 2480), AMQP on 5681..5683, management on 15681..15683,
replication on 25681..25683 (`--etcd-port`, `--amqp-port`, `--management-port`,
`--replication-port` move each base). Data, logs, configs and PID files live in `--dir`;
`stop` signals exactly the PIDs recorded there and waits for each to go. etcd is the
project's `.tools/etcd` (`make tools`) or one on PATH.

Why a command and not only a Makefile recipe: the same steps serve `make cluster`, a user
with only the installed package, and the test that proves they work.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

NODES = ("n1", "n2", "n3")
GUEST = "Basic Z3Vlc3Q6Z3Vlc3Q="


def etcd_binary() -> str | None:
    tools = Path(__file__).resolve().parents[2] / ".tools" / "etcd"
    return str(tools) if tools.exists() else shutil.which("etcd")


def _running(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def _wait(predicate, timeout: float, step: float = 0.2):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            answer = predicate()
            if answer:
                return answer
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(step)
    return None


def start(args: argparse.Namespace) -> int:
    where = Path(args.dir)
    for pid_file in where.glob("*.pid"):
        if _running(pid_file):
            print(f"cluster-demo: already running ({pid_file}); stop it first", file=sys.stderr)
            return 1
    etcd = etcd_binary()
    if etcd is None:
        print("cluster-demo: no etcd (make tools puts one in .tools/etcd)", file=sys.stderr)
        return 1
    where.mkdir(parents=True, exist_ok=True)
    client = f"http://127.0.0.1:{args.etcd_port}"
    peer = f"http://127.0.0.1:{args.etcd_port + 1}"
    with open(where / "etcd.log", "ab") as out:
        proc = subprocess.Popen(
            [
                etcd,
                "--name=demo",
                f"--data-dir={where / 'etcd'}",
                "--log-level=warn",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=demo={peer}",
            ],
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    (where / "etcd.pid").write_text(str(proc.pid))
    if not _wait(lambda: urllib.request.urlopen(client + "/health", timeout=1), 15):
        print(f"cluster-demo: etcd did not start (see {where / 'etcd.log'})", file=sys.stderr)
        return 1
    for i, node in enumerate(NODES):
        config = where / f"{node}.toml"
        config.write_text(
            f'[amqp]\nbind = ["127.0.0.1"]\nport = {args.amqp_port + i}\n'
            f'[management]\nbind = "127.0.0.1"\nport = {args.management_port + i}\n'
            f"[cluster]\netcd = [{json.dumps(client)}]\nnode = {json.dumps(node)}\n"
            f"replication_port = {args.replication_port + i}\n"
        )
        with open(where / f"{node}.log", "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "roarmq", "--config", str(config)]
                + ["--data-dir", str(where / node)],
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        (where / f"{node}.pid").write_text(str(proc.pid))

    def led() -> str | None:
        """Ready once every node has joined and names the same leader of `/` (a node that
        has not joined yet refuses clients with 530)."""
        rows = []
        for i in range(len(NODES)):
            request = urllib.request.Request(
                f"http://127.0.0.1:{args.management_port + i}/api/vhosts/%2F",
                headers={"Authorization": GUEST},
            )
            rows.append(json.load(urllib.request.urlopen(request, timeout=1)))
        leaders = {row["leader"] for row in rows}
        if len(leaders) != 1 or None in leaders:
            return None
        row = rows[0]
        return f"{row['leader']} (members {', '.join(row['members'])})"

    leader = _wait(led, 60, 0.5)
    print(f"etcd {client}; nodes {', '.join(NODES)}:")
    for i, node in enumerate(NODES):
        print(
            f"  {node}: amqp://guest:guest@127.0.0.1:{args.amqp_port + i}  "
            f"http://127.0.0.1:{args.management_port + i}  log {where / (node + '.log')}"
        )
    print(f"vhost / is led by {leader}" if leader else "vhost /: no leader yet (see the logs)")
    print("Connect to any node: a client of a vhost led elsewhere is handed to its leader.")
    stop_hint = "make cluster-stop" if args.make else f"roarmq cluster-demo stop --dir {where}"
    print(f"Stop with: {stop_hint}")
    return 0 if leader else 1


def stop(args: argparse.Namespace) -> int:
    where = Path(args.dir)
    for name in (*NODES, "etcd"):  # the nodes first: they leave etcd cleanly
        pid_file = where / f"{name}.pid"
        pid = _running(pid_file)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            if not _wait(lambda f=pid_file: _running(f) is None, 15, 0.1):
                os.kill(pid, signal.SIGKILL)
            print(f"stopped {name} (pid {pid})")
        pid_file.unlink(missing_ok=True)
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="roarmq cluster-demo", description="a local etcd and three nodes to try a cluster"
    )
    p.add_argument("action", nargs="?", choices=("start", "stop"), default="start")
    p.add_argument("--dir", default="cluster-demo", help="data, logs, configs, PIDs")
    p.add_argument("--etcd-port", type=int, default=2479, help="etcd client port (peer: +1)")
    p.add_argument("--amqp-port", type=int, default=5681, help="n1's; n2, n3 the next")
    p.add_argument("--management-port", type=int, default=15681, help="n1's; n2, n3 the next")
    p.add_argument("--replication-port", type=int, default=25681, help="n1's; n2, n3 the next")
    p.add_argument("--make", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    return start(args) if args.action == "start" else stop(args)
