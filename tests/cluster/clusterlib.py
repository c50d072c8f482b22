"""Helpers shared by the cluster tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(predicate: Callable[[], object], timeout: float, step: float = 0.05) -> bool:
    """Poll `predicate` on the loop until it is true or `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(step)
    return bool(predicate())
