"""Lazy removal (broker/routing/bindings.py) in an index's Hypothesis state machine."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from roarmq.broker.routing import bindings


def coarse_bucket(key: str, akey: tuple) -> int:
    """A bucket function under which most identities share a bucket: equal identities
    still land in the same one, so lookups must tell the others apart by comparing."""
    return len(key) + len(akey)


class LazyRemovalRules:
    """Mix into a state machine whose ``idx`` is an index and ``model`` its bindings: every
    removal of two bindings or more is left to ``sweep``, swept a few at a time between the
    other rules, so routes, counts and listings meet buried bindings swept or not, and
    destinations bound again while their old bindings wait.

    A destination's identity dict (fanout and headers indexes) is made from a drawn number
    of bindings on (from the second, so the few destinations of a state machine have one
    often, and are made, dropped and made again), with the real buckets or coarse ones
    that make identities collide; the machine's invariant must call ``check_ids``."""

    idx: bindings.BindingTable
    model: dict | list

    def __init__(self) -> None:
        super().__init__()
        self._saved_bindings = (bindings.LAZY_REMOVAL, bindings.IDENTIFY_FROM, bindings.bucket)
        bindings.LAZY_REMOVAL = 2

    def teardown(self) -> None:
        bindings.LAZY_REMOVAL, bindings.IDENTIFY_FROM, bindings.bucket = self._saved_bindings
        super().teardown()  # type: ignore[misc]

    @initialize(identify_from=st.sampled_from([2, 3, 4, 8]), coarse=st.booleans())
    def identities(self, identify_from: int, coarse: bool) -> None:
        bindings.IDENTIFY_FROM = identify_from
        if coarse:
            bindings.bucket = coarse_bucket

    @rule(budget=st.integers(1, 3))
    def sweep(self, budget: int) -> None:
        waiting = self.idx.to_sweep()
        assert self.idx.sweep(budget) == min(budget, waiting)
        assert self.idx.to_sweep() == waiting - min(budget, waiting)

    @rule()
    def remove_all(self) -> None:
        assert self.idx.remove_all() == len(self.model)
        self.model.clear()
