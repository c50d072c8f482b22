"""Property tests: TopicIndex against the regex reference, including a stateful interleaving of
bind, unbind, remove_destination and route with caches small enough to evict constantly, and
the same with removals left to ``sweep`` (buried bindings that routes must skip)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from support.routing_lazy import LazyRemovalRules
from support.routing_reference import amqp_match, mqtt_match, mqtt_valid, routed
from support.routing_strategies import ARG_CLASS, ARGS, DESTS

from roarmq.broker.routing import TopicIndex, key_cache

WORDS = ["a", "b", "", "ab", "*x", "#y", "+", "$s", "\udcff"]


def _joined(tokens: list[str], sep: str, max_size: int) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(tokens), max_size=max_size).map(sep.join)


PATTERNS = {
    "amqp": st.one_of(
        _joined(WORDS + ["*", "#", "*", "#"], ".", 6), st.text(alphabet="ab.*#", max_size=9)
    ),
    "mqtt": st.one_of(
        _joined(WORDS + ["+", "#", "+", "#"], "/", 6), st.text(alphabet="ab/+#$", max_size=9)
    ),
}
KEYS = {
    "amqp": st.one_of(_joined(WORDS, ".", 7), st.text(alphabet="ab.*#", max_size=9)),
    "mqtt": st.one_of(_joined(WORDS, "/", 7), st.text(alphabet="ab/+#$", max_size=9)),
}
REFERENCE = {"amqp": amqp_match, "mqtt": mqtt_match}


def _valid(syntax: str, pattern: str) -> bool:
    return syntax == "amqp" or mqtt_valid(pattern)


@pytest.mark.slow  # 1,500 Hypothesis examples a syntax: not in `make check`
@pytest.mark.parametrize("syntax", ["amqp", "mqtt"])
def test_route_matches_reference(syntax: str) -> None:
    reference = REFERENCE[syntax]

    @settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        bound=st.lists(st.tuples(PATTERNS[syntax], st.sampled_from(DESTS)), max_size=12),
        probes=st.lists(KEYS[syntax], min_size=1, max_size=8),
        cache_keys=st.sampled_from([0, 1, 3, 100]),
        route_first=st.booleans(),
    )
    def check(
        bound: list[tuple[str, str]], probes: list[str], cache_keys: int, route_first: bool
    ) -> None:
        idx = TopicIndex(syntax=syntax, cache_keys=cache_keys)
        if route_first:  # cache the keys first, so binds must patch the cache
            for key in probes:
                idx.route(key)
        valid = []
        for pattern, dest in bound:
            if _valid(syntax, pattern):
                idx.bind(pattern, dest)
                valid.append((pattern, dest))
            else:
                with pytest.raises(ValueError):
                    idx.bind(pattern, dest)
        for key in probes + probes:  # the second pass hits the cache
            expected = {d for p, d in valid if reference(p, key)}
            assert routed(idx, key) == expected, (key, valid)
        idx.check_invariants()

    check()


class TopicMachine(RuleBasedStateMachine):
    """Drive TopicIndex and a plain set of bindings through the same operations."""

    def __init__(self) -> None:
        super().__init__()
        self.model: dict[tuple[str, str, int], object] = {}

    @initialize(syntax=st.sampled_from(["amqp", "mqtt"]), cache_keys=st.sampled_from([0, 1, 2, 4]))
    def setup(self, syntax: str, cache_keys: int) -> None:
        self.syntax = syntax
        self.idx = TopicIndex(syntax=syntax, cache_keys=cache_keys)

    @rule(data=st.data(), dest=st.sampled_from(DESTS), arg=st.integers(0, len(ARGS) - 1))
    def bind(self, data: st.DataObject, dest: str, arg: int) -> None:
        pattern = data.draw(PATTERNS[self.syntax])
        if not _valid(self.syntax, pattern):
            with pytest.raises(ValueError):
                self.idx.bind(pattern, dest, ARGS[arg])
            return
        ident = (pattern, dest, ARG_CLASS[arg])
        assert self.idx.bind(pattern, dest, ARGS[arg]) is (ident not in self.model)
        self.model.setdefault(ident, ARGS[arg])

    @rule(data=st.data())
    def unbind_existing(self, data: st.DataObject) -> None:
        if not self.model:
            return
        pattern, dest, cls = data.draw(st.sampled_from(sorted(self.model)))
        arg = data.draw(st.sampled_from([i for i, c in enumerate(ARG_CLASS) if c == cls]))
        assert self.idx.unbind(pattern, dest, ARGS[arg]) is True
        del self.model[(pattern, dest, cls)]

    @rule(data=st.data(), dest=st.sampled_from(DESTS), arg=st.integers(0, len(ARGS) - 1))
    def unbind_any(self, data: st.DataObject, dest: str, arg: int) -> None:
        pattern = data.draw(PATTERNS[self.syntax])
        ident = (pattern, dest, ARG_CLASS[arg])
        assert self.idx.unbind(pattern, dest, ARGS[arg]) is (ident in self.model)
        self.model.pop(ident, None)

    @rule(dest=st.sampled_from(DESTS))
    def remove_destination(self, dest: str) -> None:
        doomed = [ident for ident in self.model if ident[1] == dest]
        assert self.idx.remove_destination(dest) == len(doomed)
        for ident in doomed:
            del self.model[ident]

    @rule(data=st.data())
    def route(self, data: st.DataObject) -> None:
        key = data.draw(KEYS[self.syntax])
        reference = REFERENCE[self.syntax]
        expected = {d for p, d, _ in self.model if reference(p, key)}
        assert routed(self.idx, key) == expected
        assert routed(self.idx, key) == expected

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "idx"):
            return
        self.idx.check_invariants()
        assert len(self.idx) == len(self.model)
        assert self.idx.has_bindings() is bool(self.model)
        listed = sorted((k, d, repr(a)) for k, d, a in self.idx.bindings())
        assert listed == sorted((k, d, repr(a or None)) for (k, d, _), a in self.model.items())


TopicMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
# 300 Hypothesis runs: not in `make check`
test_topic_state_machine = pytest.mark.slow(TopicMachine.TestCase)


class FlushingTopicMachine(TopicMachine):
    """The same operations with patch budgets so small that most binds flush the cache."""

    def __init__(self) -> None:
        super().__init__()
        self._saved = (key_cache.PATCH_BUDGET, key_cache.VERIFY_BUDGET)
        key_cache.PATCH_BUDGET, key_cache.VERIFY_BUDGET = 1, 0

    def teardown(self) -> None:
        key_cache.PATCH_BUDGET, key_cache.VERIFY_BUDGET = self._saved


FlushingTopicMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_topic_state_machine_with_cache_flushes = FlushingTopicMachine.TestCase


class LazyRemovalTopicMachine(LazyRemovalRules, TopicMachine):
    """The same operations with removals left to ``sweep`` (``LazyRemovalRules``)."""


LazyRemovalTopicMachine.TestCase.settings = TopicMachine.TestCase.settings
test_topic_state_machine_with_lazy_removal = LazyRemovalTopicMachine.TestCase


def test_bind_against_a_full_cache_of_long_keys_is_bounded():
    """10,000 cached 121-word keys, then `#.zzN.#` binds: each flushes, routing stays exact."""
    idx = TopicIndex(cache_keys=10_000)
    idx.bind("k0.#", "q-all")
    keys = [
        ".".join([f"k{i % 7}", f"n{i}"] + [f"w{(i + j) % 50}" for j in range(119)])
        for i in range(10_000)
    ]
    for key in keys:
        idx.route(key)
    assert idx.cached_keys() == 10_000
    for n in range(20):
        idx.bind(f"#.zz{n}.#", f"q{n}")
        assert idx.cached_keys() == 0  # too many candidates to verify: flushed, not scanned
    assert routed(idx, keys[0]) == {"q-all"}
    assert routed(idx, "a.zz3.b") == {"q3"}
    idx.check_invariants()
