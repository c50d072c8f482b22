"""Example-based edge cases for TopicIndex (AMQP and MQTT syntax)."""

from __future__ import annotations

import gc
import weakref

import pytest
from support.routing_reference import amqp_match, mqtt_match, routed

from roarmq.broker.routing import TopicIndex

# (pattern, routing key, matches?) -- RabbitMQ semantics: "" is zero words, "a..b" three.
AMQP_CASES = [
    ("#", "", True),
    ("*", "", False),
    ("", "", True),
    ("", "a", False),
    ("#", "a.b.c", True),
    ("#.#", "", True),
    ("#.#", "a", True),
    ("#.#", "a.b.c", True),
    ("a.#.#.b", "a.b", True),
    ("a.#.#.b", "a.x.b", True),
    ("a.#.#.b", "a.x.y.z.b", True),
    ("a.#.#.b", "a.x.y", False),
    ("*.#", "", False),
    ("*.#", "a", True),
    ("*.#", "a.b.c", True),
    ("#.*", "", False),
    ("#.*", "a", True),
    ("#.*", "a.b", True),
    ("#.a.#", "a", True),
    ("#.a.#", "x.a", True),
    ("#.a.#", "a.x", True),
    ("#.a.#", "x.a.y", True),
    ("#.a.#", "x.y", False),
    ("#.a.#", "", False),
    ("*", ".", False),
    ("*.*", ".", True),
    ("#", ".", True),
    ("a.*", "a.", True),
    ("a", "a.", False),
    ("a.#", "a", True),
    ("a.#", "a.", True),
    ("a.*.b", "a..b", True),
    ("a..b", "a..b", True),
    ("a..b", "a.b", False),
    ("*.*.*", "a..b", True),
    ("a.*", "a", False),
    ("*", "*", True),
    ("a*", "ab", False),
    ("a*", "a*", True),
    ("a.#b", "a.#b", True),
    ("a.#b", "a.x", False),
    ("\udcff.*", "\udcff.x", True),  # surrogateescape'd bytes are ordinary word characters
]


@pytest.mark.parametrize(("pattern", "key", "expected"), AMQP_CASES)
@pytest.mark.parametrize("cache_keys", [0, 1, 10000])
def test_amqp_semantics(pattern: str, key: str, expected: bool, cache_keys: int) -> None:
    assert amqp_match(pattern, key) is expected  # the reference agrees with the table
    idx = TopicIndex(cache_keys=cache_keys)
    idx.bind(pattern, "q")
    assert (routed(idx, key) == {"q"}) is expected
    assert (routed(idx, key) == {"q"}) is expected  # second lookup is the cached one


@pytest.mark.parametrize(("pattern", "key", "expected"), AMQP_CASES)
def test_amqp_bind_after_key_is_cached(pattern: str, key: str, expected: bool) -> None:
    idx = TopicIndex()
    idx.bind("unrelated.pattern.#", "other")
    assert routed(idx, key) == set()  # the key is now cached ...
    idx.bind(pattern, "q")  # ... and the new pattern must patch it
    assert (routed(idx, key) == {"q"}) is expected
    idx.check_invariants()
    idx.unbind(pattern, "q")
    assert routed(idx, key) == set()
    idx.check_invariants()


MQTT_CASES = [
    ("a/#", "a", True),
    ("a/#", "a/", True),
    ("a/#", "a/b/c", True),
    ("a/#", "ab", False),
    ("#", "a/b", True),
    ("#", "", True),
    ("#", "/", True),
    ("+", "", True),
    ("+", "a", True),
    ("+", "a/b", False),
    ("+/+", "/", True),
    ("a/+", "a", False),
    ("a/+", "a/", True),
    ("a/+/c", "a/b/c", True),
    ("+/#", "a", True),
    ("a.b", "a.b", True),
    ("a/*", "a/x", False),
    ("a/*", "a/*", True),
    ("#", "$SYS/x", False),
    ("+/x", "$SYS/x", False),
    ("$SYS/#", "$SYS/x", True),
    ("$SYS/+", "$SYS/x", True),
    ("a/#", "a/$x", True),
    ("/finance", "/finance", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
]


@pytest.mark.parametrize(("pattern", "key", "expected"), MQTT_CASES)
@pytest.mark.parametrize("cache_first", [False, True])
def test_mqtt_semantics(pattern: str, key: str, expected: bool, cache_first: bool) -> None:
    assert mqtt_match(pattern, key) is expected
    idx = TopicIndex(syntax="mqtt")
    if cache_first:
        idx.route(key)
    idx.bind(pattern, "q")
    assert (routed(idx, key) == {"q"}) is expected
    assert (routed(idx, key) == {"q"}) is expected
    idx.check_invariants()


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("", "at least one character"),
        ("a/#/b", "'#' must be the last level"),
        ("#/a", "'#' must be the last level"),
        ("a/b#", "whole level"),
        ("a+/b", "whole level"),
        ("a/+b", "whole level"),
        ("sport/tennis#", "whole level"),
    ],
)
def test_invalid_mqtt_filters_raise(pattern: str, message: str) -> None:
    idx = TopicIndex(syntax="mqtt")
    with pytest.raises(ValueError, match=message):
        idx.bind(pattern, "q")
    assert len(idx) == 0
    assert idx.unbind(pattern, "q") is False  # never bound, so nothing to remove


def test_unknown_syntax_and_cache_size() -> None:
    with pytest.raises(ValueError):
        TopicIndex(syntax="nats")
    with pytest.raises(ValueError):
        TopicIndex(cache_keys=-1)


def test_bind_is_idempotent_per_arguments() -> None:
    idx = TopicIndex()
    assert idx.bind("a.*", "q") is True
    assert idx.bind("a.*", "q") is False
    assert idx.bind("a.*", "q", {}) is False  # no arguments == empty table
    assert idx.bind("a.*", "q", {"x-foo": 1}) is True  # distinct binding ...
    assert idx.bind("a.*", "q", {"x-foo": ("I", 1)}) is False  # ... same as typed form
    assert idx.bind("a.*", "q", {"x-foo": ("l", 1)}) is True  # another type, another binding
    assert len(idx) == 3
    assert routed(idx, "a.b") == {"q"}  # ... but the queue gets the message once
    assert idx.unbind("a.*", "q", {"x-foo": 1}) is True
    assert idx.unbind("a.*", "q", {"x-foo": 1}) is False
    assert len(idx) == 2
    assert routed(idx, "a.b") == {"q"}
    assert sorted(k for k, _, _ in idx.bindings()) == ["a.*", "a.*"]


def test_equivalent_patterns_are_distinct_bindings() -> None:
    idx = TopicIndex()
    for p in ("#", "#.#", "#.#.#"):
        assert idx.bind(p, "q") is True
    assert idx.bind("#.*", "q") is True
    assert idx.bind("*.#", "q") is True  # same trie node as "#.*", different binding key
    assert len(idx) == 5
    assert routed(idx, "x") == {"q"}
    assert routed(idx, "") == {"q"}
    assert idx.unbind("#.#", "q")
    assert idx.unbind("*.#", "q")
    assert routed(idx, "") == {"q"}
    assert routed(idx, "x") == {"q"}
    assert {k for k, _, _ in idx.bindings()} == {"#", "#.#.#", "#.*"}
    idx.check_invariants()


def test_dedupe_across_bindings() -> None:
    idx = TopicIndex()
    for p in ("a.b", "a.*", "*.b", "#", "a.#", "#.b"):
        idx.bind(p, "q1")
    idx.bind("a.b", "q2")
    assert routed(idx, "a.b") == {"q1", "q2"}
    assert isinstance(idx.route("a.b"), frozenset)
    idx.unbind("a.b", "q2")
    assert routed(idx, "a.b") == {"q1"}
    for p in ("a.b", "a.*", "*.b", "#", "a.#"):
        idx.unbind(p, "q1")
        assert routed(idx, "a.b") == {"q1"}
    idx.unbind("#.b", "q1")
    assert routed(idx, "a.b") == set()
    assert not idx.has_bindings()
    idx.check_invariants()


def test_hot_path_returns_the_same_object() -> None:
    idx = TopicIndex()
    idx.bind("a.*", "q")
    first = idx.route("a.b")
    assert idx.route("a.b") is first
    idx.bind("a.b", "q")  # no new destination: the frozenset survives
    assert idx.route("a.b") is first
    idx.bind("a.b", "r")
    assert routed(idx, "a.b") == {"q", "r"}


def test_ids_are_recycled() -> None:
    idx = TopicIndex()
    for i in range(10):
        idx.bind(f"k{i}.#", f"q{i}")
    for i in range(10):
        idx.unbind(f"k{i}.#", f"q{i}")
    assert len(idx) == 0
    for i in range(10):
        idx.bind(f"n{i}.*", f"r{i}")
    assert len(idx._keys) == 10  # no new ids were allocated
    assert routed(idx, "n3.x") == {"r3"}


def test_remove_destination() -> None:
    idx = TopicIndex(cache_keys=4)
    for p in ("a.b", "a.*", "#", "x.y"):
        idx.bind(p, "q1")
        idx.bind(p, "q2")
    idx.bind("a.b", "q1", {"x-a": 1})
    assert routed(idx, "a.b") == {"q1", "q2"}
    assert idx.remove_destination("q1") == 5
    assert idx.remove_destination("q1") == 0
    assert routed(idx, "a.b") == {"q2"}
    assert routed(idx, "x.y") == {"q2"}
    assert len(idx) == 4
    assert all(d == "q2" for _, d, _ in idx.bindings())
    idx.check_invariants()


def test_cache_is_bounded_and_evicts() -> None:
    idx = TopicIndex(cache_keys=3)
    idx.bind("#", "all")
    idx.bind("k1", "one")
    for i in range(10):
        assert routed(idx, f"k{i}") == ({"all", "one"} if i == 1 else {"all"})
        assert idx.cached_keys() <= 3
        idx.check_invariants()
    idx.bind("k9", "nine")
    idx.unbind("#", "all")
    for i in range(10):
        expected = {"one"} if i == 1 else {"nine"} if i == 9 else set()
        assert routed(idx, f"k{i}") == expected
    idx.check_invariants()


def test_clock_keeps_a_hot_key() -> None:
    idx = TopicIndex(cache_keys=4)
    idx.bind("#", "q")
    idx.route("hot")
    for i in range(50):
        idx.route("hot")
        idx.route(f"cold{i}")
    assert idx.is_cached("hot")


def test_one_off_keys_do_not_evict_a_full_caches_keys() -> None:
    """Admission: once full, a key goes in on its second miss within a window, so a stream
    of distinct keys (Celery's per-delay keys, say) costs its trie walks and nothing else."""
    idx = TopicIndex(cache_keys=4)
    idx.bind("#", "q")
    hot = [f"hot{i}" for i in range(4)]
    for key in hot:
        idx.route(key)  # room: in at once
    for i in range(100):
        assert routed(idx, f"once{i}") == {"q"}
    assert all(idx.is_cached(k) for k in hot)
    assert idx.misses == 104 and idx.hits == 0
    idx.check_invariants()


def test_a_key_that_misses_twice_is_admitted() -> None:
    idx = TopicIndex(cache_keys=2)
    idx.bind("a.#", "q")
    idx.route("a.1")
    idx.route("a.2")  # full now
    assert routed(idx, "a.3") == {"q"} and not idx.is_cached("a.3")
    assert routed(idx, "a.3") == {"q"} and idx.is_cached("a.3")  # the second miss: admitted
    assert idx.cached_keys() == 2
    idx.bind("a.3", "lit")  # patched like any cached key
    assert routed(idx, "a.3") == {"q", "lit"}
    idx.check_invariants()


def test_the_admission_window_forgets_one_off_keys() -> None:
    idx = TopicIndex(cache_keys=2)
    idx.bind("#", "q")
    idx.route("a")
    idx.route("b")
    idx.route("c")  # a candidate
    for i in range(2):
        idx.route(f"x{i}")  # the window of 2 candidates fills and starts again
    idx.route("c")
    assert not idx.is_cached("c")  # its first miss was forgotten


def test_no_cache() -> None:
    idx = TopicIndex(cache_keys=0)
    idx.bind("a.#", "q")
    assert routed(idx, "a.b") == {"q"}
    assert idx.cached_keys() == 0


def test_uncached_routes_follow_binds_and_unbinds_at_a_pattern() -> None:
    # A pattern end remembers where its bindings lead for keys the cache does not keep.
    idx = TopicIndex(cache_keys=0)
    idx.bind("a.*", "q1")
    idx.bind("a.#", "q1")
    assert routed(idx, "a.b") == {"q1"}
    idx.bind("a.*", "q2")
    assert routed(idx, "a.b") == {"q1", "q2"}
    assert routed(idx, "a.c") == {"q1", "q2"}
    idx.unbind("a.*", "q1")
    assert routed(idx, "a.b") == {"q1", "q2"}  # q1 still through a.#
    idx.unbind("a.#", "q1")
    assert routed(idx, "a.b") == {"q2"}
    idx.bind("a.*", "q3", {"x-a": 1})
    assert routed(idx, "a.b") == {"q2", "q3"}
    idx.remove_destination("q2")
    assert routed(idx, "a.b") == {"q3"}
    assert routed(idx, "a") == set()
    idx.check_invariants()


def test_uncached_routes_keep_no_deleted_destination_alive() -> None:
    class Queue:
        pass

    idx = TopicIndex(cache_keys=0)
    queue = Queue()
    gone = weakref.ref(queue)
    idx.bind("a.*", queue)
    idx.bind("b.#", queue)
    assert routed(idx, "a.b") == {queue}
    assert routed(idx, "b") == {queue}
    assert idx.remove_destination(queue) == 2
    del queue
    gc.collect()
    assert gone() is None
    assert routed(idx, "a.b") == set()
    idx.check_invariants()


def test_pathological_hashes_are_not_exponential() -> None:
    idx = TopicIndex(cache_keys=0)
    pattern = ".".join(["#", "a"] * 12 + ["#"])
    idx.bind(pattern, "q")
    idx.bind(".".join(["#"] * 40), "r")
    key = ".".join(["a"] * 120)
    assert routed(idx, key) == {"q", "r"}
    assert routed(idx, ".".join(["b"] * 120)) == {"r"}


def test_empty_key_and_empty_pattern() -> None:
    idx = TopicIndex()
    idx.bind("", "empty")
    idx.bind("#", "hash")
    idx.bind("*", "star")
    assert routed(idx, "") == {"empty", "hash"}
    assert routed(idx, "x") == {"hash", "star"}
    assert routed(idx, ".") == {"hash"}


def test_evicted_key_id_is_recycled_cleanly() -> None:
    idx = TopicIndex(cache_keys=1)
    idx.bind("a.*", "q1")
    assert routed(idx, "a.x") == {"q1"}  # cached under some key id
    assert routed(idx, "b.y") == set()  # evicts "a.x"; "b.y" reuses its key id
    idx.bind("a.*", "q2")  # must not touch "b.y" through a stale reverse index
    assert routed(idx, "b.y") == set()
    idx.check_invariants()
