"""Fanout routing: every bound destination, whatever the routing key."""

from __future__ import annotations

from collections.abc import Hashable, Mapping

from .bindings import BindingTable


class FanoutIndex(BindingTable):
    """Fanout-exchange bindings; the key and arguments only tell bindings apart."""

    __slots__ = ("_all",)

    IDENTIFIED = True  # a binding is found through its destination's ids alone

    def __init__(self) -> None:
        super().__init__()
        self._all: frozenset | None = frozenset()

    def bind(self, key: str, destination: Hashable, arguments: Mapping | None = None) -> bool:
        if self._find(self._by_dest.get(destination), key, destination, arguments) is not None:
            return False
        self._new_id(key, destination, arguments)
        if self._all is not None and destination not in self._all:
            self._all = None
        return True

    def unbind(self, key: str, destination: Hashable, arguments: Mapping | None = None) -> bool:
        b = self._find(self._by_dest.get(destination), key, destination, arguments)
        if b is None:
            return False
        self._drop(b)
        return True

    def _drop(self, b: int) -> None:
        self._free_id(b)
        if self._dests_changed():
            self._all = None

    def _unindex(self, b: int) -> None:
        pass  # a fanout binding is in no table but ``_by_dest``

    def _forget(self, destination: Hashable | None) -> None:
        self._all = None

    def _dests_changed(self) -> bool:
        return self._all is None or len(self._all) != len(self._by_dest)

    def route(self, routing_key: str, headers: Mapping | None = None) -> frozenset:
        dests = self._all
        if dests is None:
            dests = self._all = frozenset(self._by_dest)
        return dests

    def __repr__(self) -> str:
        return f"<FanoutIndex bindings={len(self)}>"
