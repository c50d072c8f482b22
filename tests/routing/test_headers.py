"""HeadersIndex: RabbitMQ's x-match semantics, typed equality, and properties against a
transcription of rabbit_exchange_type_headers:headers_match/2."""

from __future__ import annotations

import datetime
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from support.routing_lazy import LazyRemovalRules
from support.routing_reference import headers_match
from support.routing_strategies import header_values

from roarmq.broker.routing import HeadersIndex, InvalidBinding


def route1(args: dict | None, headers: dict | None) -> bool:
    idx = HeadersIndex()
    idx.bind("", "q", args)
    return idx.route("", headers) == {"q"}


def test_all_and_any() -> None:
    args = {"x-match": "all", "a": 1, "b": "x"}
    assert route1(args, {"a": 1, "b": "x"})
    assert route1(args, {"a": 1, "b": "x", "c": 3})
    assert not route1(args, {"a": 1})
    assert not route1(args, {"a": 2, "b": "x"})
    assert not route1(args, None)
    anyargs = {"x-match": "any", "a": 1, "b": "x"}
    assert route1(anyargs, {"a": 1})
    assert route1(anyargs, {"b": "x", "z": 0})
    assert not route1(anyargs, {"a": 2})
    assert not route1(anyargs, {})


def test_default_is_all() -> None:
    assert route1({"a": 1, "b": 2}, {"a": 1, "b": 2})
    assert not route1({"a": 1, "b": 2}, {"a": 1})


def test_no_criteria() -> None:
    assert route1({}, None)
    assert route1(None, {"a": 1})
    assert route1({"x-match": "all"}, None)
    assert not route1({"x-match": "any"}, {"a": 1})
    assert route1({"x-match": "all", "x-foo": 1}, {})  # x- names are not criteria ...
    assert not route1({"x-match": "any", "x-foo": 1}, {"x-foo": 1})


def test_with_x_variants() -> None:
    assert route1({"x-match": "all-with-x", "x-foo": 1}, {"x-foo": 1})
    assert not route1({"x-match": "all-with-x", "x-foo": 1}, {})
    assert route1({"x-match": "any-with-x", "x-foo": 1, "a": 2}, {"x-foo": 1})
    assert not route1({"x-match": "any-with-x", "x-foo": 1}, {"x-foo": 2})
    # x-match itself is never a criterion, even in the -with-x modes.
    assert route1({"x-match": "all-with-x"}, {})


def test_void_means_presence() -> None:
    assert route1({"a": None}, {"a": "anything"})
    assert route1({"a": ("V", None)}, {"a": ("V", None)})
    assert route1({"a": None}, {"a": ("I", 7)})
    assert not route1({"a": None}, {"b": 1})
    assert not route1({"a": 1}, {"a": None})  # a void header equals no value


def test_typed_equality_is_erlang_value_equality() -> None:
    # rabbit_exchange_type_headers compares PV == DV and ignores the field types.
    assert route1({"a": ("I", 1)}, {"a": ("l", 1)})
    assert route1({"a": ("I", 1)}, {"a": ("d", 1.0)})
    assert route1({"a": ("b", 1)}, {"a": ("T", 1)})
    assert route1({"a": ("S", "x")}, {"a": ("x", b"x")})
    assert route1({"a": "x"}, {"a": ("S", b"x")})
    assert not route1({"a": ("t", True)}, {"a": ("I", 1)})
    assert not route1({"a": True}, {"a": 1})
    assert route1({"a": False}, {"a": ("t", False)})
    assert not route1({"a": ("S", "1")}, {"a": ("I", 1)})
    # decimals compare as (scale, unscaled): 1.0 is not 1.00
    assert route1({"a": Decimal("1.0")}, {"a": ("D", Decimal("1.0"))})
    assert not route1({"a": Decimal("1.0")}, {"a": ("D", Decimal("1.00"))})
    # timestamps are integers
    when = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
    assert route1({"a": when}, {"a": ("T", int(when.timestamp()))})
    assert route1({"a": ("l", int(when.timestamp()))}, {"a": when})
    # nested tables and arrays: types count inside, and an empty table equals an empty array
    assert route1({"a": {"k": 1}}, {"a": ("F", {"k": ("I", 1)})})
    assert not route1({"a": {"k": 1}}, {"a": ("F", {"k": ("l", 1)})})
    assert route1({"a": [1, "x"]}, {"a": ("A", [("I", 1), ("S", b"x")])})
    assert not route1({"a": [1]}, {"a": ("A", [("d", 1.0)])})
    assert route1({"a": ("F", {})}, {"a": ("A", [])})
    assert not route1({"a": {"k": 1, "j": 2}}, {"a": {"j": 2, "k": 1}})  # order counts


def test_invalid_x_match() -> None:
    idx = HeadersIndex()
    with pytest.raises(InvalidBinding) as err:
        idx.bind("", "q", {"x-match": "some"})
    assert str(err.value) == (
        'Invalid x-match field value <<"some">>; expected all, any, all-with-x, or any-with-x'
    )
    with pytest.raises(ValueError, match=r"Invalid x-match field type signedint \(value 1\)"):
        idx.bind("", "q", {"x-match": 1})
    with pytest.raises(ValueError, match="Invalid x-match field type binary"):
        idx.bind("", "q", {"x-match": b"all"})
    assert len(idx) == 0
    assert idx.bind("", "q", {"x-match": ("S", b"any"), "a": 1})


def test_dedupe_idempotence_and_remove_destination() -> None:
    idx = HeadersIndex()
    assert idx.bind("", "q", {"a": 1})
    assert not idx.bind("", "q", {"a": ("I", 1)})
    assert idx.bind("rk", "q", {"a": 1})  # the binding key is part of the identity
    assert idx.bind("", "q", {"x-match": "any", "a": 1, "b": 2})
    assert idx.bind("", "r", {})
    assert idx.route("whatever", {"a": 1}) == {"q", "r"}
    assert len(idx) == 4
    assert idx.unbind("rk", "q", {"a": ("I", 1)})
    assert not idx.unbind("rk", "q", {"a": ("I", 1)})
    assert not idx.unbind("", "q", {"x-match": "bogus"})
    assert idx.remove_destination("q") == 2
    assert idx.route("", {"a": 1}) == {"r"}
    assert idx.remove_destination("r") == 1
    assert idx.route("", None) == set()
    assert not idx.has_bindings()


NAMES = ["a", "b", "c", "x-a"]
modes = st.sampled_from([None, "all", "any", "all-with-x", "any-with-x", ("S", b"any")])


@st.composite
def binding_args(draw: st.DrawFn) -> dict:
    args = draw(st.dictionaries(st.sampled_from(NAMES), header_values, max_size=3))
    mode = draw(modes)
    if mode is not None:
        args["x-match"] = mode
    return args


headers_tables = st.one_of(
    st.none(), st.dictionaries(st.sampled_from(NAMES), header_values, max_size=4)
)


@pytest.mark.slow  # 1,000 Hypothesis examples: not in `make check`
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    bound=st.lists(st.tuples(binding_args(), st.sampled_from("qrs")), max_size=8),
    messages=st.lists(headers_tables, min_size=1, max_size=6),
)
def test_route_matches_reference(bound: list[tuple[dict, str]], messages: list) -> None:
    idx = HeadersIndex()
    for args, dest in bound:
        idx.bind("", dest, args)
    for headers in messages:
        expected = {d for a, d in bound if headers_match(a, headers)}
        assert idx.route("", headers) == expected, headers


class HeadersMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.idx = HeadersIndex()
        self.model: list[tuple[str, str, dict]] = []

    def _same(self, key: str, dest: str, args: dict) -> int | None:
        from roarmq.broker.routing.fields import arguments_key

        for i, (k, d, a) in enumerate(self.model):
            if k == key and d == dest and arguments_key(a) == arguments_key(args):
                return i
        return None

    @rule(key=st.sampled_from(["", "k"]), dest=st.sampled_from("qrs"), args=binding_args())
    def bind(self, key: str, dest: str, args: dict) -> None:
        new = self._same(key, dest, args) is None
        assert self.idx.bind(key, dest, args) is new
        if new:
            self.model.append((key, dest, args))

    @rule(data=st.data())
    def unbind_existing(self, data: st.DataObject) -> None:
        if self.model:
            key, dest, args = data.draw(st.sampled_from(self.model))
            assert self.idx.unbind(key, dest, args)
            self.model.remove((key, dest, args))

    @rule(dest=st.sampled_from("qrs"))
    def remove_destination(self, dest: str) -> None:
        doomed = [b for b in self.model if b[1] == dest]
        assert self.idx.remove_destination(dest) == len(doomed)
        self.model = [b for b in self.model if b[1] != dest]

    @rule(headers=headers_tables)
    def route(self, headers: dict | None) -> None:
        expected = {d for _, d, a in self.model if headers_match(a, headers)}
        assert self.idx.route("", headers) == expected

    @invariant()
    def sizes(self) -> None:
        assert len(self.idx) == len(self.model)


HeadersMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# 200 Hypothesis runs: not in `make check`
test_headers_state_machine = pytest.mark.slow(HeadersMachine.TestCase)


class LazyRemovalHeadersMachine(LazyRemovalRules, HeadersMachine):
    """The same with removals left to ``sweep`` (``LazyRemovalRules``)."""

    @invariant()
    def listed(self) -> None:
        self.idx.check_ids()
        listed = sorted(map(repr, self.idx.bindings()))
        assert listed == sorted(repr((k, d, a or None)) for k, d, a in self.model)


LazyRemovalHeadersMachine.TestCase.settings = settings(
    HeadersMachine.TestCase.settings, max_examples=100
)
test_headers_state_machine_with_lazy_removal = LazyRemovalHeadersMachine.TestCase


def test_all_counts_hits_across_headers() -> None:
    idx = HeadersIndex()
    idx.bind("", "A", {"a": 1, "b": 1})
    idx.bind("", "B", {"b": 1, "c": 1})
    idx.bind("", "C", {"a": 1, "b": 1, "c": 1, "d": 1})
    assert idx.route("", {"a": 1, "b": 1, "c": 1}) == {"A", "B"}
    assert idx.route("", {"c": 1, "b": 1, "a": 1, "d": 1}) == {"A", "B", "C"}


dense_args = st.dictionaries(
    st.sampled_from("abcd"), st.sampled_from([1, 2, None]), max_size=4
).flatmap(lambda d: st.sampled_from(["all", "any"]).map(lambda m: {**d, "x-match": m}))
dense_headers = st.dictionaries(st.sampled_from("abcd"), st.sampled_from([1, 2]), max_size=4)


@pytest.mark.slow  # 1,000 Hypothesis examples: not in `make check`
@settings(max_examples=1000, deadline=None)
@given(
    bound=st.lists(dense_args, max_size=10),
    messages=st.lists(dense_headers, min_size=1, max_size=6),
)
def test_dense_criteria_match_reference(bound: list[dict], messages: list[dict]) -> None:
    idx = HeadersIndex()
    for i, args in enumerate(bound):
        idx.bind("", i, args)
    for headers in messages:
        expected = {i for i, a in enumerate(bound) if headers_match(a, headers)}
        assert idx.route("", headers) == expected, headers
