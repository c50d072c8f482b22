"""Topic routing: literal patterns in a dict, wildcard patterns in a trie, and a routing-key cache.

The parts (the ideas come from the seed papers; see docs/benchmarks.md "## Routing"):

* Patterns without wildcards live in ``_literal: pattern -> ids`` (the WSO2 split): a routing
  key finds them with one dict lookup.
* Wildcard patterns live in ``trie.WildcardTrie`` (NATS sublist, RabbitMQ).
* ``key_cache.RoutingKeyCache`` is OpenAMQ's inverted bitmap: ``routing key -> CachedKey``
  with the matching binding ids and their destinations, patched, never rebuilt, when bindings
  change, and admitting a key only when it is likely to be routed again.

``TopicIndex`` ties them together: a route is a cache hit (one dict lookup), or a trie walk plus
the literal lookup (a miss; the key is cached if admitted); a bind or unbind changes the dict
or the trie and patches the cached keys the pattern matches.

Semantics (AMQP syntax) follow RabbitMQ's ``rabbit_db_topic_exchange:split_topic_key/1``: a key
is split on ``.``; the empty key is *zero* words (so ``#`` and the empty pattern match it, ``*``
does not); ``a..b`` has an empty middle word; ``*`` is exactly one word, ``#`` zero or more. The
MQTT syntax splits on ``/``, ``+`` is one level, ``#`` (last level only) is zero or more levels
so ``a/#`` matches ``a``; filters starting with a wildcard do not match topics whose first level
starts with ``$`` (MQTT 3.1.1 section 4.7.2); an invalid filter raises ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping

from pyroaring import BitMap

from .bindings import EMPTY, BindingTable, ids_add, ids_iter, ids_remove
from .key_cache import CachedKey, RoutingKeyCache, TooManyKeys
from .trie import Pattern, TrieNode, WildcardTrie, parse_amqp, parse_mqtt


class TopicIndex(BindingTable):
    """Topic-exchange bindings with a bounded routing-key cache (see the module docstring)."""

    __slots__ = (
        "syntax",
        "_sep",
        "_mqtt",
        "_literal",
        "trie",
        "cache",
        "_cached",
        "hits",
        "misses",
    )

    def __init__(self, syntax: str = "amqp", cache_keys: int = 10000) -> None:
        super().__init__()
        if syntax not in ("amqp", "mqtt"):
            raise ValueError(f"unknown topic syntax {syntax!r}; expected 'amqp' or 'mqtt'")
        self.syntax = syntax
        self._mqtt = syntax == "mqtt"
        self._sep = "/" if self._mqtt else "."
        self._literal: dict[str, int | BitMap] = {}
        self.trie = WildcardTrie(skip_dollar=self._mqtt)
        self.cache = RoutingKeyCache(cache_keys, mqtt=self._mqtt)
        self._cached = self.cache.by_key  # the hot path's one lookup
        self.hits = 0  # routes answered from the cache (Prometheus: roarmq_routing_cache_*)
        self.misses = 0  # routes that walked the trie

    # -- parsing ------------------------------------------------------------------------------

    def split(self, routing_key: str) -> tuple[str, ...]:
        """The words of a routing key (AMQP: the empty key has none; MQTT: one empty level)."""
        if not routing_key and not self._mqtt:
            return ()
        return tuple(routing_key.split(self._sep))

    def parse(self, pattern: str) -> Pattern | None:
        """Normalised tokens of a wildcard pattern, or ``None`` for a literal one.

        Raises ``ValueError`` for an invalid MQTT filter.
        """
        return parse_mqtt(pattern) if self._mqtt else parse_amqp(pattern)

    # -- routing ------------------------------------------------------------------------------

    def route(self, routing_key: str, headers: Mapping | None = None) -> Collection:
        """Destinations whose patterns match ``routing_key``, each once (``headers`` unused):
        a frozenset, or a one-tuple where a cold key reaches a single binding."""
        entry = self._cached.get(routing_key)
        if entry is not None:
            entry.referenced = True
            self.hits += 1
            dests = entry.dests
            if dests is None:
                dests = entry.dests = frozenset(map(self._dests.__getitem__, entry.ids))
            return dests
        return self._route_miss(routing_key)

    def _route_miss(self, routing_key: str) -> Collection:
        self.misses += 1
        words = routing_key.split(self._sep) if routing_key or self._mqtt else []
        nodes = self.trie.match(words)
        literal = self._literal.get(routing_key)
        # While removed bindings wait to be swept (``_dead``), a pattern end's ``dests`` may
        # still name their destination: such a miss takes the BitMap way, without theirs.
        dead = self._dead
        admitted = self.cache.admits(routing_key)
        if not admitted and dead is None:
            if literal is None and len(nodes) == 1:  # one pattern end: the common cold key
                node = nodes[0]
                one = node.one
                if one is not None:
                    # A fresh one-tuple: the compiled channel iterates it in place (a set
                    # takes an iterator object), and nothing but the node is read to make
                    # it, where each message meets a different one of 100,000 pattern ends.
                    return (one,)
                dests = node.dests
                return dests if dests is not None else self._node_dests(node)
            return self._destinations(nodes, literal)
        ids = BitMap()
        if literal is not None:
            if type(literal) is int:
                ids.add(literal)
            else:
                ids |= literal
        for node in nodes:
            n_ids = node.ids
            if type(n_ids) is int:
                ids.add(n_ids)
            else:
                ids |= n_ids  # type: ignore[operator]
        if dead is not None:
            ids -= dead
        dests = frozenset(map(self._dests.__getitem__, ids)) if ids else EMPTY
        if admitted:
            self.cache.insert(routing_key, tuple(words), ids, nodes).dests = dests
        return dests

    def _destinations(self, nodes: list[TrieNode], literal: int | BitMap | None) -> frozenset:
        """Where a key goes without caching it: no BitMap, one set of destinations."""
        dests = self._dests
        if not nodes:
            if literal is None:
                return EMPTY
            if type(literal) is int:
                return frozenset((dests[literal],))
        out = set()
        if literal is not None:
            if type(literal) is int:
                out.add(dests[literal])
            else:
                out.update(map(dests.__getitem__, literal))
        for node in nodes:
            one = node.one
            if one is not None:
                out.add(one)
                continue
            node_dests = node.dests
            out.update(node_dests if node_dests is not None else self._node_dests(node))
        return frozenset(out)

    def _node_dests(self, node: TrieNode) -> tuple | frozenset:
        """Where a pattern end's bindings lead, noted on the node for the next cold route:
        ``TrieNode.one`` for one binding (returned as a one-tuple), else ``TrieNode.dests``."""
        ids = node.ids
        if type(ids) is int:
            node.one = self._dests[ids]
            return (node.one,)
        dests = node.dests = frozenset(map(self._dests.__getitem__, ids))  # type: ignore[arg-type]
        return dests

    # -- bind / unbind ------------------------------------------------------------------------

    def bind(self, key: str, destination: Hashable, arguments: Mapping | None = None) -> bool:
        """Add binding ``(key, destination, arguments)``; False if it already existed."""
        tokens = self.parse(key)
        if tokens is None:
            ids = self._literal.get(key)
            if ids is not None and self._find(ids, key, destination, arguments) is not None:
                return False
            b = self._new_id(key, destination, arguments)
            self._literal[key] = ids_add(ids, b)
            entry = self._cached.get(key)
            if entry is not None:
                self._entry_add(entry, b, destination)
            return True
        node = self.trie.end_of(tokens)
        if node.ids is not None and self._find(node.ids, key, destination, arguments) is not None:
            return False
        b = self._new_id(key, destination, arguments)
        was_end = node.ids is not None
        node.ids = ids_add(node.ids, b)
        node.one = node.dests = None
        cache = self.cache
        if was_end:
            if node.cached is not None:
                if cache.over_budget(node.cached):
                    cache.flush()
                    return True
                for slot in node.cached:
                    self._entry_add(cache.entry(slot), b, destination)
        elif self._cached:
            try:
                slots = cache.keys_matching(tokens)
            except TooManyKeys:
                cache.flush()
                return True
            if slots:
                node.cached = slots
                for slot in slots:
                    entry = cache.entry(slot)
                    entry.nodes.add(node)
                    self._entry_add(entry, b, destination)
        return True

    def unbind(self, key: str, destination: Hashable, arguments: Mapping | None = None) -> bool:
        """Remove binding ``(key, destination, arguments)``; False if there was none."""
        try:
            tokens = self.parse(key)
        except ValueError:
            return False  # an invalid filter was never bound
        if tokens is None:
            ids = self._literal.get(key)
            b = None if ids is None else self._find(ids, key, destination, arguments)
        else:
            node = self.trie.find(tokens)
            b = None if node is None else self._find(node.ids, key, destination, arguments)
        if b is None:
            return False
        self._remove(b, key, tokens)
        return True

    def _drop(self, b: int) -> None:
        key = self._keys[b]
        self._remove(b, key, self.parse(key))  # type: ignore[arg-type]

    def _forget(self, destination: Hashable | None) -> None:
        """Bindings were buried: the cached keys' ids may hold theirs, so the cache is emptied
        (it refills as keys are routed; what it held is freed by the sweeps). The pattern
        ends that still name the destination (``one``, ``dests``) let go of it as they are
        swept; until then a cold route takes the BitMap way, which subtracts ``_dead``."""
        self._to_free += self.cache.retire()

    def _unindex(self, b: int) -> None:
        """Sweep a buried binding out of the literal dict or the trie. No cached key holds
        it (``_forget`` emptied the cache, and a key cached since holds no buried id)."""
        key = self._keys[b]
        self._take_out(b, key, self.parse(key), None)  # type: ignore[arg-type]

    def _remove(self, b: int, key: str, tokens: Pattern | None) -> None:
        destination = self._dests[b]
        self._free_id(b)  # first, so ``_reaches`` no longer counts b
        self._take_out(b, key, tokens, destination)

    def _take_out(
        self, b: int, key: str, tokens: Pattern | None, destination: Hashable | None
    ) -> None:
        """Take ``b`` out of the literal dict or the trie, and out of the cached keys that
        hold it if it led to ``destination`` (None: a buried binding, which none hold)."""
        if tokens is None:
            rest = ids_remove(self._literal[key], b)
            if rest is None:
                del self._literal[key]
            else:
                self._literal[key] = rest
            entry = self._cached.get(key) if destination is not None else None
            if entry is not None:
                self._entry_remove(entry, b, destination)
            return
        steps, node = self.trie.path(tokens)
        node.ids = ids_remove(node.ids, b)
        node.one = node.dests = None
        cache = self.cache
        slots = node.cached
        if slots is not None and destination is not None:
            if cache.over_budget(slots):
                cache.flush()
            else:
                for slot in slots:
                    self._entry_remove(cache.entry(slot), b, destination)
        if node.ids is None:  # no longer a pattern end
            self._unlink_cached(node)
            self.trie.prune(node, steps)

    def _unlink_cached(self, node: TrieNode) -> None:
        """``node`` is no longer a pattern end: the cached keys stop listing it (or, past the
        patch budget, the cache is flushed)."""
        slots = node.cached
        if slots is None:
            return
        cache = self.cache
        if cache.over_budget(slots):
            cache.flush()
            return
        node.cached = None
        for slot in slots:
            cache.entry(slot).nodes.discard(node)

    # -- patching cached keys -----------------------------------------------------------------

    def _entry_add(self, entry: CachedKey, b: int, destination: Hashable) -> None:
        entry.ids.add(b)
        dests = entry.dests
        if dests is not None and destination not in dests:
            entry.dests = None  # rebuilt on the next route, not now: binds come in bursts

    def _entry_remove(self, entry: CachedKey, b: int, destination: Hashable) -> None:
        ids = entry.ids
        ids.discard(b)
        if entry.dests is not None and not self._reaches(ids, destination):
            entry.dests = None

    # -- introspection ------------------------------------------------------------------------

    def flush_cache(self) -> None:
        """Forget every cached key at once (the cache refills as keys are routed)."""
        self.cache.flush()

    def cached_keys(self) -> int:
        """How many routing keys the cache holds."""
        return len(self._cached)

    def is_cached(self, routing_key: str) -> bool:
        """Whether a publish with this key would be a cache hit now (route explain)."""
        return routing_key in self._cached

    def check_invariants(self) -> None:
        """Assert the cache agrees with a fresh match of every cached key (for tests)."""
        self.check_ids()
        self.cache.check()
        dead = self._dead or BitMap()
        for key, entry in self._cached.items():
            nodes = self.trie.match(entry.words)
            expect = BitMap()
            for node in nodes:
                expect.update(ids_iter(node.ids))
            expect.update(ids_iter(self._literal.get(key)))
            expect -= dead
            assert entry.ids == expect, (key, entry.ids, expect)
            assert entry.nodes == set(nodes), key
            for node in nodes:
                assert node.cached is not None and entry.slot in node.cached, key
            if entry.dests is not None:
                assert entry.dests == frozenset(self._dests[b] for b in expect), key
        for node in self.trie.nodes():
            assert node is self.trie.root or not node.is_empty(), "unpruned empty node"
            live = not dead.intersect(BitMap(ids_iter(node.ids)))
            if node.one is not None and live:
                assert type(node.ids) is int, "one destination noted on a shared pattern end"
                assert node.one is self._dests[node.ids], "stale destination on a pattern end"
            if node.dests is not None and live:
                assert type(node.ids) is not int, "a set noted on a one-binding pattern end"
                expect_dests = frozenset(self._dests[b] for b in ids_iter(node.ids))
                assert node.dests == expect_dests, "stale destinations on a pattern end"
            if node.cached is not None:
                assert node.ids is not None and node.cached, "reverse index on a non-pattern node"
                for slot in node.cached:
                    entry = self.cache.entry(slot)
                    assert entry is not None and node in entry.nodes, "stale reverse index"

    def __repr__(self) -> str:
        return f"<TopicIndex {self.syntax} bindings={len(self)} cached={len(self._cached)}>"
