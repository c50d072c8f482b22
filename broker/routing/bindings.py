"""The binding registry every index shares: small recycled integer ids and what they stand for.

A binding is ``(key, destination, arguments)``; its identity is ``(key, destination,
arguments_key(arguments))`` as in RabbitMQ. Each binding gets the lowest-numbered free id so the
bitmaps that hold ids stay dense. Per-binding data lives in three parallel lists indexed by id
(no per-binding object, no identity dict) because at a million bindings every 100 bytes count;
a binding is found again through ``destination -> ids`` intersected with the ids stored where
its key lives.

Sets of ids are stored as a plain ``int`` while they have one member and as a pyroaring
``BitMap`` from the second one on: an empty BitMap costs ~100 bytes and a one-element one ~200,
which would dominate the memory of an index where most keys have a single binding.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping
from heapq import heappop, heappush
from typing import Any

from pyroaring import BitMap

from .fields import arguments_key

Ids = int | BitMap | None
EMPTY: frozenset = frozenset()


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

    __slots__ = ("_keys", "_dests", "_args", "_free", "_by_dest", "_count")

    def __init__(self) -> None:
        self._keys: list[str | None] = []  # None marks a free id
        self._dests: list[Any] = []
        self._args: list[Mapping | None] = []
        self._free: list[int] = []
        self._by_dest: dict[Hashable, int | BitMap] = {}
        self._count = 0

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
                yield key, dests[b], args[b]

    def remove_destination(self, destination: Hashable) -> int:
        """Drop every binding to ``destination`` (a deleted queue); returns how many."""
        ids = self._by_dest.get(destination)
        if ids is None:
            return 0
        doomed = list(ids_iter(ids))
        for b in doomed:
            self._drop(b)
        return len(doomed)

    def _drop(self, b: int) -> None:
        raise NotImplementedError

    def _find(
        self, ids: Ids, key: str, destination: Hashable, arguments: Mapping | None
    ) -> int | None:
        """The id of binding ``(key, destination, arguments)`` among ``ids``, if any."""
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
        by_dest[destination] = ids_add(by_dest.get(destination), b)
        self._count += 1
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
        self._keys[b] = None
        self._dests[b] = None
        self._args[b] = None
        self._count -= 1
        heappush(self._free, b)  # a min-heap: low ids are reused first, keeping bitmaps dense

    def _reaches(self, ids: BitMap, destination: Hashable) -> bool:
        """True if some binding in ``ids`` still leads to ``destination``."""
        d = self._by_dest.get(destination)
        if d is None:
            return False
        if type(d) is int:
            return d in ids
        return ids.intersect(d)
