"""Fixtures the store's tests share."""

from __future__ import annotations

import pytest
from machine import missing
from support.powerloss import FuseUnavailable, powerloss_mount


@pytest.fixture
def fs(tmp_path):
    """A power-loss filesystem mounted under `tmp_path` (tests/support/powerloss.py)."""
    try:
        with powerloss_mount(tmp_path) as mounted:
            yield mounted
    except FuseUnavailable as exc:
        missing(f"cannot mount FUSE: {exc}", exc.provided_by)
