"""Waiting and ports for tests: the one `free_port`, the one `until` (and its asyncio
twin, `until_async`), and `wait_for`, the `until` that fails the test when it runs out."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import time
from collections.abc import Callable
from typing import Any

_HANDED_OUT: set[int] = set()

#: Ports handed out lie below the kernel's ephemeral range (32768 and up on Linux), so no
#: client connection of any process takes one between `free_port` and the bind; the range
#: is cut in slices, one per pytest-xdist worker (PYTEST_XDIST_WORKER=gwN), so two workers
#: never hand out the same port.
_FIRST, _LAST, _SLICES = 10_000, 32_700, 4
_next_port: int | None = None


def _slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) % _SLICES if worker[2:].isdigit() else 0
    size = (_LAST - _FIRST) // _SLICES
    return range(_FIRST + index * size, _FIRST + (index + 1) * size)


def free_port() -> int:
    """A loopback port nothing listens on, never the same twice in this process, from
    this worker's slice of 10000-32700 (above)."""
    global _next_port
    ports = _slice()
    if _next_port is None:  # a random start: two test sessions at once seldom meet
        _next_port = random.randrange(ports.start, ports.stop)
    for _ in range(len(ports)):
        port, _next_port = _next_port, _next_port + 1
        if _next_port >= ports.stop:
            _next_port = ports.start
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free port left in {ports}")


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
