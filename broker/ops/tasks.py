"""Ending a child task from the task that owns it."""

from __future__ import annotations

import asyncio

#: How long a cancelled task may take to end before it is cancelled again: long enough for
#: the clean-up its `finally` blocks do (a connection's close handshake), short enough that
#: a cancellation the task lost does not keep its owner waiting.
RECANCEL_SECONDS = 5.0


async def cancel_and_wait(task: asyncio.Task, *ignored: type[BaseException]) -> None:
    """Cancel `task` and wait until it has ended; its exceptions of the `ignored` kinds are
    dropped, any other is raised.

    Why not `task.cancel()` then `with suppress(CancelledError): await task`: that also
    swallows a cancellation of the *waiting* task arriving while it waits, and the waiter
    then runs on as if never cancelled. It happened: a vhost's follower told to stop while
    it was tearing a replication session down kept reconnecting for good, and the
    promotion waiting for it to stop never served the vhost. Here a cancellation of the
    waiter is told apart (it interrupts `asyncio.wait`) and raised once the task has ended,
    as `await task` would.

    Why cancel again: Python 3.11's `asyncio.wait_for` returns its awaitable's result (or
    raises its exception) instead of the cancellation when both arrive in the same loop
    turn, so a task can lose the cancel and go on (a link whose connection the other
    broker closed at the moment it was stopped did: reconnecting, and its broker's stop
    waiting for good). Every RECANCEL_SECONDS it is cancelled again until it ends."""
    cancelled = False  # the waiter's own cancellation: raised once the task has ended
    while not task.done():
        task.cancel()
        try:
            await asyncio.wait({task}, timeout=RECANCEL_SECONDS)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None and not isinstance(exc, ignored):
        raise exc
