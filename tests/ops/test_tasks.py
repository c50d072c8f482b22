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


async def test_a_task_that_loses_its_cancellation_is_cancelled_again(monkeypatch):
    """Python 3.11's `asyncio.wait_for` returns its awaitable's result instead of the
    cancellation when both arrive in one loop turn: the task goes on. It is cancelled again
    until it ends, instead of its owner waiting for good."""
    monkeypatch.setattr("roarmq.broker.ops.tasks.RECANCEL_SECONDS", 0.1)
    reply: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    sessions: list[str] = []

    async def relay() -> None:
        while True:  # a link's sessions, one after another
            sessions.append(await asyncio.wait_for(reply, 30))
            await asyncio.sleep(60)

    task = asyncio.create_task(relay())
    await asyncio.sleep(0)
    reply.set_result("the peer closed")  # the awaitable finishes ...
    await cancel_and_wait(task)  # ... in the same turn as the cancel
    assert sessions == ["the peer closed"]  # the first cancel was lost: it went on
    assert task.cancelled()
