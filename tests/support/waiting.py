"""Waiting and ports for tests: the one `free_port`, the one `until` (and its asyncio
twin, `until_async`), and `wait_for`, the `until` that fails the test when it runs out."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any

_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, never the same twice in this process (the
    kernel may give a just-closed port again; two nodes then clash on it)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def until(
    predicate: Callable[[], Any],
    timeout: float,
    step: float = 0.1,
    *,
    ignore: type[BaseException] | tuple[type[BaseException], ...] = OSError,
) -> Any:
    """Poll `predicate` until it answers something true (returned) or `timeout` seconds
    have passed (its last answer is returned). An exception of `ignore` (OSError: a node's
    API not up yet) counts as no answer."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except ignore:
            value = None
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)


def wait_for(
    check: Callable[[], Any],
    timeout: float = 15.0,
    step: float = 0.05,
    what: str = "condition",
    *,
    ignore: type[BaseException] | tuple[type[BaseException], ...] = OSError,
) -> Any:
    """`until`, for a condition the test cannot go on without: its true answer, or an
    AssertionError naming `what` once `timeout` seconds have passed."""
    value = until(check, timeout, step, ignore=ignore)
    if not value:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")
    return value


async def until_async(predicate: Callable[[], object], timeout: float, step: float = 0.05) -> bool:
    """Poll `predicate` on the loop until it is true or `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(step)
    return bool(predicate())
