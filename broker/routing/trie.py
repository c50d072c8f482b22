"""Wildcard topic patterns and the trie that matches routing keys against them.

A pattern is a tuple of tokens: a literal word, ``STAR`` (exactly one word) or ``HASH`` (zero or
more words). Runs of wildcards are normalised (``#.#`` -> ``#``, ``#.*`` -> ``*.#``), which
bounds the matcher's work. The trie has a dict of literal edges and separate ``*`` and ``#``
edges per node (NATS sublist, RabbitMQ); a node where a pattern ends holds the ids of its
bindings (an ``int`` for one, a ``BitMap`` for more) and, for the routing-key cache, the slots of
the cached keys that pattern matches (``cached``: every binding at a node matches the same keys,
so one BitMap serves them all).
"""

from __future__ import annotations

from pyroaring import BitMap


class _Wildcard:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


STAR = _Wildcard("STAR")  # exactly one word
HASH = _Wildcard("HASH")  # zero or more words

Token = str | _Wildcard
Pattern = tuple[Token, ...]


def normalise(tokens: list[Token]) -> Pattern:
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


def parse_amqp(pattern: str) -> Pattern | None:
    """Normalised tokens of an AMQP wildcard pattern (``.``-separated), ``None`` if literal."""
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
    return normalise(tokens) if wild else None


def parse_mqtt(pattern: str) -> Pattern | None:
    """Tokens of an MQTT topic filter (``/``, ``+``, a last-level ``#``), ``None`` if literal.

    Raises ``ValueError`` for an invalid filter.
    """
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


def match_tokens(tokens: Pattern, words: tuple[str, ...] | list[str]) -> bool:
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


class TrieNode:
    """``ids`` is set where a pattern ends; ``cached`` are the cached keys that pattern matches;
    where its bindings lead, which the index notes on a cold route through the node and
    clears whenever ``ids`` changes: ``one``, the destination of a lone binding (the node
    itself answers, no object of its own to read), or ``dests``, a frozenset."""

    __slots__ = ("children", "star", "hash", "ids", "cached", "one", "dests")

    def __init__(self) -> None:
        self.children: dict[str, TrieNode] | None = None
        self.star: TrieNode | None = None
        self.hash: TrieNode | None = None
        self.ids: int | BitMap | None = None
        self.cached: BitMap | None = None
        self.one: object | None = None
        self.dests: frozenset | None = None

    def is_empty(self) -> bool:
        return self.ids is None and not self.children and self.star is None and self.hash is None


class WildcardTrie:
    """The wildcard patterns' trie: where each pattern ends, and which ends a key reaches."""

    __slots__ = ("root", "skip_dollar")

    def __init__(self, skip_dollar: bool = False) -> None:
        self.root = TrieNode()
        #: MQTT: a filter starting with a wildcard does not match a topic whose first level
        #: starts with "$" (MQTT 3.1.1 section 4.7.2).
        self.skip_dollar = skip_dollar

    def end_of(self, tokens: Pattern) -> TrieNode:
        """The node where ``tokens`` ends, created (with its path) if new."""
        node = self.root
        for t in tokens:
            if t is STAR:
                nxt = node.star
                if nxt is None:
                    nxt = node.star = TrieNode()
            elif t is HASH:
                nxt = node.hash
                if nxt is None:
                    nxt = node.hash = TrieNode()
            else:
                children = node.children
                if children is None:
                    children = node.children = {}
                nxt = children.get(t)  # type: ignore[arg-type]
                if nxt is None:
                    nxt = children[t] = TrieNode()  # type: ignore[index]
            node = nxt
        return node

    def find(self, tokens: Pattern) -> TrieNode | None:
        """The node where ``tokens`` ends, if the trie has it."""
        node: TrieNode | None = self.root
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

    def path(self, tokens: Pattern) -> tuple[list[tuple[TrieNode, Token]], TrieNode]:
        """``(parent, token)`` of each step to an existing pattern's end (for ``prune``), and
        that end."""
        steps: list[tuple[TrieNode, Token]] = []
        node = self.root
        for t in tokens:
            steps.append((node, t))
            if t is STAR:
                node = node.star  # type: ignore[assignment]
            elif t is HASH:
                node = node.hash  # type: ignore[assignment]
            else:
                node = node.children[t]  # type: ignore[index]
        return steps, node

    @staticmethod
    def prune(node: TrieNode, steps: list[tuple[TrieNode, Token]]) -> None:
        """Unlink ``node`` and the ancestors it leaves empty (``steps`` from ``path``)."""
        while steps and node.is_empty():
            parent, t = steps.pop()
            if t is STAR:
                parent.star = None
            elif t is HASH:
                parent.hash = None
            else:
                del parent.children[t]  # type: ignore[union-attr, arg-type]
                if not parent.children:
                    parent.children = None
            node = parent

    def match(self, words: tuple[str, ...] | list[str]) -> list[TrieNode]:
        """Nodes with bindings whose patterns match ``words`` (each node once).

        Every (node, position) state is visited at most once: non-``#`` nodes are reached at a
        given position by a single path, and each ``#`` node remembers the lowest position it
        was entered at (``hash_from``), so re-entering it only scans positions not yet scanned.
        The work is therefore O(trie nodes on matching paths x words), never exponential.

        A walk follows one path in its inner loop (the literal edge, else the ``*`` edge) and
        stacks only the branches it leaves behind; nothing is allocated but ``found`` unless a
        key forks (a literal and a ``*`` edge both match) or meets a ``#``.
        """
        n = len(words)
        found: list[TrieNode] = []
        node = self.root
        i = 0
        if self.skip_dollar and n and words[0][:1] == "$":
            # MQTT: only filters whose first level is literal match a "$" topic
            children = node.children
            node = None if children is None else children.get(words[0])  # type: ignore[assignment]
            if node is None:
                return found
            i = 1
        hash_from: dict[TrieNode, int] | None = None
        stack: list[tuple[TrieNode, int]] | None = None
        while True:
            while True:
                h = node.hash
                if i == n:
                    if node.ids is not None:
                        found.append(node)
                    # a "#" here matches zero words; (h, n) is new unless h was entered before
                    if h is not None:
                        if hash_from is None:
                            hash_from = {}
                        if h not in hash_from:
                            hash_from[h] = n
                            if h.ids is not None:
                                found.append(h)
                    break
                if h is not None:
                    # "#" may swallow words[i:j] for every j in [i, n]; the states (h, j) an
                    # earlier entry already scanned (j >= stop) need no second visit.
                    if hash_from is None:
                        hash_from = {}
                    stop = hash_from.get(h, n + 1)
                    if i < stop:
                        hash_from[h] = i
                        if stop > n and h.ids is not None:
                            found.append(h)
                        end = stop if stop < n else n
                        h_children, h_star = h.children, h.star
                        if h_children is not None:
                            for j in range(i, end):
                                child = h_children.get(words[j])
                                if child is not None:
                                    if stack is None:
                                        stack = []
                                    stack.append((child, j + 1))
                        if h_star is not None and i < end:
                            if stack is None:
                                stack = []
                            stack.extend([(h_star, j + 1) for j in range(i, end)])
                star = node.star
                children = node.children
                if children is not None:
                    nxt = children.get(words[i])
                    if nxt is not None:
                        if star is not None:
                            if stack is None:
                                stack = []
                            stack.append((star, i + 1))
                        node = nxt
                        i += 1
                        continue
                if star is None:
                    break
                node = star
                i += 1
            if not stack:
                return found
            node, i = stack.pop()

    def nodes(self) -> list[TrieNode]:
        """Every node (for invariant checks)."""
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend((node.children or {}).values())
            stack.extend(n for n in (node.star, node.hash) if n is not None)
        return out
