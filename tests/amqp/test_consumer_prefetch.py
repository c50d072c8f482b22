"""basic.qos on a channel that already has consumers, with pika over a real socket, against
RoarMQ and (marked `slow`) RabbitMQ 3.10.8, step by step.

The one deliberate difference (docs/operations.md, "Consumer prefetch"): a non-global
basic.qos re-limits the channel's existing consumers on RoarMQ, as on LavinMQ, where
RabbitMQ applies it only to consumers created afterwards. That is what Celery's worker
needs: it holds ETA (countdown) tasks unacked and raises its prefetch with a non-global
basic.qos for every broker but RabbitMQ 3.3-3.x (kombu's `qos_semantics_matches_spec`),
so on RabbitMQ's semantics its one consumer never sees the raise. Every other step is
the same on both, and asserted the same.
"""

from __future__ import annotations

import time
import uuid

import pika
import pytest
from support.waiting import wait_for

pytestmark = pytest.mark.timeout(120)

#: Seconds without a new delivery after which a step's count is taken as final: a
#: delivery the broker meant to send arrives within milliseconds (the wait up to the
#: expected count has no such bound; this one only lets an excess show).
QUIET = 0.4


class Held:
    """Each consumer's deliveries not yet acked, by consumer tag."""

    def __init__(self, conn: pika.BlockingConnection, ch) -> None:
        self.conn, self.ch = conn, ch
        self.tags: dict[str, list[int]] = {}

    def consume(self, queue: str) -> str:
        tag = queue
        self.tags[tag] = []
        self.ch.basic_consume(
            queue,
            lambda _c, m, _p, _b: self.tags[m.consumer_tag].append(m.delivery_tag),
            consumer_tag=tag,
        )
        return tag

    def counts(self, expected: dict[str, int], total: int | None = None) -> dict[str, int]:
        """Each consumer's unacked count once each has reached `expected` (and all together
        `total`), or 10 s passed, and no further delivery came for QUIET seconds."""

        def reached() -> bool:
            self.conn.process_data_events(0.05)
            now = {t: len(d) for t, d in self.tags.items()}
            return all(now[t] >= n for t, n in expected.items()) and (
                total is None or sum(now.values()) >= total
            )

        wait_for(reached, 10.0, 0, what=f"deliveries {expected} (total {total})")
        last = {t: len(d) for t, d in self.tags.items()}
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < QUIET:
            self.conn.process_data_events(0.05)
            now = {t: len(d) for t, d in self.tags.items()}
            if now != last:
                last, quiet_since = now, time.monotonic()
        return last

    def ack_all(self, tag: str) -> None:
        for delivery_tag in self.tags[tag]:
            self.ch.basic_ack(delivery_tag)
        self.tags[tag] = []


def test_non_global_qos_reaches_existing_consumers(target, request):
    """Two queues of 20 messages; consumer A at qos 1, then qos 5, consumer B, qos 2,
    global qos 8, global qos 3 (acking everything held before each of the last three):
    the unacked deliveries each consumer holds after each step. DIFFERS marks the steps
    where RoarMQ answers otherwise than RabbitMQ on purpose; the rest is the same."""
    on_rabbitmq = "rabbitmq" in request.node.callspec.id
    conn = pika.BlockingConnection(pika.URLParameters(target.url))
    ch = conn.channel()
    qa, qb = ("pf-" + uuid.uuid4().hex[:10] for _ in range(2))
    for q in (qa, qb):
        ch.queue_declare(q, auto_delete=True)
        for i in range(20):
            ch.basic_publish("", q, str(i).encode())
    held = Held(conn, ch)

    ch.basic_qos(prefetch_count=1)
    a = held.consume(qa)
    assert held.counts({a: 1}) == {a: 1}  # same: the consumer takes the channel's 1

    ch.basic_qos(prefetch_count=5)
    # DIFFERS. RabbitMQ: a non-global qos is for consumers created afterwards; A stays
    # at 1. RoarMQ (as LavinMQ): A is re-limited to 5 at once.
    assert held.counts({a: 1 if on_rabbitmq else 5}) == {a: 1 if on_rabbitmq else 5}

    b = held.consume(qb)
    # Same: a consumer created after the qos takes it (A as before).
    want = {a: 1, b: 5} if on_rabbitmq else {a: 5, b: 5}
    assert held.counts(want) == want

    ch.basic_qos(prefetch_count=2)
    held.ack_all(a)
    held.ack_all(b)
    # DIFFERS. RabbitMQ: A at its 1, B at its 5. RoarMQ: both re-limited to 2.
    want = {a: 1, b: 5} if on_rabbitmq else {a: 2, b: 2}
    assert held.counts(want) == want

    ch.basic_qos(prefetch_count=8, global_qos=True)
    held.ack_all(a)
    held.ack_all(b)
    # Same: a global qos limits the channel as a whole and leaves each consumer's own
    # limit as it was (8 is more than the two together take).
    assert held.counts(want) == want

    ch.basic_qos(prefetch_count=3, global_qos=True)
    held.ack_all(a)
    held.ack_all(b)
    # Same: the channel's 3 caps the two together, each within its own limit; which one
    # gets the third is the broker's order, so only that is asserted.
    got = held.counts({}, total=3)
    assert sum(got.values()) == 3 and got[a] <= want[a] and got[b] <= want[b]
    conn.close()
