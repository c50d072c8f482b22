"""Loop-stall attribution (broker/ops/stalls.py): the stall ring that GET /api/diagnostics/stalls
serves, the GC metrics at /metrics, the endpoint's guard and the stall log line; the rule
that explains a stall, below the socket."""

from __future__ import annotations

import gc
import hashlib
import mmap
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pika
import pytest
from support.broker_process import BrokerProcess
from support.timer_witness import TimerWitness

from roarmq.broker.ops.stalls import (
    JOB_LABELS,
    CpuSteal,
    GcWatch,
    JobTimes,
    OtherThreads,
    Stall,
    job_name,
)
from roarmq.broker.testing import BrokerThread, ephemeral_config

pytestmark = pytest.mark.timeout(120)

STALLS = "/api/diagnostics/stalls"


@pytest.fixture
def probed(tmp_path):
    """A broker on its own thread, management API on, the probe at 1 ms, stalls from 20 ms."""
    cfg = ephemeral_config(
        data_dir=str(tmp_path / "d"),
        diagnostics={"loop_lag_probe_ms": 1, "stall_threshold_ms": 20},
    )
    with BrokerThread(cfg, management=True) as b:
        yield b


def _wait_for_stall(b, since: int, deadline: float = 10.0) -> list[dict]:
    """The stalls after id `since`, once there is one (the probe's next tick records it)."""
    end = time.monotonic() + deadline
    while True:
        status, doc = b.api("GET", f"{STALLS}?since={since}")
        assert status == 200, doc
        if doc["stalls"] or time.monotonic() > end:
            return doc["stalls"]
        time.sleep(0.05)


def test_a_large_definitions_import_is_a_stall_named_after_its_request(probed):
    """A management request that holds the loop (importing 5,000 queues in one go) is kept in
    the ring with the request as the job that ran through the stall."""
    since = probed.api("GET", STALLS)[1]["recorded"]
    doc = {
        "queues": [
            {"name": f"imp.{i}", "vhost": "/", "durable": False, "auto_delete": False}
            for i in range(5000)
        ]
    }
    assert probed.api("POST", "/api/definitions", doc)[0] == 204
    stalls = _wait_for_stall(probed, since)
    importing = [
        s for s in stalls if any(j["name"] == "management POST /api/definitions" for j in s["jobs"])
    ]
    assert importing, stalls
    stall = max(importing, key=lambda s: s["lag_ms"])
    assert stall["lag_ms"] >= 20
    # the import explains it, unless the collector ran through most of it (then it is the GC's)
    assert stall["kind"] in ("job", "gc"), stall
    if stall["kind"] == "job":
        assert stall["cause"].startswith("management POST /api/definitions ran ")
    assert stall["window_ms"] >= stall["lag_ms"]
    assert stall["cpu_ms"] > 0
    assert stall["steal_ms"] is not None and stall["steal_ms"] >= 0  # Linux has /proc/stat
    assert stall["major_page_faults"] >= 0
    jobs = probed.api("GET", STALLS)[1]["jobs"]
    assert any(j["name"] == "management POST /api/definitions" and j["runs"] == 1 for j in jobs)


def test_definitions_writes_and_requests_are_timed_jobs(probed):
    """Every write to the definitions store the loop makes is a job (its commit in it), as
    is every management request, by its route; a durable queue's write is the store's
    writes thread's, not the loop's (broker/core/persistence.py)."""
    assert probed.api("PUT", "/api/vhosts/kept", {})[0] == 201
    jobs = {j["name"]: j for j in probed.api("GET", STALLS)[1]["jobs"]}
    writes = jobs["definitions store write"]["runs"]
    assert writes >= 1
    assert jobs["management PUT /api/vhosts/{vhost}"]["runs"] == 1
    assert probed.api("PUT", "/api/queues/%2F/kept", {"durable": True})[0] == 201
    jobs = {j["name"]: j for j in probed.api("GET", STALLS)[1]["jobs"]}
    assert jobs["definitions store write"]["runs"] == writes
    assert jobs["management PUT /api/queues/{vhost}/{name}"]["runs"] == 1


def test_a_full_collection_on_the_loop_is_a_gc_stall(probed):
    """A gen-2 pass over a million tracked objects, run on the broker's loop, is kept as a
    GC stall naming the generation."""
    held = [[i] for i in range(1_000_000)]  # tracked objects the pass must visit
    time.sleep(0.2)  # making them held the GIL: let the probe see that first
    since = probed.api("GET", STALLS)[1]["recorded"]
    probed.call(gc.collect)
    stalls = _wait_for_stall(probed, since)
    del held
    full = [s for s in stalls if any(g["generation"] == 2 for g in s["gc"])]
    assert full, stalls
    stall = max(full, key=lambda s: s["lag_ms"])
    gen2 = next(g for g in stall["gc"] if g["generation"] == 2)
    assert gen2["passes"] >= 1 and gen2["longest_ms"] >= 10
    assert stall["kind"] == "gc" and "gen2: 1 pass" in stall["cause"], stall


def test_the_endpoint_needs_the_administrator_tag(probed):
    assert probed.api("GET", STALLS, auth="guest:wrong")[0] == 401
    status, _ = probed.api("PUT", "/api/users/watcher", {"password": "pw", "tags": "monitoring"})
    assert status in (201, 204)
    assert probed.api(
        "PUT", "/api/permissions/%2F/watcher", {"configure": ".*", "write": ".*", "read": ".*"}
    )[0] in (201, 204)
    status, body = probed.api("GET", STALLS, auth="watcher:pw")
    assert status == 401 and body["reason"] == "Not administrator user"
    status, body = probed.api("GET", STALLS)
    assert status == 200
    assert body["probe_ms"] == 1 and body["threshold_ms"] == 20
    assert {g["generation"] for g in body["gc"]["generations"]} == {0, 1, 2}
    assert probed.api("GET", STALLS + "?since=x")[0] == 400


def test_without_the_probe_the_endpoint_answers_with_no_stalls(tmp_path):
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        status, body = b.api("GET", STALLS)
        assert status == 200
        assert body["probe_ms"] == 0 and body["stalls"] == [] and body["jobs"] == []
        assert body["gc"]["generations"][0]["collections"] >= 0


def _metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    prefix = f"{name}{{{want}}} " if labels else f"{name} "
    line = next(x for x in text.splitlines() if x.startswith(prefix))
    return float(line.split()[-1])


def test_gc_metrics_of_a_broker_process_grow_as_it_makes_objects(tmp_path):
    """A real broker process (python -m roarmq): /metrics has the collector's passes per
    generation, their pause histogram and longest pause, what the start-up froze, and the
    stall counters; the passes grow as the broker makes objects that stay (queues)."""
    diagnostics = "[diagnostics]\nloop_lag_probe_ms = 1\nstall_threshold_ms = 5\n"
    broker = BrokerProcess(tmp_path / "d", extra=diagnostics, log_level="notice").start()
    try:
        before = broker.metrics()
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
        ch = conn.channel()
        for i in range(3000):  # objects that stay: what makes the collector run
            ch.queue_declare(f"gcq.{i}")
        conn.close()
        after = broker.metrics()
        gen0 = ("roarmq_gc_collections_total", {"generation": "0"})
        assert _metric(after, gen0[0], **gen0[1]) > _metric(before, gen0[0], **gen0[1])
        assert _metric(after, "roarmq_gc_pause_seconds_count", generation="0") == _metric(
            after, gen0[0], **gen0[1]
        )
        assert _metric(after, "roarmq_gc_pause_seconds_sum", generation="0") > 0
        assert _metric(after, "roarmq_gc_pause_max_seconds", generation="0") > 0
        for kind in ("gc", "job", "run_queue", "steal", "gil", "page_in", "blocked", "on_cpu"):
            _metric(after, "roarmq_event_loop_stalls_total", kind=kind)
    finally:
        broker.stop(grace=30)
    assert broker.proc.returncode == 0, broker.tail()  # type: ignore[union-attr]


def test_a_stall_is_logged_once_with_its_cause(probed, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="roarmq.stalls")
    probed.call(lambda: time.sleep(0.1))  # the loop blocked in a system call
    _wait_for_stall(probed, 0)
    time.sleep(0.1)
    lines = [r for r in caplog.records if r.name == "roarmq.stalls"]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert re.match(r"event loop stalled \d+\.\d ms: off CPU", lines[0].getMessage())
    assert lines[0].kind == "blocked"


def test_a_page_read_back_from_disk_is_told_from_a_system_call(probed, tmp_path):
    """The loop touches 16 MB of a mapped file whose pages the kernel does not hold (as
    after the kernel reclaimed pages of the broker's code), one page at a time (no
    read-ahead: each a major fault that waits for the disk): off CPU, reading them back.
    (With read-ahead, 128 MB were once mostly the kernel's copying: on CPU, rightly.)"""
    path = tmp_path / "cold"
    with open(path, "wb") as f:
        f.write(os.urandom(16 << 20))
        os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        pages = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        pages.madvise(mmap.MADV_RANDOM)
        since = probed.api("GET", STALLS)[1]["recorded"]
        probed.call(lambda: sum(pages[i] for i in range(0, len(pages), 4096)))
        stalls = _wait_for_stall(probed, since)
        pages.close()
    finally:
        os.close(fd)
    stall = max(stalls, key=lambda s: s["lag_ms"])
    assert stall["major_page_faults"] >= 100, stalls
    assert f"{stall['major_page_faults']} major page faults" in stall["cause"], stall
    # Off CPU reading the pages, if the disk was what took the time (here each read took
    # 36 us and the kernel 26 us of CPU a fault: page_in by a little), else on CPU in the
    # kernel's fault handling, or waiting for a core: what the rule (unit-tested below)
    # says of the split; never a system call's "blocked".
    assert stall["kind"] in ("page_in", "on_cpu", "run_queue", "steal"), stall
    if stall["kind"] == "page_in":
        assert "reading pages of its own back from disk" in stall["cause"]


# -- below the socket -----------------------------------------------------------------


def _stall(lag: float, **kw) -> Stall:
    fields = {"cpu": lag, "run_queue": 0.0, "others_cpu": 0.0, "window": lag + 0.001}
    fields.update(kw)
    stall = Stall(id=1, wall=0.0, lag=lag, **fields)
    stall.explain()
    return stall


def test_the_rule_that_explains_a_stall():
    gc_pass = [[1, 1, 0.012, 0.012, 0]]
    job = [["consumer-timeout sweep", 1, 0.011]]
    assert _stall(0.016, gc=gc_pass, jobs=job).kind == "gc"  # a collection inside a job
    assert "gen1: 1 pass 12.0 ms" in _stall(0.016, gc=gc_pass).cause
    assert _stall(0.016, jobs=job).kind == "job"
    assert _stall(0.016, jobs=job).cause.startswith("consumer-timeout sweep ran 11.0 ms")
    assert _stall(0.016, cpu=0.001, run_queue=0.014).kind == "run_queue"
    assert _stall(0.016, cpu=0.001, others_cpu=0.012).kind == "gil"
    handed = _stall(0.016, cpu=0.001, others_run_queue=0.012)  # the GIL to a waiting thread
    assert handed.kind == "gil" and "waited 12.0 ms for a core" in handed.cause
    assert _stall(0.016, cpu=0.001).kind == "blocked"
    assert _stall(0.016, cpu=0.001, steal=0.010).kind == "steal"
    assert _stall(0.016, cpu=0.001, steal=0.010).cause.endswith("stolen 10 ms)")
    assert _stall(0.016, cpu=0.001, steal=0.0).kind == "blocked"
    assert _stall(0.016, cpu=0.001, page_ins=2).kind == "page_in"
    assert "2 major page faults" in _stall(0.016, cpu=0.001, page_ins=2).cause
    assert _stall(0.016, cpu=0.001, run_queue=0.014, page_ins=1).kind == "run_queue"
    # half on CPU, half waiting for a core: off CPU for most of it, and that was the queue
    assert _stall(0.016, cpu=0.008, run_queue=0.008, window=0.0175).kind == "run_queue"
    assert _stall(0.016).kind == "on_cpu"
    assert _stall(0.016, gc=[[0, 3, 0.004, 0.002, 0]]).kind == "on_cpu"  # GC under half


def hold_cpu0(seconds: float) -> None:
    """A SCHED_FIFO process busy on CPU 0 for `seconds`: nothing else of ours runs there."""
    busy = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"
    hog = subprocess.run(
        ["chrt", "-f", "10", "taskset", "-c", "0", sys.executable, "-c", busy], timeout=30
    )
    assert hog.returncode == 0


def test_another_threads_wait_for_a_core_is_read():
    """A thread of this process pinned to CPU 0, hashing without the GIL, while a SCHED_FIFO
    process holds CPU 0 for 300 ms: `OtherThreads` reads its wait for a core, and not the
    calling thread's (a loop that hands the GIL to such a thread waits that long: the rule
    above calls it the GIL's, not a system call's)."""
    if 0 not in os.sched_getaffinity(0) or len(os.sched_getaffinity(0)) < 2:
        # (the machines here have two: this skips only where the test process may not use
        # both, as under a `taskset` of one CPU)
        pytest.skip("needs CPUs 0 and 1: a thread pinned to CPU 0, this one on another")
    done = threading.Event()

    def hashing() -> None:
        os.sched_setaffinity(0, {0})
        data = b"x" * (1 << 20)
        while not done.is_set():
            hashlib.sha256(data).digest()  # (no GIL held for a buffer this large)

    others = OtherThreads()
    helper = threading.Thread(target=hashing)
    helper.start()
    try:
        time.sleep(0.05)
        before = others.read(0.0)
        hold_cpu0(0.3)
        after = others.read(0.05)
    finally:
        done.set()
        helper.join()
        others.close()
    assert helper.native_id in before
    assert OtherThreads.longest(before, after) >= 0.2, (before, after)


def test_the_timer_witness_counts_what_the_machine_took_and_not_a_wait_for_a_core():
    """Its witness for CPU 0 stopped 300 ms (SIGSTOP: neither running nor waiting for a
    core, as a sleeper whose timer the machine delivers late): counted. CPU 0 held 300 ms
    by a SCHED_FIFO process: its witness waits for the core as long, and that is not
    counted (the stall probe already reads a loop's own wait for a core)."""
    if 0 not in os.sched_getaffinity(0):
        # (the machines here have two: this skips only where the test process may not use
        # CPU 0, as under a `taskset` of CPU 1)
        pytest.skip("needs CPU 0: a witness and a SCHED_FIFO process pinned there")
    with TimerWitness() as machine:
        pid = machine.pids[0]
        start = time.perf_counter()
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.3)
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.05)
        stopped = machine.late(start, time.perf_counter())
        start = time.perf_counter()
        hold_cpu0(0.3)
        time.sleep(0.05)
        held = machine.late(start, time.perf_counter())
    assert stopped >= 0.25, machine.intervals()
    assert held < 0.1, machine.intervals()


def test_steal_is_read_for_the_cpu_the_thread_is_on():
    steal = CpuSteal()
    stolen = steal.read()
    assert set(stolen) == set(range(os.cpu_count() or 0)), stolen
    assert all(seconds >= 0 for seconds in stolen.values())
    assert steal.cpu() in stolen


def test_job_times_keep_long_runs_and_name_them():
    jobs = JobTimes(floor=0.005)
    jobs.run(lambda: None)
    jobs.run(time.sleep, 0.01)
    assert len(jobs.recent) == 1 and jobs.recent[0][2] == "sleep"
    assert jobs.jobs["sleep"][0] == 1 and jobs.jobs["sleep"][2] >= 0.01
    assert job_name(JobTimes.run) == "JobTimes.run"


def test_every_job_label_names_a_real_method():
    """JOB_LABELS names methods by their qualified names: a rename must rename it there."""
    from roarmq.broker import server
    from roarmq.broker.amqp import channel, connection
    from roarmq.broker.core import persistence, queue, vhost
    from roarmq.broker.management import rates
    from roarmq.broker.store import messages

    classes = {
        c.__name__: c
        for c in (
            queue.Queue,
            channel.Channel,
            rates.RateSampler,
            vhost.VirtualHost,
            persistence.Persistence,
            server.Broker,
            messages.MessageStore,
            messages.SegmentDurability,
            connection.Connection,
        )
    }
    for name, label in JOB_LABELS.items():
        owner, _, method = name.partition(".")
        method = method.split(".<locals>")[0]
        assert job_name(getattr(classes[owner], method)) in (label, "management sampler"), name


def test_gc_watch_times_every_pass():
    watch = GcWatch()
    watch.install()
    try:
        gc.collect(1)
        gc.collect()
    finally:
        watch.uninstall()
    assert watch.generations[1].collections >= 1 and watch.generations[2].collections >= 1
    assert sum(watch.generations[2].buckets) == watch.generations[2].collections
    start, end, generation, _ = watch.recent[-1]
    assert generation == 2 and end >= start
    assert watch.overlapping(start, end) == [watch.recent[-1]]
