"""Ending a child task from the task that owns it."""

from __future__ import annotations

import asyncio


async def cancel_and_wait(task: asyncio.Task, *ignored: type[BaseException]) -> None:
    """Cancel `task` and wait until it has ended; its exceptions of the `ignored` kinds are
    dropped, any other is raised.

    Why not `task.cancel()` then `with suppress(CancelledError): await task`: that also
    swallows a cancellation of the *waiting* task arriving while it waits, and the waiter
    then runs on as if never cancelled. It happened: a vhost's follower told to stop while
    it was tearing a replication session down kept reconnecting for good, and the
    promotion waiting for it to stop never served the vhost. `Task.cancelling()` tells the
    two cancellations apart."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except ignored:
        pass
