"""Persistent messages in durable queues survive restarts and kill -9; nothing confirmed is lost.

The broker runs as a real subprocess; publishers use pika with publisher confirms.
"""

from __future__ import annotations

import os
import random
import struct
import time

import pika
import pytest
from support.faultlib import PERSISTENT, BrokerProcess, connect, drain
from support.waiting import free_port, wait_for

from roarmq.broker.store.segments import SegmentLog
from roarmq.broker.testing import BrokerThread, ephemeral_config

# slow (kill -9 rounds and restarts): `make check` leaves it out
pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def test_restart_keeps_persistent_drops_transient(tmp_path):
    cfg = ephemeral_config(data_dir=str(tmp_path / "data"))
    with BrokerThread(cfg) as b:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("dq", durable=True)
        ch.queue_declare("tq", durable=False)
        for i in range(100):
            ch.basic_publish("", "dq", f"p{i}".encode(), PERSISTENT)
        for i in range(100):
            ch.basic_publish("", "dq", f"t{i}".encode())  # transient: not kept
        ch.basic_publish("", "tq", b"gone", PERSISTENT)
        # Deliver two without acking, ack one: after a clean stop the unacked one is redelivered.
        m1, _, b1 = ch.basic_get("dq")
        m2, _, b2 = ch.basic_get("dq")
        ch.basic_ack(m1.delivery_tag)
        conn.close()
    with BrokerThread(cfg) as b:
        assert b.broker.recovery["messages"] == 99
        got = drain(b.port, "dq")
    bodies = [body for body, _ in got]
    assert bodies == [f"p{i}".encode() for i in range(1, 100)]
    assert got[0] == (b"p1", True)  # delivered before the restart, never acked
    assert not any(red for _, red in got[1:])  # clean stop: the markers are exact


def test_kill9_rounds_lose_nothing_confirmed(tmp_path):
    """Publish with confirms, consume with acks, kill -9 at random moments, restart, repeat."""
    rng = random.Random(1234)
    port = free_port()
    broker = BrokerProcess(tmp_path / "data", port)
    confirmed: dict[str, list[int]] = {"k1": [], "k2": []}
    acked: set[int] = set()
    seen: dict[int, int] = {}
    seq = 0
    try:
        broker.start()
        for _round in range(4):
            conn = connect(port)
            ch = conn.channel()
            ch.confirm_delivery()
            for q in confirmed:
                ch.queue_declare(q, durable=True)
            deadline = time.monotonic() + rng.uniform(0.3, 1.2)
            killer_at = rng.randint(50, 400)
            try:
                n = 0
                while time.monotonic() < deadline:
                    seq += 1
                    q = "k1" if seq % 3 else "k2"
                    ch.basic_publish(
                        "", q, struct.pack(">Q", seq) + os.urandom(rng.randint(0, 2048)), PERSISTENT
                    )
                    confirmed[q].append(seq)  # basic_publish returned: the broker confirmed it
                    n += 1
                    if n % 37 == 0:  # consume and ack a few along the way
                        method, _, body = ch.basic_get("k1")
                        if method is not None:
                            (value,) = struct.unpack(">Q", body[:8])
                            seen[value] = seen.get(value, 0) + 1
                            ch.basic_ack(method.delivery_tag)
                            acked.add(value)
                    if n == killer_at:
                        broker.kill9()
                        break
                else:
                    broker.kill9()
            except (pika.exceptions.AMQPError, OSError):
                pass  # the broker died under us: only confirmed messages count
            broker.start()
        # The rounds prove something only if the broker confirmed a fair number first.
        assert sum(map(len, confirmed.values())) >= 200, confirmed
        # Final check: every confirmed, unacked message is there exactly once, in order.
        for q, sent in confirmed.items():
            got = drain(port, q)
            values = [struct.unpack(">Q", body[:8])[0] for body, _ in got]
            expected = [v for v in sent if v not in acked]
            missing = set(expected) - set(values)
            assert not missing, f"{q}: confirmed messages lost: {sorted(missing)[:10]}"
            extra = set(values) - set(sent)
            assert not extra, f"{q}: messages never confirmed came back: {sorted(extra)[:10]}"
            # An acked message may come back only if its ack was not yet on disk, and then
            # only as redelivered; everything else exactly once, in publish order.
            for (_body, redelivered), value in zip(got, values, strict=True):
                if value in acked:
                    assert redelivered
            assert len(values) == len(set(values))
            assert values == sorted(values)
    finally:
        broker.stop()


def test_torn_and_corrupt_tail_recovers_and_reports(tmp_path):
    port = free_port()
    broker = BrokerProcess(tmp_path / "data", port)
    try:
        broker.start()
        conn = connect(port)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("tq", durable=True)
        for i in range(50):
            ch.basic_publish("", "tq", f"m{i:03d}".encode() * 10, PERSISTENT)
        conn.close()
        broker.kill9()
        segments = sorted((tmp_path / "data" / "messages").glob("*.seg"))
        seg = max((s for s in segments if s.stat().st_size), key=lambda s: s.name)
        # The records end where the zeros of the space allocated past them begin.
        size = len(seg.read_bytes().rstrip(b"\x00"))
        with open(seg, "r+b") as f:
            f.truncate(size - 7)  # tear the last record
            f.seek(0, 2)
            f.write(b"\x00garbage\xff" * 3)  # and leave junk behind it
        broker.start()
        got = drain(port, "tq")
        assert [b[:4] for b, _ in got] == [f"m{i:03d}".encode() for i in range(49)]
        log_text = broker.log.read_text()
        assert "message log damage truncated" in log_text
    finally:
        broker.stop()


def test_long_queue_pages_bodies_to_the_log(tmp_path):
    """Over queue_memory_limit a durable queue keeps only its index; bodies come back from disk."""
    cfg = ephemeral_config(
        data_dir=str(tmp_path / "data"), storage={"queue_memory_limit": 64 * 1024}
    )
    body = os.urandom(1024)
    with BrokerThread(cfg) as b:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.queue_declare("long", durable=True)
        for i in range(2000):
            ch.basic_publish("", "long", struct.pack(">I", i) + body, PERSISTENT)
        assert ch.queue_declare("long", passive=True).method.message_count == 2000
        queue = b.broker.vhosts["/"].queues["long"]
        paged = b.call(lambda: sum(1 for e in queue.iter_ready() if e.msg.body is None))
        assert paged >= 1900
        # Only the in-memory part counts against the memory alarm.
        assert b.call(lambda: b.broker.queued_bytes) <= 64 * 1024 + 2 * 1028
        for i in range(2000):
            method, _, got = ch.basic_get("long")
            assert got == struct.pack(">I", i) + body
            ch.basic_ack(method.delivery_tag)
        conn.close()


@pytest.mark.parametrize("how", ["x-queue-mode", "policy"])
def test_lazy_queue_pages_bodies_out_at_once(tmp_path, how):
    """queue-mode "lazy" (an x-argument or a policy): persistent bodies go to disk at once."""
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "data"))) as b:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        if how == "policy":
            body = {"pattern": "^lazy$", "definition": {"queue-mode": "lazy"}}
            b.call(lambda: b.broker.set_policy("/", "lazy", body))
            ch.queue_declare("lazy", durable=True)
        else:
            ch.queue_declare("lazy", durable=True, arguments={"x-queue-mode": "lazy"})
        for i in range(20):
            ch.basic_publish("", "lazy", b"%04d" % i, PERSISTENT)
        assert ch.queue_declare("lazy", passive=True).method.message_count == 20
        queue = b.broker.vhosts["/"].queues["lazy"]
        paged = b.call(lambda: sum(1 for e in queue.iter_ready() if e.msg.body is None))
        assert paged == 19  # all but the first, which met an empty queue
        for i in range(20):
            _, _, got = ch.basic_get("lazy", auto_ack=True)
            assert got == b"%04d" % i
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.queue_declare("bad", arguments={"x-queue-mode": "weird"})
        assert err.value.args == (
            406,
            "PRECONDITION_FAILED - invalid arg 'x-queue-mode' for queue 'bad' in vhost '/': "
            "\"unsupported queue mode 'weird'\"",
        )
        conn.close()


def _fsyncs(broker: BrokerProcess) -> int:
    """The message store's fdatasyncs so far (its latency histogram's count)."""
    for line in broker.metrics().splitlines():
        if line.startswith("roarmq_store_fsync_seconds_count "):
            return int(float(line.split()[1]))
    raise AssertionError("no roarmq_store_fsync_seconds_count in /metrics")


def test_an_ack_waits_for_the_next_publish_fsync_not_one_of_its_own(tmp_path):
    """A publisher waiting for each confirm, a consumer acking each message: one fsync a
    message. An ack's own fsync (two a message before) took the next confirm's turn at the
    disk; now the ack record goes out with the next publish's batch. The wait for one is
    made longer than this test's round trips can take on a loaded machine (10 ms by
    default: a publish that came later let the ack's own timer go first, and counted)."""
    broker = BrokerProcess(tmp_path / "data", storage="ack_sync_delay_ms = 2000").start()
    try:
        pub = connect(broker.port).channel()
        pub.confirm_delivery()
        pub.queue_declare("w1", durable=True)
        consumer = connect(broker.port).channel()
        n = 100
        before = _fsyncs(broker)
        for i in range(n):
            pub.basic_publish("", "w1", b"%d" % i, PERSISTENT)  # returns once confirmed
            method, _, _ = consumer.basic_get("w1")
            consumer.basic_ack(method.delivery_tag)
            # A round trip: the ack is in before the next publish (each had a batch before).
            consumer.queue_declare("w1", durable=True, passive=True)
        used = _fsyncs(broker) - before
        assert n <= used <= n * 1.25
    finally:
        broker.stop()


def test_an_ack_with_nothing_after_it_reaches_the_disk_soon(tmp_path):
    """No publish follows the ack: ACK_SYNC_DELAY's timer syncs it, and after a kill -9
    the acked message stays acked."""
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        ch = connect(broker.port).channel()
        ch.confirm_delivery()
        ch.queue_declare("alone", durable=True)
        for i in range(3):
            ch.basic_publish("", "alone", b"%d" % i, PERSISTENT)
        before = _fsyncs(broker)
        method, _, body = ch.basic_get("alone")
        assert body == b"0"
        ch.basic_ack(method.delivery_tag)
        wait_for(lambda: _fsyncs(broker) > before, timeout=5, what="the ack's fsync")
        broker.kill9()
        broker.start()
        assert [b for b, _ in drain(broker.port, "alone")] == [b"1", b"2"]
    finally:
        broker.stop()


def test_a_record_kind_of_a_newer_version_stops_recovery_saying_so(tmp_path):
    """A message store holding a record this version does not know (a newer RoarMQ wrote
    it, then an older one was started on the data dir) is not recovered around it: the
    broker stops, with one line naming the directory and the kind. Skipping it would
    drop whatever it meant."""
    broker = BrokerProcess(tmp_path / "data").start()
    connect(broker.port).close()
    broker.stop()
    with SegmentLog.open(tmp_path / "data" / "messages") as log:
        log.append(b"Z" + bytes(20))
        log.sync_now()
    with pytest.raises(AssertionError):  # it exits instead of serving
        broker.start()
    assert broker.proc is not None and broker.proc.wait(10) == 1
    last = broker.log.read_text().strip().splitlines()[-1]
    assert "cannot start:" in last and "messages: a record of kind b'Z' (21 bytes)" in last
    assert "is not of this version's message store" in last
