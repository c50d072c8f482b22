"""Topic routing: literal patterns in a dict, wildcard patterns in a trie, and a routing-key cache.

Layout (the ideas come from the seed papers; see docs/benchmarks.md "## Routing"):

* Patterns without wildcards live in ``_exact: pattern -> ids`` (the WSO2 split): a routing key
  finds them with one dict lookup.
* Wildcard patterns live in a trie of words with separate ``*`` and ``#`` edges (NATS sublist,
  RabbitMQ); a node where a pattern ends holds the ids of its bindings. Runs of wildcards are
  normalised (``#.#`` -> ``#``, ``#.*`` -> ``*.#``), which bounds the matcher's work.
* The cache is OpenAMQ's inverted bitmap: ``routing key -> entry`` holding the BitMap of matching
  binding ids and, lazily, the frozenset of their destinations. A cache hit is one dict lookup
  and returns that frozenset. The cache is patched, never rebuilt: binding a new pattern finds
  the cached keys it matches through a key-side positional index (the WSO2 per-constituent
  tables, applied to the cached keys), and sets its bit there; unbinding clears the bit through
  the reverse index kept on each trie node (``node.kids``: cached-key ids that node's pattern
  matches -- every binding at a node matches the same keys, so one BitMap serves them all;
  literal patterns need none, as the only key they match is themselves). Eviction is CLOCK
  (second chance) over ``cache_keys`` slots.

Semantics (AMQP syntax) follow RabbitMQ's ``rabbit_db_topic_exchange:split_topic_key/1``: a key
is split on ``.``; the empty key is *zero* words (so ``#`` and the empty pattern match it, ``*``
does not); ``a..b`` has an empty middle word; ``*`` is exactly one word, ``#`` zero or more. The
MQTT syntax splits on ``/``, ``+`` is one level, ``#`` (last level only) is zero or more levels
so ``a/#`` matches ``a``; filters starting with a wildcard do not match topics whose first level
starts with ``$`` (MQTT 3.1.1 section 4.7.2); an invalid filter raises ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

from pyroaring import BitMap

from .bindings import EMPTY, BindingTable, ids_add, ids_iter, ids_remove

#: Most cached keys one bind or unbind patches; past it the cache is flushed instead and
#: refills as keys are routed again, so a bind costs O(budget), never O(cache x key length).
PATCH_BUDGET = 2048
#: Most candidate keys checked word by word for a pattern with two or more ``#``.
VERIFY_BUDGET = 256


class _TooMany(Exception):
    """Patching the cache would cost more than the budget: flush it."""


class _Wildcard:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


STAR = _Wildcard("STAR")  # exactly one word
HASH = _Wildcard("HASH")  # zero or more words

Token = str | _Wildcard


class _Node:
    """A trie node. ``ids`` is set where a pattern ends; ``kids`` are the cached keys it matches."""

    __slots__ = ("children", "star", "hash", "ids", "kids")

    def __init__(self) -> None:
        self.children: dict[str, _Node] | None = None
        self.star: _Node | None = None
        self.hash: _Node | None = None
        self.ids: int | BitMap | None = None
        self.kids: BitMap | None = None

    def is_empty(self) -> bool:
        return self.ids is None and not self.children and self.star is None and self.hash is None


def _bitmap(ids: int | BitMap) -> BitMap:
    return BitMap((ids,)) if type(ids) is int else ids  # type: ignore[return-value]


class _Entry:
    """A cached routing key: matching binding ids and (lazily) their destinations."""

    __slots__ = ("key", "kid", "words", "ids", "dests", "ref", "nodes")

    def __init__(self, key: str, kid: int, words: tuple[str, ...], ids: BitMap, nodes: set) -> None:
        self.key = key
        self.kid = kid
        self.words = words
        self.ids = ids
        self.dests: frozenset | None = None
        self.ref = False
        self.nodes = nodes  # the wildcard trie nodes whose ``kids`` hold ``kid``


def _normalise(tokens: list[Token]) -> tuple[Token, ...]:
    """Rewrite every run of wildcards as its stars followed by at most one ``#``."""
    out: list[Token] = []
    stars = 0
    hashed = False
    for t in tokens:
        if t is STAR:
            stars += 1
        elif t is HASH:
            hashed = True
        else:
            if stars or hashed:
                out.extend([STAR] * stars)
                if hashed:
                    out.append(HASH)
                stars, hashed = 0, False
            out.append(t)
    out.extend([STAR] * stars)
    if hashed:
        out.append(HASH)
    return tuple(out)


def match_tokens(tokens: tuple[Token, ...], words: tuple[str, ...] | list[str]) -> bool:
    """Does the normalised pattern ``tokens`` match ``words``? (Linear: greedy segments.)"""
    segments: list[list[Token]] = [[]]
    for t in tokens:
        if t is HASH:
            segments.append([])
        else:
            segments[-1].append(t)
    n = len(words)

    def seg_at(seg: list[Token], p: int) -> bool:
        for k, t in enumerate(seg):
            if t is not STAR and t != words[p + k]:
                return False
        return True

    if len(segments) == 1:
        return len(segments[0]) == n and seg_at(segments[0], 0)
    first, last = segments[0], segments[-1]
    if sum(map(len, segments)) > n:
        return False
    if not seg_at(first, 0) or not seg_at(last, n - len(last)):
        return False
    pos, end = len(first), n - len(last)
    for seg in segments[1:-1]:
        width = len(seg)
        while pos + width <= end and not seg_at(seg, pos):
            pos += 1
        if pos + width > end:
            return False
        pos += width
    return True


class TopicIndex(BindingTable):
    """Topic-exchange bindings with a bounded routing-key cache (see the module docstring)."""

    __slots__ = (
        "syntax",
        "_sep",
        "_mqtt",
        "_exact",
        "_root",
        "_cache",
        "_entries",
        "_free_kids",
        "_capacity",
        "_hand",
        "_kpos",
        "_kneg",
        "_klen",
        "_kall",
        "_kdollar",
        "hits",
        "misses",
    )

    def __init__(self, syntax: str = "amqp", cache_keys: int = 10000) -> None:
        super().__init__()
        if syntax not in ("amqp", "mqtt"):
            raise ValueError(f"unknown topic syntax {syntax!r}; expected 'amqp' or 'mqtt'")
        if cache_keys < 0:
            raise ValueError("cache_keys must be >= 0")
        self.syntax = syntax
        self._mqtt = syntax == "mqtt"
        self._sep = "/" if self._mqtt else "."
        self._exact: dict[str, int | BitMap] = {}
        self._root = _Node()
        self._capacity = cache_keys
        self._entries: list[_Entry | None] = []
        self.hits = 0  # routes answered from the cache (Prometheus: roarmq_routing_cache_*)
        self.misses = 0  # routes that walked the trie
        self.flush_cache()  # the cache and its key-side index, empty

    # -- parsing ------------------------------------------------------------------------------

    def split(self, routing_key: str) -> tuple[str, ...]:
        """The words of a routing key (AMQP: the empty key has none; MQTT: one empty level)."""
        if not routing_key and not self._mqtt:
            return ()
        return tuple(routing_key.split(self._sep))

    def parse(self, pattern: str) -> tuple[Token, ...] | None:
        """Normalised tokens of a wildcard pattern, or ``None`` for a literal one.

        Raises ``ValueError`` for an invalid MQTT filter.
        """
        if self._mqtt:
            return self._parse_mqtt(pattern)
        if "*" not in pattern and "#" not in pattern:
            return None
        tokens: list[Token] = []
        wild = False
        for w in pattern.split("."):
            if w == "*":
                tokens.append(STAR)
                wild = True
            elif w == "#":
                tokens.append(HASH)
                wild = True
            else:
                tokens.append(w)
        return _normalise(tokens) if wild else None

    @staticmethod
    def _parse_mqtt(pattern: str) -> tuple[Token, ...] | None:
        if not pattern:
            raise ValueError("invalid MQTT topic filter '': it must be at least one character long")
        if "+" not in pattern and "#" not in pattern:
            return None
        levels = pattern.split("/")
        last = len(levels) - 1
        tokens: list[Token] = []
        for i, level in enumerate(levels):
            if level == "+":
                tokens.append(STAR)
            elif level == "#":
                if i != last:
                    raise ValueError(
                        f"invalid MQTT topic filter {pattern!r}: '#' must be the last level"
                    )
                tokens.append(HASH)
            elif "+" in level or "#" in level:
                raise ValueError(
                    f"invalid MQTT topic filter {pattern!r}: "
                    f"a wildcard must occupy a whole level (got {level!r})"
                )
            else:
                tokens.append(level)
        return tuple(tokens)

    # -- bind / unbind ------------------------------------------------------------------------

    def bind(self, key: str, destination: Hashable, arguments: Mapping | None = None) -> bool:
        """Add binding ``(key, destination, arguments)``; False if it already existed."""
        tokens = self.parse(key)
        if tokens is None:
            ids = self._exact.get(key)
            if ids is not None and self._find(ids, key, destination, arguments) is not None:
                return False
            b = self._new_id(key, destination, arguments)
            self._exact[key] = ids_add(ids, b)
            entry = self._cache.get(key)
            if entry is not None:
                self._entry_add(entry, b, destination)
            return True
        node = self._root
        for t in tokens:
            if t is STAR:
                nxt = node.star
                if nxt is None:
                    nxt = node.star = _Node()
            elif t is HASH:
                nxt = node.hash
                if nxt is None:
                    nxt = node.hash = _Node()
            else:
                children = node.children
                if children is None:
                    children = node.children = {}
                nxt = children.get(t)  # type: ignore[arg-type]
                if nxt is None:
                    nxt = children[t] = _Node()  # type: ignore[index]
            node = nxt
        if node.ids is not None and self._find(node.ids, key, destination, arguments) is not None:
            return False
        b = self._new_id(key, destination, arguments)
        was_end = node.ids is not None
        node.ids = ids_add(node.ids, b)
        entries = self._entries
        if was_end:
            if node.kids is not None:
                if len(node.kids) > PATCH_BUDGET:
                    self.flush_cache()
                    return True
                for kid in node.kids:
                    self._entry_add(entries[kid], b, destination)  # type: ignore[arg-type]
        elif self._cache:
            try:
                kids = self._cached_matches(tokens)
            except _TooMany:
                self.flush_cache()
                return True
            if kids:
                node.kids = kids
                for kid in kids:
                    entry = entries[kid]
                    entry.nodes.add(node)  # type: ignore[union-attr]
                    self._entry_add(entry, b, destination)  # type: ignore[arg-type]
        return True

    def unbind(self, key: str, destination: Hashable, arguments: Mapping | None = None) -> bool:
        """Remove binding ``(key, destination, arguments)``; False if there was none."""
        try:
            tokens = self.parse(key)
        except ValueError:
            return False  # an invalid filter was never bound
        if tokens is None:
            ids = self._exact.get(key)
            b = None if ids is None else self._find(ids, key, destination, arguments)
        else:
            node = self._walk(tokens)
            b = None if node is None else self._find(node.ids, key, destination, arguments)
        if b is None:
            return False
        self._remove(b, key, tokens)
        return True

    def _drop(self, b: int) -> None:
        key = self._keys[b]
        self._remove(b, key, self.parse(key))  # type: ignore[arg-type]

    def _walk(self, tokens: tuple[Token, ...]) -> _Node | None:
        node: _Node | None = self._root
        for t in tokens:
            if t is STAR:
                node = node.star  # type: ignore[union-attr]
            elif t is HASH:
                node = node.hash  # type: ignore[union-attr]
            else:
                children = node.children  # type: ignore[union-attr]
                node = None if children is None else children.get(t)  # type: ignore[arg-type]
            if node is None:
                return None
        return node

    def _remove(self, b: int, key: str, tokens: tuple[Token, ...] | None) -> None:
        destination = self._dests[b]
        self._free_id(b)  # first, so ``_reaches`` no longer counts b
        if tokens is None:
            rest = ids_remove(self._exact[key], b)
            if rest is None:
                del self._exact[key]
            else:
                self._exact[key] = rest
            entry = self._cache.get(key)
            if entry is not None:
                self._entry_remove(entry, b, destination)
            return
        path: list[tuple[_Node, Token]] = []
        node = self._root
        for t in tokens:
            path.append((node, t))
            if t is STAR:
                node = node.star  # type: ignore[assignment]
            elif t is HASH:
                node = node.hash  # type: ignore[assignment]
            else:
                node = node.children[t]  # type: ignore[index]
        node.ids = ids_remove(node.ids, b)
        kids = node.kids
        if kids is not None and len(kids) > PATCH_BUDGET:
            self.flush_cache()
            kids = None
        if kids is not None:
            entries = self._entries
            if node.ids is None:  # no longer a pattern end: drop the reverse index
                node.kids = None
                for kid in kids:
                    entry = entries[kid]
                    entry.nodes.discard(node)  # type: ignore[union-attr]
                    self._entry_remove(entry, b, destination)  # type: ignore[arg-type]
            else:
                for kid in kids:
                    self._entry_remove(entries[kid], b, destination)  # type: ignore[arg-type]
        while path and node.is_empty():
            parent, t = path.pop()
            if t is STAR:
                parent.star = None
            elif t is HASH:
                parent.hash = None
            else:
                del parent.children[t]  # type: ignore[union-attr, arg-type]
                if not parent.children:
                    parent.children = None
            node = parent

    # -- the cache ----------------------------------------------------------------------------

    def _entry_add(self, entry: _Entry, b: int, destination: Hashable) -> None:
        entry.ids.add(b)
        dests = entry.dests
        if dests is not None and destination not in dests:
            entry.dests = None  # rebuilt on the next route, not now: binds come in bursts

    def _entry_remove(self, entry: _Entry, b: int, destination: Hashable) -> None:
        ids = entry.ids
        ids.discard(b)
        if entry.dests is not None and not self._reaches(ids, destination):
            entry.dests = None

    def route(self, routing_key: str, headers: Mapping | None = None) -> frozenset:
        """Destinations whose patterns match ``routing_key``, each once (``headers`` unused)."""
        entry = self._cache.get(routing_key)
        if entry is not None:
            entry.ref = True
            self.hits += 1
            dests = entry.dests
            if dests is not None:
                return dests
            dests = entry.dests = frozenset(map(self._dests.__getitem__, entry.ids))
            return dests
        return self._route_miss(routing_key)

    def _route_miss(self, routing_key: str) -> frozenset:
        self.misses += 1
        words = self.split(routing_key)
        nodes = self._match(words)
        ids = BitMap()
        exact = self._exact.get(routing_key)
        if exact is not None:
            if type(exact) is int:
                ids.add(exact)
            else:
                ids |= exact
        for node in nodes:
            n_ids = node.ids
            if type(n_ids) is int:
                ids.add(n_ids)
            else:
                ids |= n_ids  # type: ignore[operator]
        dests = frozenset(map(self._dests.__getitem__, ids)) if ids else EMPTY
        if self._capacity:
            entry = self._insert(routing_key, words, ids, nodes)
            entry.dests = dests
        return dests

    def _match(self, words: tuple[str, ...]) -> list[_Node]:
        """Trie nodes with bindings whose patterns match ``words`` (each node once).

        Every (node, position) state is visited at most once: non-``#`` nodes are reached at a
        given position by a single path, and each ``#`` node remembers the lowest position it
        was entered at (``hash_from``), so re-entering it only scans positions not yet scanned.
        The work is therefore O(trie nodes on matching paths x words), never exponential.
        """
        n = len(words)
        found: list[_Node] = []
        root = self._root
        skip_root_wild = self._mqtt and n > 0 and words[0][:1] == "$"
        hash_from: dict[_Node, int] = {}
        stack: list[tuple[_Node, int]] = [(root, 0)]
        pop, push = stack.pop, stack.append
        while stack:
            node, i = pop()
            # Follow the literal chain in this loop; only wildcard branches go on the stack.
            while True:
                h = node.hash
                if i == n:
                    if node.ids is not None:
                        found.append(node)
                    # a "#" here matches zero words; (h, n) is new unless h was entered before
                    if h is not None and h not in hash_from:
                        hash_from[h] = n
                        if h.ids is not None:
                            found.append(h)
                    break
                if skip_root_wild and node is root:
                    h = None
                elif node.star is not None:
                    push((node.star, i + 1))
                if h is not None:
                    # "#" may swallow words[i:j] for every j in [i, n]; the states (h, j) an
                    # earlier entry already scanned (j >= stop) need no second visit.
                    stop = hash_from.get(h, n + 1)
                    if i < stop:
                        hash_from[h] = i
                        if stop > n and h.ids is not None:
                            found.append(h)
                        h_children, h_star = h.children, h.star
                        if h_children is not None:
                            get = h_children.get
                            for j in range(i, min(stop, n)):
                                child = get(words[j])
                                if child is not None:
                                    push((child, j + 1))
                        if h_star is not None:
                            for j in range(i, min(stop, n)):
                                push((h_star, j + 1))
                children = node.children
                if children is None:
                    break
                node = children.get(words[i])  # type: ignore[assignment]
                if node is None:
                    break
                i += 1
        return found

    def _insert(self, key: str, words: tuple[str, ...], ids: BitMap, nodes: list[_Node]) -> _Entry:
        cache = self._cache
        if len(cache) >= self._capacity:
            self._evict()
        entries = self._entries
        if self._free_kids:
            kid = self._free_kids.pop()
        else:
            kid = len(entries)
            entries.append(None)
        entry = _Entry(key, kid, words, ids, set(nodes))
        cache[key] = entry
        entries[kid] = entry
        for node in nodes:
            kids = node.kids
            if kids is None:
                node.kids = BitMap((kid,))
            else:
                kids.add(kid)
        n = len(words)
        kpos, kneg = self._kpos, self._kneg
        while len(kpos) < n:
            kpos.append({})
            kneg.append({})
        last = n - 1
        for i, w in enumerate(words):
            table = kpos[i]
            table[w] = ids_add(table.get(w), kid)
            table = kneg[last - i]
            table[w] = ids_add(table.get(w), kid)
        klen = self._klen
        klen[n] = ids_add(klen.get(n), kid)
        self._kall.add(kid)
        if self._mqtt and n and words[0][:1] == "$":
            self._kdollar.add(kid)
        return entry

    def _evict(self) -> None:
        """CLOCK: skip (and clear) recently used entries, evict the first one not used."""
        entries = self._entries
        size = len(entries)
        hand = self._hand
        while True:
            if hand >= size:
                hand = 0
            entry = entries[hand]
            hand += 1
            if entry is None:
                continue
            if entry.ref:
                entry.ref = False
            else:
                break
        self._hand = hand
        self._drop_entry(entry)

    def _drop_entry(self, entry: _Entry) -> None:
        kid = entry.kid
        del self._cache[entry.key]
        self._entries[kid] = None
        self._free_kids.append(kid)
        for node in entry.nodes:
            kids = node.kids
            kids.discard(kid)  # type: ignore[union-attr]
            if not kids:
                node.kids = None
        words = entry.words
        n = len(words)
        kpos, kneg = self._kpos, self._kneg
        last = n - 1
        for i, w in enumerate(words):
            for table in (kpos[i], kneg[last - i]):
                rest = ids_remove(table[w], kid)
                if rest is None:
                    del table[w]
                else:
                    table[w] = rest
        rest = ids_remove(self._klen[n], kid)
        if rest is None:
            del self._klen[n]
        else:
            self._klen[n] = rest
        self._kall.discard(kid)
        self._kdollar.discard(kid)

    def _cached_matches(self, tokens: tuple[Token, ...]) -> BitMap | None:
        """Cached-key ids matched by a pattern new to the trie, from the key-side index.

        Literal tokens before the first ``#`` constrain a position from the start, those after
        the last ``#`` a position from the end, and the count of non-``#`` tokens the length
        (exactly, without ``#``; at least, with one). That is exact for patterns with at most one
        ``#``; with more, the candidates are checked against their words.
        """
        kpos, kneg, klen = self._kpos, self._kneg, self._klen
        constraints: list = []  # BitMaps, or ints for single cached keys
        if HASH not in tokens:
            n = len(tokens)
            bm = klen.get(n)
            if bm is None:
                return None
            constraints.append(bm)
            for i, t in enumerate(tokens):
                if t is not STAR:
                    bm = kpos[i].get(t)  # type: ignore[arg-type]
                    if bm is None:
                        return None
                    constraints.append(bm)
            verify = False
        else:
            first = tokens.index(HASH)
            last = len(tokens) - 1 - tokens[::-1].index(HASH)
            for i in range(first):
                t = tokens[i]
                if t is not STAR:
                    if i >= len(kpos):
                        return None
                    bm = kpos[i].get(t)  # type: ignore[arg-type]
                    if bm is None:
                        return None
                    constraints.append(bm)
            for j, t in enumerate(reversed(tokens[last + 1 :])):
                if t is not STAR:
                    if j >= len(kneg):
                        return None
                    bm = kneg[j].get(t)  # type: ignore[arg-type]
                    if bm is None:
                        return None
                    constraints.append(bm)
            fixed = len(tokens) - tokens.count(HASH)
            if fixed:
                lengths = [_bitmap(bm) for length, bm in klen.items() if length >= fixed]
                if not lengths:
                    return None
                constraints.append(BitMap.union(*lengths) if len(lengths) > 1 else lengths[0])
            verify = first != last
        if not constraints:
            result = BitMap(self._kall)
        else:
            single = [c for c in constraints if type(c) is int]
            if single:  # a single cached key can satisfy this: test just that one
                kid = single[0]
                if any(c != kid if type(c) is int else kid not in c for c in constraints):
                    return None
                result = BitMap((kid,))
            elif len(constraints) == 1:
                result = BitMap(constraints[0])
            else:
                constraints.sort(key=len)
                result = BitMap.intersection(*constraints)
        if self._mqtt and tokens and not isinstance(tokens[0], str):
            result -= self._kdollar
        if len(result) > PATCH_BUDGET or (verify and len(result) > VERIFY_BUDGET):
            raise _TooMany
        if verify and result:
            entries = self._entries
            result = BitMap(
                kid
                for kid in result
                if match_tokens(tokens, entries[kid].words)  # type: ignore[union-attr]
            )
        return result or None

    def flush_cache(self) -> None:
        """Forget every cached key at once (the cache refills as keys are routed).

        O(cached keys' matched nodes): the key-side index is dropped whole, not key by key.
        """
        for entry in self._entries:
            if entry is not None:
                for node in entry.nodes:
                    node.kids = None
        self._cache: dict[str, _Entry] = {}
        self._entries = []
        self._free_kids: list[int] = []
        self._hand = 0
        # Key-side positional index over the cached keys: word at position i (from the start,
        # and from the end), number of words, all, and (MQTT) first level starting with "$".
        self._kpos: list[dict[str, int | BitMap]] = []
        self._kneg: list[dict[str, int | BitMap]] = []
        self._klen: dict[int, int | BitMap] = {}
        self._kall = BitMap()
        self._kdollar = BitMap()

    # -- introspection ------------------------------------------------------------------------

    def cached_keys(self) -> int:
        """How many routing keys the cache holds."""
        return len(self._cache)

    def is_cached(self, routing_key: str) -> bool:
        """Whether a publish with this key would be a cache hit now (route explain)."""
        return routing_key in self._cache

    def check_invariants(self) -> None:
        """Assert the cache agrees with a fresh match of every cached key (for tests)."""
        for key, entry in self._cache.items():
            assert self._entries[entry.kid] is entry
            nodes = self._match(entry.words)
            expect = BitMap()
            for node in nodes:
                expect.update(ids_iter(node.ids))
            expect.update(ids_iter(self._exact.get(key)))
            assert entry.ids == expect, (key, entry.ids, expect)
            assert entry.nodes == set(nodes), key
            for node in nodes:
                assert node.kids is not None and entry.kid in node.kids, key
            if entry.dests is not None:
                assert entry.dests == frozenset(self._dests[b] for b in expect), key
        live = BitMap(e.kid for e in self._cache.values())
        assert self._kall == live
        stack = [self._root]
        while stack:
            node = stack.pop()
            assert node is self._root or not node.is_empty(), "unpruned empty node"
            if node.kids is not None:
                assert node.ids is not None and node.kids, "reverse index on a non-pattern node"
                for kid in node.kids:
                    entry = self._entries[kid]
                    assert entry is not None and node in entry.nodes, "stale reverse index"
            stack.extend((node.children or {}).values())
            stack.extend(n for n in (node.star, node.hash) if n is not None)

    def __repr__(self) -> str:
        return f"<TopicIndex {self.syntax} bindings={len(self)} cached={len(self._cache)}>"
