"""Fixtures the store's tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from machine import missing
from support.faultlib import BrokerProcess
from support.powerloss import FuseUnavailable, powerloss_mount


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker process to fault with strace and kill (tests/support/faultlib.py), its data
    under `tmp_path`: here in place of the in-process broker of tests/conftest.py."""
    b = BrokerProcess(tmp_path / "data").start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def fs(tmp_path):
    """A power-loss filesystem mounted under `tmp_path` (tests/support/powerloss.py)."""
    try:
        with powerloss_mount(tmp_path) as mounted:
            yield mounted
    except FuseUnavailable as exc:
        missing(f"cannot mount FUSE: {exc}", exc.provided_by)
