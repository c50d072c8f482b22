"""`cancel_and_wait`: stopping a child task must not swallow the stopper's own
cancellation (a follower stopped mid-teardown once reconnected for good, and the vhost's
promotion that waited for it never served)."""

from __future__ import annotations

import asyncio

import pytest

from roarmq.broker.ops.tasks import cancel_and_wait

pytestmark = pytest.mark.timeout(10)


async def slow_to_end(ended: asyncio.Event) -> None:
    """A child that, like a session tearing down, takes a while to end once cancelled."""
    try:
        await asyncio.sleep(60)
    finally:
        await asyncio.sleep(0.2)
        ended.set()


async def test_a_cancellation_of_the_waiter_is_not_swallowed():
    ended = asyncio.Event()
    child = asyncio.create_task(slow_to_end(ended))
    await asyncio.sleep(0)
    after: list[str] = []

    async def owner() -> None:
        await cancel_and_wait(child)
        after.append("ran on after the cancel")  # what the old suppress() allowed
        await asyncio.sleep(60)

    task = asyncio.create_task(owner())
    await asyncio.sleep(0.05)  # the owner now waits for the child's teardown
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert after == []
    assert child.cancelled() or child.done()


async def test_the_childs_own_cancellation_and_ignored_errors_are_dropped():
    ended = asyncio.Event()
    child = asyncio.create_task(slow_to_end(ended))
    await asyncio.sleep(0)
    await cancel_and_wait(child)
    assert ended.is_set() and child.cancelled()

    async def fails() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            raise ConnectionResetError("peer went away")

    failing = asyncio.create_task(fails())
    await asyncio.sleep(0)
    await cancel_and_wait(failing, ConnectionResetError)

    failing = asyncio.create_task(fails())
    await asyncio.sleep(0)
    with pytest.raises(ConnectionResetError):
        await cancel_and_wait(failing)
