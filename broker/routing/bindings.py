"""The binding registry every index shares: small recycled integer ids and what they stand for.

A binding is ``(key, destination, arguments)``; its identity is ``(key, destination,
arguments_key(arguments))`` as in RabbitMQ. Each binding gets the lowest-numbered free id so the
bitmaps that hold ids stay dense. Per-binding data lives in three parallel lists indexed by id
(no per-binding object, no identity dict) because at a million bindings every 100 bytes count;
a binding is found again through ``destination -> ids`` intersected with the ids stored where
its key lives.

Fanout and headers bindings have no key index to narrow that search, so there it would cover
every binding of the destination: binding 100,000 routing keys of one queue to a fanout
exchange compared each new one with all the others (minutes). Those two indexes set
``IDENTIFIED``: a destination with ``IDENTIFY_FROM`` bindings or more gets its own dict
(``_ident``) from a bucket, its binding's routing key if it has no arguments, else the hash of
its whole identity, to the ids in it (see ``bucket``); bind and unbind look there and compare
only what shares the bucket. Below that the search stays the short scan, so the usual shapes
(a queue bound once or a few times) keep no dict at all.

Sets of ids are stored as a plain ``int`` while they have one member and as a pyroaring
``BitMap`` from the second one on: an empty BitMap costs ~100 bytes and a one-element one ~200,
which would dominate the memory of an index where most keys have a single binding.

Removing a destination with many bindings (a deleted queue bound by 100,000 patterns) is done in
two steps so that no one step holds the event loop: ``remove_destination`` takes them out of
``destination -> ids``, the counts and the listings and adds their ids to ``_dead``, which every
route subtracts, and the index drops what it had cached of routes (``_forget``), all without
visiting the bindings one by one; ``sweep(budget)`` then takes that many of them out of the
index's own tables per call, and the caller (``VirtualHost``) calls it once a loop turn until
none is left. A dead id is not reused before it is swept. Fewer than ``LAZY_REMOVAL`` bindings
are removed at once, as before. A destination's ``_ident`` dict is swept the same way, entry by
entry (a lookup skips dead ids meanwhile), rather than freed whole in the removal's turn.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping
from heapq import heappop, heappush
from typing import Any

from pyroaring import BitMap

from .fields import arguments_key

Ids = int | BitMap | None
EMPTY: frozenset = frozenset()

#: ``remove_destination`` of at least this many bindings leaves them to ``sweep``: a topic
#: binding costs ~2 us to take out of the trie, so 1,000 is ~2 ms, the most a delete does at once.
LAZY_REMOVAL = 1000

#: A destination of an ``IDENTIFIED`` index gets an identity dict from this many bindings on
#: (below it a bind compares at most 7), and loses it under ``IDENTIFY_FROM // 2``, so that a
#: count going up and down by one does not make and drop it each time. The dict costs a binding
#: ~50-70 bytes (its slot and its id as an int), ~90 with arguments (the hash too): fanout 25 ->
#: 74, headers 94 -> 186 bytes a binding, all bound to one queue (bench/binds.py, memory).
IDENTIFY_FROM = 8


def ids_add(ids: Ids, b: int) -> int | BitMap:
    """``ids`` with ``b`` added (``b`` must not be in it)."""
    if ids is None:
        return b
    if type(ids) is int:
        return BitMap((ids, b))
    ids.add(b)
    return ids


def ids_remove(ids: Ids, b: int) -> Ids:
    """``ids`` with ``b`` removed; ``None`` once empty, back to an ``int`` at one member."""
    if ids is None or type(ids) is int:
        return None if ids == b else ids
    ids.discard(b)
    n = len(ids)
    if n > 1:
        return ids
    return ids.min() if n else None


def ids_iter(ids: Ids) -> Iterable[int]:
    if ids is None:
        return ()
    if type(ids) is int:
        return (ids,)
    return ids


def ids_contains(ids: Ids, b: int) -> bool:
    if ids is None:
        return False
    if type(ids) is int:
        return ids == b
    return b in ids


def ids_len(ids: Ids) -> int:
    if ids is None:
        return 0
    if type(ids) is int:
        return 1
    return len(ids)


def bucket(key: str, akey: tuple) -> Hashable:
    """Where a binding with routing key ``key`` and ``arguments_key`` ``akey`` goes in its
    destination's identity dict: the key itself when there are no arguments (the string the
    binding holds already, so the entry adds no object), else the hash of the identity (an
    int of ~32 bytes where the identity is a tuple of tuples of a few hundred). A ``str`` never
    equals an ``int``, so the two kinds never share a bucket; identities with the same hash
    do, and ``_find`` tells them apart by comparing, as a dict would."""
    return hash((key, akey)) if akey else key


def ids_intersect(a: Ids, b: Ids) -> Iterable[int]:
    if a is None or b is None:
        return ()
    if type(a) is int:
        return (a,) if ids_contains(b, a) else ()
    if type(b) is int:
        return (b,) if b in a else ()
    return a & b


class BindingTable:
    """Id allocation and the per-binding arrays; subclasses index the keys."""

    __slots__ = (
        "_keys",
        "_dests",
        "_args",
        "_free",
        "_by_dest",
        "_count",
        "_dead",
        "_to_free",
        "_ident",
    )

    #: Whether destinations with many bindings get an identity dict (``IDENTIFY_FROM``): for
    #: the indexes that find a binding through its destination's ids alone.
    IDENTIFIED = False

    def __init__(self) -> None:
        self._keys: list[str | None] = []  # None marks a free id
        self._dests: list[Any] = []
        self._args: list[Mapping | None] = []
        self._free: list[int] = []
        self._by_dest: dict[Hashable, int | BitMap] = {}
        self._count = 0
        #: Removed bindings not yet swept out of the index's tables (None: none); routes
        #: subtract them, listings skip them, and their ids are not reused until swept.
        self._dead: BitMap | None = None
        #: What a lazy removal let go of (cached routes), freed by ``sweep`` a few at a time.
        self._to_free: list = []
        #: destination -> bucket (see ``bucket``) -> ids, for destinations with
        #: ``IDENTIFY_FROM`` bindings or more: every live binding of the destination is in
        #: it, and so may be buried ones not swept yet.
        self._ident: dict[Hashable, dict[Hashable, int | BitMap]] = {}

    def __len__(self) -> int:
        return self._count

    def has_bindings(self) -> bool:
        return self._count > 0

    def bindings(self) -> Iterator[tuple[str, Any, Mapping | None]]:
        """Every binding as ``(key, destination, arguments)``, arguments as first given."""
        keys, dests, args = self._keys, self._dests, self._args
        for b in range(len(keys)):
            key = keys[b]
            if key is not None:
                dead = self._dead  # read each time: a removal may come between two yields
                if dead is None or b not in dead:
                    yield key, dests[b], args[b]

    def remove_destination(self, destination: Hashable) -> int:
        """Drop every binding to ``destination`` (a deleted queue); returns how many.

        From ``LAZY_REMOVAL`` bindings on they are gone from routes, counts and listings at
        once and left for ``sweep`` to take out of the tables (see the module docstring).
        """
        ids = self._by_dest.get(destination)
        if ids is None:
            return 0
        if type(ids) is int or len(ids) < LAZY_REMOVAL:
            doomed = list(ids_iter(ids))
            for b in doomed:
                self._drop(b)
            return len(doomed)
        del self._by_dest[destination]
        self._bury(ids)
        self._forget(destination)
        return len(ids)

    def remove_all(self) -> int:
        """Drop every binding (the index's exchange is deleted), leaving them all to ``sweep``:
        what would free the index's tables at once is spread over the sweeps."""
        n = self._count
        if n:
            live = BitMap(range(len(self._keys)))
            live -= BitMap(self._free)
            if self._dead is not None:
                live -= self._dead
            self._by_dest.clear()
            self._bury(live)
            self._forget(None)
        return n

    def _bury(self, ids: BitMap) -> None:
        """Count ``ids`` (no longer in ``_by_dest``) as removed, to be swept."""
        self._count -= len(ids)
        if self._dead is None:
            self._dead = ids
        else:
            self._dead |= ids

    def to_sweep(self) -> int:
        """How much lazy removals left for ``sweep``: objects to free, bindings to sweep out."""
        dead = self._dead
        return len(self._to_free) + (0 if dead is None else len(dead))

    def sweep(self, budget: int) -> int:
        """Free up to ``budget`` objects lazy removals let go of, then take removed bindings
        out of the index's tables, ``budget`` in all; returns how many."""
        to_free = self._to_free
        done = min(budget, len(to_free))
        if done:
            del to_free[-done:]
        dead = self._dead
        if dead is None or done == budget:
            return done
        batch = dead[: budget - done]
        identified = self._ident
        for b in batch:
            self._unindex(b)
            if identified:
                self._unident(b)
            self._release(b)
        dead -= batch
        if not dead:
            self._dead = None
        return done + len(batch)

    def _drop(self, b: int) -> None:
        """Remove live binding ``b`` from everything."""
        self._unindex(b)
        self._free_id(b)

    def _unindex(self, b: int) -> None:
        """Take ``b`` out of the index's own tables (not ``_by_dest``, not the id arrays)."""
        raise NotImplementedError

    def _forget(self, destination: Hashable | None) -> None:
        """``destination``'s bindings (None: every binding) were just buried: drop what the
        index remembers of where routes go, so that no route reaches them from now on."""
        raise NotImplementedError

    def _find(
        self, ids: Ids, key: str, destination: Hashable, arguments: Mapping | None
    ) -> int | None:
        """The id of binding ``(key, destination, arguments)`` among ``ids``, if any."""
        if self._ident:
            ident = self._ident.get(destination)
            if ident is not None:
                return self._identified(ident, key, arguments)
        candidates = ids_intersect(ids, self._by_dest.get(destination))
        if not candidates:
            return None
        akey = None
        keys, args = self._keys, self._args
        for b in candidates:
            if keys[b] == key:
                if akey is None:
                    akey = arguments_key(arguments)
                if arguments_key(args[b]) == akey:
                    return b
        return None

    def _identified(self, ident: dict, key: str, arguments: Mapping | None) -> int | None:
        """The live binding with ``key`` and ``arguments`` in a destination's identity dict."""
        akey = arguments_key(arguments)
        ids = ident.get(bucket(key, akey))
        if ids is None:
            return None
        keys, args, dead = self._keys, self._args, self._dead
        for b in ids_iter(ids):
            if keys[b] != key or (dead is not None and b in dead):
                continue  # another identity with the same hash, or a binding being swept
            if (args[b] is None) if not akey else (arguments_key(args[b]) == akey):
                return b
        return None

    def _identify(self, destination: Hashable, b: int, ids: Ids) -> None:
        """Put new binding ``b`` in its destination's identity dict (``ids``: the
        destination's live ids, ``b`` among them), making the dict once they are many."""
        ident = self._ident.get(destination)
        if ident is not None:
            where = bucket(self._keys[b], arguments_key(self._args[b]))  # type: ignore[arg-type]
            ident[where] = ids_add(ident.get(where), b)
        elif ids_len(ids) >= IDENTIFY_FROM:
            ident = self._ident[destination] = {}
            keys, args = self._keys, self._args
            for i in ids_iter(ids):
                where = bucket(keys[i], arguments_key(args[i]))  # type: ignore[arg-type]
                ident[where] = ids_add(ident.get(where), i)

    def _unident(self, b: int) -> None:
        """Take ``b`` out of its destination's identity dict if it is in one (still named by
        the id arrays), dropping the dict when both it and the live bindings are few."""
        destination = self._dests[b]
        ident = self._ident.get(destination)
        if ident is None:
            return
        where = bucket(self._keys[b], arguments_key(self._args[b]))  # type: ignore[arg-type]
        ids = ident.get(where)
        if ids is not None:  # b may be gone already: dropped with an earlier dict, or swept
            rest = ids_remove(ids, b)
            if rest is None:
                del ident[where]
            else:
                ident[where] = rest
        few = IDENTIFY_FROM // 2
        if len(ident) < few and ids_len(self._by_dest.get(destination)) < few:
            del self._ident[destination]

    def _new_id(self, key: str, destination: Hashable, arguments: Mapping | None) -> int:
        free = self._free
        if free:
            b = heappop(free)
            self._keys[b] = key
            self._dests[b] = destination
            self._args[b] = arguments or None
        else:
            b = len(self._keys)
            self._keys.append(key)
            self._dests.append(destination)
            self._args.append(arguments or None)
        by_dest = self._by_dest
        ids = by_dest[destination] = ids_add(by_dest.get(destination), b)
        self._count += 1
        if self.IDENTIFIED:
            self._identify(destination, b, ids)
        return b

    def _free_id(self, b: int) -> None:
        """Forget binding ``b``; callers must already have removed it from their indexes."""
        destination = self._dests[b]
        by_dest = self._by_dest
        rest = ids_remove(by_dest[destination], b)
        if rest is None:
            del by_dest[destination]
        else:
            by_dest[destination] = rest
        self._count -= 1
        if self._ident:
            self._unident(b)
        self._release(b)

    def _release(self, b: int) -> None:
        """Make id ``b`` free for reuse."""
        self._keys[b] = None
        self._dests[b] = None
        self._args[b] = None
        heappush(self._free, b)  # a min-heap: low ids are reused first, keeping bitmaps dense

    def check_ids(self) -> None:
        """Assert the id arrays, ``_by_dest``, the count and ``_dead`` agree (for tests)."""
        used = BitMap(b for b, key in enumerate(self._keys) if key is not None)
        assert not used.intersect(BitMap(self._free)), "an id both used and free"
        dead = self._dead if self._dead is not None else BitMap()
        assert self._dead is None or dead, "an empty _dead left behind"
        assert dead <= used, "a buried id was released before it was swept"
        live = BitMap()
        for destination, ids in self._by_dest.items():
            for b in ids_iter(ids):
                assert self._dests[b] == destination, "an id under another destination"
                live.add(b)
        assert live == used - dead, "a live id missing from _by_dest, or a buried one in it"
        assert self._count == len(live), "the count is off"
        self._check_ident(dead)

    def _check_ident(self, dead: BitMap) -> None:
        """Assert every identity dict holds its destination's live bindings, each in its own
        bucket, besides buried ones only, and that one exists wherever bindings are many."""
        assert self.IDENTIFIED or not self._ident, "an identity dict in an index without them"
        few = IDENTIFY_FROM // 2
        for destination, ids in self._by_dest.items():
            if self.IDENTIFIED and ids_len(ids) >= IDENTIFY_FROM:
                assert destination in self._ident, "many bindings and no identity dict"
        for destination, ident in self._ident.items():
            live = self._by_dest.get(destination)
            assert len(ident) >= few or ids_len(live) >= few, "an identity dict left behind"
            held = BitMap()
            for where, ids in ident.items():
                assert ids is not None and (type(ids) is int or len(ids) > 1), "a bad bucket"
                for b in ids_iter(ids):
                    assert self._dests[b] == destination, "an id under another destination"
                    key, akey = self._keys[b], arguments_key(self._args[b])
                    assert bucket(key, akey) == where, "an id in the wrong bucket"  # type: ignore[arg-type]
                    assert b not in held, "an id in two buckets"
                    held.add(b)
            assert BitMap(ids_iter(live)) <= held, "a live binding missing from its dict"
            assert held - BitMap(ids_iter(live)) <= dead, "a released id in an identity dict"

    def _reaches(self, ids: BitMap, destination: Hashable) -> bool:
        """True if some binding in ``ids`` still leads to ``destination``."""
        d = self._by_dest.get(destination)
        if d is None:
            return False
        if type(d) is int:
            return d in ids
        return ids.intersect(d)
