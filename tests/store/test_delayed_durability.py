"""A durable delayed exchange's persistent messages are in the message store before they
are confirmed and survive kill -9: due while the broker was down, they are routed as soon
as it is back; due later, they are routed then and not before. Transient ones go, as a
durable queue's transient messages do. The broker runs as a real subprocess (pika)."""

from __future__ import annotations

import signal
import time

import pika
import pytest
from support.delayed import delayed_direct_to_queue
from support.faultlib import BrokerProcess, connect, inject
from support.waiting import wait_for

# slow (kill -9 and restarts): `make check` leaves it out
pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def _props(n: int, delay: int, persistent: bool = True) -> pika.BasicProperties:
    return pika.BasicProperties(
        headers={"x-delay": delay, "n": n}, delivery_mode=2 if persistent else 1
    )


def test_kill9_keeps_scheduled_messages_and_routes_those_due_meanwhile_at_start(tmp_path):
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        conn = connect(broker.port)
        ch = conn.channel()
        ch.confirm_delivery()
        delayed_direct_to_queue(ch)
        # a fanout in front: each message also reaches a queue at once (a publish record
        # shared with the schedule, which then stores a record of its own)
        ch.exchange_declare("fx", "fanout", durable=True)
        ch.queue_declare("copies", durable=True)
        ch.queue_bind("copies", "fx")
        ch.exchange_bind("dx", "fx")
        soon, later, transient = range(0, 100), range(100, 150), range(150, 170)
        started = time.time()
        for n in soon:
            ch.basic_publish("fx" if n % 10 == 0 else "dx", "k", b"%d" % n, _props(n, 1500))
        for n in later:
            ch.basic_publish("dx", "k", b"%d" % n, _props(n, 7000))
        for n in transient:
            ch.basic_publish("dx", "k", b"%d" % n, _props(n, 1500, persistent=False))
        confirmed_after = time.time() - started
        assert confirmed_after < 1.5  # every confirm came before anything was due
        assert ch.queue_declare("q", durable=True, passive=True).method.message_count == 0
        assert ch.queue_declare("copies", durable=True, passive=True).method.message_count == 10
        broker.kill9()
        assert broker.proc is not None and broker.proc.returncode == -signal.SIGKILL
        # down until the first ones are due (time itself is what the test waits for)
        time.sleep(max(0.0, started + 1.6 - time.time()))
        broker.start()
        back = time.time()
        conn = connect(broker.port)
        ch = conn.channel()
        got: dict[int, tuple[float, dict]] = {}

        def on_message(channel, method, props, body):
            got[int(body)] = (time.time(), props.headers)
            channel.basic_ack(method.delivery_tag)

        ch.basic_consume("q", on_message)
        wait_for(
            lambda: conn.process_data_events(0.02) or len(got) >= len(soon),
            timeout=15,
            what="the messages due during the downtime",
        )
        assert sorted(got) == list(soon)  # the transient ones are gone, the later not yet
        assert max(at for at, _ in got.values()) - back < 3.0  # promptly after the start
        assert all(h["x-delay"] == -1500 and h["n"] == n for n, (_, h) in got.items())
        wait_for(
            lambda: conn.process_data_events(0.02) or len(got) >= len(soon) + len(later),
            timeout=20,
            what="the messages due after the restart",
        )
        assert sorted(got) == list(soon) + list(later)
        copies = ch.queue_declare("copies", durable=True, passive=True).method.message_count
        assert copies == 10
        early = [n for n in later if got[n][0] < started + 7.0]
        assert early == []
        assert [n for n in later if got[n][1]["x-delay"] != -7000] == []
        conn.close()
    finally:
        broker.stop()


def test_a_deleted_durable_delayed_exchange_takes_its_messages_with_it(tmp_path):
    """Deleting the exchange settles what it held in the store: an exchange declared again
    under its name (its schedule has the same id in the store) gets none of them back after
    a kill -9, only what was published to it since."""
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        ch = connect(broker.port).channel()
        ch.confirm_delivery()

        def declare() -> None:
            ch.exchange_declare(
                "dx", "x-delayed-message", durable=True, arguments={"x-delayed-type": "fanout"}
            )
            ch.queue_bind("q", "dx")

        ch.queue_declare("q", durable=True)
        declare()
        for n in range(50):
            ch.basic_publish("dx", "", b"%d" % n, _props(n, 1000))
        ch.exchange_delete("dx")
        declare()
        ch.basic_publish("dx", "", b"marker", _props(99, 2000))  # due after the 50
        broker.kill9()
        broker.start()
        conn = connect(broker.port)
        ch = conn.channel()
        wait_for(
            lambda: ch.queue_declare("q", durable=True, passive=True).method.message_count,
            timeout=15,
            what="the marker",
        )
        _, _, body = ch.basic_get("q", auto_ack=True)
        assert body == b"marker"
        assert ch.queue_declare("q", durable=True, passive=True).method.message_count == 0
        conn.close()
    finally:
        broker.stop()


def test_a_failed_fsync_nacks_the_delayed_publish_and_the_confirmed_ones_are_routed(tmp_path):
    """The fsync of the batch holding a delayed publish fails (injected into the broker's
    real fdatasync): that publish is nacked at once, the store resumes in place, later
    ones are confirmed; after a kill -9 every confirmed one is routed when due, once, none
    early (the nacked one may be too: a nack allows it, as for a queue)."""
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        conn = connect(broker.port)
        ch = conn.channel()
        ch.confirm_delivery()
        delayed_direct_to_queue(ch)
        confirmed: list[int] = []
        nacked: list[int] = []
        due: dict[int, float] = {}

        def publish(n: int) -> None:
            due[n] = time.time() + 2.0
            try:
                ch.basic_publish("dx", "k", b"%d" % n, _props(n, 2000))
            except pika.exceptions.NackError:
                nacked.append(n)
            else:
                confirmed.append(n)

        for n in range(20):
            publish(n)
        segment = max((broker.data_dir / "messages").glob("*.seg"), key=lambda p: p.name)
        with inject(broker.pid, segment, "fdatasync:error=EIO:when=1"):
            publish(20)
            wait_for(lambda: broker.call("/api/overview")[1]["message_store"]["resumes"] >= 1)
            for n in range(21, 40):
                publish(n)
        assert nacked == [20] and len(confirmed) == 39
        conn.close()
        broker.kill9()
        broker.start()
        conn = connect(broker.port)
        ch = conn.channel()
        got: dict[int, float] = {}

        def on_message(channel, method, props, body):
            assert int(body) not in got, f"{int(body)} routed twice"
            got[int(body)] = time.time()
            channel.basic_ack(method.delivery_tag)

        ch.basic_consume("q", on_message)
        wait_for(
            lambda: conn.process_data_events(0.05) or set(confirmed) <= set(got),
            timeout=20,
            what="every confirmed delayed message",
        )
        assert set(got) <= set(confirmed) | set(nacked)
        assert [n for n, at in got.items() if at < due[n]] == []
        conn.close()
    finally:
        broker.stop()


def test_a_policy_made_delayed_exchange_keeps_what_it_held_after_the_policy_and_a_kill_9(
    tmp_path,
):
    """An exchange LavinMQ's policy key `delayed-message` made delayed stores its
    persistent messages as any durable delayed exchange; removed, the policy delays nothing
    new, and after a kill -9 (no policy to make the exchange delayed at the start) what
    it held is still routed when due: never lost, never early."""
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        ch = connect(broker.port).channel()
        ch.confirm_delivery()
        policy = {
            "pattern": "^px$",
            "apply-to": "exchanges",
            "definition": {"delayed-message": True},
        }
        assert broker.call("/api/policies/%2F/delay", "PUT", policy)[0] == 201
        ch.exchange_declare("px", "direct", durable=True)
        ch.queue_declare("q", durable=True)
        ch.queue_bind("q", "px", "k")
        published = time.time()
        ch.basic_publish("px", "k", b"held", _props(1, 6000))
        assert broker.api("/api/exchanges/%2F/px")["messages_delayed"] == 1
        assert broker.call("/api/policies/%2F/delay", "DELETE")[0] == 204
        ch.basic_publish("px", "k", b"now", _props(2, 6000))  # no policy: at once
        assert ch.queue_declare("q", durable=True, passive=True).method.message_count == 1
        broker.kill9()
        broker.start()
        ch = connect(broker.port).channel()
        assert broker.api("/api/exchanges/%2F/px")["messages_delayed"] == 1
        method, _props_, body = ch.basic_get("q", auto_ack=True)
        assert body == b"now"
        got: list[tuple[float, bytes]] = []

        def arrived() -> bool:
            method, _p, body = ch.basic_get("q", auto_ack=True)
            if method is not None:
                got.append((time.time(), body))
            return bool(got)

        wait_for(arrived, timeout=20, step=0.01, what="the held message")
        at, body = got[0]
        assert body == b"held" and at >= published + 6.0
        # still not delaying: the woken schedule only delivers what it held
        ch.basic_publish("px", "k", b"after", _props(3, 6000))
        assert [ch.basic_get("q", auto_ack=True)[2]] == [b"after"]
    finally:
        broker.stop()
