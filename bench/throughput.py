"""Throughput benchmark: RoarMQ against RabbitMQ, end to end over AMQP, in one run.

    .venv/bin/python bench/throughput.py [--broker roarmq|rabbitmq|both] [--quick]
                                         [--json bench/results/throughput.json]

A benchmark, not a test. For each broker and scenario a broker instance is
started pinned to one core (``taskset -c 0``), then a consumer process and a
publisher process pinned to the other (``taskset -c 1``), both speaking AMQP
through our own ``protocol/`` codec on uvloop (``bench/_amqp_load.py``; aio-pika
is too slow to load a broker). Scenarios (16-byte bodies, transient messages,
one queue, one consumer):

  direct      direct exchange, one binding, consumer no-ack (autoack)
  confirms    as direct, plus publisher confirms (at most 1,000 unconfirmed)
              and manual acks (one basic.ack per delivery), prefetch 100
  topic-10    topic exchange, 10 wildcard bindings, consumer no-ack
  topic-1000  topic exchange, 1,000 wildcard bindings, consumer no-ack
  topic-1000-lead  the same with patterns that start with a wildcard (*.e{i}.# / #.o{i}),
                   which no prefix of the key can prune
  topic-100k  topic exchange, 100,000 wildcard bindings, 1,000 distinct keys (all cached)
  topic-100k-distinct  the same bindings, 100,000 distinct keys: ten times RoarMQ's routing
                   cache, so most keys are routed by a trie walk (the cold path)
  topic-100k-lead-distinct  100,000 bindings led by wildcards, 100,000 distinct keys

Topic setup: the one queue is bound with ``s{i}.*.x`` (even i) and ``s{i}.#``
(odd i) for i < N; the publisher cycles through ``--topic-keys`` distinct keys
``s{i}.w{j}.x`` / ``s{i}.w{j}.y`` (shuffled, seed 1), each matching exactly
one binding. The default of 50,000 keys exceeds RoarMQ's default 10,000-key
routing cache, so most lookups walk the trie.

msg/s is messages received / (last receive - send time of the first message);
latency is receive - send per message, via CLOCK_MONOTONIC in the body. The
publisher is unthrottled, so latency is latency under saturation (time spent
queued in the broker included), not the latency of an idle broker.

Full run: each scenario 3 times (``--repeat``) per broker, a fresh broker
instance each time, RoarMQ and RabbitMQ alternating so both see similar
background load; the row is the median run by msg/s. Broker CPU time per
message is reported too: on a shared machine it is steadier than msg/s.
``--quick`` (far fewer messages, one run, one instance per broker, a fresh
auto-delete queue and exchange per scenario) finishes in under a minute. Every scenario is bounded in time: on timeout the
row reports what was measured. All processes started here are stopped on
every exit path.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import queue
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _machine import machine_info  # noqa: E402

from roarmq.protocol import spec  # noqa: E402
from roarmq.protocol.frames import PROTOCOL_HEADER, FrameParser, MethodFrame  # noqa: E402

LOAD = REPO / "bench" / "_amqp_load.py"
MARKER = "ROARBENCH_INSTANCE"  # env var tagging every process we start, for the final sweep
RABBIT_CANDIDATES = ("/usr/lib/rabbitmq/bin/rabbitmq-server",)


@dataclass
class Scenario:
    name: str
    description: str
    exchange_type: str
    messages: int
    quick_messages: int
    manual_ack: bool = False
    prefetch: int = 0
    confirms: bool = False
    bindings: int = 1
    shape: str = "prefixed"  # topic patterns: see _amqp_load.topology
    topic_keys: int = 0  # distinct routing keys; 0: --topic-keys


SCENARIOS = [
    Scenario("direct", "direct 1->1, no-ack", "direct", 200_000, 20_000),
    Scenario(
        "confirms",
        "direct, confirms + manual ack, prefetch 100",
        "direct",
        100_000,
        10_000,
        manual_ack=True,
        prefetch=100,
        confirms=True,
    ),
    Scenario(
        "topic-10", "topic, 10 wildcard bindings, no-ack", "topic", 100_000, 10_000, bindings=10
    ),
    Scenario(
        "topic-1000",
        "topic, 1,000 wildcard bindings, no-ack",
        "topic",
        50_000,
        5_000,
        bindings=1000,
    ),
    Scenario(
        "topic-1000-lead",
        "topic, 1,000 bindings led by wildcards, no-ack",
        "topic",
        50_000,
        5_000,
        bindings=1000,
        shape="leading",
    ),
    Scenario(
        "topic-100k",
        "topic, 100,000 wildcard bindings, 1,000 keys (cached), no-ack",
        "topic",
        50_000,
        5_000,
        bindings=100_000,
        topic_keys=1_000,
    ),
    Scenario(
        "topic-100k-distinct",
        "topic, 100,000 wildcard bindings, 100,000 distinct keys (mostly uncached), no-ack",
        "topic",
        50_000,
        5_000,
        bindings=100_000,
        topic_keys=100_000,
    ),
    Scenario(
        "topic-100k-lead-distinct",
        "topic, 100,000 bindings led by wildcards, 100,000 distinct keys, no-ack",
        "topic",
        20_000,
        2_000,
        bindings=100_000,
        shape="leading",
        topic_keys=100_000,
    ),
]
BROKERS = ("roarmq", "rabbitmq")
LABEL = {"roarmq": "RoarMQ", "rabbitmq": "RabbitMQ"}


class BrokerUnavailable(Exception):
    """The broker cannot be run here (e.g. not installed): its rows say 'skipped'."""


# -- processes -----------------------------------------------------------------------


class Procs:
    """Every process we start: own session (so a process group), tagged with MARKER."""

    def __init__(self) -> None:
        self.live: list[subprocess.Popen] = []

    def start(
        self, cmd: list[str], *, instance: str, env: dict[str, str] | None = None, **kw: Any
    ) -> subprocess.Popen:
        full_env = dict(os.environ if env is None else env)
        full_env[MARKER] = instance
        proc = subprocess.Popen(cmd, env=full_env, start_new_session=True, cwd=REPO, **kw)
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def start_roarmq(procs: Procs, tmp: Path, cpu: int | None) -> Running:
    # management disabled (a config file is the only way), port 0 = the kernel picks a free one
    data = tmp / "data"
    cfg = tmp / "roarmq.toml"
    cfg.write_text(
        '[amqp]\nbind = ["127.0.0.1"]\nport = 0\n\n[management]\nenabled = false\n\n'
        f'[storage]\ndata_dir = "{data}"\n\n[log]\nlevel = "notice"\n'
    )
    log = tmp / "roarmq.log"
    instance = uuid.uuid4().hex
    cmd = pinned(
        cpu,
        [
            sys.executable,
            "-m",
            "roarmq",
            "--config",
            str(cfg),
            "--data-dir",
            str(data),
            "--log-level",
            "notice",  # start-up, listeners (the port is read from them) and problems
        ],
    )
    with open(log, "wb") as out:
        proc = procs.start(cmd, instance=instance, stdout=out, stderr=subprocess.STDOUT)

    def port_of() -> int:  # "RoarMQ 0.1.0: AMQP on 127.0.0.1 port 43809"
        for line in log.read_text(errors="replace").splitlines():
            if "AMQP on" in line and " port " in line:
                return int(line.rsplit(" port ", 1)[1].split()[0].rstrip(","))
        return 0

    try:
        port, props = _wait_ready(proc, port_of, log, 30)
    except BaseException:
        procs.stop(proc)
        sweep(instance)
        raise
    return Running("roarmq", port, str(props.get("version", "?")), proc, instance, log)


def rabbit_server() -> str | None:
    for path in RABBIT_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("rabbitmq-server")


def ensure_rabbitmq() -> str:
    path = rabbit_server()
    if path:
        return path
    if os.geteuid() != 0:
        raise BrokerUnavailable("skipped: rabbitmq-server not installed")
    print("rabbitmq-server not installed: apt-get install -y rabbitmq-server ...", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    ok = subprocess.call(["apt-get", "install", "-y", "rabbitmq-server"], env=env) == 0
    if not ok:
        subprocess.call(["apt-get", "update"], env=env)
        ok = subprocess.call(["apt-get", "install", "-y", "rabbitmq-server"], env=env) == 0
    # the package may start a system node: we run our own instance on our own ports
    subprocess.call(
        ["service", "rabbitmq-server", "stop"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    path = rabbit_server()
    if not ok or not path:
        raise BrokerUnavailable("skipped: rabbitmq-server not installed (apt-get failed)")
    return path


def start_rabbitmq(procs: Procs, tmp: Path, cpu: int | None, attempts: int = 2) -> Running:
    server = ensure_rabbitmq()
    for attempt in range(attempts):
        base = tmp / f"rabbit{attempt}"
        base.mkdir(parents=True)
        (base / "enabled_plugins").write_text("[].\n")
        port, dist, epmd = free_port(), free_port(), free_port()
        instance = uuid.uuid4().hex
        env = dict(os.environ)
        env.update(
            {
                "HOME": str(base),  # the Erlang cookie goes here
                "RABBITMQ_NODENAME": "roarbench@localhost",
                "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
                "RABBITMQ_NODE_PORT": str(port),
                "RABBITMQ_DIST_PORT": str(dist),
                "ERL_EPMD_PORT": str(epmd),
                "ERL_EPMD_ADDRESS": "127.0.0.1",
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
                "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
                "RABBITMQ_LOG_BASE": str(base / "log"),
                "RABBITMQ_PID_FILE": str(base / "rabbit.pid"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
                "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq"),  # absent: defaults
                "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),
                "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
            }
        )
        log = base / "stdout.log"
        with open(log, "wb") as out:
            proc = procs.start(
                pinned(cpu, [server]),
                instance=instance,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            port, props = _wait_ready(proc, lambda p=port: p, log, 90)
        except RuntimeError:
            procs.stop(proc, grace=15)
            sweep(instance)
            if attempt + 1 == attempts:
                raise
            continue
        except BaseException:
            procs.stop(proc, grace=15)
            sweep(instance)
            raise
        return Running("rabbitmq", port, str(props.get("version", "?")), proc, instance, log)
    raise AssertionError("unreachable")


def stop_broker(procs: Procs, broker: Running) -> None:
    procs.stop(broker.proc, grace=20)
    sweep(broker.instance)


@contextlib.contextmanager
def broker_instance(kind: str, procs: Procs, cpu: int | None) -> Iterator[Running]:
    tmp = Path(tempfile.mkdtemp(prefix=f"roarbench-{kind}-"))
    broker = None
    try:
        broker = (start_roarmq if kind == "roarmq" else start_rabbitmq)(procs, tmp, cpu)
        yield broker
    finally:
        if broker is not None:
            stop_broker(procs, broker)
        shutil.rmtree(tmp, ignore_errors=True)


# -- one scenario --------------------------------------------------------------------


def _reader(proc: subprocess.Popen, lines: queue.Queue) -> None:
    for line in proc.stdout:  # type: ignore[union-attr]
        with contextlib.suppress(ValueError):
            lines.put(json.loads(line))
    lines.put(None)


def _next_line(lines: queue.Queue, deadline: float) -> dict | None:
    try:
        return lines.get(timeout=max(0.0, deadline - time.monotonic()))
    except queue.Empty:
        return None


def run_scenario(
    procs: Procs, broker: Running, sc: Scenario, args: argparse.Namespace, tag: str
) -> dict[str, Any]:
    """One scenario against a running broker: consumer (declares, consumes), then publisher.

    Besides the consumer's figures, the broker's CPU time from the consumer's
    ready line to its result is measured: broker CPU per message does not
    depend on how much of its core other processes take.
    """
    port = broker.port
    messages = args.messages or (sc.quick_messages if args.quick else sc.messages)
    settings = {
        "exchange": f"bench.{sc.name}.{tag}",
        "queue": f"bench.q.{sc.name}.{tag}",
        "exchange_type": sc.exchange_type,
        "messages": messages,
        "manual_ack": sc.manual_ack,
        "prefetch": sc.prefetch,
        "confirms": sc.confirms,
        "window": args.window,
        "batch": args.batch,
        "bindings": sc.bindings,
        "shape": sc.shape,
        "topic_keys": sc.topic_keys or args.topic_keys,
        "timeout": args.timeout,
    }
    blob = json.dumps(settings)
    instance = uuid.uuid4().hex
    base = [sys.executable, str(LOAD)]
    hard_deadline = time.monotonic() + args.timeout + 20
    cons_lines: queue.Queue = queue.Queue()
    pub_lines: queue.Queue = queue.Queue()
    cons = pub = None
    try:
        cons = procs.start(
            pinned(args.load_cpu, [*base, "consumer", "--port", str(port), "--scenario", blob]),
            instance=instance,
            stdout=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=_reader, args=(cons, cons_lines), daemon=True).start()
        ready = _next_line(cons_lines, hard_deadline)
        if not ready or not ready.get("ready"):
            return {"status": f"error: consumer not ready: {ready}", "messages": 0}
        load = loadavg()
        cpu0 = group_cpu_s(broker.proc.pid)
        pub = procs.start(
            pinned(args.load_cpu, [*base, "publisher", "--port", str(port), "--scenario", blob]),
            instance=instance,
            stdout=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=_reader, args=(pub, pub_lines), daemon=True).start()
        consumed = _next_line(cons_lines, hard_deadline)
        broker_cpu = group_cpu_s(broker.proc.pid) - cpu0
        published = _next_line(pub_lines, hard_deadline)
    finally:
        for proc in (pub, cons):
            if proc is not None:
                procs.stop(proc, grace=5)
        sweep(instance)
    if not consumed or "received" not in consumed:
        return {"status": f"error: consumer: {consumed}", "messages": 0, "publisher": published}
    status = "ok"
    if consumed["timed_out"]:
        status = f"timeout after {args.timeout:.0f} s"
    if consumed.get("error"):
        status += f"; consumer: {consumed['error']}"
    if published and published.get("error"):
        status += f"; publisher: {published['error']}"
    if published and published.get("nacked"):
        status += f"; {published['nacked']} nacked"
    return {
        "status": status,
        "messages": consumed["received"],
        "expected": messages,
        "msgs_per_s": consumed["msgs_per_s"],
        "p50_ms": consumed["p50_ms"],
        "p99_ms": consumed["p99_ms"],
        "broker_cpu_us_per_msg": broker_cpu / consumed["received"] * 1e6
        if consumed["received"]
        else None,
        "loadavg": load,
        "publisher": published,
    }


# -- report --------------------------------------------------------------------------


def _num(value: Any) -> float | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)


def fmt(value: float | None, digits: int) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def table(rows: list[dict[str, Any]], repeat: int) -> str:
    head = [
        "scenario",
        "broker",
        "msg/s",
        "p50 ms",
        "p99 ms",
        "messages",
        "RoarMQ/RabbitMQ",
        "broker CPU us/msg",
    ]
    runs = f"median of {repeat} runs (by msg/s); " if repeat > 1 else ""
    out = [
        f"{runs}Latency is publish -> deliver under saturation (unthrottled publisher; time queued "
        "in the broker included).",
        "Broker CPU us/msg: the broker's user+system CPU time over the scenario / messages "
        "(largely independent of other load on its core).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] * 2 + ["---:"] * 6) + "|",
    ]
    rate = {(r["scenario"], r["broker"]): r.get("msgs_per_s") for r in rows}
    for r in rows:
        ratio = ""
        if r["broker"] == "roarmq":
            ours, theirs = (
                rate.get((r["scenario"], "roarmq")),
                rate.get((r["scenario"], "rabbitmq")),
            )
            if ours and theirs:
                ratio = f"{ours / theirs:.2f}x"
        msgs = f"{r['messages']:,}" if r.get("messages") is not None else "-"
        if r.get("status", "ok") != "ok":
            msgs += f" ({r['status']})"
        out.append(
            "| "
            + " | ".join(
                [
                    r["scenario"],
                    LABEL[r["broker"]],
                    fmt(r.get("msgs_per_s"), 0),
                    fmt(r.get("p50_ms"), 1),
                    fmt(r.get("p99_ms"), 1),
                    msgs,
                    ratio,
                    fmt(r.get("broker_cpu_us_per_msg"), 1),
                ]
            )
            + " |"
        )
    return "\n".join(out)


def machine(versions: dict[str, str]) -> dict[str, Any]:
    try:
        import uvloop

        uv = uvloop.__version__
    except ImportError:
        uv = None
    return machine_info(uvloop=uv, **{f"{k}_version": v for k, v in versions.items()})


def summarize(scenario: str, kind: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from a scenario's runs: the median run by msg/s (lower middle if even)."""
    measured = sorted(
        (r for r in results if _num(r.get("msgs_per_s")) is not None), key=lambda r: r["msgs_per_s"]
    )
    pick = measured[(len(measured) - 1) // 2] if measured else results[-1]
    cpus = sorted(c for r in measured if (c := _num(r.get("broker_cpu_us_per_msg"))) is not None)
    return {
        "scenario": scenario,
        "broker": kind,
        "msgs_per_s": _num(pick.get("msgs_per_s")),
        "p50_ms": _num(pick.get("p50_ms")),
        "p99_ms": _num(pick.get("p99_ms")),
        "messages": pick.get("messages"),
        "status": pick["status"],
        "broker_cpu_us_per_msg": cpus[(len(cpus) - 1) // 2] if cpus else None,
        "runs_msgs_per_s": [_num(r.get("msgs_per_s")) for r in results],
        "runs_loadavg_1m": [_num(r.get("loadavg")) for r in results],
    }


# -- main ----------------------------------------------------------------------------


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main() -> int:
    p = argparse.ArgumentParser(description="RoarMQ vs RabbitMQ throughput and latency.")
    p.add_argument("--broker", choices=["roarmq", "rabbitmq", "both"], default="both")
    p.add_argument("--quick", action="store_true", help="far fewer messages; under a minute")
    p.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "throughput.json")
    p.add_argument(
        "--scenarios",
        default=",".join(s.name for s in SCENARIOS),
        help="comma-separated subset of: " + ", ".join(s.name for s in SCENARIOS),
    )
    p.add_argument("--messages", type=int, default=0, help="override every scenario's count")
    p.add_argument(
        "--timeout", type=float, default=0.0, help="seconds per scenario (default 60, quick 10)"
    )
    p.add_argument(
        "--topic-keys",
        type=int,
        default=50_000,
        help="distinct routing keys in the topic scenarios (default 50,000)",
    )
    p.add_argument("--window", type=int, default=1000, help="unconfirmed messages, confirms")
    p.add_argument("--batch", type=int, default=200, help="messages per transport.write")
    p.add_argument("--broker-cpu", type=int, default=0)
    p.add_argument("--load-cpu", type=int, default=1)
    p.add_argument(
        "--repeat",
        type=int,
        default=0,
        help="runs per scenario and broker, the median reported (default 3, quick 1)",
    )
    p.add_argument(
        "--reuse-broker",
        action="store_true",
        help="one broker instance for all scenarios (default with --quick)",
    )
    args = p.parse_args()
    args.timeout = args.timeout or (10.0 if args.quick else 60.0)
    args.repeat = args.repeat or (1 if args.quick else 3)
    reuse = args.reuse_broker or args.quick
    chosen = [s for s in SCENARIOS if s.name in args.scenarios.split(",")]
    if not chosen:
        p.error("no scenario selected")
    brokers = BROKERS if args.broker == "both" else (args.broker,)
    if shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        print("warning: no taskset or a single CPU: broker and load are NOT pinned", flush=True)
        args.broker_cpu = args.load_cpu = None

    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop every process.
    signal.signal(signal.SIGTERM, _interrupt)
    procs = Procs()
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    versions: dict[str, str] = {}
    unavailable: dict[str, str] = {}
    print(
        f"throughput: brokers {', '.join(brokers)}; scenarios "
        f"{', '.join(s.name for s in chosen)}; {'quick' if args.quick else 'full'} run, "
        f"{args.repeat} run(s) each; load average {loadavg():.2f}",
        flush=True,
    )

    def record(kind: str, sc: Scenario, result: dict[str, Any]) -> None:
        runs.setdefault((sc.name, kind), []).append(result)
        print(
            f"  {kind:9} {sc.name:11} {fmt(_num(result.get('msgs_per_s')), 0):>9} msg/s  "
            f"p50 {fmt(_num(result.get('p50_ms')), 1):>7} ms  "
            f"p99 {fmt(_num(result.get('p99_ms')), 1):>7} ms  "
            f"{result.get('messages') or 0:,} msgs  "
            f"broker {fmt(_num(result.get('broker_cpu_us_per_msg')), 1)} us/msg  "
            f"load {fmt(_num(result.get('loadavg')), 2)}  {result['status']}",
            flush=True,
        )

    def failed(kind: str, exc: Exception) -> dict[str, Any]:
        if isinstance(exc, BrokerUnavailable):
            unavailable[kind] = str(exc)
            return {"status": str(exc), "messages": None}
        print(f"{kind}: {exc}", file=sys.stderr, flush=True)  # a broker that would not start
        unavailable[kind] = f"error: {str(exc).splitlines()[0]}"
        return {"status": unavailable[kind], "messages": None}

    try:
        if reuse:  # one instance per broker; fresh (auto-delete) queue and exchange per scenario
            for kind in brokers:
                try:
                    with broker_instance(kind, procs, args.broker_cpu) as broker:
                        versions[kind] = broker.version
                        for sc in chosen:
                            for _ in range(args.repeat):
                                record(
                                    kind,
                                    sc,
                                    run_scenario(procs, broker, sc, args, uuid.uuid4().hex[:8]),
                                )
                except (BrokerUnavailable, RuntimeError) as exc:
                    result = failed(kind, exc)
                    for sc in chosen:
                        if (sc.name, kind) not in runs:
                            record(kind, sc, result)
        else:  # a fresh instance per run; brokers interleaved so both see similar background load
            for sc in chosen:
                for _ in range(args.repeat):
                    for kind in brokers:
                        if kind in unavailable:
                            if (sc.name, kind) not in runs:
                                record(kind, sc, {"status": unavailable[kind], "messages": None})
                            continue
                        try:
                            with broker_instance(kind, procs, args.broker_cpu) as broker:
                                versions[kind] = broker.version
                                record(kind, sc, run_scenario(procs, broker, sc, args, "1"))
                        except (BrokerUnavailable, RuntimeError) as exc:
                            record(kind, sc, failed(kind, exc))
    except KeyboardInterrupt:
        print("interrupted: stopping everything", file=sys.stderr, flush=True)
        return 130
    finally:
        procs.stop_all()

    rows = [summarize(name, kind, results) for (name, kind), results in runs.items()]
    order = {s.name: i for i, s in enumerate(SCENARIOS)}
    rows.sort(key=lambda r: (order[r["scenario"]], BROKERS.index(r["broker"])))
    print()
    print(table(rows, args.repeat))
    info = machine(versions)
    result = {
        "benchmark": "throughput",
        "quick": args.quick,
        "command": " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv]),
        "machine": info,
        "settings": {
            "scenarios": [asdict(s) for s in chosen],
            "body_bytes": 16,
            "topic_keys": args.topic_keys,
            "confirm_window": args.window,
            "batch": args.batch,
            "timeout_s": args.timeout,
            "repeat": args.repeat,
            "fresh_broker_per_scenario": not reuse,
            "broker_cpu": args.broker_cpu,
            "load_cpu": args.load_cpu,
        },
        "results": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
