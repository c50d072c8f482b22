"""broker/core/queue.py's Queue driven directly, below the socket (h11 tests its core with bytes).

A Broker is built in-process and never started: no listener, no event loop, no message
store; its timers run on a VirtualClock the test advances. Queues are made the way a
client makes them, through ``VirtualHost.declare_queue`` with x-arguments, and consumers
are fakes holding what the queue asks of a consumer (``has_credit``, ``priority``,
``exclusive``, ``channel.deliver``). What a client sees of the same rules over AMQP is in
test_aiopika.py, test_semantics_raw.py and test_timers.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from roarmq.broker.core.message import Message
from roarmq.broker.core.queue import Entry, Queue
from roarmq.broker.core.vhost import VirtualHost
from roarmq.broker.ops.clock import VirtualClock
from roarmq.broker.server import Broker
from roarmq.broker.testing import ephemeral_config
from roarmq.protocol.frames import ContentHeader
from roarmq.protocol.properties import BasicProperties


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def vhost(tmp_path: Any, clock: VirtualClock) -> Iterator[VirtualHost]:
    broker = Broker(ephemeral_config(data_dir=str(tmp_path / "data")), clock=clock)
    yield broker.vhosts["/"]
    broker.persistence.close()


def declare(vhost: VirtualHost, name: str, **arguments: Any) -> Queue:
    """A transient queue with ``x-...`` arguments given as keywords (x_max_length=2)."""
    args = {"x-" + k.removeprefix("x_").replace("_", "-"): v for k, v in arguments.items()}
    queue, created = vhost.declare_queue(name, None, arguments=args or None)
    assert created
    return queue


def message(body: bytes, routing_key: str = "k", **properties: Any) -> Message:
    props = BasicProperties(**properties)
    header = ContentHeader.from_properties(props, body_size=len(body))
    return Message("", routing_key, header, body)


def publish(queue: Queue, *bodies: bytes, **properties: Any) -> list[bool]:
    return [queue.publish(message(b, **properties)) for b in bodies]


def drain(queue: Queue) -> list[bytes]:
    """basic.get until empty: the bodies in the order the queue hands them out."""
    out = []
    while (entry := queue.get()) is not None:
        out.append(entry.msg.body)
    return out


class FakeChannel:
    """The channel side of a delivery: records entries, counts unacked per consumer."""

    def __init__(self) -> None:
        self.can_deliver = True
        self.delivered: list[tuple[str, Entry]] = []

    def deliver(self, consumer: FakeConsumer, entry: Entry) -> None:
        entry.consumer = consumer  # type: ignore[assignment]
        consumer.unacked += 1
        self.delivered.append((consumer.tag, entry))

    def bodies(self, tag: str | None = None) -> list[bytes]:
        return [e.msg.body for t, e in self.delivered if tag is None or t == tag]


class FakeConsumer:
    """What Queue asks of a consumer; ``prefetch`` 0 means unlimited credit."""

    def __init__(
        self, channel: FakeChannel, tag: str, prefetch: int = 0, priority: int = 0
    ) -> None:
        self.channel, self.tag, self.prefetch, self.priority = channel, tag, prefetch, priority
        self.exclusive = False
        self.unacked = 0

    def has_credit(self) -> bool:
        return self.channel.can_deliver and not (self.prefetch and self.unacked >= self.prefetch)


def consume(queue: Queue, channel: FakeChannel, tag: str, **kw: Any) -> FakeConsumer:
    consumer = FakeConsumer(channel, tag, **kw)
    queue.add_consumer(consumer)  # type: ignore[arg-type]
    return consumer


# -- FIFO, basic.get, purge ---------------------------------------------------------------


def test_get_is_fifo_and_counts(vhost: VirtualHost) -> None:
    q = declare(vhost, "q")
    assert publish(q, b"a", b"b", b"c") == [True, True, True]
    assert q.message_count() == 3 and q.ready_bytes == 3 and q.stats_published == 3
    assert drain(q) == [b"a", b"b", b"c"]
    assert q.message_count() == 0 and q.ready_bytes == 0 and q.get() is None


def test_purge_returns_the_count_and_empties(vhost: VirtualHost) -> None:
    q = declare(vhost, "q")
    publish(q, b"a", b"bb")
    assert q.purge() == 2
    assert q.message_count() == 0 and q.ready_bytes == 0


def test_one_message_shared_by_two_queues(vhost: VirtualHost) -> None:
    a, b = declare(vhost, "a"), declare(vhost, "b")
    msg = message(b"x")
    assert vhost.enqueue(msg, [a, b]) == (True, None)
    ea, eb = a.get(), b.get()
    assert ea is not None and eb is not None
    assert ea.msg is eb.msg and ea is not eb  # one Message, an Entry per queue


# -- consumers --------------------------------------------------------------------------------


def test_publish_to_a_consumer_with_credit_is_delivered_at_once(vhost: VirtualHost) -> None:
    q, ch = declare(vhost, "q"), FakeChannel()
    consume(q, ch, "c")
    publish(q, b"a")
    assert ch.bodies() == [b"a"] and q.message_count() == 0 and q.stats_delivered == 1


def test_consumers_of_equal_priority_take_turns(vhost: VirtualHost) -> None:
    q, ch = declare(vhost, "q"), FakeChannel()
    consume(q, ch, "c1")
    consume(q, ch, "c2")
    publish(q, b"1", b"2", b"3", b"4")
    assert ch.bodies("c1") == [b"1", b"3"] and ch.bodies("c2") == [b"2", b"4"]


def test_the_lone_consumer_shortcut_follows_every_change_of_consumers(vhost: VirtualHost) -> None:
    """A queue with exactly one consumer hands out without its group list (``_only``): the
    shortcut must name the right consumer, or none, after each add, cancel and delete."""
    q, ch = declare(vhost, "q"), FakeChannel()
    first = consume(q, ch, "first")
    assert q._only is first
    second = consume(q, ch, "second")
    assert q._only is None  # two: round-robin again
    publish(q, b"1", b"2")
    assert ch.bodies("first") == [b"1"] and ch.bodies("second") == [b"2"]
    q.remove_consumer(first)  # type: ignore[arg-type]
    assert q._only is second
    publish(q, b"3")
    assert ch.bodies("second") == [b"2", b"3"] and ch.bodies("first") == [b"1"]
    q.remove_consumer(second)  # type: ignore[arg-type]
    assert q._only is None
    publish(q, b"4")
    assert q.message_count() == 1  # nobody to take it
    third = consume(q, ch, "third", prefetch=1)
    assert q._only is third and ch.bodies("third") == [b"4"]
    publish(q, b"5")  # the lone consumer has no credit: the message waits
    assert q.message_count() == 1 and ch.bodies("third") == [b"4"]
    high = consume(q, ch, "high", priority=5)
    assert q._only is None and ch.bodies("high") == [b"5"]
    q.remove_consumer(high)  # type: ignore[arg-type]
    assert q._only is third
    q.on_deleted()
    assert q._only is None and q.consumer_count == 0


def test_higher_priority_consumer_first_while_it_has_credit(vhost: VirtualHost) -> None:
    q, ch = declare(vhost, "q"), FakeChannel()
    consume(q, ch, "low", priority=0)
    consume(q, ch, "high", priority=5, prefetch=2)
    publish(q, b"1", b"2", b"3")
    assert ch.bodies("high") == [b"1", b"2"] and ch.bodies("low") == [b"3"]


def test_prefetch_holds_messages_until_credit_returns(vhost: VirtualHost) -> None:
    q, ch = declare(vhost, "q"), FakeChannel()
    consumer = consume(q, ch, "c", prefetch=2)
    publish(q, b"1", b"2", b"3", b"4")
    assert ch.bodies() == [b"1", b"2"] and q.message_count() == 2
    assert q.consumers_blocked
    _, first = ch.delivered[0]
    consumer.unacked -= 1  # the channel saw a basic.ack
    q.ack(first)
    q.dispatch()
    assert ch.bodies() == [b"1", b"2", b"3"] and q.stats_acked == 1


def test_a_channel_that_cannot_deliver_leaves_messages_ready(vhost: VirtualHost) -> None:
    q, ch = declare(vhost, "q"), FakeChannel()
    ch.can_deliver = False  # channel.flow off, or its socket is full
    consume(q, ch, "c")
    publish(q, b"1", b"2")
    assert ch.bodies() == [] and q.message_count() == 2
    ch.can_deliver = True
    q.dispatch()
    assert ch.bodies() == [b"1", b"2"]


def test_removing_the_last_consumer_of_an_auto_delete_queue_deletes_it(
    vhost: VirtualHost,
) -> None:
    q, _ = vhost.declare_queue("ad", None, auto_delete=True)
    consumer = consume(q, FakeChannel(), "c")
    q.remove_consumer(consumer)  # type: ignore[arg-type]
    assert q.deleted and "ad" not in vhost.queues


# -- requeue ------------------------------------------------------------------------------------


def test_requeued_messages_go_back_in_publish_order_marked_redelivered(
    vhost: VirtualHost,
) -> None:
    q = declare(vhost, "q")
    publish(q, b"1", b"2", b"3", b"4")
    taken = [q.get() for _ in range(3)]
    q.requeue([taken[2], taken[0]])  # out of order, and not all of them
    got = []
    while (entry := q.get()) is not None:
        got.append((entry.msg.body, entry.redelivered))
    assert got == [(b"1", True), (b"3", True), (b"4", False)]


def test_reject_with_requeue_redelivers_to_the_next_consumer(vhost: VirtualHost) -> None:
    q, ch = declare(vhost, "q"), FakeChannel()
    c1 = consume(q, ch, "c1", prefetch=1)
    publish(q, b"1")
    _, entry = ch.delivered[0]
    q.remove_consumer(c1)  # type: ignore[arg-type]
    consume(q, ch, "c2")
    q.reject(entry, requeue=True)
    assert [(t, e.msg.body, e.redelivered) for t, e in ch.delivered] == [
        ("c1", b"1", True),  # the same Entry object, now marked
        ("c2", b"1", True),
    ]


# -- priorities ---------------------------------------------------------------------------------


def test_priority_queue_hands_out_highest_first_fifo_within_a_level(vhost: VirtualHost) -> None:
    q = declare(vhost, "pq", x_max_priority=5)
    for body, priority in ((b"a1", 1), (b"b5", 5), (b"c3", 3), (b"d5", 5), (b"e0", 0)):
        q.publish(message(body, priority=priority))
    assert drain(q) == [b"b5", b"d5", b"c3", b"a1", b"e0"]


def test_priority_above_the_maximum_counts_as_the_maximum(vhost: VirtualHost) -> None:
    q = declare(vhost, "pq", x_max_priority=2)
    q.publish(message(b"two", priority=2))
    q.publish(message(b"nine", priority=9))
    q.publish(message(b"one", priority=1))
    assert drain(q) == [b"two", b"nine", b"one"]


def test_a_queue_without_max_priority_ignores_priorities(vhost: VirtualHost) -> None:
    q = declare(vhost, "q")
    q.publish(message(b"low", priority=0))
    q.publish(message(b"high", priority=9))
    assert drain(q) == [b"low", b"high"]


# -- TTL on a virtual clock ---------------------------------------------------------------------


def test_queue_ttl_expires_messages_when_the_clock_passes_it(
    vhost: VirtualHost, clock: VirtualClock
) -> None:
    q = declare(vhost, "q", x_message_ttl=1000)
    publish(q, b"a")
    clock.advance(0.5)
    publish(q, b"b")
    clock.advance(0.6)  # a is 1.1 s old, b 0.6 s
    assert q.message_count() == 1
    clock.advance(0.5)
    assert q.message_count() == 0 and clock.pending() == 0


def test_per_message_expiration_shorter_than_the_queue_ttl_wins(
    vhost: VirtualHost, clock: VirtualClock
) -> None:
    q = declare(vhost, "q", x_message_ttl=10_000)
    q.publish(message(b"short", expiration="100"))
    q.publish(message(b"long"))
    clock.advance(0.2)
    assert drain(q) == [b"long"]


def test_only_the_head_expires(vhost: VirtualHost, clock: VirtualClock) -> None:
    """As RabbitMQ: an expired message behind a live one stays until it reaches the head,
    and basic.get skips it then."""
    q = declare(vhost, "q")
    q.publish(message(b"forever"))
    q.publish(message(b"brief", expiration="10"))
    clock.advance(1)
    assert q.message_count() == 2
    assert drain(q) == [b"forever"]


def test_zero_ttl_expires_unless_a_consumer_takes_it_now(
    vhost: VirtualHost, clock: VirtualClock
) -> None:
    q = declare(vhost, "q", x_message_ttl=0)
    publish(q, b"nobody")
    assert q.message_count() == 0
    ch = FakeChannel()
    consume(q, ch, "c")
    publish(q, b"taken")
    assert ch.bodies() == [b"taken"]


def test_x_expires_deletes_an_unused_queue_and_use_postpones_it(
    vhost: VirtualHost, clock: VirtualClock
) -> None:
    q = declare(vhost, "idle", x_expires=1000)
    clock.advance(0.8)
    q.get()  # basic.get counts as use
    clock.advance(0.8)
    assert "idle" in vhost.queues
    clock.advance(0.3)
    assert "idle" not in vhost.queues and q.deleted


# -- max-length ---------------------------------------------------------------------------------


def test_max_length_drop_head_keeps_the_newest(vhost: VirtualHost) -> None:
    q = declare(vhost, "q", x_max_length=2)
    assert publish(q, b"1", b"2", b"3", b"4") == [True] * 4
    assert drain(q) == [b"3", b"4"]


def test_max_length_bytes_drop_head(vhost: VirtualHost) -> None:
    q = declare(vhost, "q", x_max_length_bytes=5)
    publish(q, b"aaa", b"bb", b"c")  # 6 bytes: the head goes
    assert q.ready_bytes == 3 and drain(q) == [b"bb", b"c"]


def test_reject_publish_refuses_when_full_and_keeps_the_oldest(vhost: VirtualHost) -> None:
    q = declare(vhost, "q", x_max_length=2, x_overflow="reject-publish")
    assert publish(q, b"1", b"2", b"3") == [True, True, False]
    assert drain(q) == [b"1", b"2"]
    assert publish(q, b"4") == [True]


def test_max_length_counts_ready_messages_not_unacked_ones(vhost: VirtualHost) -> None:
    q, ch = declare(vhost, "q", x_max_length=1, x_overflow="reject-publish"), FakeChannel()
    consume(q, ch, "c", prefetch=1)
    assert publish(q, b"1", b"2", b"3") == [True, True, False]  # 1 unacked, 2 ready
    assert ch.bodies() == [b"1"]


# -- dead-lettering -----------------------------------------------------------------------------


def deaths(entry: Entry | None) -> list[dict]:
    assert entry is not None
    return entry.msg.headers["x-death"]


def test_expired_messages_are_dead_lettered_with_x_death(
    vhost: VirtualHost, clock: VirtualClock
) -> None:
    dlq = declare(vhost, "dlq")
    q = declare(vhost, "work", x_message_ttl=100, x_dead_letter_exchange="",
                x_dead_letter_routing_key="dlq")  # fmt: skip
    publish(q, b"late")
    clock.advance(0.2)
    assert q.message_count() == 0 and dlq.message_count() == 1
    entry = dlq.get()
    [death] = deaths(entry)
    assert death["reason"] == "expired" and death["queue"] == "work" and death["count"] == 1
    assert death["routing-keys"] == ["k"] and entry.msg.routing_key == "dlq"
    assert entry.msg.headers["x-first-death-reason"] == "expired"
    assert q.stats_dead_lettered == 1


def test_drop_head_dead_letters_the_dropped_message_as_maxlen(vhost: VirtualHost) -> None:
    dlq = declare(vhost, "dlq")
    q = declare(vhost, "q", x_max_length=1, x_dead_letter_exchange="",
                x_dead_letter_routing_key="dlq")  # fmt: skip
    publish(q, b"old", b"new")
    entry = dlq.get()
    assert entry.msg.body == b"old" and deaths(entry)[0]["reason"] == "maxlen"
    assert drain(q) == [b"new"]


def test_reject_publish_dlx_dead_letters_the_refused_message(vhost: VirtualHost) -> None:
    dlq = declare(vhost, "dlq")
    q = declare(vhost, "q", x_max_length=1, x_overflow="reject-publish-dlx",
                x_dead_letter_exchange="", x_dead_letter_routing_key="dlq")  # fmt: skip
    assert publish(q, b"kept", b"refused") == [True, False]
    entry = dlq.get()
    assert entry.msg.body == b"refused" and deaths(entry)[0]["reason"] == "maxlen"


def test_reject_without_requeue_dead_letters_as_rejected(vhost: VirtualHost) -> None:
    dlq = declare(vhost, "dlq")
    q = declare(vhost, "q", x_dead_letter_exchange="", x_dead_letter_routing_key="dlq")
    publish(q, b"bad")
    q.reject(q.get(), requeue=False)
    assert deaths(dlq.get())[0]["reason"] == "rejected"


def test_dead_lettering_keeps_the_routing_key_without_x_dead_letter_routing_key(
    vhost: VirtualHost,
) -> None:
    vhost.declare_exchange("dlx", "direct")
    dlq = declare(vhost, "dlq")
    vhost.bind_queue(dlq, vhost.get_exchange("dlx"), "orders", None)
    q = declare(vhost, "q", x_dead_letter_exchange="dlx")
    q.publish(message(b"m", routing_key="orders"))
    q.reject(q.get(), requeue=False)
    entry = dlq.get()
    assert entry.msg.body == b"m" and entry.msg.routing_key == "orders"


def test_a_dead_letter_cycle_without_rejection_is_dropped(
    vhost: VirtualHost, clock: VirtualClock
) -> None:
    """q expires into itself: RabbitMQ drops the message rather than loop it forever."""
    q = declare(vhost, "loop", x_message_ttl=10, x_dead_letter_exchange="",
                x_dead_letter_routing_key="loop")  # fmt: skip
    publish(q, b"m")
    clock.advance(1)
    assert q.message_count() == 0 and clock.pending() == 0


def test_the_dead_letter_exchange_missing_drops_the_message(vhost: VirtualHost) -> None:
    q = declare(vhost, "q", x_dead_letter_exchange="nowhere")
    publish(q, b"m")
    q.reject(q.get(), requeue=False)
    assert q.message_count() == 0
