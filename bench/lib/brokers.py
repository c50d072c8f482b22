"""One way to run each broker the benchmarks compare, on free loopback ports, and stop it.

    from lib.brokers import broker_instance, start_roarmq, start_rabbitmq, start_garagemq

RoarMQ from this tree (or another source tree, ``src``: lib/revisions.py makes one), RabbitMQ
(Debian's rabbitmq-server, its own node, ports and dirs; the management plugin on request) and
GarageMQ (Debian's garagemq), each in its own process group (lib/procs.py) so that everything it
spawned is swept away on every exit path. ``roarmq_command`` and ``rabbitmq_env`` are the launch
recipes themselves, for bench/persistence.py, which restarts a broker on the same data and
times its start itself; ``amqp_probe`` and ``wait_ready`` tell when a broker speaks AMQP;
``monitored_instance`` is a broker with its resident memory sampled (lib/observe.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.waiting import free_port

from lib import REPO
from lib.observe import RssSampler
from lib.procs import Procs, pinned, sweep
from roarmq.protocol import spec
from roarmq.protocol.frames import PROTOCOL_HEADER, FrameParser, MethodFrame

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


# -- probes ------------------------------------------------------------------------


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
    stream_port: int | None = None  # the stream protocol, when it was asked for
    env: dict[str, str] | None = None  # a RabbitMQ node's: what its rabbitmqctl needs


def wait_ready(proc: subprocess.Popen, port_of: Any, log: Path, timeout: float) -> tuple[int, dict]:
    """(port, connection.start's properties) once ``port_of()`` names a port on which the
    broker speaks AMQP; RuntimeError with ``log``'s tail if it exits or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode}; log tail:\n{log_tail(log)}")
        port = port_of()
        if port:
            props = amqp_probe(port)
            if props:
                return port, props
        time.sleep(0.2)
    raise RuntimeError(
        f"broker not accepting AMQP after {timeout:.0f} s; log tail:\n{log_tail(log)}"
    )


def log_tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a broker's log, for an error message."""
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
    ports = {"amqp": 0, "mgmt": 0, "stream": 0}

    def port_of() -> int:  # "RoarMQ 0.1.0: AMQP on 127.0.0.1 port 43809, streams on
        # 127.0.0.1:40111, management http://h:p"
        for line in log.read_text(errors="replace").splitlines():
            if "AMQP on" in line and " port " in line:
                ports["amqp"] = int(line.rsplit(" port ", 1)[1].split()[0].rstrip(","))
                if "streams on " in line:
                    where = line.split("streams on ", 1)[1].split(",")[0].split()[0]
                    ports["stream"] = int(where.rsplit(":", 1)[1])
                if "management http://" in line:
                    ports["mgmt"] = int(line.rsplit(":", 1)[1].split()[0].rstrip(",/"))
        return ports["amqp"]

    try:
        port, props = wait_ready(proc, port_of, log, ready_timeout)
    except BaseException:
        procs.stop(proc)
        sweep(instance)
        raise
    version = str(props.get("version", "?"))
    mgmt_port = ports["mgmt"] or None
    return Running("roarmq", port, version, proc, instance, log, mgmt_port, ports["stream"] or None)


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
        return wait_ready(proc, lambda: port, log, timeout)
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
    stream_port: int | None = None,
    plugins: tuple[str, ...] = (),
) -> dict[str, str]:
    """The environment that runs a RabbitMQ node of its own: everything under ``base``
    (Erlang cookie, logs, mnesia unless given), loopback ports (AMQP ``port``; fresh ones for
    distribution and epmd), no plugins unless ``mgmt_port`` (the management plugin there);
    ``schedulers``: the Erlang VM's scheduler threads (``+S N:N``; default one per core);
    ``stream_port``: the stream plugin on that loopback port, advertising 127.0.0.1;
    ``plugins``: more to enable (rabbitmq_shovel, rabbitmq_federation, ...)."""
    plugins = list(plugins)
    conf = ""
    if mgmt_port is not None:
        plugins.append("rabbitmq_management")
        conf += f"management.tcp.port = {mgmt_port}\nmanagement.tcp.ip = 127.0.0.1\n"
    if stream_port is not None:
        plugins.append("rabbitmq_stream")
        conf += (
            f"stream.listeners.tcp.1 = 127.0.0.1:{stream_port}\n"
            f"stream.advertised_host = 127.0.0.1\nstream.advertised_port = {stream_port}\n"
        )
    (base / "enabled_plugins").write_text(f"[{','.join(plugins)}].\n")
    if conf:
        (base / "rabbitmq.conf").write_text(conf)
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
            # rabbitmq.conf: absent (defaults) unless a management or stream port is set above
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
    streams: bool = False,
    plugins: tuple[str, ...] = (),
) -> Running:
    """RabbitMQ on free loopback ports, ready when it speaks AMQP (and, with
    ``management``, when its HTTP API answers /api/overview); ``schedulers`` and
    ``plugins`` as in ``rabbitmq_env``."""
    server = ensure_rabbitmq()
    for attempt in range(attempts):
        base = tmp / f"rabbit{attempt}"
        base.mkdir(parents=True)
        port = free_port()
        mgmt = free_port() if management else None
        stream_port = free_port() if streams else None
        env = rabbitmq_env(
            base,
            port,
            nodename=nodename,
            mgmt_port=mgmt,
            schedulers=schedulers,
            stream_port=stream_port,
            plugins=plugins,
        )
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
        running.stream_port = stream_port
        running.env = env
        if mgmt is not None:
            running.mgmt_port = mgmt
            try:
                wait_http(f"http://127.0.0.1:{mgmt}/api/overview", proc, log, 60)
            except BaseException:
                stop_broker(procs, running)
                raise
        return running
    raise AssertionError("unreachable")


def rabbitmqctl(running: Running, *args: str, timeout: float = 60) -> str:
    """`rabbitmqctl ARGS` against a node `start_rabbitmq` started (its cookie, epmd and
    name); its output, CalledProcessError if it fails."""
    assert running.env is not None, "not a RabbitMQ node of start_rabbitmq's"
    ctl = str(Path(ensure_rabbitmq()).with_name("rabbitmqctl"))
    node = running.env["RABBITMQ_NODENAME"]
    done = subprocess.run(
        [ctl, "-n", node, *args],
        env=running.env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return done.stdout


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    """Until ``url`` answers (any HTTP status: 401 means the API is up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode}; log tail:\n{log_tail(log)}")
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"no answer from {url} after {timeout:.0f} s; log tail:\n{log_tail(log)}")


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


@dataclass
class Monitored:
    """A running broker with its resident memory sampled."""

    running: Running
    mgmt_port: int | None
    rss: RssSampler


@contextlib.contextmanager
def monitored_instance(
    kind: str,
    procs: Procs,
    cpu: int | None,
    roarmq_src: Path,
    extra_config: str = "",
    *,
    keep: Path | None = None,
    ready_timeout: float = 30,
) -> Iterator[Monitored]:
    """``broker_instance`` with its resident memory sampled; RoarMQ (from source tree
    ``roarmq_src``) with the management API and the event-loop lag probe on."""
    options: dict[str, Any] = {}
    if kind == "roarmq":
        options = {
            "src": roarmq_src,
            "management": True,
            "lag_probe": True,
            "extra_config": extra_config,
            "ready_timeout": ready_timeout,
        }
    with broker_instance(kind, procs, cpu, keep=keep, **options) as running:
        sampler = RssSampler(running.proc.pid)
        sampler.start()
        try:
            yield Monitored(running, running.mgmt_port, sampler)
        finally:
            sampler.stop()
