"""DirectIndex, FanoutIndex and make_index; finding one of many bindings of one destination."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from support.routing_lazy import LazyRemovalRules, coarse_bucket
from support.routing_strategies import ARG_CLASS, ARGS, DESTS, header_values

from roarmq.broker.routing import (
    DirectIndex,
    FanoutIndex,
    HeadersIndex,
    TopicIndex,
    bindings,
    make_index,
)

ARG_INDEX = st.integers(0, len(ARGS) - 1)


def test_direct() -> None:
    idx = DirectIndex()
    assert idx.route("k") == set()
    assert idx.bind("k", "q1")
    assert not idx.bind("k", "q1", {})
    assert idx.bind("k", "q1", {"x-a": 1})
    assert idx.bind("k", "q2")
    assert idx.bind("", "q3")
    assert idx.route("k") == {"q1", "q2"}
    assert idx.route("k") is idx.route("k")
    assert idx.route("") == {"q3"}
    assert idx.route("k.") == set()
    assert idx.unbind("k", "q1")
    assert idx.route("k") == {"q1", "q2"}  # still bound with other arguments
    assert not idx.unbind("k", "q1")
    assert not idx.unbind("nope", "q1")
    assert idx.remove_destination("q1") == 1
    assert idx.route("k") == {"q2"}
    assert len(idx) == 2
    assert sorted(idx.bindings()) == [("", "q3", None), ("k", "q2", None)]


def test_fanout() -> None:
    idx = FanoutIndex()
    assert idx.route("x") == set()
    assert idx.bind("", "q1")
    assert idx.bind("any", "q1")  # the key tells bindings apart but does not route
    assert not idx.bind("any", "q1")
    assert idx.bind("", "q2", {"a": 1})
    assert idx.route("whatever") == {"q1", "q2"}
    assert idx.unbind("", "q1")
    assert idx.route("x") == {"q1", "q2"}
    assert idx.unbind("any", "q1")
    assert idx.route("x") == {"q2"}
    assert not idx.unbind("", "q2")  # arguments differ
    assert idx.remove_destination("q2") == 1
    assert idx.route("x") == set()
    assert not idx.has_bindings()


@pytest.mark.parametrize("cls", [DirectIndex, FanoutIndex, TopicIndex, HeadersIndex])
def test_unhashable_arguments_are_fine(cls: type) -> None:
    idx = cls()
    args = {"x-list": [1, 2], "x-table": {"a": None}}
    assert idx.bind("k", "q", args)
    assert not idx.bind("k", "q", {"x-table": {"a": None}, "x-list": [1, 2]})
    assert list(idx.bindings()) == [("k", "q", args)]
    assert idx.unbind("k", "q", args)


def test_make_index() -> None:
    assert isinstance(make_index("direct"), DirectIndex)
    assert isinstance(make_index("fanout"), FanoutIndex)
    assert isinstance(make_index("headers"), HeadersIndex)
    topic = make_index("topic", cache_keys=5)
    assert isinstance(topic, TopicIndex) and topic.syntax == "amqp"
    mqtt = make_index("topic", {"x-topic-syntax": "mqtt"})
    assert isinstance(mqtt, TopicIndex) and mqtt.syntax == "mqtt"
    assert make_index("topic", {"x-topic-syntax": ("S", b"mqtt")}).syntax == "mqtt"
    with pytest.raises(ValueError):
        make_index("topic", {"x-topic-syntax": "regex"})
    with pytest.raises(ValueError):
        make_index("x-consistent-hash")


@pytest.mark.parametrize("index", [DirectIndex, FanoutIndex, HeadersIndex, TopicIndex])
def test_lazy_removal(index: type) -> None:
    """A destination with LAZY_REMOVAL bindings or more is gone from routes, counts and
    listings at once; its ids are swept out later, and not reused before."""
    idx = index()
    fanout = index is FanoutIndex  # routes every message to every destination

    def route(i: int) -> frozenset:
        return idx.route(f"k{i}", {"h": i})

    n = bindings.LAZY_REMOVAL
    for i in range(n):
        idx.bind(f"k{i}", "gone", {"x-match": "any", "h": i})
    idx.bind("k0", "kept", {"x-match": "any", "h": 0})
    assert route(0) == {"gone", "kept"}
    assert idx.remove_destination("gone") == n
    assert idx.to_sweep() >= n  # the bindings, and what the index had cached of them
    assert len(idx) == 1 and idx.has_bindings()
    assert [(k, d) for k, d, _ in idx.bindings()] == [("k0", "kept")]
    assert route(0) == {"kept"}
    assert route(1) == ({"kept"} if fanout else set())
    assert idx.bind("k1", "gone", {"x-match": "any", "h": 1})  # bound again: a new binding
    assert route(1) == ({"gone", "kept"} if fanout else {"gone"})
    assert idx.sweep(n // 2) == n // 2
    assert route(1) == ({"gone", "kept"} if fanout else {"gone"})
    assert route(0) == ({"gone", "kept"} if fanout else {"kept"})
    while idx.sweep(n):
        pass
    assert idx.to_sweep() == 0 and idx.sweep(10) == 0
    idx.check_ids()
    assert sorted((k, d) for k, d, _ in idx.bindings()) == [("k0", "kept"), ("k1", "gone")]
    assert route(1) == ({"gone", "kept"} if fanout else {"gone"})
    assert idx.remove_all() == 2
    assert len(idx) == 0 and not idx.has_bindings() and list(idx.bindings()) == []
    assert route(0) == set()
    idx.sweep(10)
    idx.check_ids()
    assert idx.to_sweep() == 0


# -- many bindings to one destination ---------------------------------------------------------


class CountedKey(str):
    """A routing key that counts how often it is compared: what a search for a binding costs."""

    compared = 0
    __hash__ = str.__hash__

    def __eq__(self, other: object) -> bool:
        CountedKey.compared += 1
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        CountedKey.compared += 1
        return str.__ne__(self, other)


@pytest.mark.parametrize("kind", ["fanout", "headers"])
def test_many_bindings_to_one_destination_are_found_without_a_scan(kind, monkeypatch) -> None:
    """Each bind, bind again and unbind of one of n bindings of one queue compares a bounded
    number of keys and argument tables, however many bindings the queue has: the search
    used to go through all of them (n**2 / 2 in all: minutes at 100,000)."""
    keyed = {"calls": 0}
    real_arguments_key = bindings.arguments_key

    def arguments_key(arguments):
        keyed["calls"] += 1
        return real_arguments_key(arguments)

    monkeypatch.setattr(bindings, "arguments_key", arguments_key)
    n = 2000
    idx = make_index(kind)

    def binding(i: int) -> tuple[str, str, dict | None]:  # new key objects every time
        if kind == "fanout":
            return CountedKey(f"k{i}"), "q", None
        return CountedKey(""), "q", {"x-match": ("S", b"all"), "h": ("I", i)}

    order = list(range(n))
    random.Random(7).shuffle(order)
    for op, expected, ids in (
        (idx.bind, True, range(n)),
        (idx.bind, False, range(n)),
        (idx.unbind, True, order),
        (idx.unbind, False, order),
    ):
        CountedKey.compared = keyed["calls"] = 0
        assert all(op(*binding(i)) is expected for i in ids)
        assert CountedKey.compared <= 3 * n, (op.__name__, expected, CountedKey.compared)
        assert keyed["calls"] <= 4 * n, (op.__name__, expected, keyed["calls"])
        if op == idx.bind:
            assert len(idx) == n and idx.route("x", {"h": 5}) == {"q"}
            idx.check_ids()
    assert len(idx) == 0 and not idx._ident
    idx.check_ids()


@pytest.mark.parametrize("index", [FanoutIndex, HeadersIndex])
def test_an_identity_dict_from_identify_from_bindings_until_few_are_left(index: type) -> None:
    idx = index()
    many, few = bindings.IDENTIFY_FROM, bindings.IDENTIFY_FROM // 2
    args = [{"x-match": "any", "h": i} for i in range(many)]
    for i in range(many - 1):
        assert idx.bind("", "q", args[i]) and idx.bind(f"k{i}", "r")
    assert not idx._ident  # a short scan finds them
    assert idx.bind("", "q", args[-1])
    assert set(idx._ident) == {"q"}
    idx.check_ids()
    assert not idx.bind("", "q", {"h": ("I", 0), "x-match": ("S", b"any")})  # the same table
    assert idx.bind("", "q", {"x-match": "any", "h": ("l", 0)})  # another type: another one
    assert idx.unbind("", "q", {"x-match": "any", "h": ("l", 0)})
    for i in range(many - few):
        assert idx.unbind("", "q", args[i])
        assert not idx.unbind("", "q", args[i])
    assert set(idx._ident) == {"q"}  # not dropped and made again as the count wavers
    idx.check_ids()
    assert idx.unbind("", "q", args[many - few])
    assert not idx._ident
    idx.check_ids()
    assert idx.route("", {"h": many - 1}) == {"q", "r"}  # r's bindings have no criteria
    assert idx.remove_destination("q") == few - 1 and len(idx) == many - 1
    idx.check_ids()


def test_a_buried_destination_keeps_its_identity_dict_until_swept() -> None:
    """A large removal leaves the destination's dict to ``sweep`` with the rest; a binding
    bound again meanwhile is a new one, found again, and outlives the old ones' sweep."""
    idx = FanoutIndex()
    n = bindings.LAZY_REMOVAL
    for i in range(n):
        idx.bind(f"k{i}", "q")
    assert idx.remove_destination("q") == n
    assert len(idx._ident["q"]) == n  # nothing freed in the removal's turn
    assert not idx.unbind("k1", "q") and idx.bind("k1", "q") and not idx.bind("k1", "q")
    assert set(bindings.ids_iter(idx._ident["q"]["k1"])) == {1, n}  # buried, and new
    idx.check_ids()
    while idx.sweep(100):
        idx.check_ids()
    assert not idx._ident  # one binding left: found by the scan again
    assert [(k, d) for k, d, _ in idx.bindings()] == [("k1", "q")]
    assert not idx.bind("k1", "q")
    assert idx.unbind("k1", "q") and idx.route("x") == set()


IDENTITY_KEYS = ["", "a", "b"]
IDENTITY_ARGS = st.one_of(
    st.none(),
    st.dictionaries(st.sampled_from(["x-a", "b"]), header_values, max_size=2),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(
        st.tuples(
            st.booleans(),
            st.sampled_from(IDENTITY_KEYS),
            st.sampled_from("qr"),
            IDENTITY_ARGS,
        ),
        max_size=40,
    )
)
def test_identity_dicts_answer_as_the_scan_does(ops: list) -> None:
    """Equal argument tables (typed or not, nested) are one binding, unequal ones two, the
    same with every destination's identity dict as with none, colliding buckets or not."""
    saved = bindings.IDENTIFY_FROM, bindings.bucket
    answers = []
    try:
        for identify_from, bucket in ((10**9, saved[1]), (2, saved[1]), (2, coarse_bucket)):
            bindings.IDENTIFY_FROM, bindings.bucket = identify_from, bucket
            idx = FanoutIndex()
            answers.append([(idx.bind if bind else idx.unbind)(k, d, a) for bind, k, d, a in ops])
            idx.check_ids()
            answers.append(sorted(map(repr, idx.bindings())))
    finally:
        bindings.IDENTIFY_FROM, bindings.bucket = saved
    assert answers[0::2] == [answers[0]] * 3
    assert answers[1::2] == [answers[1]] * 3


class FanoutDirectMachine(RuleBasedStateMachine):
    """FanoutIndex or DirectIndex against a plain dict of bindings."""

    def __init__(self) -> None:
        super().__init__()
        self.model: dict[tuple[str, str, int], object] = {}

    @initialize(kind=st.sampled_from([FanoutIndex, DirectIndex]))
    def setup(self, kind: type) -> None:
        self.idx = kind()

    @rule(key=st.sampled_from(IDENTITY_KEYS), dest=st.sampled_from(DESTS), arg=ARG_INDEX)
    def bind(self, key: str, dest: str, arg: int) -> None:
        ident = (key, dest, ARG_CLASS[arg])
        assert self.idx.bind(key, dest, ARGS[arg]) is (ident not in self.model)
        self.model.setdefault(ident, ARGS[arg])

    @rule(key=st.sampled_from(IDENTITY_KEYS), dest=st.sampled_from(DESTS), arg=ARG_INDEX)
    def unbind(self, key: str, dest: str, arg: int) -> None:
        ident = (key, dest, ARG_CLASS[arg])
        assert self.idx.unbind(key, dest, ARGS[arg]) is (ident in self.model)
        self.model.pop(ident, None)

    @rule(dest=st.sampled_from(DESTS))
    def remove_destination(self, dest: str) -> None:
        kept = {ident: args for ident, args in self.model.items() if ident[1] != dest}
        assert self.idx.remove_destination(dest) == len(self.model) - len(kept)
        self.model = kept

    @rule(key=st.sampled_from(IDENTITY_KEYS))
    def route(self, key: str) -> None:
        fanout = isinstance(self.idx, FanoutIndex)
        assert self.idx.route(key) == {d for k, d, _ in self.model if fanout or k == key}

    @invariant()
    def consistent(self) -> None:
        if hasattr(self, "idx"):
            self.idx.check_ids()
            listed = Counter(repr(binding) for binding in self.idx.bindings())
            model = ((k, d, args or None) for (k, d, _), args in self.model.items())
            assert listed == Counter(map(repr, model)) and len(self.idx) == len(self.model)


FanoutDirectMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None
)
test_fanout_direct_state_machine = FanoutDirectMachine.TestCase


class LazyRemovalFanoutDirectMachine(LazyRemovalRules, FanoutDirectMachine):
    """The same with removals left to ``sweep`` and identity dicts from a few bindings on."""


LazyRemovalFanoutDirectMachine.TestCase.settings = FanoutDirectMachine.TestCase.settings
test_fanout_direct_state_machine_with_lazy_removal = LazyRemovalFanoutDirectMachine.TestCase
