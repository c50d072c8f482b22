"""The topic exchange's routing-key cache: OpenAMQ's inverted bitmap, patched in place.

``routing key -> CachedKey`` holding the BitMap of matching binding ids and their destinations
(a frozenset, rebuilt lazily after a change). A hit is one dict lookup.

Binding a new pattern must set its bit in every cached key it matches without walking them
all: the *key index* answers "which cached keys could this pattern match" from per-position
tables over the cached keys' words (the WSO2 per-constituent tables, applied to the keys):
``word at position i from the start``, ``from the end``, ``number of words``, and (MQTT) ``first
level starts with $``. Unbinding goes the other way, through the slots each trie node keeps
(``TrieNode.cached``).

Eviction is CLOCK (second chance) over ``capacity`` slots. Admission keeps one-off keys from
evicting hot ones (TinyLFU's doorkeeper, as NATS found with a million distinct subjects,
nats-server #4341): while the cache has room every key goes in; once full, a key is admitted
on its second miss within a window of ``capacity`` misses. A key that is not admitted costs its
trie walk and nothing else, so a stream of distinct keys costs what the trie costs.
"""

from __future__ import annotations

from pyroaring import BitMap

from .bindings import ids_add, ids_remove
from .trie import HASH, STAR, Pattern, TrieNode, match_tokens

#: Most cached keys one bind or unbind patches; past it the cache is flushed instead and
#: refills as keys are routed again, so a bind costs O(budget), never O(cache x key length).
PATCH_BUDGET = 2048
#: Most candidate keys checked word by word for a pattern with two or more ``#``.
VERIFY_BUDGET = 256


class TooManyKeys(Exception):
    """Patching the cache would cost more than the budget: flush it."""


def _bitmap(ids: int | BitMap) -> BitMap:
    return BitMap((ids,)) if type(ids) is int else ids  # type: ignore[return-value]


class CachedKey:
    """A cached routing key: matching binding ids and (lazily) their destinations."""

    __slots__ = ("key", "slot", "words", "ids", "dests", "referenced", "nodes")

    def __init__(
        self, key: str, slot: int, words: tuple[str, ...], ids: BitMap, nodes: set[TrieNode]
    ) -> None:
        self.key = key
        self.slot = slot  # its bit in the key index and in ``TrieNode.cached``
        self.words = words
        self.ids = ids
        self.dests: frozenset | None = None
        self.referenced = False  # CLOCK's second-chance bit
        self.nodes = nodes  # the wildcard trie nodes whose ``cached`` holds ``slot``


class RoutingKeyCache:
    """Cached keys by name and by slot, CLOCK eviction, admission, and the key index."""

    __slots__ = (
        "capacity",
        "by_key",
        "_mqtt",
        "_slots",
        "_free",
        "_hand",
        "_candidates",
        "_at_start",
        "_at_end",
        "_by_length",
        "_all",
        "_dollar",
    )

    def __init__(self, capacity: int, mqtt: bool = False) -> None:
        if capacity < 0:
            raise ValueError("cache_keys must be >= 0")
        self.capacity = capacity
        self._mqtt = mqtt
        self.by_key: dict[str, CachedKey] = {}  # the hot path reads this dict directly
        self._slots: list[CachedKey | None] = []
        self.flush()

    def __len__(self) -> int:
        return len(self.by_key)

    @staticmethod
    def over_budget(slots: BitMap) -> bool:
        """Patching this many cached keys costs more than flushing the cache."""
        return len(slots) > PATCH_BUDGET

    def entry(self, slot: int) -> CachedKey:
        return self._slots[slot]  # type: ignore[return-value]

    # -- admission, insertion, eviction -------------------------------------------------------

    def admits(self, key: str) -> bool:
        """Whether a key that just missed goes in (see the module docstring)."""
        if len(self.by_key) < self.capacity:
            return True
        if not self.capacity:
            return False
        candidates = self._candidates
        if key in candidates:
            candidates.discard(key)
            return True
        if len(candidates) >= self.capacity:
            candidates.clear()  # the window ends: forget the one-off keys
        candidates.add(key)
        return False

    def insert(
        self, key: str, words: tuple[str, ...], ids: BitMap, nodes: list[TrieNode]
    ) -> CachedKey:
        if len(self.by_key) >= self.capacity:
            self._evict()
        slots = self._slots
        if self._free:
            slot = self._free.pop()
        else:
            slot = len(slots)
            slots.append(None)
        entry = CachedKey(key, slot, words, ids, set(nodes))
        self.by_key[key] = entry
        slots[slot] = entry
        for node in nodes:
            cached = node.cached
            if cached is None:
                node.cached = BitMap((slot,))
            else:
                cached.add(slot)
        n = len(words)
        at_start, at_end = self._at_start, self._at_end
        while len(at_start) < n:
            at_start.append({})
            at_end.append({})
        last = n - 1
        for i, w in enumerate(words):
            table = at_start[i]
            table[w] = ids_add(table.get(w), slot)
            table = at_end[last - i]
            table[w] = ids_add(table.get(w), slot)
        by_length = self._by_length
        by_length[n] = ids_add(by_length.get(n), slot)
        self._all.add(slot)
        if self._mqtt and n and words[0][:1] == "$":
            self._dollar.add(slot)
        return entry

    def _evict(self) -> None:
        """CLOCK: skip (and clear) recently used entries, evict the first one not used."""
        slots = self._slots
        size = len(slots)
        hand = self._hand
        while True:
            if hand >= size:
                hand = 0
            entry = slots[hand]
            hand += 1
            if entry is None:
                continue
            if entry.referenced:
                entry.referenced = False
            else:
                break
        self._hand = hand
        self._drop(entry)

    def _drop(self, entry: CachedKey) -> None:
        slot = entry.slot
        del self.by_key[entry.key]
        self._slots[slot] = None
        self._free.append(slot)
        for node in entry.nodes:
            cached = node.cached
            cached.discard(slot)  # type: ignore[union-attr]
            if not cached:
                node.cached = None
        words = entry.words
        n = len(words)
        last = n - 1
        for i, w in enumerate(words):
            for table in (self._at_start[i], self._at_end[last - i]):
                rest = ids_remove(table[w], slot)
                if rest is None:
                    del table[w]
                else:
                    table[w] = rest
        rest = ids_remove(self._by_length[n], slot)
        if rest is None:
            del self._by_length[n]
        else:
            self._by_length[n] = rest
        self._all.discard(slot)
        self._dollar.discard(slot)

    def flush(self) -> None:
        """Forget every cached key at once (the cache refills as keys are routed).

        O(cached keys' matched nodes): the key index is dropped whole, not key by key.
        """
        for entry in self._slots:
            if entry is not None:
                for node in entry.nodes:
                    node.cached = None
        self.by_key.clear()  # in place: the index holds a reference to it
        self._slots = []
        self._free: list[int] = []
        self._hand = 0
        self._candidates: set[str] = set()
        self._at_start: list[dict[str, int | BitMap]] = []
        self._at_end: list[dict[str, int | BitMap]] = []
        self._by_length: dict[int, int | BitMap] = {}
        self._all = BitMap()
        self._dollar = BitMap()

    def retire(self) -> list:
        """``flush``, handing back what the cache held instead of freeing it here: the cached
        keys and the key index's tables, for the caller to let go of a few at a time (freeing
        10,000 cached keys at once takes ~4 ms, resetting their trie nodes' slots ~3 ms)."""
        held: list = [entry for entry in self._slots if entry is not None]
        held += self._at_start
        held += self._at_end
        held.append(self._by_length)
        self.flush()
        return held

    # -- the key index ------------------------------------------------------------------------

    def keys_matching(self, tokens: Pattern) -> BitMap | None:
        """Slots of the cached keys a wildcard pattern new to the trie matches.

        Literal tokens before the first ``#`` constrain a position from the start, those after
        the last ``#`` a position from the end, and the count of non-``#`` tokens the length
        (exactly, without ``#``; at least, with one). That is exact for patterns with at most one
        ``#``; with more, the candidates are checked against their words. Raises
        ``TooManyKeys`` past the budgets.
        """
        at_start, at_end, by_length = self._at_start, self._at_end, self._by_length
        constraints: list = []  # BitMaps, or ints for single cached keys
        if HASH not in tokens:
            n = len(tokens)
            bm = by_length.get(n)
            if bm is None:
                return None
            constraints.append(bm)
            for i, t in enumerate(tokens):
                if t is not STAR:
                    bm = at_start[i].get(t)  # type: ignore[arg-type]
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
                    if i >= len(at_start):
                        return None
                    bm = at_start[i].get(t)  # type: ignore[arg-type]
                    if bm is None:
                        return None
                    constraints.append(bm)
            for j, t in enumerate(reversed(tokens[last + 1 :])):
                if t is not STAR:
                    if j >= len(at_end):
                        return None
                    bm = at_end[j].get(t)  # type: ignore[arg-type]
                    if bm is None:
                        return None
                    constraints.append(bm)
            fixed = len(tokens) - tokens.count(HASH)
            if fixed:
                lengths = [_bitmap(bm) for length, bm in by_length.items() if length >= fixed]
                if not lengths:
                    return None
                constraints.append(BitMap.union(*lengths) if len(lengths) > 1 else lengths[0])
            verify = first != last
        if not constraints:
            result = BitMap(self._all)
        else:
            single = [c for c in constraints if type(c) is int]
            if single:  # a single cached key can satisfy this: test just that one
                slot = single[0]
                if any(c != slot if type(c) is int else slot not in c for c in constraints):
                    return None
                result = BitMap((slot,))
            elif len(constraints) == 1:
                result = BitMap(constraints[0])
            else:
                constraints.sort(key=len)
                result = BitMap.intersection(*constraints)
        if self._mqtt and tokens and not isinstance(tokens[0], str):
            result -= self._dollar
        if len(result) > PATCH_BUDGET or (verify and len(result) > VERIFY_BUDGET):
            raise TooManyKeys
        if verify and result:
            slots = self._slots
            result = BitMap(
                slot
                for slot in result
                if match_tokens(tokens, slots[slot].words)  # type: ignore[union-attr]
            )
        return result or None

    def check(self) -> None:
        """Assert the slots and the key index agree with the cached keys (for tests)."""
        for key, entry in self.by_key.items():
            assert entry.key == key and self._slots[entry.slot] is entry
        live = BitMap(e.slot for e in self.by_key.values())
        assert self._all == live
        assert len(self.by_key) <= max(self.capacity, 0)
