"""Hypothesis strategies and binding arguments the routing tests share (tests/routing):
header values as AMQP tables carry them, and binding arguments with the identity class each
belongs to."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import strategies as st

DESTS = ["q0", "q1", "q2", "q3"]
# Binding arguments and the identity class each belongs to (None == {}, 1 == ("I", 1)).
ARGS = [None, {}, {"x-a": 1}, {"x-a": ("I", 1)}, {"x-a": ("l", 1)}, {"x-a": "s"}]
ARG_CLASS = [0, 0, 1, 1, 2, 3]

typed_values = st.one_of(
    st.tuples(st.sampled_from("bBsuIilT"), st.integers(-2, 2)),
    st.tuples(st.sampled_from("fd"), st.sampled_from([0.0, 1.0, -1.0, 2.5])),
    st.tuples(st.just("t"), st.booleans()),
    st.tuples(st.sampled_from("Sx"), st.sampled_from([b"", b"1", b"a"])),
    st.tuples(st.just("S"), st.sampled_from(["", "1", "a"])),
    st.tuples(st.just("V"), st.none()),
    st.tuples(st.just("D"), st.sampled_from([Decimal("1"), Decimal("1.0"), Decimal("-1")])),
)
plain_values = st.one_of(
    st.integers(-2, 2), st.booleans(), st.none(), st.sampled_from(["", "1", 1.0, b"a"])
)
leaf_values = st.one_of(typed_values, plain_values)
header_values = st.one_of(
    leaf_values,
    st.tuples(st.just("F"), st.dictionaries(st.sampled_from("kj"), leaf_values, max_size=2)),
    st.tuples(st.just("A"), st.lists(leaf_values, max_size=2)),
    st.lists(plain_values, max_size=2),
)
