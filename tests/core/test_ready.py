"""The compact ready list (broker/core/ready.py) against a plain sorted list, driven by Hypothesis."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from roarmq.broker.core import ready
from roarmq.broker.core.message import Message
from roarmq.broker.core.queue import Entry
from roarmq.protocol.frames import ContentHeader
from roarmq.protocol.properties import BasicProperties


def _message(seq: int, big: bool) -> Message:
    props = BasicProperties(priority=seq % 3, delivery_mode=1 + seq % 2)
    body = bytes([seq % 256]) * (ready.INLINE_MAX + 1 if big else seq % 40)
    header = ContentHeader.from_properties(props, body_size=len(body))
    return Message(f"x{seq % 4}", f"key.{seq}", header, body)


def _view(entry: Entry) -> tuple:
    m = entry.msg
    return (
        entry.seq,
        entry.redelivered,
        entry.expires_at,
        entry.delivery_count,
        m.exchange,
        m.routing_key,
        m.header.raw,
        m.body,
        m.priority,
        m.persistent,
    )


class ReadyMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._saved = (ready.HEAD_MAX, ready.REFILL)
        ready.HEAD_MAX, ready.REFILL = 3, 2  # pack and refill all the time
        self.fifo = ready.FifoReady(Entry)
        self.model: list[tuple] = []  # views, ordered by seq
        self.out: list[Entry] = []  # popped, not yet requeued
        self.seq = 0

    def teardown(self) -> None:
        ready.HEAD_MAX, ready.REFILL = self._saved

    @rule(big=st.booleans(), expires=st.booleans())
    def push(self, big: bool, expires: bool) -> None:
        self.seq += 1
        entry = Entry(_message(self.seq, big), self.seq, None)  # type: ignore[arg-type]
        if expires:
            entry.expires_at = 1000.0 + self.seq / 8
        self.fifo.push(entry)
        self.model.append(_view(entry))

    @precondition(lambda self: self.model)
    @rule()
    def pop(self) -> None:
        entry = self.fifo.pop()
        assert _view(entry) == self.model.pop(0)
        self.out.append(entry)

    @precondition(lambda self: self.out)
    @rule(data=st.data())
    def requeue(self, data: st.DataObject) -> None:
        chosen = data.draw(st.lists(st.sampled_from(self.out), unique_by=id, min_size=1))
        for entry in chosen:
            self.out.remove(entry)
            entry.redelivered = True
            entry.delivery_count += 1
        self.fifo.requeue(list(chosen))
        self.model = sorted(self.model + [_view(e) for e in chosen])

    @rule()
    def clear(self) -> None:
        cleared = self.fifo.clear()
        assert len(cleared) == len(self.model)
        as_objects = sorted(_view(e) for e in cleared.entries)
        rest = [v for v in self.model if v not in as_objects]
        assert len(as_objects) + len(rest) == len(self.model)  # each seq once
        assert cleared.packed == len(rest)
        assert cleared.packed_bytes == sum(len(v[7]) for v in rest)
        assert all(len(v[7]) <= ready.INLINE_MAX for v in rest)  # big ones stay objects
        self.model = []

    @invariant()
    def agrees(self) -> None:
        assert len(self.fifo) == len(self.model)
        assert [_view(e) for e in self.fifo] == self.model
        head = self.fifo.peek()
        assert (head is None) == (not self.model)
        if head is not None:
            assert _view(head) == self.model[0]


ReadyMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_ready_state_machine = ReadyMachine.TestCase


def test_requeue_in_ascending_order_is_not_quadratic():
    """20,000 single requeues in ascending order each cost O(log n): the old list re-sorted."""
    fifo = ready.FifoReady(Entry)
    entries = [Entry(_message(i, False), i, None) for i in range(1, 20_001)]  # type: ignore[arg-type]
    for e in entries:
        fifo.push(e)
    taken = [fifo.pop() for _ in range(20_000)]
    for e in taken:
        fifo.requeue([e])
    assert [fifo.pop().seq for _ in range(20_000)] == list(range(1, 20_001))


def test_packed_messages_are_small():
    """A queued 16-byte message costs well under 100 bytes once packed."""
    fifo = ready.FifoReady(Entry)
    n = 50_000
    for i in range(n):
        header = ContentHeader(60, 16, b"\x00\x00")
        fifo.push(Entry(Message("", "work", header, i.to_bytes(16, "big")), i, None))  # type: ignore[arg-type]
    assert fifo.packed() == n - ready.HEAD_MAX
    packed_bytes = sum(len(c) for c in fifo._chunks)  # noqa: SLF001
    assert packed_bytes / fifo.packed() < 64
    assert [fifo.pop().msg.body for _ in range(n)] == [i.to_bytes(16, "big") for i in range(n)]
