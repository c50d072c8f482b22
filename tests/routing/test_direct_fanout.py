"""DirectIndex, FanoutIndex and make_index."""

from __future__ import annotations

import pytest

from roarmq.broker.routing import (
    DirectIndex,
    FanoutIndex,
    HeadersIndex,
    TopicIndex,
    bindings,
    make_index,
)


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
