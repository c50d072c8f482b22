"""DueIndex against a plain sorted list: the same entries come out in the same order
whatever mix of adds and pops, across the in-memory heap and the run files."""

from __future__ import annotations

import random

import pytest

from roarmq.broker.store.due_index import DueIndex


@pytest.mark.parametrize("seed", range(6))
def test_entries_come_out_in_due_then_publish_order(tmp_path, seed):
    rng = random.Random(seed)
    index = DueIndex(tmp_path / "runs", run_entries=rng.choice([4, 16, 64]))
    reference: list[tuple[int, int, int]] = []
    order = 0
    out, expected = [], []
    for _ in range(3000):
        if rng.random() < 0.6 or not reference:
            order += 1
            entry = (rng.randrange(0, 200), order, rng.randrange(1 << 40))
            index.add(*entry)
            reference.append(entry)
        else:
            reference.sort()
            expected.append(reference.pop(0))
            assert index.first() == expected[-1]
            out.append(index.pop())
        assert len(index) == len(reference)
    reference.sort()
    assert out == expected
    assert list(index.drain()) == reference
    assert len(index) == 0 and index.first() is None
    assert list((tmp_path / "runs").glob("*.run")) == []  # a run read to its end is removed


def test_memory_is_the_heap_and_a_buffer_per_run(tmp_path):
    """Spilled entries live in files: the in-memory heap never holds more than a run."""
    index = DueIndex(tmp_path / "runs", run_entries=100)
    for n in range(1050):
        index.add(1000 - n % 1000, n, n)
    assert len(index._fresh) == 50 and len(index._runs) == 10
    assert sum(p.stat().st_size for p in (tmp_path / "runs").glob("*.run")) == 1000 * 24
    first = [index.pop() for _ in range(3)]
    assert first == [(1, 999, 999), (2, 998, 998), (3, 997, 997)]


def test_clear_and_a_new_index_remove_the_files(tmp_path):
    index = DueIndex(tmp_path / "runs", run_entries=10)
    for n in range(25):
        index.add(n, n, n)
    assert list((tmp_path / "runs").glob("*.run"))
    DueIndex(tmp_path / "runs")  # a start: whatever was there is a stale cache
    assert not (tmp_path / "runs").exists()
    index = DueIndex(tmp_path / "runs", run_entries=10)
    for n in range(25):
        index.add(n, n, n)
    index.clear()
    assert len(index) == 0 and not (tmp_path / "runs").exists()
