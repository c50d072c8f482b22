"""Power loss under the broker, on our own filesystem that keeps only what was made
durable (tests/support/powerloss.py): nothing confirmed to a publisher is lost, and a log
reopened after a kill counts as durable only what it made durable."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.faultlib import PERSISTENT, BrokerProcess, connect, drain

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_a_fresh_broker_keeps_what_it_confirmed_through_a_power_loss(fs):
    """A broker on a new data dir confirms 2,000 persistent messages, is killed, and the
    power goes: every confirmed message is there when it starts again. (The data dir's
    own name was never made durable: the whole dir, queue and messages, went with the
    power.)"""
    broker = BrokerProcess(fs.path / "data").start()
    conn = connect(broker.port)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("kept", durable=True)
    confirmed = []
    for i in range(2000):
        ch.basic_publish("", "kept", b"%d" % i, PERSISTENT)
        confirmed.append(b"%d" % i)
    broker.kill9()
    report = fs.power_loss()
    assert report["files_reverted"] + report["nodes_lost"] > 0, report  # something was lost
    broker.start()
    try:
        got = [body for body, _ in drain(broker.port, "kept")]
    finally:
        broker.stop()  # before the filesystem is unmounted
    assert got == confirmed


def run(script: str, *args: object) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_replicated_log_reopened_after_a_kill_counts_durable_only_what_it_synced(fs):
    """A follower's log is killed with 200 records written but never fsynced (they are in
    the page cache). Reopened, it reports them durable (a follower acks that at once), so
    it must have made them durable first: after a power loss they are all still there."""
    log_dir = fs.path / "log"
    run(
        """
        import os, sys
        from roarmq.broker.replog.records import SegmentRecordStore
        store = SegmentRecordStore(sys.argv[1], fsync=False)
        for offset in range(1, 201):
            store.append(offset, b"record %d" % offset)
        store.sync()  # written to the files, never fsynced (fsync=False)
        os._exit(0)
        """,
        log_dir,
    )
    reported = run(
        """
        import os, sys
        from roarmq.broker.replog.records import SegmentRecordStore
        store = SegmentRecordStore(sys.argv[1])
        print(store.durable_offset, flush=True)
        os._exit(0)
        """,
        log_dir,
    )
    assert int(reported) == 200
    fs.power_loss()
    held = run(
        """
        import sys
        from roarmq.broker.replog.records import SegmentRecordStore
        store = SegmentRecordStore(sys.argv[1])
        print(store.last_offset, len(store.records()))
        store.close()
        """,
        log_dir,
    )
    assert held.split() == ["200", "200"]
