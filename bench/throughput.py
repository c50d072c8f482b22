"""Throughput benchmark: RoarMQ against RabbitMQ and GarageMQ, end to end over AMQP, in one run.

    .venv/bin/python bench/throughput.py [--broker roarmq|rabbitmq|garagemq|both|all]
                                         [--scenarios direct,fanout,...] [--quick]
                                         [--json bench/results/throughput.json]

A benchmark, not a test. For each broker and scenario a broker instance is
started pinned to one core (``taskset -c 0``), then a consumer process and a
publisher process pinned to the other (``taskset -c 1``), both speaking AMQP
through our own ``protocol/`` codec on uvloop (``bench/lib/amqp_load.py``; aio-pika
is too slow to load a broker). Brokers (``--broker``; default ``all``, ``both``
is RoarMQ and RabbitMQ):

  roarmq      this repository, management off, its own data dir
  rabbitmq    RabbitMQ (Debian's rabbitmq-server, 3.10), its own node, ports and dirs
  garagemq    GarageMQ (Debian's garagemq, a Go AMQP 0-9-1 broker), its own config file
              (Debian's settings plus TCP_NODELAY), loopback ports and badger data dir

RabbitMQ and GarageMQ are ``apt-get install``ed when missing and we are root;
otherwise their rows say skipped. A scenario a broker cannot run says
``failed: <reason>`` (or times out) in its row. Scenarios (16-byte bodies,
transient messages, one queue and one consumer unless said otherwise):

  direct      direct exchange, one binding, consumer no-ack (autoack)
  confirms    as direct, plus publisher confirms (at most 1,000 unconfirmed)
              and manual acks (one basic.ack per delivery), prefetch 100
  4p4c        4 publisher processes, each to its own queue (direct exchange, queue k bound
              with "bench.key.k"), 4 consumers (one process, one channel) with manual acks
              and prefetch 100; deliveries/s over all four
  persistent-w1000  as confirms, but persistent messages (delivery-mode 2) to a durable
              (auto-delete) queue: the broker makes each durable before confirming it
  persistent-w1     the same with a publisher that waits for each confirm before the next
              publish (pika's BlockingConnection): its rate is 1 / the broker's confirm latency
              Both report the publisher's confirm latency p50/p99 beside the delivery latency
  fanout      fanout exchange bound to 10 queues, one no-ack consumer per queue (10
              consumers on one channel of one consumer process, which walks frames
              instead of parsing them, so it is not the bottleneck: see its CPU %),
              publisher unthrottled; reported as deliveries/s (10 per message)
  latency-10k as direct, but the publisher is paced at 10,000 msg/s (bursts of 10 against
              a monotonic schedule; 100,000 messages, 10 s): p50/p99 publish -> deliver
              latency of a broker that is not saturated, and the achieved rate. This
              publisher runs on asyncio's own loop: uvloop defers each write to the end
              of a loop iteration, which alone made p99 0.55 ms for every broker
  latency-60s a steady 10,000 msg/s for 60 s (600,000 messages; --quick 3 s) to a queue with
              a message TTL (expiry timers), consumed with manual acks and prefetch 100
              (the consumer-timeout sweep): the tail (p99.9, max) with the periodic
              jobs running; RoarMQ also runs its management sampler, as in every row
  topic-10    topic exchange, 10 wildcard bindings, consumer no-ack
  topic-1000  topic exchange, 1,000 wildcard bindings, consumer no-ack
  topic-1000-lead  the same with patterns that start with a wildcard (*.e{i}.# / #.o{i}),
                   which no prefix of the key can prune
  topic-10k   topic exchange, 10,000 wildcard bindings, 1,000 distinct keys (all cached)
  topic-100k  topic exchange, 100,000 wildcard bindings, 1,000 distinct keys (all cached)
  topic-100k-distinct  the same bindings, 100,000 distinct keys: ten times RoarMQ's routing
                   cache, so most keys are routed by a trie walk (the cold path)
  topic-100k-lead-distinct  100,000 bindings led by wildcards, 100,000 distinct keys

Topic setup: the one queue is bound with ``s{i}.*.x`` (even i) and ``s{i}.#``
(odd i) for i < N; the publisher cycles through ``--topic-keys`` distinct keys
``s{i}.w{j}.x`` / ``s{i}.w{j}.y`` (shuffled, seed 1), each matching exactly
one binding. The default of 50,000 keys exceeds RoarMQ's default 10,000-key
routing cache, so most lookups walk the trie.

Every row also has: p99.9 and the slowest delivery; RoarMQ's longest event-loop stall
during the scenario (the lag of a 1 ms timer; RoarMQ runs with its management API and that
probe on, ``ROARMQ_OPTIONS``) and beside it each stall of 5 ms or more (the broker's
``stall_threshold_ms``) with what explains it: GC passes, a periodic job, time off CPU (GET
/api/diagnostics/stalls, read before and after the scenario; the JSON keeps every run's
full list under ``runs_stalls``, the collector's passes in the scenario under ``runs_gc``,
the jobs' run times under ``runs_jobs``). The longest stall is the longest of those in the
scenario's window, or under 5 ms the ``roarmq_event_loop_lag_max_seconds`` gauge read before
and after (``loop_stall_gauge_ms``: read alone it also holds the stall of the scrape that
reset it, which ends after the reset); and what other processes used (the machine's busy time from /proc/stat minus the broker's,
the load processes' and this script's CPU). A run in which others used more than
``OTHERS_LIMIT`` (0.25) cores is refused: its status says so and its rate is not reported
(``measured_msgs_per_s`` in the JSON keeps it).

deliveries/s (``msgs_per_s`` in the JSON) is messages received by all consumers /
(last receive - send time of the first message): msg/s with one queue. Latency
is receive - send per message, via CLOCK_MONOTONIC in the body. Except in
latency-10k the publisher is unthrottled, so latency is latency under
saturation (time spent queued in the broker included), not the latency of an
idle broker. The consumer's CPU % over its receive window is reported, to show
whether the load side (publisher and consumer share a core) kept up.

Full run: each scenario 3 times (``--repeat``) per broker, a fresh broker
instance each time, the brokers alternating so all see similar background
load; the row is the median run by deliveries/s (by p99 latency for the paced
latency-10k). Broker CPU time per delivery
is reported too: on a shared machine it is steadier than deliveries/s.
``--quick`` (far fewer messages, one run, one instance per broker, a fresh
auto-delete queue and exchange per scenario, and 10,000 instead of 100,000
bindings in the topic-100k* scenarios, which RabbitMQ needs ~20 s and GarageMQ
~50 s to create) finishes in about a minute. Every scenario is bounded in time
(``--timeout``, set-up included): on timeout the row reports what was
measured. Scenarios with 1,000 bindings or more also report the rate at which each broker
took them (binds/s: the consumer pipelines every queue.bind, then reads the bind-oks).
All processes started here are stopped on every exit path.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from lib import LOAD, REPO
from lib.brokers import (
    ALL_BROKERS,
    BROKERS,
    LABEL,
    BrokerUnavailable,
    Running,
    broker_instance,
)
from lib.machine import machine_with_versions as machine
from lib.observe import (
    loadavg,
    loop_lag_ms,
    machine_busy_s,
    machine_steal_s,
    stall_log,
    stall_summary,
)
from lib.output import fmt, next_json_line, number, read_json_lines
from lib.procs import Procs, group_cpu_s, pinned, sweep

#: A run in which other processes used more than this many cores (the machine's busy time
#: minus the broker's, the load's and this script's) is refused: it shared the broker's
#: core with someone, and its figures would be theirs as much as ours.
OTHERS_LIMIT = 0.25

#: What RoarMQ runs with in every scenario: the management API (its sampler is a periodic
#: job of every production broker) and the event-loop lag probe (the loop-stall column).
ROARMQ_OPTIONS = {"management": True, "lag_probe": True}

# --quick binds the 100k-binding scenarios with this many patterns: RabbitMQ takes ~20 s and
# GarageMQ ~50 s (quadratic) to create 100,000 bindings, longer than a quick run's timeout
QUICK_BINDINGS = 10_000


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
    shape: str = "prefixed"  # topic patterns: see lib/amqp_load.py topology
    topic_keys: int = 0  # distinct routing keys; 0: --topic-keys
    queues: int = 1  # queues bound to the exchange, one consumer each (fanout)
    rate: int = 0  # publisher pace, msg/s; 0: unthrottled
    scan: bool = False  # the consumer's frame scanner instead of FrameParser (lib/amqp_load.py)
    quick_bindings: int = 0  # bindings with --quick; 0: as bindings
    persistent: bool = False  # durable queue, delivery-mode 2 (the broker fsyncs them)
    queue_arguments: dict[str, Any] | None = None  # queue.declare arguments of the queue(s)
    timeout: float = 0  # seconds, set-up included, when longer than --timeout
    publishers: int = 1  # publisher processes; with several queues, publisher k -> queue k
    window: int = 0  # unconfirmed messages with confirms; 0: --window


#: A publisher with confirms and a consumer with manual acks and prefetch 100.
CONFIRMED_AND_ACKED: dict[str, Any] = {"confirms": True, "manual_ack": True, "prefetch": 100}

SCENARIOS = [
    Scenario("direct", "direct 1->1, no-ack", "direct", 200_000, 20_000),
    Scenario(
        "confirms",
        "direct, confirms + manual ack, prefetch 100",
        "direct",
        100_000,
        10_000,
        **CONFIRMED_AND_ACKED,
    ),
    Scenario(
        "4p4c",
        "4 publishers -> 4 queues -> 4 consumers, manual ack, prefetch 100",
        "direct",
        200_000,
        20_000,
        manual_ack=True,
        prefetch=100,
        queues=4,
        publishers=4,
    ),
    Scenario(
        "persistent-w1000",
        "persistent, durable queue, confirms (<= 1,000 unconfirmed) + manual ack, prefetch 100",
        "direct",
        100_000,
        10_000,
        **CONFIRMED_AND_ACKED,
        persistent=True,
        window=1000,
    ),
    Scenario(
        "persistent-w1",
        "persistent, durable queue, a publisher that waits for each confirm, manual ack",
        "direct",
        3_000,
        300,
        **CONFIRMED_AND_ACKED,
        persistent=True,
        window=1,
    ),
    Scenario(
        "fanout",
        "fanout to 10 queues, one no-ack consumer each",
        "fanout",
        100_000,
        10_000,
        queues=10,
        scan=True,
    ),
    Scenario(
        "latency-10k",
        "direct 1->1, no-ack, publisher paced at 10,000 msg/s",
        "direct",
        100_000,
        10_000,
        rate=10_000,
    ),
    Scenario(
        "latency-60s",
        "direct 1->1 at 10,000 msg/s for 60 s, manual ack, TTL'd queue (periodic jobs busy)",
        "direct",
        600_000,
        30_000,
        rate=10_000,
        manual_ack=True,
        prefetch=100,
        queue_arguments={"x-message-ttl": 600_000},
        timeout=90,
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
        "topic-10k",
        "topic, 10,000 wildcard bindings, 1,000 keys (cached), no-ack",
        "topic",
        50_000,
        5_000,
        bindings=10_000,
        topic_keys=1_000,
    ),
    Scenario(
        "topic-100k",
        "topic, 100,000 wildcard bindings, 1,000 keys (cached), no-ack",
        "topic",
        50_000,
        5_000,
        bindings=100_000,
        quick_bindings=QUICK_BINDINGS,
        topic_keys=1_000,
    ),
    Scenario(
        "topic-100k-distinct",
        "topic, 100,000 wildcard bindings, 100,000 distinct keys (mostly uncached), no-ack",
        "topic",
        50_000,
        5_000,
        bindings=100_000,
        quick_bindings=QUICK_BINDINGS,
        topic_keys=100_000,
    ),
    Scenario(
        "topic-100k-lead-distinct",
        "topic, 100,000 bindings led by wildcards, 100,000 distinct keys, no-ack",
        "topic",
        20_000,
        2_000,
        bindings=100_000,
        quick_bindings=QUICK_BINDINGS,
        shape="leading",
        topic_keys=100_000,
    ),
]
# -- one scenario --------------------------------------------------------------------


def _publisher_settings(settings: dict[str, Any], sc: Scenario) -> list[str]:
    """One scenario blob per publisher process: with several, publisher k sends its share
    of the messages with routing key "bench.key.k" (queue k's only binding)."""
    if sc.publishers == 1:
        return [json.dumps(settings)]
    share = settings["messages"] // sc.publishers
    return [
        json.dumps({**settings, "messages": share, "routing_key": f"bench.key.{k % sc.queues}"})
        for k in range(sc.publishers)
    ]


def _merge_publishers(answers: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Several publishers' results as one: counts summed, the first error, and the slowest
    confirm latencies (each publisher's own p50/p99: the worst of them)."""
    if len(answers) <= 1:
        return answers[0] if answers else None
    merged: dict[str, Any] = {"publishers": answers}
    for key in ("sent", "confirmed", "nacked", "cpu_s"):
        merged[key] = sum(a.get(key) or 0 for a in answers)
    merged["error"] = next((a["error"] for a in answers if a.get("error")), None)
    for key in ("confirm_p50_ms", "confirm_p99_ms"):
        values = [a[key] for a in answers if a.get(key) is not None]
        merged[key] = max(values) if values else None
    return merged


def _children_cpu_s() -> float:
    """CPU seconds of this script's reaped children (the load processes)."""
    t = os.times()
    return t.children_user + t.children_system


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


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
    timeout = args.timeout if args.quick else max(args.timeout, sc.timeout)
    bindings = sc.quick_bindings if args.quick and sc.quick_bindings else sc.bindings
    settings = {
        "exchange": f"bench.{sc.name}.{tag}",
        "queue": f"bench.q.{sc.name}.{tag}",
        "exchange_type": sc.exchange_type,
        "messages": messages,
        "manual_ack": sc.manual_ack,
        "prefetch": sc.prefetch,
        "confirms": sc.confirms,
        "window": sc.window or args.window,
        "batch": args.batch,
        "durable": sc.persistent,
        "delivery_mode": 2 if sc.persistent else None,
        "confirm_latency": sc.confirms,
        "queue_arguments": sc.queue_arguments or {},
        "bindings": bindings,
        "shape": sc.shape,
        "topic_keys": sc.topic_keys or args.topic_keys,
        "queues": sc.queues,
        "rate": sc.rate,
        "scan": sc.scan,
        "key_per_queue": sc.publishers > 1,
        "timeout": timeout,
    }
    blob = json.dumps(settings)
    instance = uuid.uuid4().hex
    base = [sys.executable, str(LOAD)]
    hard_deadline = time.monotonic() + timeout + 20
    cons_lines: queue.Queue = queue.Queue()
    pub_lines: queue.Queue = queue.Queue()
    cons = None
    pubs: list[subprocess.Popen] = []
    published: dict[str, Any] | None = None
    t_load: float | None = None
    broker_cpu = 0.0
    kids0 = mine0 = busy0 = wall0 = wall1 = steal0 = 0.0
    steal = None
    stall = None
    before = after = None
    try:
        cons = procs.start(
            pinned(args.load_cpu, [*base, "consumer", "--port", str(port), "--scenario", blob]),
            instance=instance,
            stdout=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=read_json_lines, args=(cons, cons_lines), daemon=True).start()
        ready = next_json_line(cons_lines, hard_deadline)
        if not ready or not ready.get("ready"):
            why = (
                ready.get("error", ready)
                if ready
                else f"no ready line within {timeout + 20:.0f} s (declare, bind, consume)"
            )
            return {"status": f"failed: consumer not ready: {why}", "messages": 0}
        load = loadavg()
        before = stall_log(broker.mgmt_port)  # the stalls and GC passes so far
        loop_lag_ms(broker.mgmt_port)  # reading it starts a new maximum
        time.sleep(0.05)  # the probe's next tick records that scrape's own stall, if any
        wall0 = time.time()  # stalls from here on are the scenario's (not our requests')
        kids0, mine0, busy0 = _children_cpu_s(), _own_cpu_s(), machine_busy_s()
        steal0 = machine_steal_s()
        t_load = time.monotonic()
        cpu0 = group_cpu_s(broker.proc.pid)
        for blob_k in _publisher_settings(settings, sc):
            pub = procs.start(
                pinned(
                    args.load_cpu, [*base, "publisher", "--port", str(port), "--scenario", blob_k]
                ),
                instance=instance,
                stdout=subprocess.PIPE,
                text=True,
            )
            pubs.append(pub)
            threading.Thread(target=read_json_lines, args=(pub, pub_lines), daemon=True).start()
        consumed = next_json_line(cons_lines, hard_deadline)
        broker_cpu = group_cpu_s(broker.proc.pid) - cpu0
        wall1 = time.time()
        steal = machine_steal_s() - steal0
        stall = loop_lag_ms(broker.mgmt_port)
        after = stall_log(broker.mgmt_port, before["recorded"]) if before else None
        answers = [next_json_line(pub_lines, hard_deadline) for _ in pubs]
        published = _merge_publishers([a for a in answers if a])
    finally:
        for proc in (*pubs, cons):
            if proc is not None:
                procs.stop(proc, grace=5)
        sweep(instance)
    scenario_stalls = _in_window(after, wall0, wall1)
    others = None
    if t_load is not None:
        span = time.monotonic() - t_load
        ours = (
            broker_cpu
            + (_children_cpu_s() - kids0)  # the publisher and consumer, reaped just now
            + (_own_cpu_s() - mine0)
        )
        others = max(0.0, (machine_busy_s() - busy0 - ours) / span) if span > 0 else None
    if not consumed or "received" not in consumed:
        why = consumed.get("error", consumed) if consumed else "no answer"
        return {"status": f"failed: consumer: {why}", "messages": 0, "publisher": published}
    status = "ok"
    if consumed["timed_out"]:
        status = f"timeout after {timeout:.0f} s"
    if consumed.get("error"):
        status += f"; consumer: {consumed['error']}"
    if published and published.get("error"):
        status += f"; publisher: {published['error']}"
    if published and published.get("nacked"):
        status += f"; {published['nacked']} nacked"
    rate = consumed["msgs_per_s"]
    if others is not None and others > OTHERS_LIMIT:  # not reported: see OTHERS_LIMIT
        status = f"refused: other processes used {others:.2f} cores; {status}"
        rate = None
    return {
        "status": status,
        "messages": consumed["received"],  # deliveries: messages x queues
        "expected": messages * (1 if sc.publishers > 1 else sc.queues),
        "bindings": bindings,
        "msgs_per_s": rate,  # deliveries/s
        "measured_msgs_per_s": consumed["msgs_per_s"],  # also in a refused run
        "p50_ms": consumed["p50_ms"],
        "p99_ms": consumed["p99_ms"],
        "p999_ms": consumed.get("p999_ms"),
        "max_ms": consumed.get("max_ms"),
        # RoarMQ: the longest event-loop stall (a 1 ms timer's lag) in the scenario
        "loop_stall_ms": _longest(stall, scenario_stalls, after),
        "loop_stall_gauge_ms": stall,  # the gauge as read: it also holds our first scrape's
        "stalls": scenario_stalls,  # RoarMQ: each one over its threshold
        "gc": _gc_in_run(before, after),
        "jobs": after["jobs"] if after else None,  # RoarMQ: each timed job's runs since start
        "others_cores": others,
        "steal_s": steal,  # CPU seconds the hypervisor took from this VM in the scenario
        "broker_cpu_us_per_msg": broker_cpu / consumed["received"] * 1e6
        if consumed["received"]
        else None,
        "loadavg": load,
        "consumer_cpu_pct": consumed.get("cpu_pct"),
        "binds_per_s": consumed.get("binds_per_s"),  # pipelined queue.bind, declaring the topology
        "publish_rate": published.get("publish_rate") if published and sc.rate else None,
        "confirm_p50_ms": published.get("confirm_p50_ms") if published else None,
        "confirm_p99_ms": published.get("confirm_p99_ms") if published else None,
        "publisher": published,
    }


def _in_window(log: dict[str, Any] | None, start: float, end: float) -> Any:
    """The stalls the broker saw between ``start`` and ``end`` (wall clock, this machine's):
    those of the scenario, not of our own requests for the stall log and the metrics."""
    if log is None:
        return None
    return [s for s in log["stalls"] if start <= datetime.fromisoformat(s["at"]).timestamp() <= end]


def _longest(gauge: float | None, stalls: list[dict] | None, log: dict | None) -> Any:
    """The scenario's longest stall. The gauge, read before and after, also holds the stall
    of the scrape that reset it (it ends after the reset, in a busy moment 10-20 ms); the
    stall log has every stall over its threshold with its time, so where there is one the
    longest in the scenario's window is the answer, and with none the gauge's value when
    under the threshold (else only "under the threshold" is known: the threshold)."""
    if stalls is None or log is None:
        return gauge
    if stalls:
        return max(s["lag_ms"] for s in stalls)
    return None if gauge is None else min(gauge, log["threshold_ms"])


def _gc_in_run(before: dict[str, Any] | None, after: dict[str, Any] | None) -> Any:
    """RoarMQ's collector passes during the scenario, per generation (from the stall log's
    process-wide counts before and after), and the longest pass since the broker started."""
    if not before or not after:
        return None
    return [
        {
            "generation": b["generation"],
            "collections": a["collections"] - b["collections"],
            "pause_total_ms": round(a["pause_total_ms"] - b["pause_total_ms"], 3),
            "pause_max_ms_since_start": a["pause_max_ms"],
        }
        for b, a in zip(before["gc"]["generations"], after["gc"]["generations"], strict=True)
    ]


# -- report --------------------------------------------------------------------------


def tail_latency(row: dict[str, Any]) -> str:
    """p99.9 and the slowest delivery."""
    p999, most = number(row.get("p999_ms")), number(row.get("max_ms"))
    if p999 is None or most is None:
        return "-"
    digits = 2 if p999 < 10 else 1
    return f"{p999:,.{digits}f} / {most:,.{digits}f}"


def confirm_latency(row: dict[str, Any]) -> str:
    """The publisher's write -> confirm latency, where it had confirms."""
    p50, p99 = number(row.get("confirm_p50_ms")), number(row.get("confirm_p99_ms"))
    if p50 is None or p99 is None:
        return "-"
    return f"{p50:,.1f} / {p99:,.1f}"


def stall_causes(stalls: list[dict[str, Any]] | None) -> str:
    """A row's stalls of 5 ms or more, short: "16.2 gc, 6.0 run_queue", or past four of them
    per kind: "31: run_queue 29 (longest 8.3), blocked 2 (9.9)" ("-": not measured)."""
    if stalls is None:
        return "-"
    if not stalls:
        return "none"
    if len(stalls) <= 4:
        return ", ".join(f"{s['lag_ms']:.1f} {s['kind']}" for s in stalls)
    kinds: dict[str, list[float]] = {}
    for s in stalls:
        kinds.setdefault(s["kind"], []).append(s["lag_ms"])
    return f"{len(stalls)}: " + ", ".join(
        f"{kind} {len(lags)} ({'longest ' if i == 0 else ''}{max(lags):.1f})"
        for i, (kind, lags) in enumerate(sorted(kinds.items(), key=lambda k: -len(k[1])))
    )


def stall_list(rows: list[dict[str, Any]]) -> list[str]:
    """Every RoarMQ run's stalls of 5 ms or more, each with its cause."""
    out = []
    for r in rows:
        for k, stalls in enumerate(r.get("runs_stalls") or [], 1):
            for s in stalls or []:
                out.append(f"- {r['scenario']}, run {k}: {stall_summary(s)}")
    if not out:
        return []
    return [
        "",
        "RoarMQ's event-loop stalls of 5 ms or more, each run, with what explains them:",
        *out,
    ]


def table(rows: list[dict[str, Any]], repeat: int, quick: bool = False) -> str:
    others = [k for k in ALL_BROKERS[1:] if any(r["broker"] == k for r in rows)]
    head = [
        "scenario",
        "broker",
        "deliveries/s",
        "p50 ms",
        "p99 ms",
        "p99.9 / max ms",
        "confirm p50 / p99 ms",
        "received",
        *(f"RoarMQ/{LABEL[k]}" for k in others),
        "broker CPU us/delivery",
        "loop stall ms",
        "stalls >= 5 ms",
        "others, cores",
        "consumer CPU %",
    ]
    runs = f"median of {repeat} runs (by deliveries/s; latency-10k by p99); " if repeat > 1 else ""
    out = [
        f"{runs}deliveries/s: messages received by all consumers / (last receive - first "
        "send); with one queue that is msg/s, with fanout 10 deliveries per message published.",
        "Latency is publish -> deliver; under saturation (time queued in the broker included) "
        "except latency-10k, whose publisher is paced (achieved rate under received).",
        "Broker CPU us/delivery: the broker's user+system CPU time over the scenario / "
        "deliveries (largely independent of other load on its core). Consumer CPU %: the "
        "consumer process's CPU time over its receive window (it shares a core with the "
        "publisher).",
        *(
            [f"Quick run: the topic-100k* scenarios bind {QUICK_BINDINGS:,} patterns, not 100,000."]
            if quick
            else []
        ),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|",
    ]
    rate = {(r["scenario"], r["broker"]): r.get("msgs_per_s") for r in rows}
    for r in rows:
        ratios = []
        for kind in others:
            ours, theirs = rate.get((r["scenario"], "roarmq")), rate.get((r["scenario"], kind))
            ok = r["broker"] == "roarmq" and ours and theirs and not r.get("publish_rate")
            ratios.append(f"{ours / theirs:.2f}x" if ok else "")
        msgs = f"{r['messages']:,}" if r.get("messages") is not None else "-"
        if r.get("publish_rate"):
            msgs += f" (paced {r['publish_rate']:,.0f}/s)"
        if r.get("status", "ok") != "ok":
            msgs += f" ({r['status']})"
        out.append(
            "| "
            + " | ".join(
                [
                    r["scenario"],
                    LABEL[r["broker"]],
                    fmt(r.get("msgs_per_s"), 0),
                    fmt(r.get("p50_ms"), 2 if r["scenario"] == "latency-10k" else 1),
                    fmt(r.get("p99_ms"), 2 if r["scenario"] == "latency-10k" else 1),
                    tail_latency(r),
                    confirm_latency(r),
                    msgs,
                    *ratios,
                    fmt(r.get("broker_cpu_us_per_msg"), 1),
                    fmt(r.get("loop_stall_ms"), 1),
                    stall_causes(r.get("stalls")),
                    fmt(r.get("others_cores"), 2),
                    fmt(r.get("consumer_cpu_pct"), 0),
                ]
            )
            + " |"
        )
    out += stall_list(rows)
    binding = [r for r in rows if (r.get("bindings") or 0) >= 1000]
    if binding:  # how fast each broker took the scenario's bindings (pipelined queue.bind)
        out += [
            "",
            "queue.bind rate: the consumer sends all of a scenario's binds, then reads all "
            "bind-oks (median of the runs).",
            "",
            "| scenario | broker | bindings | binds/s |",
            "|---|---|---:|---:|",
        ]
        for r in binding:
            rates = sorted(v for v in r.get("runs_binds_per_s") or [] if v is not None)
            rate = rates[(len(rates) - 1) // 2] if rates else None
            out.append(
                f"| {r['scenario']} | {LABEL[r['broker']]} | {r['bindings']:,} | {fmt(rate, 0)} |"
            )
    return "\n".join(out)


def summarize(
    scenario: str, kind: str, results: list[dict[str, Any]], paced: bool = False
) -> dict[str, Any]:
    """One row from a scenario's runs: the median run (lower middle if even) by msg/s.

    Paced scenarios (the rate is fixed) take the median run by p99 latency instead.
    """
    measured = sorted(
        (r for r in results if number(r.get("msgs_per_s")) is not None),
        key=lambda r: r["msgs_per_s"],
    )
    if paced:
        measured = [r for r in measured if number(r.get("p99_ms")) is not None]
        measured.sort(key=lambda r: r["p99_ms"])
    pick = measured[(len(measured) - 1) // 2] if measured else results[-1]
    cpus = sorted(c for r in measured if (c := number(r.get("broker_cpu_us_per_msg"))) is not None)
    return {
        "scenario": scenario,
        "broker": kind,
        "msgs_per_s": number(pick.get("msgs_per_s")),
        "p50_ms": number(pick.get("p50_ms")),
        "p99_ms": number(pick.get("p99_ms")),
        "messages": pick.get("messages"),
        "status": pick["status"],
        "broker_cpu_us_per_msg": cpus[(len(cpus) - 1) // 2] if cpus else None,
        "consumer_cpu_pct": number(pick.get("consumer_cpu_pct")),
        "bindings": pick.get("bindings"),
        "runs_binds_per_s": [number(r.get("binds_per_s")) for r in results],
        "publish_rate": number(pick.get("publish_rate")),  # paced scenarios only
        "p999_ms": number(pick.get("p999_ms")),
        "max_ms": number(pick.get("max_ms")),
        "loop_stall_ms": number(pick.get("loop_stall_ms")),
        "stalls": pick.get("stalls"),  # RoarMQ: the picked run's stalls over the threshold
        "gc": pick.get("gc"),
        "others_cores": number(pick.get("others_cores")),
        "confirm_p50_ms": number(pick.get("confirm_p50_ms")),  # scenarios with confirms
        "confirm_p99_ms": number(pick.get("confirm_p99_ms")),
        "runs_msgs_per_s": [number(r.get("msgs_per_s")) for r in results],
        "runs_p50_ms": [number(r.get("p50_ms")) for r in results],
        "runs_p99_ms": [number(r.get("p99_ms")) for r in results],
        "runs_loadavg_1m": [number(r.get("loadavg")) for r in results],
        "runs_loop_stall_ms": [number(r.get("loop_stall_ms")) for r in results],
        "runs_loop_stall_gauge_ms": [number(r.get("loop_stall_gauge_ms")) for r in results],
        "runs_stalls": [r.get("stalls") for r in results],
        "runs_gc": [r.get("gc") for r in results],
        "runs_jobs": [r.get("jobs") for r in results],
        "runs_steal_s": [number(r.get("steal_s")) for r in results],
    }


# -- main ----------------------------------------------------------------------------


def options(kind: str) -> dict[str, Any]:
    return dict(ROARMQ_OPTIONS) if kind == "roarmq" else {}


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main() -> int:
    p = argparse.ArgumentParser(
        description="RoarMQ vs RabbitMQ vs GarageMQ throughput and latency.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="scenarios:\n"
        + "\n".join(f"  {s.name:25} {s.description}" for s in SCENARIOS)
        + "\n\nRabbitMQ and GarageMQ are apt-get installed when missing (as root), "
        "else their rows say skipped.",
    )
    p.add_argument(
        "--broker",
        choices=["roarmq", "rabbitmq", "garagemq", "both", "all"],
        default="all",
        help="both: roarmq and rabbitmq; all (default): roarmq, rabbitmq and garagemq",
    )
    p.add_argument(
        "--quick", action="store_true", help="far fewer messages, one run; about a minute"
    )
    p.add_argument(
        "--json",
        type=Path,
        default=REPO / "bench" / "results" / "throughput.json",
        help="where the results go (default bench/results/throughput.json)",
    )
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
    p.add_argument("--broker-cpu", type=int, default=0, help="core the broker is pinned to")
    p.add_argument(
        "--load-cpu", type=int, default=1, help="core the publisher and consumer are pinned to"
    )
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
    wanted = [name for name in args.scenarios.split(",") if name]
    unknown = set(wanted) - {s.name for s in SCENARIOS}
    if unknown:
        p.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    chosen = [s for s in SCENARIOS if s.name in wanted]
    if not chosen:
        p.error("no scenario selected")
    brokers = {"both": BROKERS, "all": ALL_BROKERS}.get(args.broker, (args.broker,))
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
            f"  {kind:9} {sc.name:11} {fmt(number(result.get('msgs_per_s')), 0):>9} dlv/s  "
            f"p50 {fmt(number(result.get('p50_ms')), 2):>8} ms  "
            f"p99 {fmt(number(result.get('p99_ms')), 2):>8} ms  "
            f"{result.get('messages') or 0:,} dlvs  "
            f"broker {fmt(number(result.get('broker_cpu_us_per_msg')), 1)} us/dlv  "
            f"consumer {fmt(number(result.get('consumer_cpu_pct')), 0)}% CPU  "
            + (f"paced {fmt(number(result.get('publish_rate')), 0)}/s  " if sc.rate else "")
            + f"load {fmt(number(result.get('loadavg')), 2)}  {result['status']}"
            + "".join(f"\n      stall {stall_summary(x)}" for x in result.get("stalls") or []),
            flush=True,
        )

    def failed(kind: str, exc: Exception) -> dict[str, Any]:
        if isinstance(exc, BrokerUnavailable):
            unavailable[kind] = str(exc)
            return {"status": str(exc), "messages": None}
        print(f"{kind}: {exc}", file=sys.stderr, flush=True)  # a broker that would not start
        unavailable[kind] = f"failed: broker did not start: {str(exc).splitlines()[0]}"
        return {"status": unavailable[kind], "messages": None}

    try:
        if reuse:  # one instance per broker; fresh (auto-delete) queue and exchange per scenario
            for kind in brokers:
                try:
                    with broker_instance(kind, procs, args.broker_cpu, **options(kind)) as broker:
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
        else:  # a fresh instance per run; brokers interleaved so all see similar background load
            for sc in chosen:
                for _ in range(args.repeat):
                    for kind in brokers:
                        if kind in unavailable:
                            if (sc.name, kind) not in runs:
                                record(kind, sc, {"status": unavailable[kind], "messages": None})
                            continue
                        try:
                            with broker_instance(
                                kind, procs, args.broker_cpu, **options(kind)
                            ) as broker:
                                versions[kind] = broker.version
                                record(kind, sc, run_scenario(procs, broker, sc, args, "1"))
                        except (BrokerUnavailable, RuntimeError) as exc:
                            record(kind, sc, failed(kind, exc))
    except KeyboardInterrupt:
        print("interrupted: stopping everything", file=sys.stderr, flush=True)
        return 130
    finally:
        procs.stop_all()

    rate = {s.name: s.rate for s in SCENARIOS}
    rows = [
        summarize(name, kind, results, paced=bool(rate[name]))
        for (name, kind), results in runs.items()
    ]
    order = {s.name: i for i, s in enumerate(SCENARIOS)}
    rows.sort(key=lambda r: (order[r["scenario"]], ALL_BROKERS.index(r["broker"])))
    print()
    print(table(rows, args.repeat, args.quick))
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
