"""The `x-delay` rule and the `x-delayed-type` checks, as the delayed-message plugin reads
them (rabbit_delayed_message_utils:get_delay, rabbit_exchange_type_delayed_message:validate)."""

from __future__ import annotations

import datetime
from decimal import Decimal

import pytest

from roarmq.broker.routing import EXCHANGE_TYPES, make_index
from roarmq.broker.routing.delayed import (
    MAX_DELAY_MS,
    DelayedIndex,
    RefusedArguments,
    UnknownExchangeType,
    delay_of,
)


@pytest.mark.parametrize(
    ("value", "delay"),
    [
        (1, 1),
        (5000, 5000),
        (MAX_DELAY_MS, MAX_DELAY_MS),
        (("l", 250), 250),  # a typed header
        (("B", 7), 7),
        ("1500", 1500),  # numeric strings are parsed
        ("+20", 20),
        (b"30", 30),
        (1.9, 1),  # floats are truncated
        (2500.99, 2500),
        # routed at once: not in 0 < delay <= 2^32 - 1
        (0, None),
        (-5, None),
        (MAX_DELAY_MS + 1, None),
        ("0", None),
        ("-100", None),
        (0.5, None),
        (-1.5, None),
        (float("inf"), None),
        (float("nan"), None),
        # routed at once: not an integer, a numeric string or a float
        ("abc", None),
        ("1.5", None),
        (" 100", None),
        ("", None),
        (True, None),
        (Decimal("100"), None),
        (datetime.datetime(2030, 1, 1), None),
        ({"a": 1}, None),
        ([100], None),
    ],
)
def test_delay_of_reads_x_delay_as_the_plugin(value, delay):
    assert delay_of({"x-delay": value}) == delay


def test_no_headers_or_no_x_delay_is_no_delay():
    assert delay_of(None) is None
    assert delay_of({}) is None
    assert delay_of({"x-delay-ms": 100}) is None


@pytest.mark.parametrize("underlying", ["direct", "fanout", "topic", "headers"])
def test_the_index_routes_as_its_underlying_type_and_sends_delays_to_its_schedule(underlying):
    index = make_index("x-delayed-message", {"x-delayed-type": underlying})
    plain = make_index(underlying)
    assert isinstance(index, DelayedIndex) and index.delayed_type == underlying
    for key, dest, args in [("a.b", "q1", {"x-match": "any", "k": 1}), ("a.*", "q2", None)]:
        index.bind(key, dest, args)
        plain.bind(key, dest, args)
    assert sorted(index.bindings(), key=repr) == sorted(plain.bindings(), key=repr)
    schedule = object()
    index.schedule = schedule
    for key, headers in [("a.b", {"k": 1}), ("a.c", None), ("x", {"k": 2})]:
        assert set(index.route(key, headers)) == set(plain.route(key, headers))
        assert list(index.route(key, {**(headers or {}), "x-delay": 10})) == [schedule]
        # the form a message leaves the schedule in is routed, never delayed again
        assert set(index.route(key, {**(headers or {}), "x-delay": -10})) == set(
            plain.route(key, headers)
        )


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        (None, "Invalid argument, 'x-delayed-type' must be an existing exchange type"),
        (
            {"x-delayed-type": 5},
            "Invalid argument, 'x-delayed-type' must be an existing exchange type",
        ),
        (
            {"x-delayed-type": "x-delayed-message"},
            "Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'",
        ),
    ],
)
def test_x_delayed_type_is_checked_as_the_plugin_does(arguments, text):
    with pytest.raises(RefusedArguments) as refused:
        make_index("x-delayed-message", arguments)
    assert str(refused.value) == text


def test_an_unknown_underlying_type_is_an_unknown_exchange_type():
    with pytest.raises(UnknownExchangeType) as refused:
        make_index("x-delayed-message", {"x-delayed-type": "nope"})
    assert refused.value.name == "nope"


def test_the_type_is_registered_with_the_plugins_description():
    assert EXCHANGE_TYPES["x-delayed-message"].description == "Delayed Message Exchange."
