"""A federation link that starts again (its downstream restarted, or its vhost failed over)
loses nothing published upstream meanwhile: the internal exchange routing to the link's
queue goes on routing until the new session's own is bound.

Two real broker processes. The upstream's definitions writes are slowed (strace holds each
fdatasync of its WAL 200 ms), so that each step of the new session's set-up takes that long,
while a publisher sends confirmed messages upstream all along. A session that made its
internal exchange under the name of the one in use would delete it first, and what was
published until it was bound again would be routed nowhere (it was: the new session of a
failed-over cluster's link lost 12 and 16 of 200 this way).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pika
import pytest
from support.faultlib import BrokerProcess, connect, drain, inject
from support.federation import federation_keys
from support.waiting import until

# slow (strace, two broker processes, a restart): `make check` leaves it out
pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def link_running(down: BrokerProcess) -> bool:
    status, rows = down.call("/api/federation-links")
    return status == 200 and [r["status"] for r in rows] == ["running"]


def test_a_link_started_again_keeps_routing_what_is_published_meanwhile(tmp_path: Path):
    up = BrokerProcess(tmp_path / "up").start()
    down = BrokerProcess(tmp_path / "down").start()
    try:
        value = {"value": {"uri": f"amqp://guest:guest@127.0.0.1:{up.port}"}}
        assert down.call("/api/parameters/federation-upstream/%2F/up", "PUT", value)[0] == 201
        policy = {"pattern": "^fed", "apply-to": "exchanges", "definition": {"federation-upstream": "up"}}  # fmt: skip
        assert down.call("/api/policies/%2F/fed", "PUT", policy)[0] == 201
        conn = connect(down.port)
        ch = conn.channel()
        ch.exchange_declare("fed.x", "fanout", durable=True)
        ch.queue_declare("got", durable=True)
        ch.queue_bind("got", "fed.x")
        conn.close()
        bound = lambda: federation_keys(lambda path: up.call(path)[1], "fed.x")  # noqa: E731
        assert until(lambda: link_running(down) and bound(), 20), bound()

        sent: list[bytes] = []
        stop = threading.Event()

        def publish() -> None:
            pub = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", up.port))
            pch = pub.channel()
            pch.confirm_delivery()
            i = 0
            while not stop.is_set():
                body = b"m%d" % i
                pch.basic_publish("fed.x", "", body, pika.BasicProperties(delivery_mode=2))
                sent.append(body)  # confirmed
                i += 1
                time.sleep(0.002)
            pub.close()

        with inject(
            up.pid, up.data_dir / "definitions.sqlite3-wal", "fdatasync:delay_enter=200000"
        ):
            publisher = threading.Thread(target=publish)
            publisher.start()
            try:
                time.sleep(0.2)
                down.kill9()
                down.start()
                assert until(lambda: link_running(down), 30)
                time.sleep(1.5)  # the new session's set-up, a step per slowed write
            finally:
                stop.set()
                publisher.join(30)
        assert until(lambda: bound(), 10)

        def arrived() -> set[bytes]:
            return {body for body, _ in drain(down.port, "got")}

        got: set[bytes] = set()
        until(lambda: got.update(arrived()) or set(sent) <= got, 30)
        missing = sorted(set(sent) - got, key=lambda b: int(b[1:]))
        assert len(sent) >= 200, len(sent)
        assert not missing, f"{len(missing)} of {len(sent)} never arrived: {missing[:10]}"
    finally:
        down.stop()
        up.stop()
