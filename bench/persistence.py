"""Persistence benchmark: confirmed persistent publishing and restart recovery, RoarMQ vs RabbitMQ.

    .venv/bin/python bench/persistence.py [--broker roarmq|rabbitmq|both] [--quick]
                                          [--json bench/results/persistence.json]

A benchmark, not a test. Brokers run pinned to one core (``taskset -c 0``), the
load processes (``bench/lib/amqp_load.py``, our own ``protocol/`` codec on uvloop)
to the other (``taskset -c 1``); how each broker is launched and process bookkeeping
come from ``bench/lib/`` (brokers.py, procs.py), the machine facts from lib/machine.py.

Confirmed persistent throughput: a fresh broker per run; one publisher
connection declares a durable queue and publishes 1 KiB bodies with
delivery_mode=2 through the default exchange to it, in confirm mode with at
most ``window`` unconfirmed messages (1,000 and 100). **No consumer**: the
queue only grows, as in RabbitMQ's usual persistent-throughput measurements.
msg/s = confirmed / (last basic.ack received - first publish written).
Confirm latency = basic.ack receipt - write of that publish, for every
message (publisher side, CLOCK_MONOTONIC). Broker CPU µs/msg = the broker
process group's user+system CPU over the run / confirmed messages. Full run:
3 runs per broker and window (200,000 messages each), brokers alternating; the
row is the median run by msg/s.

Recovery: a fresh broker; one publisher fills a durable queue with
1,000,000 (``--quick``: 100,000) persistent 1 KiB messages, confirmed, window
1,000; a passive queue.declare checks the count. Then the broker is killed
with SIGKILL (the whole process group) and started again on the same data
directory ("after kill -9"; ``--kill9``, both brokers by default), then stopped
with SIGTERM and started again ("after SIGTERM", a clean restart). RabbitMQ's
SIGTERM goes to its ``rabbitmq-server`` script, which stops the node
gracefully. For each
start a probe process (started first, on the load core) polls every 5 ms and
timestamps (a) the first accepted TCP connection (and the completed AMQP
handshake) and (b) the first passive queue.declare with message_count ==
expected; times are from just before the broker process is spawned. RoarMQ
replays its message log before it opens the AMQP port, so (a) is ~(b) for it;
its own "message store recovered ... ms" log line is reported too. After (b):
the broker's RSS (VmRSS summed over its process group; VmHWM = peak) and the
data directory's size on disk (allocated blocks).

Both brokers run with default settings (RoarMQ: [storage] sync_interval_ms 5,
segment_size 64 MiB, queue_memory_limit 64 MiB, so a queue past 64 MiB of
bodies keeps only its index in memory; RabbitMQ 3.10: classic queue v1,
bodies under 4 KiB embedded in the queue index). Data directories are temp
dirs (``--tmp-dir``). ``--quick``: 20,000 messages per run, one run, 100,000
for recovery (under a minute here). ``--profile DIR`` runs RoarMQ under
cProfile (a .prof per clean exit). All processes started here are stopped on
every exit path.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lib import LOAD, RESULTS
from lib.brokers import (
    BROKERS,
    LABEL,
    BrokerUnavailable,
    amqp_probe,
    ensure_rabbitmq,
    log_tail,
    rabbitmq_env,
    roarmq_command,
    wait_ready,
)
from lib.machine import machine_with_versions as machine
from lib.observe import loadavg
from lib.output import (
    command_line,
    fmt,
    markdown_table,
    next_json_line,
    number,
    read_json_lines,
    write_json,
)
from lib.procs import Procs, group_cpu_s, pinned, sweep
from support.waiting import free_port

BODY = 1024
QUEUE = "bench.persistent"
RECOVERED = re.compile(r"message store recovered .*?messages=(\d+).*? ms=([\d.]+)")


# -- brokers that keep their data across restarts -------------------------------------


@dataclass
class Broker:
    """One broker's state directory; started, stopped and restarted on the same data."""

    kind: str
    base: Path
    cpu: int | None
    profile: Path | None = None
    storage: str = ""  # extra lines for RoarMQ's [storage] section (default: none)
    proc: subprocess.Popen | None = None
    instance: str = ""
    port: int = 0
    version: str = "?"
    starts: int = 0
    spawned_ns: int = 0

    @property
    def data(self) -> Path:
        return self.base / ("data" if self.kind == "roarmq" else "mnesia")

    @property
    def log(self) -> Path:
        return self.base / "broker.log"

    def spawn(self, procs: Procs, port: int = 0) -> None:
        """Start the process (on ``port`` or a fresh one); returns at once.

        ``spawned_ns`` is CLOCK_MONOTONIC just before the fork.
        """
        self.port = port or free_port()
        self.instance = uuid.uuid4().hex
        self.starts += 1
        env = None
        if self.kind == "roarmq":
            cfg = self.base / "roarmq.toml"
            cfg.write_text(
                '[amqp]\nbind = ["127.0.0.1"]\n\n[management]\nenabled = false\n'
                + (f"\n[storage]\n{self.storage}\n" if self.storage else "")
            )
            profile = None
            if self.profile is not None:
                profile = self.profile.with_suffix(f".{self.starts}.prof")
            cmd = pinned(
                self.cpu,
                roarmq_command(cfg, self.data, port=self.port, log_level="info", profile=profile),
            )
        else:
            server = ensure_rabbitmq()
            env = rabbitmq_env(self.base, self.port, mnesia=self.data)
            cmd = pinned(self.cpu, [server])
        with open(self.log, "ab") as out:
            out.write(f"\n==== start {self.starts}: {shlex.join(cmd)}\n".encode())
            out.flush()
            self.spawned_ns = time.monotonic_ns()
            self.proc = procs.start(
                cmd, instance=self.instance, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def start(self, procs: Procs, timeout: float = 90) -> None:
        """Spawn and wait until it speaks AMQP."""
        self.spawn(procs)
        try:
            _, props = wait_ready(self.proc, lambda: self.port, self.log, timeout)
        except BaseException:
            self.kill(procs)
            raise
        self.version = str(props.get("version", "?"))

    def terminate(self, procs: Procs, timeout: float = 120) -> float:
        """Clean stop: SIGTERM to the broker (RabbitMQ: to its rabbitmq-server script, which
        stops the node gracefully). Returns seconds until it exited (SIGKILL after timeout)."""
        proc = self.proc
        t0 = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
            took = time.monotonic() - t0
        except subprocess.TimeoutExpired:
            took = float("nan")
        procs.stop(proc, grace=5)  # the rest of its group, if any
        sweep(self.instance)  # epmd and friends
        self.proc = None
        return took

    def kill(self, procs: Procs) -> None:
        """SIGKILL the whole process group at once (no clean shutdown)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        procs.stop(self.proc, grace=1)
        sweep(self.instance)
        self.proc = None

    def cpu_s(self) -> float:
        return group_cpu_s(self.proc.pid)

    def memory_kib(self) -> dict[str, int]:
        """VmRSS and VmHWM (KiB) summed over the broker's process group."""
        total = {"VmRSS": 0, "VmHWM": 0}
        pgid = self.proc.pid
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.getpgid(int(entry.name)) != pgid:
                    continue
                for line in (entry / "status").read_text().splitlines():
                    key = line.split(":", 1)[0]
                    if key in total:
                        total[key] += int(line.split()[1])
            except (OSError, ValueError):
                continue
        return total

    def recovered_log(self) -> dict[str, Any] | None:
        """RoarMQ's last "message store recovered" line: messages and ms."""
        found = None
        with contextlib.suppress(OSError):
            for line in self.log.read_text(errors="replace").splitlines():
                m = RECOVERED.search(line)
                if m:
                    found = {"messages": int(m.group(1)), "ms": float(m.group(2))}
        return found


def disk_usage(path: Path) -> dict[str, int]:
    """Bytes on disk (allocated blocks) and apparent bytes of every file under ``path``."""
    used = apparent = files = 0
    for root, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(root, name))
                used += st.st_blocks * 512
                apparent += st.st_size
                files += 1
    return {"bytes": used, "apparent_bytes": apparent, "files": files}


def filesystem(path: Path) -> str:
    """Type and device of the mount holding ``path`` (longest matching mount point)."""
    best, fs = "", "?"
    path_s = str(path.resolve())
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            dev, mnt, kind, opts = line.split()[:4]
            if (path_s == mnt or path_s.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(
                best
            ):
                best, fs = mnt, f"{kind} on {dev} ({mnt}, {opts.split(',')[0]})"
    return fs


def erlang_otp() -> str | None:
    for p in sorted(Path("/usr/lib/erlang/releases").glob("*/OTP_VERSION")):
        with contextlib.suppress(OSError):
            return p.read_text().strip()
    return None


# -- load processes ------------------------------------------------------------------


def load_cmd(role: str, port: int, settings: dict[str, Any], cpu: int | None) -> list[str]:
    return pinned(
        cpu,
        [sys.executable, str(LOAD), role, "--port", str(port), "--scenario", json.dumps(settings)],
    )


def run_load(
    procs: Procs, role: str, port: int, settings: dict[str, Any], cpu: int | None, timeout: float
) -> dict[str, Any] | None:
    """Run one load process to completion; its JSON result line (None if it printed none)."""
    instance = uuid.uuid4().hex
    lines: queue.Queue = queue.Queue()
    proc = procs.start(
        load_cmd(role, port, settings, cpu), instance=instance, stdout=subprocess.PIPE, text=True
    )
    threading.Thread(target=read_json_lines, args=(proc, lines), daemon=True).start()
    try:
        return next_json_line(lines, time.monotonic() + timeout)
    finally:
        procs.stop(proc, grace=5)
        sweep(instance)


def publish_settings(messages: int, window: int, timeout: float) -> dict[str, Any]:
    return {
        "exchange": "",
        "routing_key": QUEUE,
        "declare_queue": QUEUE,
        "durable": True,
        "delivery_mode": 2,
        "body_size": BODY,
        "confirms": True,
        "confirm_latency": True,
        "window": window,
        "batch": 200,
        "messages": messages,
        "exchange_type": "direct",
        "timeout": timeout,
    }


def publish(
    procs: Procs, broker: Broker, messages: int, window: int, load_cpu: int | None, timeout: float
) -> dict[str, Any]:
    """One confirmed persistent publishing run against a running broker."""
    load = loadavg()
    cpu0 = broker.cpu_s()
    res = run_load(
        procs,
        "publisher",
        broker.port,
        publish_settings(messages, window, timeout),
        load_cpu,
        timeout + 30,
    )
    cpu = broker.cpu_s() - cpu0
    if not res or "confirmed" not in res:
        return {"status": f"error: publisher: {res}", "confirmed": 0, "loadavg": load}
    status = "ok"
    if res["confirmed"] < messages:
        status = f"incomplete: {res['confirmed']:,} of {messages:,} confirmed in {timeout:.0f} s"
    if res.get("nacked"):
        status += f"; {res['nacked']} nacked"
    if res.get("error"):
        status += f"; {res['error']}"
    if res.get("unexpected"):
        status += f"; broker sent {', '.join(res['unexpected'])}"
    return {
        "status": status,
        "messages": messages,
        "confirmed": res["confirmed"],
        "msgs_per_s": res.get("confirmed_per_s"),
        "p50_ms": number(res.get("confirm_p50_ms")),
        "p99_ms": number(res.get("confirm_p99_ms")),
        "max_ms": number(res.get("confirm_max_ms")),
        "elapsed_s": res.get("confirm_elapsed_s"),
        "broker_cpu_us_per_msg": cpu / res["confirmed"] * 1e6 if res["confirmed"] else None,
        "loadavg": load,
    }


def timed_start(
    procs: Procs, broker: Broker, expect: int | None, load_cpu: int | None, timeout: float
) -> dict[str, Any]:
    """(Re)start ``broker`` with a probe already polling its port; times from the spawn."""
    port = free_port()
    settings: dict[str, Any] = {"timeout": timeout, "interval_ms": 5}
    if expect is not None:
        settings.update(queue=QUEUE, expect=expect)
    instance = uuid.uuid4().hex
    lines: queue.Queue = queue.Queue()
    probe = procs.start(
        load_cmd("recovery", port, settings, load_cpu),
        instance=instance,
        stdout=subprocess.PIPE,
        text=True,
    )
    threading.Thread(target=read_json_lines, args=(probe, lines), daemon=True).start()
    try:
        ready = next_json_line(lines, time.monotonic() + 30)
        if not ready or not ready.get("ready"):
            raise RuntimeError(f"recovery probe not ready: {ready}")
        broker.spawn(procs, port=port)
        deadline = time.monotonic() + timeout + 10
        got = None
        while got is None and time.monotonic() < deadline:
            got = next_json_line(lines, min(deadline, time.monotonic() + 0.5))
            if got is None and broker.proc.poll() is not None:
                raise RuntimeError(
                    f"{broker.kind} exited with {broker.proc.returncode} while "
                    f"starting; log tail:\n{log_tail(broker.log)}"
                )
        # measured right after the count was seen
        mem = broker.memory_kib() if broker.proc.poll() is None else {}
        cpu = broker.cpu_s() if broker.proc.poll() is None else None
    finally:
        procs.stop(probe, grace=1)
        sweep(instance)
    if not got:
        return {"status": f"error: probe gave no result within {timeout:.0f} s"}

    def since(key: str) -> float | None:
        return (got[key] - broker.spawned_ns) / 1e9 if got.get(key) else None

    return {
        "status": "ok" if not got.get("error") else f"error: {got['error']}",
        "accept_s": since("accept_ns"),
        "open_s": since("open_ns"),
        "count_s": since("count_ns"),
        "message_count": got.get("message_count"),
        "rss_mib": mem.get("VmRSS", 0) / 1024 if mem else None,
        "peak_rss_mib": mem.get("VmHWM", 0) / 1024 if mem else None,
        "broker_cpu_s": cpu,
    }


# -- the two parts --------------------------------------------------------------------


def new_broker(kind: str, args: argparse.Namespace, label: str) -> Broker:
    base = Path(tempfile.mkdtemp(prefix=f"roarbench-persist-{kind}-", dir=args.tmp_dir))
    profile = None
    if args.profile and kind == "roarmq":
        args.profile.mkdir(parents=True, exist_ok=True)
        profile = args.profile / f"roarmq-{label}"
    storage = "\n".join(args.roarmq_storage) if kind == "roarmq" else ""
    return Broker(kind, base, args.broker_cpu, profile=profile, storage=storage)


KEEP = False  # --keep: leave the brokers' directories (data, logs) behind


def dispose(procs: Procs, broker: Broker) -> None:
    if broker.proc is not None:
        if broker.kind == "roarmq":
            broker.terminate(procs, timeout=30)  # clean exit: a --profile gets written
        else:
            broker.kill(procs)
    if KEEP:
        print(f"  kept {broker.base}", flush=True)
    else:
        shutil.rmtree(broker.base, ignore_errors=True)


def throughput_run(
    procs: Procs,
    kind: str,
    window: int,
    args: argparse.Namespace,
    versions: dict[str, str],
    label: str,
) -> dict[str, Any]:
    broker = new_broker(kind, args, label)
    try:
        broker.start(procs)
        versions[kind] = broker.version
        return publish(procs, broker, args.messages, window, args.load_cpu, args.timeout)
    finally:
        dispose(procs, broker)


def recovery_run(
    procs: Procs, kind: str, args: argparse.Namespace, versions: dict[str, str], say: Any
) -> dict[str, Any]:
    """Fill, kill -9, restart (timed), SIGTERM, restart (timed)."""
    broker = new_broker(kind, args, "recovery")
    out: dict[str, Any] = {"broker": kind, "messages": args.recovery_messages, "starts": []}
    try:
        empty = timed_start(procs, broker, None, args.load_cpu, 120)
        empty.update(start="empty data dir", data=disk_usage(broker.data))
        out["starts"].append(empty)
        say(kind, empty)
        if not empty.get("open_s"):
            out["status"] = f"error: broker did not start: {empty['status']}"
            return out
        broker.version = _probe_version(broker.port)
        versions[kind] = broker.version
        fill = publish(
            procs, broker, args.recovery_messages, 1000, args.load_cpu, args.fill_timeout
        )
        out["fill"] = fill
        print(
            f"  {kind:9} fill {fill.get('confirmed', 0):,} msgs  "
            f"{fmt(number(fill.get('msgs_per_s')), 0)} msg/s  p99 "
            f"{fmt(number(fill.get('p99_ms')), 1)} ms  {fill['status']}",
            flush=True,
        )
        check = (
            run_load(
                procs, "declare", broker.port, {"queue": QUEUE, "passive": True}, args.load_cpu, 60
            )
            or {}
        )
        expect = check.get("message_count")
        out["queued_before_stop"] = expect
        if not expect:
            out["status"] = f"error: passive declare after the fill: {check}"
            return out
        out["data_before_stop"] = disk_usage(broker.data)
        stops = [("kill -9", None)] if kind in args.kill9 else []
        stops.append(("SIGTERM", "clean"))
        for how, _ in stops:
            if how == "kill -9":
                broker.kill(procs)
                stop_s = None
            else:
                stop_s = broker.terminate(procs)
            row = timed_start(procs, broker, expect, args.load_cpu, args.recovery_timeout)
            row.update(start=f"after {how}", stop_s=stop_s, data=disk_usage(broker.data))
            if kind == "roarmq":
                row["store_log"] = broker.recovered_log()
            out["starts"].append(row)
            say(kind, row)
            if not row.get("count_s"):
                break
        out["status"] = "ok" if all(s["status"] == "ok" for s in out["starts"]) else "error"
        return out
    finally:
        dispose(procs, broker)


def _probe_version(port: int) -> str:
    props = amqp_probe(port) or {}
    return str(props.get("version", "?"))


# -- report --------------------------------------------------------------------------


def summarize(kind: str, window: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median run by msg/s (lower middle if even); CPU per message: the median too."""
    measured = sorted(
        (r for r in runs if number(r.get("msgs_per_s"))), key=lambda r: r["msgs_per_s"]
    )
    pick = measured[(len(measured) - 1) // 2] if measured else runs[-1]
    cpus = sorted(c for r in measured if (c := number(r.get("broker_cpu_us_per_msg"))) is not None)
    return {
        "broker": kind,
        "window": window,
        "msgs_per_s": number(pick.get("msgs_per_s")),
        "p50_ms": number(pick.get("p50_ms")),
        "p99_ms": number(pick.get("p99_ms")),
        "max_ms": number(pick.get("max_ms")),
        "confirmed": pick.get("confirmed"),
        "status": pick.get("status"),
        "broker_cpu_us_per_msg": cpus[(len(cpus) - 1) // 2] if cpus else None,
        "runs_msgs_per_s": [number(r.get("msgs_per_s")) for r in runs],
        "runs_p99_ms": [number(r.get("p99_ms")) for r in runs],
        "runs_broker_cpu_us_per_msg": [number(r.get("broker_cpu_us_per_msg")) for r in runs],
        "runs_loadavg_1m": [number(r.get("loadavg")) for r in runs],
    }


def throughput_table(rows: list[dict[str, Any]], repeat: int) -> str:
    rate = {(r["broker"], r["window"]): r["msgs_per_s"] for r in rows}
    out = [
        f"Confirmed persistent publishing: {BODY} B bodies, delivery_mode=2, durable queue, no "
        f"consumer{f'; median of {repeat} runs by msg/s' if repeat > 1 else ''}.",
        "",
    ]
    head = ["broker", "window", "confirmed msg/s", "confirm p50 ms", "p99 ms", "max ms"]
    head += ["RoarMQ/RabbitMQ", "broker CPU µs/msg", "runs, msg/s"]
    cells = []
    for r in rows:
        ratio = ""
        if r["broker"] == "roarmq":
            ours, theirs = r["msgs_per_s"], rate.get(("rabbitmq", r["window"]))
            if ours and theirs:
                ratio = f"{ours / theirs:.2f}×"
        runs = ", ".join(f"{v / 1000:.1f}k" if v else "-" for v in r["runs_msgs_per_s"])
        status = "" if r["status"] == "ok" else f" ({r['status']})"
        cells.append(
            [
                LABEL[r["broker"]],
                f"{r['window']:,}",
                fmt(r["msgs_per_s"], 0) + status,
                fmt(r["p50_ms"], 1),
                fmt(r["p99_ms"], 1),
                fmt(r["max_ms"], 1),
                ratio,
                fmt(r["broker_cpu_us_per_msg"], 1),
                runs,
            ]
        )
    out.append(markdown_table(head, cells, align="lrrrrrrr"))
    return "\n".join(out)


def recovery_table(results: list[dict[str, Any]]) -> str:
    out = [
        "Restart: seconds from spawning the broker process; RSS after the count was seen.",
        "",
    ]
    head = ["broker", "start", "queued msgs", "port accepts s", "AMQP open s", "count reached s"]
    head += ["store replay ms (log)", "RSS MiB", "peak RSS MiB", "broker CPU s", "data dir MiB"]
    head.append("stop s")
    cells = []
    for res in results:
        for s in res.get("starts", []):
            count = s.get("message_count")
            replay = (s.get("store_log") or {}).get("ms")
            status = "" if s["status"] == "ok" else f" ({s['status']})"
            cells.append(
                [
                    LABEL[res["broker"]],
                    s["start"] + status,
                    f"{count:,}" if count is not None else "-",
                    fmt(s.get("accept_s"), 2),
                    fmt(s.get("open_s"), 2),
                    fmt(s.get("count_s"), 2),
                    fmt(replay, 0),
                    fmt(s.get("rss_mib"), 0),
                    fmt(s.get("peak_rss_mib"), 0),
                    fmt(s.get("broker_cpu_s"), 1),
                    fmt(s["data"]["bytes"] / 2**20, 0),
                    fmt(number(s.get("stop_s")), 2),
                ]
            )
    out.append(markdown_table(head, cells, align="llrrrrrrrrrr"))
    fills = [r for r in results if r.get("fill")]
    if fills:
        head = ["broker", "fill: messages confirmed", "msg/s", "confirm p50 ms", "p99 ms"]
        head += ["broker CPU µs/msg", "status"]
        cells = [
            [
                LABEL[res["broker"]],
                f"{res['fill'].get('confirmed', 0):,}",
                fmt(number(res["fill"].get("msgs_per_s")), 0),
                fmt(res["fill"].get("p50_ms"), 1),
                fmt(res["fill"].get("p99_ms"), 1),
                fmt(res["fill"].get("broker_cpu_us_per_msg"), 1),
                res["fill"]["status"],
            ]
            for res in fills
        ]
        out += ["", markdown_table(head, cells, align="lrrrrr")]
    return "\n".join(out)


# -- main ----------------------------------------------------------------------------


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main() -> int:
    p = argparse.ArgumentParser(
        description="RoarMQ vs RabbitMQ: confirmed persistent "
        "publishing and recovery after a restart."
    )
    p.add_argument("--broker", choices=["roarmq", "rabbitmq", "both"], default="both")
    p.add_argument("--quick", action="store_true", help="fewer messages, one run; under 2 minutes")
    p.add_argument("--json", type=Path, default=RESULTS / "persistence.json")
    p.add_argument("--parts", default="throughput,recovery", help="throughput, recovery or both")
    p.add_argument("--windows", default="1000,100", help="confirm windows (unconfirmed messages)")
    p.add_argument(
        "--messages",
        type=int,
        default=0,
        help="messages per throughput run (default 200,000; quick 20,000)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=0,
        help="throughput runs per broker and window (default 3, quick 1); the median is reported",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=0.0,
        help="seconds per throughput run (default 60, quick 20)",
    )
    p.add_argument(
        "--recovery-messages",
        type=int,
        default=0,
        help="messages queued before the restarts (default 1,000,000; quick 100,000)",
    )
    p.add_argument(
        "--fill-timeout",
        type=float,
        default=0.0,
        help="seconds for the fill (default 300, quick 60)",
    )
    p.add_argument(
        "--recovery-timeout",
        type=float,
        default=0.0,
        help="seconds for one restart to show the count (default 180, quick 60)",
    )
    p.add_argument(
        "--kill9",
        default="roarmq,rabbitmq",
        help="brokers also restarted after SIGKILL (comma-separated; '' for none)",
    )
    p.add_argument("--broker-cpu", type=int, default=0)
    p.add_argument("--load-cpu", type=int, default=1)
    p.add_argument(
        "--tmp-dir",
        type=Path,
        default=None,
        help="where the brokers' data directories go (default: the system temp dir)",
    )
    p.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="run RoarMQ under cProfile; .prof files (written on clean exits) go here",
    )
    p.add_argument(
        "--roarmq-storage",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a line for RoarMQ's [storage] config section, e.g. "
        "'sync_interval_ms = 1' (repeatable; default: none, all defaults)",
    )
    p.add_argument(
        "--keep", action="store_true", help="keep the brokers' data and log directories (printed)"
    )
    args = p.parse_args()
    global KEEP
    KEEP = args.keep
    q = args.quick
    args.messages = args.messages or (20_000 if q else 200_000)
    args.repeat = args.repeat or (1 if q else 3)
    args.timeout = args.timeout or (20.0 if q else 60.0)
    args.recovery_messages = args.recovery_messages or (100_000 if q else 1_000_000)
    args.fill_timeout = args.fill_timeout or (60.0 if q else 300.0)
    args.recovery_timeout = args.recovery_timeout or (60.0 if q else 180.0)
    args.kill9 = [k for k in args.kill9.split(",") if k]
    windows = [int(w) for w in args.windows.split(",") if w]
    parts = args.parts.split(",")
    brokers = BROKERS if args.broker == "both" else (args.broker,)
    if shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        print("warning: no taskset or a single CPU: broker and load are NOT pinned", flush=True)
        args.broker_cpu = args.load_cpu = None
    tmp_dir = args.tmp_dir or Path(tempfile.gettempdir())

    signal.signal(signal.SIGTERM, _interrupt)
    procs = Procs()
    versions: dict[str, str] = {}
    unavailable: dict[str, str] = {}
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    recoveries: list[dict[str, Any]] = []
    t_begin = time.monotonic()
    print(
        f"persistence: brokers {', '.join(brokers)}; parts {', '.join(parts)}; "
        f"{'quick' if q else 'full'} run; data in {tmp_dir} ({filesystem(tmp_dir)}); "
        f"load average {loadavg():.2f}",
        flush=True,
    )

    def say(kind: str, row: dict[str, Any]) -> None:
        replay = (row.get("store_log") or {}).get("ms")
        print(
            f"  {kind:9} start {row['start']:15} accept {fmt(row.get('accept_s'), 2):>6} s  "
            f"count {fmt(row.get('count_s'), 2):>6} s  msgs {row.get('message_count')}  "
            f"replay {fmt(replay, 0)} ms  RSS {fmt(row.get('rss_mib'), 0)} MiB  "
            f"data {row['data']['bytes'] / 2**20:,.0f} MiB  {row['status']}",
            flush=True,
        )

    try:
        if "throughput" in parts:
            for window in windows:
                for rep in range(args.repeat):
                    for kind in brokers:
                        if kind in unavailable:
                            continue
                        try:
                            r = throughput_run(
                                procs, kind, window, args, versions, f"w{window}-{rep}"
                            )
                        except (BrokerUnavailable, RuntimeError) as exc:
                            unavailable[kind] = str(exc).splitlines()[0]
                            print(f"  {kind}: {unavailable[kind]}", flush=True)
                            r = {"status": unavailable[kind]}
                        runs.setdefault((kind, window), []).append(r)
                        print(
                            f"  {kind:9} window {window:5}  {fmt(number(r.get('msgs_per_s')), 0):>7} "
                            f"msg/s  p50 {fmt(r.get('p50_ms'), 1):>6} ms  p99 "
                            f"{fmt(r.get('p99_ms'), 1):>6} ms  broker "
                            f"{fmt(r.get('broker_cpu_us_per_msg'), 1)} us/msg  load "
                            f"{fmt(number(r.get('loadavg')), 2)}  {r['status']}",
                            flush=True,
                        )
        if "recovery" in parts:
            for kind in brokers:
                if kind in unavailable:
                    recoveries.append({"broker": kind, "status": unavailable[kind], "starts": []})
                    continue
                try:
                    recoveries.append(recovery_run(procs, kind, args, versions, say))
                except (BrokerUnavailable, RuntimeError) as exc:
                    print(f"  {kind}: {exc}", flush=True)
                    recoveries.append(
                        {
                            "broker": kind,
                            "status": f"error: {str(exc).splitlines()[0]}",
                            "starts": [],
                        }
                    )
    except KeyboardInterrupt:
        print("interrupted: stopping everything", file=sys.stderr, flush=True)
        return 130
    finally:
        procs.stop_all()

    rows = [summarize(kind, window, rs) for (kind, window), rs in runs.items()]
    rows.sort(key=lambda r: (-r["window"], BROKERS.index(r["broker"])))
    print()
    if rows:
        print(throughput_table(rows, args.repeat))
        print()
    if recoveries:
        print(recovery_table(recoveries))
    info = machine(versions)
    info.update(
        erlang_otp=erlang_otp(),
        data_filesystem=filesystem(tmp_dir),
        wall_s=round(time.monotonic() - t_begin, 1),
    )
    result = {
        "benchmark": "persistence",
        "quick": q,
        "command": command_line(),
        "machine": info,
        "settings": {
            "body_bytes": BODY,
            "delivery_mode": 2,
            "queue": f"{QUEUE} (durable, default exchange, no consumer)",
            "windows": windows,
            "batch": 200,
            "messages_per_run": args.messages,
            "repeat": args.repeat,
            "timeout_s": args.timeout,
            "recovery_messages": args.recovery_messages,
            "fill_window": 1000,
            "kill9": args.kill9,
            "broker_cpu": args.broker_cpu,
            "load_cpu": args.load_cpu,
            "roarmq_config": "defaults, except [amqp] bind 127.0.0.1 and management disabled",
            "roarmq_storage": args.roarmq_storage,
            "rabbitmq_config": "defaults (no config file, no plugins)",
        },
        "throughput": rows,
        "throughput_runs": {f"{k}/{w}": rs for (k, w), rs in runs.items()},
        "recovery": recoveries,
    }
    write_json(args.json, result)
    print(f"\nwrote {args.json} ({time.monotonic() - t_begin:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
