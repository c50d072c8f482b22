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

    def _drop(self, b: int) -> None:
        key = self._keys[b]
        rest = ids_remove(self._by_key[key], b)  # type: ignore[index]
        if rest is None:
            del self._by_key[key]  # type: ignore[arg-type]
        else:
            self._by_key[key] = rest  # type: ignore[index]
        self._hot.pop(key, None)  # type: ignore[arg-type]
        self._free_id(b)

    def route(self, routing_key: str, headers: Mapping | None = None) -> frozenset:
        dests = self._hot.get(routing_key)
        if dests is not None:
            return dests
        ids = self._by_key.get(routing_key)
        if ids is None:
            return EMPTY
        dests = self._hot[routing_key] = frozenset(map(self._dests.__getitem__, ids_iter(ids)))
        return dests

    def __repr__(self) -> str:
        return f"<DirectIndex bindings={len(self)}>"
