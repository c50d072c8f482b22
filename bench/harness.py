"""The benchmarks' harness: start, probe, measure and stop the brokers they compare.

    from harness import Procs, broker_instance, start_roarmq, start_rabbitmq, start_garagemq

One way to run each broker, shared by every script in bench/ (they run as scripts,
``python bench/X.py``, so this directory is first on ``sys.path`` and ``import harness``
finds this file): RoarMQ from this tree (or another source tree, ``src``), RabbitMQ
(Debian's rabbitmq-server, its own node, ports and dirs; the management plugin on
request) and GarageMQ (Debian's garagemq), each on free loopback ports, in its own
process group tagged with ``MARKER`` so that everything it spawned can be swept away on
every exit path. ``roarmq_command`` and ``rabbitmq_env`` are the launch recipes
themselves, for bench/persistence.py, which restarts a broker on the same data and times
its start itself.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import roarmq
from roarmq.protocol import spec
from roarmq.protocol.frames import PROTOCOL_HEADER, FrameParser, MethodFrame

REPO = Path(__file__).resolve().parent.parent
# The benchmarks measure the tree they are in. With another tree's venv (comparing two
# worktrees with one interpreter) the venv's editable install would import the other
# tree's code, silently: say so instead. `PYTHONPATH=TREE` makes a tree's own code win.
if Path(roarmq.__file__).resolve().parent.parent != REPO:
    sys.exit(
        f"bench/ measures {REPO}, but roarmq was imported from {roarmq.__file__}: "
        f"run with PYTHONPATH={REPO}"
    )

LOAD = REPO / "bench" / "_amqp_load.py"
MARKER = "ROARBENCH_INSTANCE"  # env var tagging every process we start, for the final sweep
RABBIT_CANDIDATES = ("/usr/lib/rabbitmq/bin/rabbitmq-server",)
BROKERS = ("roarmq", "rabbitmq")  # --broker both (bench/overload.py and persistence.py too)
ALL_BROKERS = (*BROKERS, "garagemq")
LABEL = {"roarmq": "RoarMQ", "rabbitmq": "RabbitMQ", "garagemq": "GarageMQ"}
GARAGEMQ_CANDIDATES = ("/usr/bin/garagemq",)
# GarageMQ's config as Debian ships it (/etc/garagemq/config.yaml), but our own loopback
# ports and data dir, and TCP_NODELAY on: the shipped "nodelay: false" turns Nagle on,
# which adds up to 40 ms (delayed ACK) to a paced message; RabbitMQ and asyncio set
# TCP_NODELAY by default. "guest" is the md5 of the password guest.
GARAGEMQ_CONFIG = """\
proto: amqp-rabbit
users:
  - username: guest
    password: 084e0343a0486ff05530df6c705c8bb4
tcp:
  ip: 127.0.0.1
  port: {port}
  nodelay: true
  readBufSize: 196608
  writeBufSize: 196608
admin:
  ip: 127.0.0.1
  port: {admin}
queue:
  shardSize: 8192
  maxMessagesInRam: 131072
db:
  defaultPath: {data}
  engine: badger
vhost:
  defaultPath: /
security:
  passwordCheck: md5
connection:
  channelsMax: 4096
  frameMaxSize: 65536
"""


class BrokerUnavailable(Exception):
    """The broker cannot be run here (e.g. not installed): its rows say 'skipped'."""


# -- processes -----------------------------------------------------------------------


class Procs:
    """Every process we start: own session (so a process group), tagged with MARKER."""

    def __init__(self) -> None:
        self.live: list[subprocess.Popen] = []

    def start(
        self,
        cmd: list[str],
        *,
        instance: str,
        env: dict[str, str] | None = None,
        cwd: Path = REPO,
        **kw: Any,
    ) -> subprocess.Popen:
        full_env = dict(os.environ if env is None else env)
        full_env[MARKER] = instance
        proc = subprocess.Popen(cmd, env=full_env, start_new_session=True, cwd=cwd, **kw)
        self.live.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen, grace: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL it after ``grace`` seconds."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # the group may outlive its leader
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc in self.live:
            self.live.remove(proc)

    def stop_all(self) -> None:
        for proc in list(self.live):
            self.stop(proc, grace=3.0)


def export_rev(rev: str, into: Path, compiled: bool = True) -> Path:
    """``git archive rev`` unpacked into ``into``: a RoarMQ tree to run as a "before".

    With ``compiled`` (the default) the tree's own ``COMPILED`` modules are built beside
    their sources, as its ``make install`` would (``build_in_place``): without them a
    revision runs as pure Python, and a before/after would compare the source of one with
    the build of the other. Copying this checkout's ``.so`` files instead is no better: they
    run together or not at all (``roarmq/__init__.py``), so one from another revision sends
    the whole group back to its source.
    """
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"git archive {rev}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    if compiled:
        build_in_place(into)
    return into


def build_in_place(tree: Path) -> None:
    """Compile ``tree``'s ``COMPILED`` modules (its ``roarmq/__init__.py``) with this venv's
    Cython and ``cc``, as its setup.py would: the tree's own ``.pxd`` files, annotations not
    typed. Raises ``SystemExit`` naming the module that would not build."""
    import ast
    import sysconfig
    from concurrent.futures import ThreadPoolExecutor

    init = (tree / "roarmq" / "__init__.py").read_text()
    modules: dict[str, str] = {}
    for node in ast.parse(init).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "COMPILED":
            modules = ast.literal_eval(node.value)
    include = tree / "build" / "cython-include" / "roarmq"  # .pxd files by their full names
    include.mkdir(parents=True, exist_ok=True)
    for package in ("protocol", "broker"):
        (include / package).symlink_to(tree / package)
    cython = Path(sys.executable).with_name("cython")
    headers = sysconfig.get_paths()["include"]
    suffix = sysconfig.get_config_var("EXT_SUFFIX")

    def build(item: tuple[str, str]) -> None:
        name, source = item
        base = tree / source.removesuffix(".py")
        steps = [
            [str(cython), "-3", "-X", "annotation_typing=False", "-I", str(include.parent)]
            + ["--module-name", name, str(tree / source), "-o", f"{base}.c"],
            ["cc", "-shared", "-fPIC", "-O2", "-fwrapv", "-DNDEBUG", f"-I{headers}"]
            + [f"{base}.c", "-o", f"{base}{suffix}"],
        ]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"building {name} of {tree}: {done.stderr.strip()[-2000:]}")

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(build, modules.items()))


def sweep(instance: str) -> int:
    """SIGKILL any process still carrying our instance tag (epmd and friends detach)."""
    needle = f"{MARKER}={instance}".encode()
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
    return killed


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) used so far by the live processes of group ``pgid``."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # pgrp
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def loadavg() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")


def pinned(cpu: int | None, cmd: list[str]) -> list[str]:
    return cmd if cpu is None else ["taskset", "-c", str(cpu), *cmd]


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, never the same twice in this process (the
    kernel may give a just-closed port again; two servers then clash on it)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def amqp_probe(port: int, timeout: float = 2.0) -> dict[str, Any] | None:
    """connection.start's server properties if an AMQP broker answers on ``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(PROTOCOL_HEADER)
            parser = FrameParser(expect_protocol_header=False)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                data = s.recv(65536)
                if not data:
                    return None
                for ev in parser.feed(data):
                    if isinstance(ev, MethodFrame) and isinstance(ev.method, spec.ConnectionStart):
                        props = ev.method.server_properties or {}
                        return {
                            k: v.decode() if isinstance(v, bytes) else v
                            for k, v in props.items()
                            if k in ("product", "version")
                        }
    except (OSError, Exception):
        return None
    return None


# -- brokers -------------------------------------------------------------------------


@dataclass
class Running:
    kind: str
    port: int
    version: str
    proc: subprocess.Popen
    instance: str
    log: Path
    mgmt_port: int | None = None  # the management HTTP API, when it was asked for


def _wait_ready(
    proc: subprocess.Popen, port_of: Any, log: Path, timeout: float
) -> tuple[int, dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode}; log tail:\n{_tail(log)}")
        port = port_of()
        if port:
            props = amqp_probe(port)
            if props:
                return port, props
        time.sleep(0.2)
    raise RuntimeError(f"broker not accepting AMQP after {timeout:.0f} s; log tail:\n{_tail(log)}")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def roarmq_command(
    config: Path,
    data: Path,
    *,
    src: Path = REPO,
    port: int | None = None,
    log_level: str | None = None,
    profile: Path | None = None,
) -> list[str]:
    """``python -m roarmq`` for source tree ``src`` (run it with cwd=src, so that tree is
    the one imported); ``profile``: under cProfile, the stats written there on exit."""
    module = "roarmq" if (src / "roarmq" / "__init__.py").exists() else "broker"  # older trees
    py = [sys.executable]
    if profile is not None:
        py += ["-m", "cProfile", "-o", str(profile)]
    cmd = [*py, "-m", module, "--config", str(config), "--data-dir", str(data)]
    if port is not None:
        cmd += ["--port", str(port)]
    if log_level is not None:
        cmd += ["--log-level", log_level]
    return cmd


def roarmq_config(
    data: Path,
    *,
    src: Path = REPO,
    port: int = 0,
    management: bool = False,
    lag_probe: bool = False,
) -> str:
    """A RoarMQ config: loopback, port 0 (the kernel picks; read back from the start line),
    management off unless asked for, the start line logged, the event-loop lag probe (a
    1 ms timer) if asked for and ``src`` has one."""
    config_py = (src / "broker" / "config.py").read_text()
    # The start line (which names the port) is a notice; older trees print it at any level.
    level = "notice" if '"notice"' in config_py else "warning"
    mgmt = 'enabled = true\nbind = "127.0.0.1"\nport = 0\n' if management else "enabled = false\n"
    text = (
        f'[amqp]\nbind = ["127.0.0.1"]\nport = {port}\n\n[management]\n{mgmt}\n'
        f'[storage]\ndata_dir = "{data}"\n\n[log]\nlevel = "{level}"\n'
    )
    if lag_probe and "loop_lag_probe_ms" in config_py:
        text += "\n[diagnostics]\nloop_lag_probe_ms = 1\n"
    return text


def start_roarmq(
    procs: Procs,
    tmp: Path,
    cpu: int | None = None,
    *,
    src: Path = REPO,
    management: bool = False,
    lag_probe: bool = False,
    extra_config: str = "",
    ready_timeout: float = 30,
) -> Running:
    """RoarMQ from source tree ``src`` with its data and log under ``tmp``; ``extra_config``
    is appended to its TOML (bench/memory.py sets the memory watermark)."""
    data = tmp / "data"
    cfg = tmp / "roarmq.toml"
    text = roarmq_config(data, src=src, management=management, lag_probe=lag_probe)
    cfg.write_text(text + extra_config)
    log = tmp / "roarmq.log"
    instance = uuid.uuid4().hex
    cmd = pinned(cpu, roarmq_command(cfg, data, src=src))
    with open(log, "wb") as out:
        proc = procs.start(cmd, instance=instance, cwd=src, stdout=out, stderr=subprocess.STDOUT)
    ports = {"amqp": 0, "mgmt": 0}

    def port_of() -> int:  # "RoarMQ 0.1.0: AMQP on 127.0.0.1 port 43809, management http://h:p"
        for line in log.read_text(errors="replace").splitlines():
            if "AMQP on" in line and " port " in line:
                ports["amqp"] = int(line.rsplit(" port ", 1)[1].split()[0].rstrip(","))
                if "management http://" in line:
                    ports["mgmt"] = int(line.rsplit(":", 1)[1].split()[0].rstrip(",/"))
        return ports["amqp"]

    try:
        port, props = _wait_ready(proc, port_of, log, ready_timeout)
    except BaseException:
        procs.stop(proc)
        sweep(instance)
        raise
    version = str(props.get("version", "?"))
    mgmt_port = ports["mgmt"] or None
    return Running("roarmq", port, version, proc, instance, log, mgmt_port)


def _started(
    procs: Procs,
    proc: subprocess.Popen,
    instance: str,
    port: int,
    log: Path,
    timeout: float,
    grace: float,
    last: bool,
) -> tuple[int, dict] | None:
    """Wait for a peer broker on its known port; if it fails, stop it and sweep its
    processes, then None (try again) unless this was the ``last`` attempt (raise)."""
    try:
        return _wait_ready(proc, lambda: port, log, timeout)
    except BaseException as exc:
        procs.stop(proc, grace=grace)
        sweep(instance)
        if last or not isinstance(exc, RuntimeError):
            raise
        return None


def _installed(candidates: tuple[str, ...], command: str) -> str | None:
    """The first executable of ``candidates``, else ``command`` on PATH."""
    for path in candidates:
        if os.access(path, os.X_OK):
            return path
    return shutil.which(command)


def rabbit_server() -> str | None:
    return _installed(RABBIT_CANDIDATES, "rabbitmq-server")


def _apt_install(package: str, find: Any) -> str:
    """``find()``, else (as root) ``apt-get install -y package`` and ``find()`` again."""
    path = find()
    if path:
        return path
    if os.geteuid() != 0:
        raise BrokerUnavailable(f"skipped: {package} not installed")
    print(f"{package} not installed: apt-get install -y {package} ...", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    ok = subprocess.call(["apt-get", "install", "-y", package], env=env) == 0
    if not ok:
        subprocess.call(["apt-get", "update"], env=env)
        ok = subprocess.call(["apt-get", "install", "-y", package], env=env) == 0
    # the package may start a system service (just installed by us): we run our own
    # instance on our own ports
    subprocess.call(
        ["service", package, "stop"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    path = find()
    if not ok or not path:
        raise BrokerUnavailable(f"skipped: {package} not installed (apt-get failed)")
    return path


def ensure_rabbitmq() -> str:
    return _apt_install("rabbitmq-server", rabbit_server)


def rabbitmq_env(
    base: Path,
    port: int,
    *,
    nodename: str = "roarbench",
    mnesia: Path | None = None,
    mgmt_port: int | None = None,
    schedulers: int | None = None,
) -> dict[str, str]:
    """The environment that runs a RabbitMQ node of its own: everything under ``base``
    (Erlang cookie, logs, mnesia unless given), loopback ports (AMQP ``port``; fresh ones for
    distribution and epmd), no plugins unless ``mgmt_port`` (the management plugin there);
    ``schedulers``: the Erlang VM's scheduler threads (``+S N:N``; default one per core)."""
    if mgmt_port is None:
        (base / "enabled_plugins").write_text("[].\n")
    else:
        (base / "enabled_plugins").write_text("[rabbitmq_management].\n")
        (base / "rabbitmq.conf").write_text(
            f"management.tcp.port = {mgmt_port}\nmanagement.tcp.ip = 127.0.0.1\n"
        )
    env = dict(os.environ)
    env.update(
        {
            "HOME": str(base),  # the Erlang cookie goes here
            "RABBITMQ_NODENAME": f"{nodename}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(port),
            "RABBITMQ_DIST_PORT": str(free_port()),
            "ERL_EPMD_PORT": str(free_port()),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}"
            + (f" +S {schedulers}:{schedulers}" if schedulers else ""),
            "RABBITMQ_MNESIA_BASE": str(mnesia or base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_PID_FILE": str(base / "rabbit.pid"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            # rabbitmq.conf: absent (defaults) unless the management port is set above
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
        }
    )
    return env


def start_rabbitmq(
    procs: Procs,
    tmp: Path,
    cpu: int | None = None,
    *,
    management: bool = False,
    nodename: str = "roarbench",
    attempts: int = 2,
    schedulers: int | None = None,
) -> Running:
    """RabbitMQ on free loopback ports, ready when it speaks AMQP (and, with
    ``management``, when its HTTP API answers /api/overview); ``schedulers`` as in
    ``rabbitmq_env``."""
    server = ensure_rabbitmq()
    for attempt in range(attempts):
        base = tmp / f"rabbit{attempt}"
        base.mkdir(parents=True)
        port = free_port()
        mgmt = free_port() if management else None
        env = rabbitmq_env(base, port, nodename=nodename, mgmt_port=mgmt, schedulers=schedulers)
        instance = uuid.uuid4().hex
        log = base / "stdout.log"
        with open(log, "wb") as out:
            proc = procs.start(
                pinned(cpu, [server]),
                instance=instance,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        last = attempt + 1 == attempts
        started = _started(procs, proc, instance, port, log, 90, 15, last)
        if started is None:
            continue
        port, props = started
        running = Running("rabbitmq", port, str(props.get("version", "?")), proc, instance, log)
        if mgmt is not None:
            running.mgmt_port = mgmt
            try:
                _wait_http(f"http://127.0.0.1:{mgmt}/api/overview", proc, log, 60)
            except BaseException:
                stop_broker(procs, running)
                raise
        return running
    raise AssertionError("unreachable")


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    """Until ``url`` answers (any HTTP status: 401 means the API is up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode}; log tail:\n{_tail(log)}")
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"no answer from {url} after {timeout:.0f} s; log tail:\n{_tail(log)}")


def garagemq_server() -> str | None:
    return _installed(GARAGEMQ_CANDIDATES, "garagemq")


def garagemq_package_version() -> str | None:
    """The Debian package's version (GarageMQ itself says only "0.1")."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", "garagemq"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    return None


def start_garagemq(procs: Procs, tmp: Path, cpu: int | None, attempts: int = 2) -> Running:
    """GarageMQ on free loopback ports (AMQP; admin HTTP, which cannot be turned off).

    Its own config file and data dir (badger; transient messages only spill there
    beyond ``maxMessagesInRam`` per queue). It sets GOMAXPROCS to its CPU count,
    which ``taskset`` makes 1.
    """
    server = _apt_install("garagemq", garagemq_server)
    package = garagemq_package_version()
    for attempt in range(attempts):
        base = tmp / f"garagemq{attempt}"
        base.mkdir(parents=True)
        port, admin = free_port(), free_port()
        cfg = base / "config.yaml"
        cfg.write_text(GARAGEMQ_CONFIG.format(port=port, admin=admin, data=base / "db"))
        log = base / "garagemq.log"
        instance = uuid.uuid4().hex
        cmd = [server, "--config", str(cfg), "--log-level", "info", "--log-file", "stdout"]
        with open(log, "wb") as out:
            proc = procs.start(
                pinned(cpu, cmd), instance=instance, stdout=out, stderr=subprocess.STDOUT
            )
        started = _started(procs, proc, instance, port, log, 30, 5, attempt + 1 == attempts)
        if started is None:
            continue
        port, props = started
        version = str(props.get("version", "?"))
        if package:
            version += f" (Debian {package})"
        return Running("garagemq", port, version, proc, instance, log)
    raise AssertionError("unreachable")


STARTERS = {"roarmq": start_roarmq, "rabbitmq": start_rabbitmq, "garagemq": start_garagemq}


def stop_broker(procs: Procs, broker: Running) -> None:
    procs.stop(broker.proc, grace=20)
    sweep(broker.instance)


@contextlib.contextmanager
def broker_instance(
    kind: str, procs: Procs, cpu: int | None = None, *, keep: Path | None = None, **options: Any
) -> Iterator[Running]:
    """A broker of ``kind`` in a fresh temp dir (removed after), or in ``keep`` (left for a
    restart); ``options`` go to its start_* function."""
    tmp = keep or Path(tempfile.mkdtemp(prefix=f"roarbench-{kind}-"))
    broker = None
    try:
        broker = STARTERS[kind](procs, tmp, cpu, **options)
        yield broker
    finally:
        if broker is not None:
            stop_broker(procs, broker)
        if keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


# -- resident memory -----------------------------------------------------------------


def group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:
                pids.append(int(entry.name))
    return pids


def vmrss(pid: int) -> int:
    """Resident memory of ``pid`` in bytes (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class RssSampler(threading.Thread):
    """VmRSS summed over a process group every ``period`` s; members re-listed every second."""

    def __init__(self, pgid: int, period: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pgid, self.period = pgid, period
        self.samples: list[tuple[float, int]] = []  # (monotonic, bytes)
        self._done = threading.Event()

    def run(self) -> None:
        pids: list[int] = []
        listed = 0.0
        while not self._done.is_set():
            now = time.monotonic()
            if now - listed > 1.0:
                pids, listed = group_pids(self.pgid), now
            self.samples.append((now, sum(vmrss(pid) for pid in pids)))
            self._done.wait(self.period)

    def stop(self) -> None:
        self._done.set()
        self.join(2)

    def at(self, t: float) -> int | None:
        """The last sample taken at or before ``t``."""
        before = [rss for when, rss in self.samples if when <= t]
        return before[-1] if before else None

    def peak(self, t0: float, t1: float) -> int | None:
        window = [rss for when, rss in list(self.samples) if t0 <= when <= t1]
        return max(window) if window else None


# -- three-node clusters on one machine (bench/cluster.py) ----------------------------


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
                    with urllib.request.urlopen(
                        urllib.request.Request(
                            f"http://127.0.0.1:{m.mgmt_port}/api/vhosts/%2F",
                            headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="},
                        ),
                        timeout=1,
                    ) as resp:
                        row = json.loads(resp.read())
                    return row.get("leader"), len(row.get("in_sync") or ())
                except (OSError, ValueError):
                    continue
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

    def stop(self) -> None:
        for m in [*self.nodes, *([self.etcd] if self.etcd else [])]:
            if m.proc is not None and m.proc.poll() is None:
                self.thaw(m)
                self.procs.stop(m.proc, grace=15)
            if m.instance:
                sweep(m.instance)
        for proc in self.helpers:
            self.procs.stop(proc, grace=3)


def _etcd_binary() -> str:
    for path in (REPO / ".tools" / "etcd", shutil.which("etcd")):
        if path and os.access(path, os.X_OK):
            return str(path)
    raise BrokerUnavailable("skipped: no etcd (`make tools` extracts it into .tools/etcd)")


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
    cluster = LocalCluster("roarmq", procs)
    client, peer = free_port(), free_port()
    url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    cluster.etcd = Member(
        "etcd",
        client,
        [
            _etcd_binary(),
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
            raise RuntimeError(f"etcd not healthy; log tail:\n{_tail(tmp / 'etcd.log')}")
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
        tails = "\n".join(f"--- {m.name}\n{_tail(m.log)}" for m in cluster.nodes)
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
            _wait_ready(member.proc, lambda m=member: m.port, member.log, ready_timeout)
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
            _wait_ready(member.proc, lambda m=member: m.port, member.log, ready_timeout)
        props = amqp_probe(first.port) or {}
        cluster.version = str(props.get("version", "?"))
        return cluster
    except BaseException:
        cluster.stop()
        raise


# -- RoarMQ's own event-loop lag probe --------------------------------------------------

LAG_METRIC = "roarmq_event_loop_lag_max_seconds"


def loop_lag_ms(mgmt_port: int | None) -> float | None:
    """RoarMQ's ``roarmq_event_loop_lag_max_seconds`` in ms (max over label sets), if exported."""
    if not mgmt_port:
        return None
    try:
        url = f"http://127.0.0.1:{mgmt_port}/metrics"
        with urllib.request.urlopen(url, timeout=15) as reply:
            text = reply.read().decode()
    except (OSError, ValueError):
        return None
    values = [
        float(line.rsplit(None, 1)[1]) * 1000
        for line in text.splitlines()
        if line.startswith((LAG_METRIC + " ", LAG_METRIC + "{"))
    ]
    return max(values) if values else None


STALLS_PATH = "/api/diagnostics/stalls"


def stall_log(mgmt_port: int | None, since: int = 0) -> dict[str, Any] | None:
    """RoarMQ's GET /api/diagnostics/stalls (the stalls after id ``since``, each with what
    explains it; the jobs' and the collector's times), or None where it has none (another
    broker, an older tree, the probe off). As guest, an administrator on loopback."""
    if not mgmt_port:
        return None
    request = urllib.request.Request(
        f"http://127.0.0.1:{mgmt_port}{STALLS_PATH}?since={since}",
        headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="},  # guest:guest
    )
    try:
        with urllib.request.urlopen(request, timeout=15) as reply:
            found = json.loads(reply.read())
    except (OSError, ValueError):
        return None
    return found if found.get("probe_ms") else None


def stall_summary(stall: dict[str, Any]) -> str:
    """One stall in a few words: "16.2 ms GC gen1: 1 pass 15.8 ms"."""
    return f"{stall['lag_ms']:.1f} ms {stall['cause']}"


def machine_busy_s() -> float:
    """CPU seconds the whole machine was busy so far (/proc/stat, every CPU; idle and
    iowait excluded): with the CPU of the processes a benchmark knows, what others used."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def machine_steal_s() -> float:
    """CPU seconds the hypervisor kept this VM's CPUs from running so far (/proc/stat's
    steal, every CPU): a loop stall off CPU and out of the run queue may be this."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    return int(fields[7]) / os.sysconf("SC_CLK_TCK")


def tree_state() -> str:
    """The commit measured, and the files of the broker's code that differ from it (other
    engineers edit the tree while benchmarks run)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--short", "--", "broker", "protocol", "roarmq"],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.split("\n")
    except OSError:
        return "?"
    changed = [line[3:] for line in dirty if line.strip()]
    return head + (f" + uncommitted changes to {', '.join(changed)}" if changed else "")


# -- the Go load generator (bench/go) ---------------------------------------------------------

GO_GENERATOR = REPO / "bench" / "go"


def build_load_generator(out_dir: Path, needed_by: str) -> tuple[Path, str]:
    """Compile bench/go (Go's standard library only: Debian's golang-go) into `out_dir`;
    (the binary, `go version`). `needed_by` names the script in the error."""
    go = shutil.which("go") or "/usr/lib/go/bin/go"
    if not os.access(go, os.X_OK):
        raise SystemExit(f"{needed_by} needs Go: apt-get install golang-go")
    binary = out_dir / "roarmq-load"
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOCACHE": str(out_dir / "gocache")}
    build = subprocess.run(
        [go, "build", "-o", str(binary), "."],
        cwd=GO_GENERATOR,
        capture_output=True,
        text=True,
        env=env,
    )
    if build.returncode != 0:
        raise SystemExit(f"go build in bench/go failed:\n{build.stderr}")
    version = subprocess.run([go, "version"], capture_output=True, text=True).stdout.strip()
    return binary, version


# -- a child's JSON lines, and figures as text ------------------------------------------------


def read_json_lines(proc: subprocess.Popen, lines: queue.Queue) -> None:
    for line in proc.stdout:  # type: ignore[union-attr]
        with contextlib.suppress(ValueError):
            lines.put(json.loads(line))
    lines.put(None)


def next_json_line(lines: queue.Queue, deadline: float) -> dict | None:
    try:
        return lines.get(timeout=max(0.0, deadline - time.monotonic()))
    except queue.Empty:
        return None


def number(value: Any) -> float | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)


def fmt(value: float | None, digits: int) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"
