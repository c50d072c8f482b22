"""Celery's countdown tasks held by the broker: many scheduled over the next hour.

    .venv/bin/python bench/celery_eta.py [--broker roarmq|rabbitmq|both] [--tasks N]
        [--over S] [--pool prefork|solo] [--prefetch-multiplier M] [--json PATH]

A benchmark, not a test. For each broker: a fresh one pinned to CPU 0 (bench/lib/brokers.py's
``monitored_instance``), one unmodified Celery worker (one pool process, tests/support/
celery_app.py's app with quorum task queues, so Celery (5.5+) delays its countdown tasks on
the broker: kombu's 28 levels of TTL'd quorum queues dead-lettering at least once into each
other) and this process, both on CPU 1. N tasks (default 100,000) are sent at once, with
countdowns spread evenly over S seconds (default 3,600) in random order; then each is
waited for.

Reported per broker: the send rate; how many ran (by two minutes past the last due time),
and each one's lateness (ran minus due, both read in the worker: p50, p99, max, and how
many ran early); the most messages the
delay levels held at once and the most the worker held unacknowledged (Celery's ETA tasks
in the worker's hands: none, when the broker holds them); the broker's and the worker's
resident memory at the start of sending, at their peak and at the end (the worker's flat: the tasks
wait in the broker's queues, not in the worker's memory). The JSON also
keeps every look at the queues (each LOOK_EVERY seconds: the delay levels, ready,
unacknowledged, and how many had run), so a worker that falls behind shows when.

`--pool` (default prefork, Celery's own) and `--prefetch-multiplier M` (default 4, Celery's
own). With the solo pool a worker that falls behind stalls, on any broker: a countdown task
comes to the worker as an ETA task, which kombu's event loop runs from its timer, and the
solo pool runs it right there; its ack is queued for the loop's next turn, which comes only
after the poll that follows, up to 10 s when nothing arrives (celery/celery#7718, kombu
pull request #1587), and with every prefetched message unacknowledged nothing does: M + 1
tasks per 10 s. The prefork pool's child reports on a pipe, which ends that poll at once.
RabbitMQ 3.10.8, which does not raise an existing consumer's prefetch, meets it from the
first task.

`--stall-at S --stall-for D`: S seconds after the sending ends, the broker's processes are
stopped (SIGSTOP) for D seconds, as a broker's pause under load would be: whether the
worker catches up afterwards (tasks due during the pause run late; the ones after?).

`--load-at S --load-for D`: S seconds after the sending ends, one busy loop per core for D
seconds beside the broker and the worker, as a machine busy with other work would be.

Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from base64 import b64encode
from pathlib import Path
from typing import Any

import pika
from lib import REPO, RESULTS
from lib.brokers import monitored_instance
from lib.observe import RssSampler
from lib.output import markdown_table, write_results
from lib.procs import Procs, pinned

MiB = 1024 * 1024
#: The delay levels kombu declares (celery_delayed_0 .. celery_delayed_27).
LEVELS = 28
#: Seconds between two looks at the queues while the tasks wait.
LOOK_EVERY = 5.0


def start_worker(procs: Procs, url: str, out: Path, log: Path, multiplier: int, pool: str) -> Any:
    env = {
        **os.environ,
        "ROARMQ_CELERY_PREFETCH_MULTIPLIER": str(multiplier),
        "ROARMQ_CELERY_BROKER": url,
        "ROARMQ_CELERY_OUT": str(out),
        "ROARMQ_CELERY_QUEUE_TYPE": "quorum",
        "PYTHONPATH": os.pathsep.join((str(REPO / "tests"), os.environ.get("PYTHONPATH", ""))),
    }
    argv = [sys.executable, "-m", "celery", "-A", "support.celery_app", "worker"]
    argv += ["--pool", pool, "--concurrency", "1", "--loglevel", "warning"]
    argv += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    with open(log, "ab") as output:
        return procs.start(
            pinned(1, argv), instance="celery-eta", env=env, stdout=output, stderr=output
        )


def queue_counts(port: int) -> tuple[int, int]:
    """(messages in the delay levels, messages ready in the task queue)."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        ch = conn.channel()
        delayed = 0
        for level in range(LEVELS):
            ok = ch.queue_declare(f"celery_delayed_{level}", passive=True)
            delayed += ok.method.message_count
        ready = ch.queue_declare("celery", passive=True).method.message_count
    finally:
        conn.close()
    return delayed, ready


def unacked_of(mgmt: int | None) -> int | None:
    """The task queue's unacknowledged messages (RoarMQ's API; None without one)."""
    if mgmt is None:
        return None
    request = urllib.request.Request(
        f"http://127.0.0.1:{mgmt}/api/queues/%2F/celery",
        headers={"Authorization": "Basic " + b64encode(b"guest:guest").decode()},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return int(json.loads(resp.read())["messages_unacknowledged"])


def ran(out: Path) -> list[dict[str, Any]]:
    text = out.read_text() if out.exists() else ""
    return [json.loads(line) for line in text.split("\n")[:-1]]


def wait_until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (OSError, pika.exceptions.AMQPError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}")


def pause_broker(pid: int, at: float, length: float) -> threading.Thread:
    """Stop the broker's process group at monotonic time `at` for `length` seconds."""

    def pause() -> None:
        time.sleep(max(0.0, at - time.monotonic()))
        group = os.getpgid(pid)
        os.killpg(group, signal.SIGSTOP)
        try:
            time.sleep(length)
        finally:
            os.killpg(group, signal.SIGCONT)

    thread = threading.Thread(target=pause, daemon=True)
    thread.start()
    return thread


def load_machine(at: float, length: float) -> threading.Thread:
    """One busy loop per core from monotonic time `at` for `length` seconds (processes of
    their own, unpinned: the scheduler shares them out as it would other work)."""

    def load() -> None:
        time.sleep(max(0.0, at - time.monotonic()))
        loops = [
            subprocess.Popen(["timeout", str(length), "sh", "-c", "while :; do :; done"])
            for _ in range(os.cpu_count() or 1)
        ]
        for busy in loops:
            busy.wait()

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    return thread


def run(
    kind: str,
    procs: Procs,
    tasks: int,
    over: float,
    stall: tuple[float, float] | None = None,
    load: tuple[float, float] | None = None,
    multiplier: int = 4,
    pool: str = "prefork",
) -> dict[str, Any]:
    from celery import Celery

    with (
        monitored_instance(kind, procs, 0, REPO) as b,
        tempfile.TemporaryDirectory(prefix="celery-eta-") as tmp,
    ):
        url = f"amqp://guest:guest@127.0.0.1:{b.running.port}//"
        out, log = Path(tmp) / "ran.jsonl", Path(tmp) / "worker.log"
        worker = start_worker(procs, url, out, log, multiplier, pool)
        worker_rss = RssSampler(worker.pid, period=1.0)
        worker_rss.start()
        try:
            # the worker declares the delay levels and its quorum task queue at start
            wait_until(lambda: queue_counts(b.running.port), 120, "the worker's queues")
            sender = Celery("roarmq_bench", broker=url)
            sender.conf.task_default_queue_type = "quorum"
            sender.conf.task_default_exchange_type = "topic"
            rng = random.Random(11)
            # at least 1 s: kombu's delay levels take whole seconds, and refuse 0
            countdowns = [1 + (over - 1) * (i + 1) / tasks for i in range(tasks)]
            rng.shuffle(countdowns)
            broker_start = b.rss.samples[-1][1]
            worker_start = worker_rss.samples[-1][1] if worker_rss.samples else 0
            sent_at = time.monotonic()
            with sender.connection_for_write() as conn:
                for i, countdown in enumerate(countdowns):
                    sender.send_task("record", (str(i),), countdown=countdown, connection=conn)
            send_s = time.monotonic() - sent_at
            if stall is not None:
                pause_broker(b.running.proc.pid, time.monotonic() + stall[0], stall[1])
            if load is not None:
                load_machine(time.monotonic() + load[0], load[1])
            looks: list[tuple[float, int, int, int | None, int]] = []
            stop = threading.Event()

            def look() -> None:
                while not stop.wait(LOOK_EVERY):
                    try:
                        delayed, ready = queue_counts(b.running.port)
                        unacked = unacked_of(b.mgmt_port)
                        looks.append((time.monotonic(), delayed, ready, unacked, len(ran(out))))
                    except (OSError, pika.exceptions.AMQPError):
                        continue

            looker = threading.Thread(target=look, daemon=True)
            looker.start()
            # every task, or what ran by two minutes past the last due time (a worker that
            # fell behind is reported as it is: `ran` short of `tasks`)
            deadline = sent_at + send_s + over + 120
            while len(ran(out)) < tasks and time.monotonic() < deadline:
                time.sleep(1.0)
            stop.set()
            looker.join(30)
            runs = ran(out)
        finally:
            worker_rss.stop()
            procs.stop(worker)
        late = sorted(r["ran"] - r["due"] for r in runs) or [float("nan")]
        broker_samples = [rss for _, rss in b.rss.samples]
        worker_samples = [rss for _, rss in worker_rss.samples] or [0]
        unacked = [u for _, _, _, u, _ in looks if u is not None]
        return {
            "broker": kind,
            "version": b.running.version,
            "tasks": tasks,
            "over_s": over,
            "prefetch_multiplier": multiplier,
            "pool": pool,
            "send_per_s": round(tasks / send_s),
            "ran": len(runs),
            "early": sum(1 for x in late if x < 0),
            "late_p50_s": round(statistics.median(late), 3),
            "late_p99_s": round(late[int(len(late) * 0.99)], 3),
            "late_max_s": round(late[-1], 3),
            "stall": f"{stall[1]:g} s at +{stall[0]:g} s" if stall else "-",
            "load": f"{load[1]:g} s at +{load[0]:g} s" if load else "-",
            "delay_levels_peak": max((d for _, d, _, _, _ in looks), default=0),
            "worker_unacked_peak": max(unacked) if unacked else None,
            "broker_rss_start_mb": round(broker_start / MiB, 1),
            "broker_rss_peak_mb": round(max(broker_samples) / MiB, 1),
            "broker_rss_end_mb": round(broker_samples[-1] / MiB, 1),
            "worker_rss_start_mb": round(worker_start / MiB, 1),
            "worker_rss_peak_mb": round(max(worker_samples) / MiB, 1),
            "worker_rss_end_mb": round(worker_samples[-1] / MiB, 1),
            # (seconds after sending ended, in the delay levels, ready, unacknowledged, ran)
            "looks": [(round(t - sent_at - send_s, 1), d, r, u, n) for t, d, r, u, n in looks],
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", choices=("roarmq", "rabbitmq", "both"), default="roarmq")
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--over", type=float, default=3600.0, help="seconds (default 3600)")
    parser.add_argument("--stall-at", type=float, help="seconds after sending: pause the broker")
    parser.add_argument("--stall-for", type=float, default=3.0, help="seconds (default 3)")
    parser.add_argument("--load-at", type=float, help="seconds after sending: load the cores")
    parser.add_argument("--load-for", type=float, default=30.0, help="seconds (default 30)")
    parser.add_argument(
        "--prefetch-multiplier",
        type=int,
        default=4,
        help="the worker's worker_prefetch_multiplier (default 4, Celery's)",
    )
    parser.add_argument(
        "--pool",
        choices=("prefork", "solo"),
        default="prefork",
        help="the worker's pool, one process (default prefork, Celery's; solo: module doc)",
    )
    parser.add_argument("--json", type=Path, default=RESULTS / "celery_eta.json")
    args = parser.parse_args()
    os.sched_setaffinity(0, {1})  # the sender (this process) beside the worker
    kinds = ["roarmq", "rabbitmq"] if args.broker == "both" else [args.broker]
    procs = Procs()
    rows: list[dict[str, Any]] = []
    try:
        for kind in kinds:
            stall = None if args.stall_at is None else (args.stall_at, args.stall_for)
            load = None if args.load_at is None else (args.load_at, args.load_for)
            rows.append(
                run(
                    kind,
                    procs,
                    args.tasks,
                    args.over,
                    stall,
                    load,
                    args.prefetch_multiplier,
                    args.pool,
                )
            )
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "looks"}), flush=True)
    finally:
        procs.stop_all()
    keys = [k for k in rows[0] if k != "looks"]  # (in the JSON)
    print(markdown_table(keys, [[row[k] for k in keys] for row in rows]))
    write_results(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
