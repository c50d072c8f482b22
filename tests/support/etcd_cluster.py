"""Three etcd members, each in a network namespace of its own (tests/support/netns.py).

One etcd on loopback cannot lose a quorum, have a member cut off from its peers, or lag
behind them; a cluster of three can, which is how production runs etcd (docs/cluster.md,
"Running etcd for it"). Each member listens on its namespace's address (client 2379,
peer 2380: every member has the ports to itself), with `--initial-cluster` naming the
three peer URLs, so a partition made with `Network.cut` really separates it from its
peers, from the brokers or from both. `client_urls` is the list a broker's `[cluster] etcd`
takes.

Per member: `start()` (again on the same data dir after a stop or a kill: etcd then
rejoins with what it had), `stop()` (SIGTERM), `kill9()`, `freeze()` (SIGSTOP) and
`thaw()`, all by the PID this object started. `wait_healthy()` asks each member's
`/health` (true only when the member sees a leader: a member cut off from its peers says
false) from the test process, across the switch.

The binary is `.tools/etcd` (`make tools` extracts it from Debian's etcd-server, 3.4) or
`etcd` on PATH.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from .etcd import etcd_binary
from .netns import Network
from .process import ControlledProcess

ROOT = Path(__file__).resolve().parents[2]
CLIENT_PORT = 2379
PEER_PORT = 2380


class EtcdMember(ControlledProcess):
    """One member in host `name` of the network; the process is started by PID."""

    def __init__(self, cluster: EtcdCluster, name: str) -> None:
        super().__init__()
        self.cluster = cluster
        self.name = name
        self.address = cluster.net.addresses[name]
        self.client_url = f"http://{self.address}:{CLIENT_PORT}"
        self.peer_url = f"http://{self.address}:{PEER_PORT}"
        self.data_dir = cluster.base / name
        self.log = cluster.base / f"{name}.log"

    def argv(self) -> list[str]:
        c = self.cluster
        return [
            c.binary,
            f"--name={self.name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={self.client_url}",
            f"--advertise-client-urls={self.client_url}",
            f"--listen-peer-urls={self.peer_url}",
            f"--initial-advertise-peer-urls={self.peer_url}",
            "--initial-cluster=" + ",".join(f"{m.name}={m.peer_url}" for m in c.members),
            f"--initial-cluster-token=roarmq-{c.net.tag}",
            "--initial-cluster-state=new",  # ignored by a member whose data dir exists
            f"--heartbeat-interval={c.heartbeat_ms}",
            f"--election-timeout={c.election_ms}",
            "--log-level=warn",
        ]

    def start(self) -> None:
        if self.running:
            return
        with open(self.log, "ab") as out:
            out.write(f"--- start at {time.time():.3f}\n".encode())
            out.flush()
            self.proc = self.cluster.net.popen(
                self.name, self.argv(), stdout=out, stderr=subprocess.STDOUT
            )
        self.frozen = False

    def healthy(self, timeout: float = 1.0) -> bool:
        """etcd's /health says true: running, and it sees a leader."""
        try:
            with urllib.request.urlopen(self.client_url + "/health", timeout=timeout) as resp:
                return b'"true"' in resp.read()
        except OSError:
            return False


class EtcdCluster:
    """Members in hosts `names` of `net` (each must be a host of the network); their
    data dirs and logs under `base`. `heartbeat_ms` and `election_ms` are etcd's own
    (100 and 1000 by default, as etcd's defaults)."""

    def __init__(
        self,
        net: Network,
        base: Path,
        names: Sequence[str] = ("e1", "e2", "e3"),
        *,
        binary: str | None = None,
        heartbeat_ms: int = 100,
        election_ms: int = 1000,
    ) -> None:
        found = binary or etcd_binary()
        if found is None:
            raise FileNotFoundError("no etcd: `make tools` extracts it into .tools/etcd")
        self.binary = found
        self.net = net
        self.base = base
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms
        base.mkdir(parents=True, exist_ok=True)
        self.members: list[EtcdMember] = []
        for name in names:
            self.members.append(EtcdMember(self, name))

    def __enter__(self) -> EtcdCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.members]

    @property
    def client_urls(self) -> list[str]:
        return [m.client_url for m in self.members]

    def member(self, name: str) -> EtcdMember:
        return next(m for m in self.members if m.name == name)

    def start(self, timeout: float = 30.0) -> EtcdCluster:
        """Start every member (at once: each waits for the others to form the cluster)
        and wait until all are healthy."""
        try:
            for m in self.members:
                m.start()
            self.wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self, timeout: float, members: Sequence[EtcdMember] | None = None) -> None:
        """Until every member of `members` (default: all) says healthy; RuntimeError with
        the logs' tails otherwise."""
        wanted = list(members or self.members)
        deadline = time.monotonic() + timeout
        while True:
            for m in wanted:
                if m.proc is not None and m.proc.poll() is not None:
                    raise RuntimeError(
                        f"etcd {m.name} exited ({m.proc.returncode}):\n{self.tails()}"
                    )
            if all(m.healthy() for m in wanted):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd not healthy after {timeout} s:\n{self.tails()}")
            time.sleep(0.1)

    def tails(self, chars: int = 1500) -> str:
        out = []
        for m in self.members:
            with contextlib.suppress(OSError):
                out.append(f"--- {m.name}\n{m.log.read_text(errors='replace')[-chars:]}")
        return "\n".join(out)

    def stop(self) -> None:
        """Every member stopped by its PID (SIGCONT first, so a frozen one can stop)."""
        for m in self.members:
            m.stop()
