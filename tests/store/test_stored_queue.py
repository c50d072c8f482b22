"""Persistent messages of durable queues at rest are bare store ids (broker/core/ready.py, _STORED).

Past the queue's head, a durable queue keeps only the msg_id of each persistent message;
key, header and body come back from the segment log when the message is unpacked. These
tests check that nothing a client can see changes: order, bodies, properties, redelivered
flags, purge and delete, priorities, compaction and restarts. A real broker, real pika.
"""

from __future__ import annotations

import struct

import pika
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from roarmq.broker.core.ready import HEAD_MAX
from roarmq.broker.store.messages import BLOCK_BITS, MessageIndex
from roarmq.broker.store.segments import Location
from roarmq.broker.testing import BrokerThread, ephemeral_config

pytestmark = pytest.mark.timeout(180)
N = HEAD_MAX + 3000  # well past the head: most of the queue is packed


def props(i: int) -> pika.BasicProperties:
    return pika.BasicProperties(
        delivery_mode=2, headers={"i": i}, message_id=f"m{i}", content_type="text/plain"
    )


def body(i: int) -> bytes:
    # Every 500th body is bigger than INLINE_MAX: read back at delivery, not at unpack.
    return struct.pack(">I", i) + (b"x" * 9000 if i % 500 == 0 else b"y" * (i % 40))


def publish(b: BrokerThread, queue: str, n: int, **declare) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare(queue, durable=True, **declare)
    for i in range(n):
        ch.basic_publish("", queue, body(i), props(i))
    # No confirms (an fsync each, one at a time, in a blocking client): a round trip on the
    # channel orders the publishes before it, and a clean stop writes what is buffered.
    assert ch.queue_declare(queue, durable=True, passive=True).method.message_count == n
    conn.close()


def consume_all(b: BrokerThread, queue: str, ack: bool = True) -> list:
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    out = []
    while True:
        method, header, got = ch.basic_get(queue)
        if method is None:
            break
        out.append((got, header.headers, header.message_id, method.redelivered, method.routing_key))
        if ack:
            ch.basic_ack(method.delivery_tag)
    conn.close()
    return out


def expected(n: int, start: int = 0) -> list:
    return [(body(i), {"i": i}, f"m{i}") for i in range(start, n)]


def stored_in(b: BrokerThread, name: str) -> int:
    queue = b.broker.vhosts["/"].queues[name]
    return b.call(lambda: queue.ready._stored)


@pytest.mark.slow  # restarts: not in `make check`
def test_packed_persistent_messages_come_back_whole(tmp_path):
    cfg = ephemeral_config(data_dir=str(tmp_path / "data"))
    with BrokerThread(cfg) as b:
        publish(b, "q", N)
        assert stored_in(b, "q") == N - HEAD_MAX
        store = b.broker.store
        assert b.call(lambda: len(store.index)) == N
        got = consume_all(b, "q")
        assert [g[:3] for g in got] == expected(N)
        assert {g[4] for g in got} == {"q"} and not any(g[3] for g in got)
        assert b.call(lambda: len(store.index)) == 0  # every record released


@pytest.mark.slow  # restarts: not in `make check`
def test_recovery_queues_ids_only_and_delivers_in_order(tmp_path):
    cfg = ephemeral_config(data_dir=str(tmp_path / "data"))
    with BrokerThread(cfg) as b:
        publish(b, "q", N)
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        for _ in range(10):  # ack ten, deliver one more without acking
            method, _, _ = ch.basic_get("q")
            ch.basic_ack(method.delivery_tag)
        ch.basic_get("q")
        conn.close()  # the unacked one goes back, marked delivered
    with BrokerThread(cfg) as b:
        assert b.broker.recovery["messages"] == N - 10
        queue = b.broker.vhosts["/"].queues["q"]
        # Everything past the first REFILL records stays a bare id until needed.
        assert b.call(lambda: queue.ready._stored) >= N - 10 - 512
        assert b.call(lambda: queue.ready_bytes) == sum(len(body(i)) for i in range(10, N))
        got = consume_all(b, "q")
    assert [g[:3] for g in got] == expected(N, 10)
    assert got[0][3] is True  # delivered before the clean stop
    assert not any(g[3] for g in got[1:])


def test_purge_and_delete_of_packed_messages_survive_restart(tmp_path):
    cfg = ephemeral_config(data_dir=str(tmp_path / "data"))
    with BrokerThread(cfg) as b:
        publish(b, "purged", N)
        publish(b, "deleted", N)
        publish(b, "kept", 5)
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        assert ch.queue_purge("purged").method.message_count == N
        assert ch.queue_delete("deleted").method.message_count == N
        conn.close()
        assert b.call(lambda: len(b.broker.store.index)) == 5
    with BrokerThread(cfg) as b:
        assert b.broker.recovery["messages"] == 5
        assert consume_all(b, "purged") == []
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        conn.channel().queue_declare("deleted", durable=True)  # the same name, a new queue
        conn.close()
        assert consume_all(b, "deleted") == []
        assert [g[:3] for g in consume_all(b, "kept")] == expected(5)


@pytest.mark.slow  # restarts: not in `make check`
def test_compaction_moves_records_under_packed_queues(tmp_path):
    cfg = ephemeral_config(data_dir=str(tmp_path / "data"), storage={"segment_size": 64 * 1024})
    with BrokerThread(cfg) as b:
        publish(b, "q", N)
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        # Take most of the first part, keep every 7th: segments become sparse.
        held = []
        for i in range(HEAD_MAX + 1000):
            method, _, got = ch.basic_get("q")
            if i % 7:
                ch.basic_ack(method.delivery_tag)
            else:
                held.append(method.delivery_tag)
        store = b.broker.store
        b.call(lambda: store.log.sync_now(timeout=10))
        report = b.call(lambda: store.log.compact(store.durability.relocated, threshold=0.5))
        assert report.records_moved > 0
        ch.basic_nack(held[-1], multiple=True, requeue=True)
        conn.close()
        got = consume_all(b, "q", ack=False)  # the nacked ones first, then the rest
        want = [i for i in range(HEAD_MAX + 1000) if i % 7 == 0] + list(range(HEAD_MAX + 1000, N))
        assert [g[:3] for g in got] == [(body(i), {"i": i}, f"m{i}") for i in want]
    with BrokerThread(cfg) as b:  # the copies are what recovery finds
        got = consume_all(b, "q")
        assert [g[:3] for g in got] == [(body(i), {"i": i}, f"m{i}") for i in want]


@pytest.mark.slow  # restarts: not in `make check`
def test_priority_queue_recovers_by_priority(tmp_path):
    cfg = ephemeral_config(data_dir=str(tmp_path / "data"))
    with BrokerThread(cfg) as b:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.queue_declare("pq", durable=True, arguments={"x-max-priority": 3})
        for i in range(3 * HEAD_MAX):
            ch.basic_publish(
                "",
                "pq",
                struct.pack(">I", i),
                pika.BasicProperties(delivery_mode=2, priority=i % 4),
            )
        ch.queue_declare("pq", passive=True)
        conn.close()
    with BrokerThread(cfg) as b:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        order = []
        while True:
            method, header, got = ch.basic_get("pq", auto_ack=True)
            if method is None:
                break
            order.append((header.priority, struct.unpack(">I", got)[0]))
        conn.close()
    want = sorted(((i % 4, i) for i in range(3 * HEAD_MAX)), key=lambda p: (-p[0], p[1]))
    assert order == want


def test_dead_lettering_a_recovered_big_message_keeps_its_body(tmp_path):
    """Its body is on disk; dead-lettering reads it before the source lets go of the record."""
    cfg = ephemeral_config(data_dir=str(tmp_path / "data"))
    big = b"z" * 100_000
    dlx = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"}
    with BrokerThread(cfg) as b:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("dlq", durable=True)
        ch.queue_declare("src", durable=True, arguments=dlx)
        ch.basic_publish("", "src", big, pika.BasicProperties(delivery_mode=2))
        conn.close()
    with BrokerThread(cfg) as b:
        queue = b.broker.vhosts["/"].queues["src"]
        assert b.call(lambda: [e.msg.body for e in queue.iter_ready()]) == [None]
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        method, _, got = ch.basic_get("src")
        assert got == big
        ch.basic_reject(method.delivery_tag, requeue=False)
        method, header, got = ch.basic_get("dlq", auto_ack=True)
        assert got == big and header.headers["x-death"][0]["reason"] == "rejected"
        conn.close()
        assert b.call(lambda: len(b.broker.store.index)) == 0


class IndexMachine(RuleBasedStateMachine):
    """MessageIndex against a dict model, ids clustered so blocks fill, empty and return."""

    def __init__(self) -> None:
        super().__init__()
        self.index = MessageIndex()
        self.model: dict[int, list] = {}

    ids = st.integers(0, 3 << BLOCK_BITS)

    @rule(msg_id=ids, seg=st.integers(0, 2**32 - 1), refs=st.integers(1, 3))
    def add(self, msg_id, seg, refs):
        loc = Location(seg, msg_id * 3, 100 + msg_id % 7)
        self.index.add(msg_id, loc, refs)
        self.model[msg_id] = [loc, refs]

    @rule(msg_id=ids)
    def unref(self, msg_id):
        got = self.index.unref(msg_id)
        want = self.model.get(msg_id)
        if want is None:
            assert got is None
            return
        want[1] -= 1
        if want[1]:
            assert got is None
        else:
            assert got == want[0]
            del self.model[msg_id]

    @rule(msg_id=ids, off=st.integers(0, 2**32 - 1))
    def move(self, msg_id, off):
        loc = Location(7, off, 5)
        self.index.move(msg_id, loc)
        if msg_id in self.model:
            self.model[msg_id][0] = loc

    @invariant()
    def agrees(self):
        assert len(self.index) == len(self.model)
        assert list(self.index.ids()) == sorted(self.model)
        for msg_id, (loc, _) in self.model.items():
            assert self.index.location(msg_id) == loc
        assert len(self.index._blocks) == len({m >> BLOCK_BITS for m in self.model})


TestMessageIndex = IndexMachine.TestCase
TestMessageIndex.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
