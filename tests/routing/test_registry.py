"""The exchange types registry: one registration names a type, its index and its description."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from roarmq.broker.core import exchange
from roarmq.broker.management.node import _exchange_types
from roarmq.broker.routing import (
    EXCHANGE_TYPES,
    DelayedIndex,
    DirectIndex,
    FanoutIndex,
    HeadersIndex,
    TopicIndex,
    make_index,
    register_exchange_type,
)


@pytest.fixture
def scratch_type() -> Iterator[str]:
    name = "x-test-direct"
    yield name
    EXCHANGE_TYPES.pop(name, None)


def test_the_four_amqp_types_in_order_then_the_delayed_one() -> None:
    assert list(EXCHANGE_TYPES) == ["direct", "fanout", "topic", "headers", "x-delayed-message"]
    assert {n: t.index for n, t in EXCHANGE_TYPES.items()} == {
        "direct": DirectIndex,
        "fanout": FanoutIndex,
        "topic": TopicIndex,
        "headers": HeadersIndex,
        "x-delayed-message": DelayedIndex,
    }
    for name, kind in list(EXCHANGE_TYPES.items())[:4]:
        assert kind.description == f"AMQP {name} exchange, as per the AMQP specification"
        assert isinstance(make_index(name), kind.index)
    assert exchange.EXCHANGE_TYPES is EXCHANGE_TYPES  # the declare path reads the registry


def test_overview_lists_the_registry_by_name() -> None:
    assert [t["name"] for t in _exchange_types()] == [
        "direct",
        "fanout",
        "headers",
        "topic",
        "x-delayed-message",
    ]
    assert all(t["enabled"] is True for t in _exchange_types())


def test_one_registration_adds_a_type(scratch_type: str) -> None:
    kind = register_exchange_type(scratch_type, DirectIndex, "A test exchange")
    assert EXCHANGE_TYPES[scratch_type] is kind
    index = make_index(scratch_type, {"any": "thing"}, cache_keys=3)
    assert isinstance(index, DirectIndex)
    assert {"name": scratch_type, "description": "A test exchange", "enabled": True} in (
        _exchange_types()
    )
    with pytest.raises(ValueError, match="already registered"):
        register_exchange_type(scratch_type, FanoutIndex, "again")


def test_unknown_type_error_is_rabbitmqs() -> None:
    error = exchange.unknown_exchange_type("x-nope")
    assert (error.reply_code, error.text, error.class_id, error.method_id) == (
        503,
        "unknown exchange type 'x-nope'",
        40,
        10,
    )
    with pytest.raises(ValueError, match="unknown exchange type 'x-nope'"):
        make_index("x-nope")
