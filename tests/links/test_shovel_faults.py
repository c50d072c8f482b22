"""50,000 persistent messages shovelled from RabbitMQ 3.10.8 to RoarMQ in `on-confirm`
mode through both ends' failures: RoarMQ (running the shovel) killed with kill -9 and
started again, then RabbitMQ stopped for 10 s (`rabbitmqctl stop_app`, its connections
closed) and started again. Every message arrives (duplicates counted, none lost), the
source empties, and the shovel reports `running` again by itself each time; RoarMQ serves
AMQP again within seconds of the kill with tens of thousands of messages in its data dir."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pika
import pytest
from support.broker_process import BrokerProcess
from support.queues import ready
from support.rabbitmq import rabbitmq_node
from support.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

MESSAGES = 50_000


def shovel_state(roar) -> str | None:
    try:
        rows = roar.api("/api/shovels")
    except OSError:
        return None
    return rows[0]["state"] if rows else None


def test_fifty_thousand_move_through_a_kill_9_of_roarmq_and_a_stopped_rabbitmq(tmp_path):
    with rabbitmq_node(tmp_path / "rabbit") as rabbit:
        from lib.preload import preload  # (bench/lib: on the path once a node runs)

        asyncio.run(preload(rabbit.url, "bulk", MESSAGES))
        assert ready(rabbit.port, "bulk") == MESSAGES
        roar = BrokerProcess(tmp_path / "roar").start()
        try:
            value = {
                "src-uri": rabbit.url,
                "src-queue": "bulk",
                "src-prefetch-count": 500,
                "dest-uri": "amqp://",
                "dest-queue": "bulk",
                "reconnect-delay": 1,
            }
            assert roar.call("/api/parameters/shovel/%2F/bulk", "PUT", {"value": value})[0] == 201
            # 10,000 confirmed by RoarMQ (so durable there), which the shovel then acked at
            # the source: at most `src-prefetch-count` are in its hands unacked, so the
            # source's ready count says so (RoarMQ's own counts messages not yet synced)
            acked = MESSAGES - 10_000 - value["src-prefetch-count"]
            assert until(lambda: ready(rabbit.port, "bulk") <= acked, 60)
            roar.kill9()
            killed = time.monotonic()
            roar.start()  # waits until it serves AMQP
            served = time.monotonic() - killed
            held = ready(roar.port, "bulk")
            assert held >= 10_000 and served < 20, (held, served)
            assert until(lambda: shovel_state(roar) == "running", 30), shovel_state(roar)
            assert until(lambda: ready(roar.port, "bulk") >= 25_000, 60)
            rabbit.ctl("stop_app")  # RabbitMQ gone: the shovel's connection closed
            assert until(lambda: shovel_state(roar) == "terminated", 15), shovel_state(roar)
            time.sleep(10)
            rabbit.ctl("start_app")
            assert until(lambda: shovel_state(roar) == "running", 30), shovel_state(roar)
            assert until(lambda: ready(rabbit.port, "bulk") == 0, 90), ready(rabbit.port, "bulk")
            assert until(lambda: ready(roar.port, "bulk") >= MESSAGES, 30)
            conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", roar.port))
            ch = conn.channel()
            counts: Counter[bytes] = Counter()
            while (got := ch.basic_get("bulk", auto_ack=True))[0] is not None:
                counts[got[2]] += 1
            conn.close()
            missing = {b"m%d" % i for i in range(MESSAGES)} - set(counts)
            duplicates = sum(n - 1 for n in counts.values())
            print(
                f"moved {MESSAGES}: {len(missing)} lost, {duplicates} duplicates, "
                f"AMQP served {served:.1f} s after the kill with {held} messages held"
            )
            assert not missing, f"{len(missing)} lost"
            assert duplicates <= 2 * 500, "more duplicates than two prefetch windows"
        finally:
            roar.stop()
