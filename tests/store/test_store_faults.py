"""The message store under real disk faults: nothing confirmed is lost, nobody waits forever.

A real broker subprocess; faults injected into its real system calls with strace, or a
data dir on a small tmpfs that really fills up; pika publishes with confirms. After each
fault: kill -9, restart, and every confirmed message is back.
"""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import pika
import pytest
from support.faultlib import (
    PERSISTENT,
    BrokerProcess,
    connect,
    drain,
    inject,
    small_tmpfs,
)
from support.waiting import wait_for

# slow (injected disk faults): `make check` leaves it out
pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


def active_segment(data_dir: Path) -> Path:
    return max((data_dir / "messages").glob("*.seg"), key=lambda p: p.name)


class Publisher:
    """pika with confirms: what was confirmed, what was nacked, nothing else."""

    def __init__(self, port: int, queue: str, **params: object) -> None:
        self.conn = connect(port, **params)
        self.ch = self.conn.channel()
        self.ch.confirm_delivery()
        self.ch.queue_declare(queue, durable=True)
        self.queue = queue
        self.confirmed: list[int] = []
        self.nacked: list[int] = []
        self.seq = 0

    def publish(self, size: int = 64) -> bool:
        self.seq += 1
        body = struct.pack(">Q", self.seq) + os.urandom(max(size - 8, 0))
        try:
            self.ch.basic_publish("", self.queue, body, PERSISTENT)
        except pika.exceptions.NackError:
            self.nacked.append(self.seq)
            return False
        self.confirmed.append(self.seq)
        return True

    def close(self) -> None:
        if self.conn.is_open:
            self.conn.close()


def values(got: list[tuple[bytes, bool]]) -> list[int]:
    return [struct.unpack(">Q", body[:8])[0] for body, _ in got]


def assert_all_confirmed_back(
    broker: BrokerProcess, pub: Publisher, acked: frozenset[int] = frozenset()
) -> list[int]:
    """kill -9, restart: every confirmed message not acked by a consumer is back, once."""
    broker.kill9()
    broker.start()
    got = values(drain(broker.port, pub.queue))
    missing = set(pub.confirmed) - set(got) - acked
    assert not missing, f"confirmed messages lost: {sorted(missing)[:10]}"
    assert len(got) == len(set(got))
    assert set(got) <= set(pub.confirmed) | set(pub.nacked)
    return got


def test_failed_fsync_nacks_the_waiting_publish_and_resumes_in_place(tmp_path):
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        pub = Publisher(broker.port, "fsync-q")
        for _ in range(20):
            assert pub.publish()
        segment = active_segment(broker.data_dir)
        with inject(broker.pid, segment, "fdatasync:error=EIO:when=1"):
            # The fsync of the batch holding this publish fails: nacked at once, not left
            # waiting (pika's BlockingConnection would hang without an answer).
            assert not pub.publish()
            wait_for(lambda: broker.call("/api/overview")[1]["message_store"]["resumes"] >= 1)
            for _ in range(20):  # the store resumed in a new segment: confirmed again
                assert pub.publish()
        assert pub.nacked == [21]
        status = broker.call("/api/overview")[1]["message_store"]
        assert status["state"] == "ok" and status["failures"] == 1 and status["nacked"] == 1
        metrics = broker.metrics()
        assert "roarmq_store_failures_total 1.0" in metrics
        assert "roarmq_store_publishes_nacked_total 1.0" in metrics
        text = broker.log_text()
        assert "message store write failed; 1 publishes waiting for it were nacked" in text
        assert "segment log resumed after a write failure" in text
        # The failed batch was cut off the old segment: nothing there for recovery to cut.
        pub.close()
        got = assert_all_confirmed_back(broker, pub)
        assert "message log damage" not in broker.log_text()
        # The nacked message was copied forward with the rest of the untrusted tail.
        assert got == list(range(1, 42))
    finally:
        broker.stop()


def test_write_errors_that_last_nack_every_publish_and_keep_consumers_served(tmp_path):
    """Every write to the segment fails (EIO) while the fault lasts; then the store resumes."""
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        pub = Publisher(broker.port, "eio-q")
        for _ in range(10):
            assert pub.publish()
        consumer = connect(broker.port).channel()
        segment = active_segment(broker.data_dir)
        with inject(broker.pid, segment, "pwrite64:error=EIO"):
            # The resumed store writes a new segment, which the fault (on the old file) does
            # not reach: so each publish here is either nacked or, after a resume, confirmed.
            results = [pub.publish() for _ in range(10)]
            assert not results[0]
            method, _, body = consumer.basic_get("eio-q", auto_ack=False)
            assert struct.unpack(">Q", body[:8])[0] == 1  # consumers are still served
            consumer.basic_ack(method.delivery_tag)
            # Without confirms nothing was promised: the message is queued in memory only.
            side = connect(broker.port).channel()
            side.queue_declare("side-q", durable=True)
            side.basic_publish("", "side-q", b"unconfirmed", PERSISTENT)
            got = wait_for(lambda: side.basic_get("side-q", auto_ack=True)[2])
            assert got == b"unconfirmed"
        assert pub.nacked and set(pub.nacked) | set(pub.confirmed) == set(range(1, 21))
        wait_for(lambda: broker.call("/api/overview")[1]["message_store"]["state"] == "ok")
        for _ in range(5):
            assert pub.publish()
        pub.close()
        got = assert_all_confirmed_back(broker, pub, frozenset({1}))
        assert 1 not in got  # its ack, made while the store was failed, was written later
    finally:
        broker.stop()


def test_full_disk_nacks_blocks_reports_and_resumes_when_space_is_back(tmp_path):
    """The data dir on a 16 MB tmpfs that fills up (no alarm margin, so the write fails)."""
    with small_tmpfs(tmp_path / "disk", "16m") as mount:
        broker = BrokerProcess(mount / "data", storage="disk_free_limit = 1\n")
        broker.log = tmp_path / "broker.log"
        try:
            _fill_the_disk_and_come_back(broker.start(), mount)
        finally:
            broker.stop()


def _fill_the_disk_and_come_back(broker: BrokerProcess, mount: Path) -> None:
    pub = Publisher(broker.port, "full-q", blocked_connection_timeout=5)
    for _ in range(5):
        assert pub.publish(4096)
    filler = mount / "filler"
    with open(filler, "wb", buffering=0) as f:  # to the last byte; nothing left to close
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    blocked_or_nacked = False
    try:
        for _ in range(50):
            if not pub.publish(64 << 10):
                blocked_or_nacked = True
                break
    except pika.exceptions.ConnectionBlockedTimeout:
        blocked_or_nacked = True
    assert blocked_or_nacked
    code, health = broker.call("/api/health/checks/alarms")
    assert code == 503 and "message store failed" in health["reason"]
    assert "disk alarm" in health["reason"]
    assert "roarmq_store_failed 1.0" in broker.metrics()
    assert broker.running
    # Consumers drain what is queued while the disk is full.
    assert values(drain(broker.port, "full-q"))[:5] == [1, 2, 3, 4, 5]
    filler.unlink()
    wait_for(lambda: broker.call("/api/health/checks/alarms")[0] == 200, timeout=20)
    pub.close()
    pub2 = Publisher(broker.port, "full-q")
    for _ in range(10):
        assert pub2.publish(4096)
    pub2.close()
    assert "message log damage" not in broker.log_text()
    got = assert_all_confirmed_back(broker, pub2)
    assert set(pub2.confirmed) <= set(got)
    assert "message log damage" not in broker.log_text()


def test_disk_alarm_blocks_publishers_before_the_disk_is_full(tmp_path):
    """RabbitMQ's disk_free_limit: the alarm comes first, the store never hits ENOSPC."""
    with small_tmpfs(tmp_path / "disk", "48m") as mount:
        broker = BrokerProcess(mount / "data", storage='disk_free_limit = "16MB"\n')
        broker.log = tmp_path / "broker.log"
        try:
            _publish_into_the_alarm(broker.start())
        finally:
            broker.stop()


def _publish_into_the_alarm(broker: BrokerProcess) -> None:
    pub = Publisher(broker.port, "alarm-q", blocked_connection_timeout=3)
    started = time.monotonic()
    with pytest.raises(pika.exceptions.ConnectionBlockedTimeout):
        while time.monotonic() - started < 60:
            pub.publish(256 << 10)
    assert pub.confirmed and not pub.nacked
    status = broker.call("/api/overview")[1]
    assert status["disk_free_alarm"] and status["message_store"]["failures"] == 0
    assert "disk alarm set" in broker.log_text()
    broker.kill9()
    broker.start()
    got = values(drain(broker.port, "alarm-q"))
    assert set(pub.confirmed) <= set(got)
