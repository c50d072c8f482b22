"""Comparator topic matchers for bench/matching.py: the algorithms of the fast-topic-matching
survey, written plainly in Python so they can be compared with broker.routing.TopicIndex.

All take AMQP patterns (``*`` one word, ``#`` zero or more, the empty key is zero words) and
share one interface: ``subscribe(pattern, dest)``, ``unsubscribe(pattern, dest)``,
``lookup(key) -> set of destinations``. They are benchmarks' baselines, not production code.
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_right

from pyroaring import BitMap


def words_of(key: str) -> list[str]:
    return key.split(".") if key else []


def pattern_regex(pattern: str) -> re.Pattern:
    """Regex over a key written as ``word.`` per word (so zero words is the empty string)."""
    parts = []
    for w in words_of(pattern):
        if w == "*":
            parts.append(r"[^.\n]*\.")
        elif w == "#":
            parts.append(r"(?:[^.\n]*\.)*")
        else:
            parts.append(re.escape(w) + r"\.")
    return re.compile("".join(parts))


def is_literal(pattern: str) -> bool:
    return not any(w in ("*", "#") for w in words_of(pattern))


class _Subscriptions:
    """Subscription ids with recycling, shared by the bitmap comparators."""

    def __init__(self) -> None:
        self.ids: dict[tuple[str, object], int] = {}
        self.dests: list[object] = []
        self.free: list[int] = []

    def add(self, pattern: str, dest: object) -> int | None:
        key = (pattern, dest)
        if key in self.ids:
            return None
        if self.free:
            sid = self.free.pop()
            self.dests[sid] = dest
        else:
            sid = len(self.dests)
            self.dests.append(dest)
        self.ids[key] = sid
        return sid

    def remove(self, pattern: str, dest: object) -> int | None:
        sid = self.ids.pop((pattern, dest), None)
        if sid is not None:
            self.dests[sid] = None
            self.free.append(sid)
        return sid

    def resolve(self, bm: BitMap) -> set:
        dests = self.dests
        return {dests[i] for i in bm}


class Naive:
    """Hash map pattern -> subscribers; a lookup tests every pattern (O(n) per lookup)."""

    name = "naive scan"

    def __init__(self) -> None:
        self.literal: dict[str, set] = {}
        self.wild: dict[str, tuple] = {}  # pattern -> (compiled matcher, subscribers)

    def subscribe(self, pattern: str, dest: object) -> None:
        if is_literal(pattern):
            self.literal.setdefault(pattern, set()).add(dest)
        else:
            entry = self.wild.get(pattern)
            if entry is None:
                entry = self.wild[pattern] = (pattern_regex(pattern).fullmatch, set())
            entry[1].add(dest)

    def unsubscribe(self, pattern: str, dest: object) -> None:
        if is_literal(pattern):
            subs = self.literal.get(pattern)
            if subs is not None:
                subs.discard(dest)
                if not subs:
                    del self.literal[pattern]
            return
        entry = self.wild.get(pattern)
        if entry is not None:
            entry[1].discard(dest)
            if not entry[1]:
                del self.wild[pattern]

    def lookup(self, key: str) -> set:
        out: set = set()
        for pattern, subs in self.literal.items():
            if pattern == key:
                out |= subs
        text = "".join(w + "." for w in words_of(key))
        for match, subs in self.wild.values():
            if match(text):
                out |= subs
        return out


class InvertedBitmap:
    """Treat's "inverted bitmap": one bitmap of subscriptions per topic of a topic space known
    in advance. Subscribing tests the pattern against every known topic; a lookup is one bitmap.
    Each subscription also keeps the topic numbers it set (an ``array``) to unsubscribe fast."""

    name = "inverted bitmap"

    def __init__(self, topics: list[str]) -> None:
        self.subs = _Subscriptions()
        self.topics = topics
        self.topic_no = {t: i for i, t in enumerate(topics)}
        self.bitmaps = [BitMap() for _ in topics]
        # All topics in one string, one per line, each written as "word." per word.
        self.text = "".join("".join(w + "." for w in words_of(t)) + "\n" for t in topics)
        self.line_starts = array("I", [0])
        for t in topics:
            self.line_starts.append(self.line_starts[-1] + sum(len(w) + 1 for w in words_of(t)) + 1)
        self.matched: dict[int, array] = {}

    def _matching_topics(self, pattern: str) -> array:
        if is_literal(pattern):
            no = self.topic_no.get(pattern)
            return array("I", () if no is None else (no,))
        rx = re.compile("^" + pattern_regex(pattern).pattern + "$", re.MULTILINE)
        starts = self.line_starts
        return array("I", (bisect_right(starts, m.start()) - 1 for m in rx.finditer(self.text)))

    def subscribe(self, pattern: str, dest: object) -> None:
        sid = self.subs.add(pattern, dest)
        if sid is None:
            return
        topics = self._matching_topics(pattern)
        bitmaps = self.bitmaps
        for no in topics:
            bitmaps[no].add(sid)
        self.matched[sid] = topics

    def unsubscribe(self, pattern: str, dest: object) -> None:
        sid = self.subs.remove(pattern, dest)
        if sid is None:
            return
        bitmaps = self.bitmaps
        for no in self.matched.pop(sid):
            bitmaps[no].discard(sid)

    def lookup(self, key: str) -> set:
        no = self.topic_no.get(key)
        if no is None:
            raise KeyError(f"topic {key!r} is outside the topic space given in advance")
        return self.subs.resolve(self.bitmaps[no])


class _Table:
    """One constituent position: word rows, plus the "other" (any word) and "null" (no word)
    rows of the WSO2/Treat optimized inverted bitmap."""

    __slots__ = ("rows", "other", "null")

    def __init__(self, other: BitMap, null: BitMap) -> None:
        self.rows: dict[str, BitMap] = {}
        self.other = other
        self.null = null


class OptimizedInvertedBitmap:
    """Per-constituent tables (WSO2 MB, Treat): a lookup ANDs one row per word position.

    ``*`` at position i sets the "other" row of table i; ``#`` at position i sets "other" and
    "null" in every table from i on (WSO2's "topic and children" entries) and marks the
    subscription as able to absorb words past the last table. Patterns with words after their
    first ``#`` are indexed up to that ``#`` and post-filtered with a regex (RFC003's "discard
    false positives"), since positional tables cannot express ``a.#.b``."""

    name = "optimized inverted bitmap"

    def __init__(self) -> None:
        self.subs = _Subscriptions()
        self.tables: list[_Table] = []
        self.everyone = BitMap()  # all live subscriptions
        self.hashed = BitMap()  # subscriptions with a "#": they match any extra words
        self.verify: dict[int, object] = {}  # sid -> fullmatch, for post-filtering
        self.shape: dict[int, tuple[list[str], int | None]] = {}

    @staticmethod
    def _shape(pattern: str) -> tuple[list[str], int | None]:
        words = words_of(pattern)
        first_hash = words.index("#") if "#" in words else None
        return (words if first_hash is None else words[:first_hash]), first_hash

    def _table(self, i: int) -> _Table:
        while len(self.tables) <= i:
            # A new position: every existing subscription is shorter, so "no word here" holds
            # for all of them; "#" subscriptions also accept any word.
            self.tables.append(_Table(BitMap(self.hashed), BitMap(self.everyone)))
        return self.tables[i]

    def subscribe(self, pattern: str, dest: object) -> None:
        sid = self.subs.add(pattern, dest)
        if sid is None:
            return
        fixed, first_hash = self._shape(pattern)
        self.shape[sid] = (fixed, first_hash)
        for i, w in enumerate(fixed):
            table = self._table(i)
            if w == "*":
                table.other.add(sid)
            else:
                row = table.rows.get(w)
                if row is None:
                    row = table.rows[w] = BitMap()
                row.add(sid)
        for i in range(len(fixed), len(self.tables)):
            table = self.tables[i]
            table.null.add(sid)
            if first_hash is not None:
                table.other.add(sid)
        self.everyone.add(sid)
        if first_hash is not None:
            self.hashed.add(sid)
            if first_hash < len(words_of(pattern)) - 1:
                self.verify[sid] = pattern_regex(pattern).fullmatch

    def unsubscribe(self, pattern: str, dest: object) -> None:
        sid = self.subs.remove(pattern, dest)
        if sid is None:
            return
        fixed, first_hash = self.shape.pop(sid)
        for i, w in enumerate(fixed):
            table = self.tables[i]
            if w == "*":
                table.other.discard(sid)
            else:
                row = table.rows[w]
                row.discard(sid)
                if not row:
                    del table.rows[w]
        for i in range(len(fixed), len(self.tables)):
            self.tables[i].null.discard(sid)
            self.tables[i].other.discard(sid)
        self.everyone.discard(sid)
        self.hashed.discard(sid)
        self.verify.pop(sid, None)

    def lookup(self, key: str) -> set:
        words = words_of(key)
        tables = self.tables
        result = BitMap(self.everyone) if len(words) <= len(tables) else self.hashed & self.everyone
        for i, table in enumerate(tables):
            if i < len(words):
                row = table.rows.get(words[i])
                result &= (row | table.other) if row is not None else table.other
            else:
                result &= table.null
            if not result:
                return set()
        if self.verify:
            text = "".join(w + "." for w in words)
            verify = self.verify
            result = BitMap(s for s in result if s not in verify or verify[s](text))
        return self.subs.resolve(result)


class _TrieNode:
    __slots__ = ("children", "subs")

    def __init__(self) -> None:
        self.children: dict[str, _TrieNode] = {}
        self.subs: set = set()


class Trie:
    """RabbitMQ/ZeroMQ-style trie: ``*`` and ``#`` are ordinary edges; a lookup backtracks
    through the literal, ``*`` and ``#`` edges at every level (rabbit_db_topic_exchange)."""

    name = "trie"

    def __init__(self) -> None:
        self.root = _TrieNode()

    def subscribe(self, pattern: str, dest: object) -> None:
        node = self.root
        for w in words_of(pattern):
            child = node.children.get(w)
            if child is None:
                child = node.children[w] = _TrieNode()
            node = child
        node.subs.add(dest)

    def unsubscribe(self, pattern: str, dest: object) -> None:
        path = []
        node = self.root
        for w in words_of(pattern):
            child = node.children.get(w)
            if child is None:
                return
            path.append((node, w))
            node = child
        node.subs.discard(dest)
        while path and not node.subs and not node.children:
            parent, w = path.pop()
            del parent.children[w]
            node = parent

    def lookup(self, key: str) -> set:
        out: set = set()
        self._match(self.root, words_of(key), 0, out)
        return out

    def _match(self, node: _TrieNode, words: list[str], i: int, out: set) -> None:
        children = node.children
        if i == len(words):
            out |= node.subs
        else:
            child = children.get(words[i])
            if child is not None:
                self._match(child, words, i + 1, out)
            child = children.get("*")
            if child is not None:
                self._match(child, words, i + 1, out)
        child = children.get("#")
        if child is not None:
            for j in range(i, len(words) + 1):
                self._match(child, words, j, out)
