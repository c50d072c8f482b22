"""Lazy removal (broker/routing/bindings.py) in an index's Hypothesis state machine."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import rule

from roarmq.broker.routing import bindings


class LazyRemovalRules:
    """Mix into a state machine whose ``idx`` is an index and ``model`` its bindings: every
    removal of two bindings or more is left to ``sweep``, swept a few at a time between the
    other rules, so routes, counts and listings meet buried bindings swept or not, and
    destinations bound again while their old bindings wait."""

    idx: bindings.BindingTable
    model: dict | list

    def __init__(self) -> None:
        super().__init__()
        self._saved_lazy = bindings.LAZY_REMOVAL
        bindings.LAZY_REMOVAL = 2

    def teardown(self) -> None:
        bindings.LAZY_REMOVAL = self._saved_lazy

    @rule(budget=st.integers(1, 3))
    def sweep(self, budget: int) -> None:
        waiting = self.idx.to_sweep()
        assert self.idx.sweep(budget) == min(budget, waiting)
        assert self.idx.to_sweep() == waiting - min(budget, waiting)

    @rule()
    def remove_all(self) -> None:
        assert self.idx.remove_all() == len(self.model)
        self.model.clear()
