"""Direct routing: ``routing key -> destinations``, each set materialised once per change."""

from __future__ import annotations

from collections.abc import Hashable, Mapping

from pyroaring import BitMap

from .bindings import EMPTY, BindingTable, ids_add, ids_iter, ids_remove


class DirectIndex(BindingTable):
    """Direct-exchange bindings: the destinations bound with exactly the routing key."""

    __slots__ = ("_by_key", "_hot")

    def __init__(self) -> None:
        super().__init__()
        self._by_key: dict[str, int | BitMap] = {}
        self._hot: dict[str, frozenset] = {}  # keys whose destination set is up to date

    def bind(self, key: str, destination: Hashable, arguments: Mapping | None = None) -> bool:
        ids = self._by_key.get(key)
        if ids is not None and self._find(ids, key, destination, arguments) is not None:
            return False
        b = self._new_id(key, destination, arguments)
        self._by_key[key] = ids_add(ids, b)
        hot = self._hot.get(key)
        if hot is not None and destination not in hot:
            del self._hot[key]
        return True

    def unbind(self, key: str, destination: Hashable, arguments: Mapping | None = None) -> bool:
        ids = self._by_key.get(key)
        b = None if ids is None else self._find(ids, key, destination, arguments)
        if b is None:
            return False
        self._drop(b)
        return True

    def _unindex(self, b: int) -> None:
        key = self._keys[b]
        rest = ids_remove(self._by_key[key], b)  # type: ignore[index]
        if rest is None:
            del self._by_key[key]  # type: ignore[arg-type]
        else:
            self._by_key[key] = rest  # type: ignore[index]
        self._hot.pop(key, None)  # type: ignore[arg-type]

    def _forget(self, destination: Hashable | None) -> None:
        self._to_free.extend(self._hot.values())  # freed by the sweeps, not all at once here
        self._hot.clear()

    def route(self, routing_key: str, headers: Mapping | None = None) -> frozenset:
        dests = self._hot.get(routing_key)
        if dests is not None:
            return dests
        ids = self._by_key.get(routing_key)
        if ids is None:
            return EMPTY
        if self._dead is not None:  # removed bindings wait to be swept: skip theirs
            ids = BitMap(ids_iter(ids)) - self._dead
        dests = self._hot[routing_key] = frozenset(map(self._dests.__getitem__, ids_iter(ids)))
        return dests

    def __repr__(self) -> str:
        return f"<DirectIndex bindings={len(self)}>"
