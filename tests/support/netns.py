"""A small network of Linux network namespaces, made by the test, with faults from the kernel.

A fault test that kills processes on loopback never exercises what a real network does to a
cluster: a partition leaves every TCP connection open and silent (no reset, no error: the
packets vanish), one side may still hear the other, and a link may be slow rather than
down. This module builds, per test, one namespace per host (a broker node, an etcd member),
each with `lo` up and one `eth0`, joined by veth pairs to a Linux bridge in a namespace of
its own: the switch. The test process stays in the root namespace and reaches the hosts
through one more veth on that bridge (the only thing made outside the test's namespaces:
one link with the client's address, deleted at the end), so clients cross the same switch
as the hosts do, and routing works both ways on one flat /24.

Addresses come from a random /24 of 10.160.0.0 to 10.249.255.0 (private, rarely routed,
and checked against the root namespace's routes and addresses before use), with names
tagged by a random suffix, so parallel runs do not clash: the client is .1, the hosts
.11, .12, ... in the order given.

Faults, all undone by `heal()` and by `down()`:

* Partitions are nftables rules in the switch's namespace (a `bridge` family table on the
  forward hook): a directed pair (src, dst) drops every IPv4 packet from src's address to
  dst's, as a switch that loses them would. Nothing changes inside the hosts: a sender
  gets no EPERM (an OUTPUT-chain drop would tell it at once), its SYNs and segments just
  go unanswered. ARP is left alone, so neighbours stay resolved and healing is instant.
  `block(a, b)` is one way (a's packets to b are lost; b's to a arrive), `cut(a, b)` both
  ways between two groups, `isolate(h)` cuts h from every other host and the client,
  `drop_outgoing(h)` / `drop_incoming(h)` one way between h and everyone. Each call
  returns a `Partition` token: `heal(token)` removes exactly its pairs, so overlapping
  faults (a second cut before the first healed) stay independent; a pair blocked by two
  faults is dropped until both heal.
* A slow link: this kernel has no netem qdisc (`tc qdisc add ... netem` fails with
  "Specified qdisc kind is unknown"), so delay cannot be added directly. `slow(h)` puts a
  tbf (token bucket) rate limit with a deep queue on h's link instead, both directions by
  default (h's `eth0` for what it sends, the switch's end for what it receives): under load
  the queue fills and every packet waits behind it, which is what a congested link does;
  an idle connection sees little delay. (SIGSTOP of a process, elsewhere in the harness,
  is the other way to make a peer slow.)

Processes run in a host with `popen(host, argv)` (`ip netns exec NS argv`: the PID is that
of argv itself, since `ip netns exec` execs it, so signals by PID reach the program). With
`own_hostname=True` the program also gets a UTS namespace with the host's name as its
hostname (`unshare --uts`): software that tells "the same machine" by hostname (RoarMQ's
hand-off passes sockets to a leader on the same machine, through the filesystem, which no
partition cuts) then treats each host as a machine of its own.

`down()` kills (SIGKILL, by PID) what still runs in the namespaces, deletes the client's
link and the namespaces; it runs from `__exit__`, so a failing test leaves nothing behind.
Needs root, `ip` (iproute2), `nft` (nftables) and `unshare`; `unavailable()` says why not.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

CLIENT = "client"  # the root namespace: the test process and its clients
TABLE = "roarjepsen"
CHAIN = "partition"
#: tbf defaults for `slow`: 1 Mbit/s, a 32 kB burst, and a queue deep enough to hold
#: several seconds of traffic at that rate (a shallow one would drop, not delay).
SLOW_RATE = "1mbit"
SLOW_BURST = "32kb"
SLOW_LIMIT = "2mb"


def unavailable() -> tuple[str, str] | None:
    """Why this machine cannot build the network, with the environment variable that says
    `make test` provides what is missing (tests/machine.py's rule), or None when it can:
    root (ROARMQ_EXPECT_ROOT), `ip`, `nft` and `unshare` (ROARMQ_EXPECT_PACKAGES: the
    Makefile installs them), and a namespace and a bridge-family table that can really be
    made (as root they can, unless a container withholds the capability: loud then too)."""
    if os.geteuid() != 0:
        return "network namespaces and nftables need root", "ROARMQ_EXPECT_ROOT"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (Debian's {package})", "ROARMQ_EXPECT_PACKAGES"
    probe = f"rqprobe{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}", "ROARMQ_EXPECT_ROOT"
    try:
        table = subprocess.run(
            ["ip", "netns", "exec", probe, "nft", "add", "table", "bridge", TABLE],
            capture_output=True,
            text=True,
        )
        if table.returncode != 0:
            why = f"nftables' bridge family is not usable: {table.stderr.strip()}"
            return why, "ROARMQ_EXPECT_ROOT"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _run(argv: Sequence[str], stdin: str | None = None, timeout: float = 30) -> str:
    done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise NetworkError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


class NetworkError(RuntimeError):
    """An `ip`, `nft` or `tc` command failed (its stderr in the message)."""


@dataclass(frozen=True)
class Partition:
    """The directed pairs one fault blocks: hand it back to `Network.heal`."""

    name: str
    pairs: frozenset[tuple[str, str]]


@dataclass
class _Slow:
    host: str
    devices: list[tuple[str, str]] = field(default_factory=list)  # (namespace, device)


def _pick_subnet(rng: random.Random) -> ipaddress.IPv4Network:
    """A /24 in 10.160-249.x that no route or address of the root namespace touches."""
    taken: list[ipaddress.IPv4Network] = []
    with contextlib.suppress(NetworkError, ValueError):
        for route in json.loads(_run(["ip", "-j", "-4", "route", "show", "table", "all"])):
            dst = route.get("dst", "")
            if dst and dst != "default":
                with contextlib.suppress(ValueError):
                    taken.append(ipaddress.ip_network(dst, strict=False))
        for link in json.loads(_run(["ip", "-j", "-4", "addr"])):
            for a in link.get("addr_info", []):
                taken.append(ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False))
    for _ in range(200):
        net = ipaddress.ip_network(f"10.{rng.randint(160, 249)}.{rng.randint(0, 255)}.0/24")
        if not any(net.overlaps(t) for t in taken if t.prefixlen > 0):
            return net
    raise NetworkError("no free /24 in 10.160.0.0/16 .. 10.249.255.0/24")


class Network:
    """The namespaces, the switch, the client's link and the faults (module doc)."""

    def __init__(self, hosts: Sequence[str], *, seed: int | None = None) -> None:
        if len(set(hosts)) != len(hosts) or CLIENT in hosts:
            raise ValueError(f"host names must be distinct and not {CLIENT!r}: {hosts}")
        self.hosts = list(hosts)
        self.tag = secrets.token_hex(2)
        self.subnet = _pick_subnet(random.Random(seed))
        base = self.subnet.network_address
        self.addresses = {CLIENT: str(base + 1)}
        for i, host in enumerate(self.hosts):
            self.addresses[host] = str(base + 11 + i)
        self.switch = f"rqj{self.tag}-switch"
        self.namespaces = {host: f"rqj{self.tag}-{host}" for host in self.hosts}
        self.client_link = f"rqj{self.tag}cl"
        self._bridge_ends = {host: f"rqj{self.tag}{i:02d}" for i, host in enumerate(self.hosts)}
        self._bridge_ends[CLIENT] = f"rqj{self.tag}cb"
        self._blocked: Counter[tuple[str, str]] = Counter()
        self._slow: dict[str, _Slow] = {}
        self._made: list[str] = []  # namespaces made so far (for down() after a failed up())
        self._lock = threading.Lock()
        self._procs: list[subprocess.Popen] = []
        self.is_up = False

    # -- life ------------------------------------------------------------------------------

    def __enter__(self) -> Network:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> Network:
        """Make the switch, one namespace per host and the client's link; check that every
        host reaches the client and back (a TCP connection from inside each namespace)."""
        try:
            self._add_namespace(self.switch)
            _run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
            nft = (
                f"table bridge {TABLE} {{\n"
                f"  chain {CHAIN} {{ type filter hook forward priority 0; policy accept; }}\n"
                "}\n"
            )
            _run(["ip", "netns", "exec", self.switch, "nft", "-f", "-"], stdin=nft)
            for host in self.hosts:
                ns = self.namespaces[host]
                self._add_namespace(ns)
                end = self._bridge_ends[host]
                _run(["ip", "link", "add", end, "netns", self.switch, "type", "veth"]
                     + ["peer", "name", "eth0", "netns", ns])  # fmt: skip
                _run(["ip", "-n", self.switch, "link", "set", end, "master", "br0", "up"])
                _run(["ip", "-n", ns, "addr", "add", f"{self.addresses[host]}/24", "dev", "eth0"])
                _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            end = self._bridge_ends[CLIENT]
            _run(["ip", "link", "add", self.client_link, "type", "veth"]
                 + ["peer", "name", end, "netns", self.switch])  # fmt: skip
            _run(["ip", "-n", self.switch, "link", "set", end, "master", "br0", "up"])
            _run(["ip", "addr", "add", f"{self.addresses[CLIENT]}/24", "dev", self.client_link])
            _run(["ip", "link", "set", self.client_link, "up"])
            self.is_up = True
            self._check_reachable()
        except BaseException:
            self.down()
            raise
        return self

    def _add_namespace(self, ns: str) -> None:
        _run(["ip", "netns", "add", ns])
        self._made.append(ns)
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])

    def _check_reachable(self, timeout: float = 10.0) -> None:
        """Every host opens a TCP connection to a listener of the test process on the
        client's address: `ip netns exec` works, and packets cross the switch both ways."""
        with socket.socket() as listener:
            listener.bind((self.addresses[CLIENT], 0))
            listener.listen(len(self.hosts))
            listener.settimeout(0.2)
            port = listener.getsockname()[1]
            code = (
                "import socket, sys\n"
                f"socket.create_connection(({self.addresses[CLIENT]!r}, {port}), {timeout})"
                ".sendall(sys.argv[1].encode())\n"
            )
            children = {
                host: self.popen(host, [sys.executable, "-c", code, host], stderr=subprocess.PIPE)
                for host in self.hosts
            }
            heard: set[str] = set()
            deadline = time.monotonic() + timeout
            while len(heard) < len(self.hosts) and time.monotonic() < deadline:
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.settimeout(2)
                    heard.add(conn.recv(64).decode())
            failed = {}
            for host, child in children.items():
                try:
                    _, err = child.communicate(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    child.kill()
                    _, err = child.communicate()
                if child.returncode != 0:
                    failed[host] = (err or b"").decode(errors="replace").strip()[-300:]
            if heard != set(self.hosts) or failed:
                raise NetworkError(
                    f"hosts that did not reach the client at {self.addresses[CLIENT]}: "
                    f"{sorted(set(self.hosts) - heard)} {failed}"
                )

    def down(self) -> None:
        """Kill (by PID) whatever still runs in our namespaces, then delete the client's
        link and every namespace made. Safe to call twice, and after a failed `up()`."""
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    os.kill(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
        for ns in self._made:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in pids.stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGCONT)
                    os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "link", "del", self.client_link], capture_output=True)
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made.clear()
        self._blocked.clear()
        self._slow.clear()
        self.is_up = False

    # -- processes -------------------------------------------------------------------------

    def command(self, host: str, argv: Sequence[str], *, own_hostname: bool = False) -> list[str]:
        """argv run inside `host`'s namespace (see `popen`)."""
        inner = list(argv)
        if own_hostname:
            inner = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host, *inner]
        return ["ip", "netns", "exec", self.namespaces[host], *inner]

    def popen(
        self, host: str, argv: Sequence[str], *, own_hostname: bool = False, **kwargs
    ) -> subprocess.Popen:
        """Start argv inside `host`'s namespace; its PID is argv's own (`ip netns exec` and
        `unshare` exec, they do not fork), so signals by PID reach it. `down()` kills it
        if it still runs."""
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(self.command(host, argv, own_hostname=own_hostname), **kwargs)
        self._procs.append(proc)
        return proc

    def run(self, host: str, argv: Sequence[str], timeout: float = 30) -> str:
        """Run argv in `host`'s namespace to its end; its stdout (NetworkError if it fails)."""
        return _run(self.command(host, argv), timeout=timeout)

    # -- partitions ------------------------------------------------------------------------

    def _parties(self, group: str | Iterable[str]) -> list[str]:
        names = [group] if isinstance(group, str) else list(group)
        for name in names:
            if name not in self.addresses:
                raise KeyError(f"no host {name!r} in this network")
        return names

    def block(
        self, src: str | Iterable[str], dst: str | Iterable[str], name: str = ""
    ) -> Partition:
        """One way: packets from every host of `src` to every host of `dst` are dropped
        at the switch (the replies of `dst` still reach `src`)."""
        pairs = frozenset((a, b) for a in self._parties(src) for b in self._parties(dst) if a != b)
        token = Partition(name or f"block {sorted(pairs)}", pairs)
        with self._lock:
            self._blocked.update(pairs)
            self._render()
        return token

    def cut(self, a: str | Iterable[str], b: str | Iterable[str], name: str = "") -> Partition:
        """Both ways between two groups: no packet between a host of `a` and one of `b`."""
        pairs = frozenset(
            p
            for x in self._parties(a)
            for y in self._parties(b)
            if x != y
            for p in ((x, y), (y, x))
        )
        token = Partition(
            name or f"cut {sorted(self._parties(a))} | {sorted(self._parties(b))}", pairs
        )
        with self._lock:
            self._blocked.update(pairs)
            self._render()
        return token

    def others(self, host: str, *, client: bool = True) -> list[str]:
        """Every party but `host` (the client too, unless `client=False`)."""
        return [p for p in self.addresses if p != host and (client or p != CLIENT)]

    def isolate(self, host: str) -> Partition:
        """`host` alone: nothing in or out, with its peers and with the client."""
        return self.cut(host, self.others(host), name=f"isolate {host}")

    def drop_outgoing(self, host: str) -> Partition:
        """What `host` sends is lost; what others send it arrives (one way)."""
        return self.block(host, self.others(host), name=f"{host} outgoing dropped")

    def drop_incoming(self, host: str) -> Partition:
        """What others send `host` is lost; what it sends arrives (one way)."""
        return self.block(self.others(host), host, name=f"{host} incoming dropped")

    def heal(self, token: Partition | None = None) -> None:
        """Remove one fault's pairs (None: every partition)."""
        with self._lock:
            if token is None:
                self._blocked.clear()
            else:
                self._blocked.subtract(token.pairs)
                self._blocked = +self._blocked  # drop the pairs at zero
            self._render()

    def blocked(self) -> set[tuple[str, str]]:
        """The directed pairs dropped now."""
        with self._lock:
            return set(self._blocked)

    def _render(self) -> None:
        """The switch's rules for the pairs blocked now, replaced in one nft transaction."""
        lines = [f"flush chain bridge {TABLE} {CHAIN}"]
        for src, dst in sorted(self._blocked):
            lines.append(
                f"add rule bridge {TABLE} {CHAIN} ip saddr {self.addresses[src]} "
                f"ip daddr {self.addresses[dst]} drop"
            )
        _run(["ip", "netns", "exec", self.switch, "nft", "-f", "-"], stdin="\n".join(lines) + "\n")

    # -- slow links ------------------------------------------------------------------------

    def slow(
        self,
        host: str,
        *,
        rate: str = SLOW_RATE,
        burst: str = SLOW_BURST,
        limit: str = SLOW_LIMIT,
        outgoing: bool = True,
        incoming: bool = True,
    ) -> None:
        """Rate-limit `host`'s link with tbf and a deep queue (no netem on this kernel: the
        module doc). `outgoing`: its own eth0; `incoming`: the switch's end of its link."""
        self.unslow(host)
        state = _Slow(host)
        if outgoing:
            state.devices.append((self.namespaces[host], "eth0"))
        if incoming:
            state.devices.append((self.switch, self._bridge_ends[host]))
        for ns, dev in state.devices:
            _run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf"]
                 + ["rate", rate, "burst", burst, "limit", limit])  # fmt: skip
        self._slow[host] = state

    def unslow(self, host: str) -> None:
        state = self._slow.pop(host, None)
        if state is not None:
            for ns, dev in state.devices:
                subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"],
                               capture_output=True)  # fmt: skip

    def heal_all(self) -> None:
        """Every partition healed and every link at full speed again."""
        self.heal()
        for host in list(self._slow):
            self.unslow(host)
