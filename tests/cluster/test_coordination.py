"""Membership, leadership with epochs, the in-sync set and placement, on a real etcd.

Several Coordinators in this process, each with its own client, stand for the nodes; the
freeze test runs one in a subprocess (node_proc.py) so it can be SIGSTOPped."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.waiting import until_async as until

from roarmq.broker.cluster.coordination import Coordinator, IsrChange
from roarmq.broker.cluster.etcd import EtcdClient

pytestmark = pytest.mark.timeout(60)

TTL = 2  # seconds; etcd's own minimum


@contextlib.asynccontextmanager
async def nodes(etcd, names, *, ttl=TTL, replicas=3, grace=0.3):
    coords = [
        Coordinator(
            EtcdClient([etcd.url], timeout=1.0),
            node=n,
            address=f"127.0.0.{i + 1}",
            lease_ttl=ttl,
            replicas=replicas,
            campaign_grace=grace,
        )
        for i, n in enumerate(names)
    ]
    try:
        for c in coords:
            await c.start()
        for c in coords:
            assert await c.nodes.synced()
        yield coords
    finally:
        for c in coords:
            with contextlib.suppress(Exception):
                await c.stop()
            await c.client.close()


def leaders(coords, vhost):
    return [c for c in coords if vhost in c.leading]


async def test_membership_is_watched(etcd):
    async with nodes(etcd, ["a", "b", "c"]) as (a, b, c):
        assert await until(lambda: set(a.members()) == {"a", "b", "c"}, 5)
        assert a.members()["b"]["address"] == "127.0.0.2"
        await c.stop()
        assert await until(lambda: set(a.members()) == {"a", "b"} == set(b.members()), 5)


async def test_exactly_one_leader_among_concurrent_campaigns(etcd):
    async with nodes(etcd, ["a", "b", "c"]) as coords:
        placement = await coords[0].place_vhost("/")
        assert sorted(placement.members) == ["a", "b", "c"]
        results = await asyncio.gather(*(c.campaign("/") for c in coords))
        winners = [r for r in results if r.won]
        assert len(winners) == 1
        epoch = winners[0].epoch
        assert all(r.epoch == epoch and r.leader == winners[0].leader for r in results)
        assert len(leaders(coords, "/")) == 1
        for c in coords:  # every cache agrees on (leader, epoch); "/" is encoded in the key
            assert await c.vhosts.synced()
            assert c.leader("/") == (winners[0].leader, epoch)
        assert "/roarmq/vhosts/%2F/leader" in coords[0].vhosts.under("/roarmq/vhosts/%2F/")


async def test_failover_after_lease_revoked_gives_a_higher_epoch(etcd):
    async with nodes(etcd, ["a", "b", "c"]) as coords:
        await coords[0].place_vhost("v")
        for c in coords:
            c.follow("v")
        assert await until(lambda: len(leaders(coords, "v")) == 1, 5)
        (old,) = leaders(coords, "v")
        assert old.node == "a"  # placement's preferred leader: the others gave it the grace
        epoch = old.leading["v"]
        lost = []
        old.on_lost.append(lambda v, e, why: lost.append((v, e, why)))
        await old.client.lease_revoke(old.lease)
        others = [c for c in coords if c is not old]
        assert await until(lambda: len(leaders(others, "v")) == 1, 5)
        (new,) = leaders(others, "v")
        assert new.leading["v"] > epoch
        assert await until(lambda: lost, 5)
        assert lost[0][:2] == ("v", epoch)
        assert not old.may_confirm("v", epoch)
        # The deposed node rejoins (new lease, membership back) as a follower.
        assert await until(lambda: "a" in new.members() and old.lease, 5)
        assert "v" not in old.leading


async def test_leader_that_stops_renewing_is_fenced_before_it_is_replaced(etcd):
    async with nodes(etcd, ["a", "b"]) as (a, b):
        await a.place_vhost("v")
        a.follow("v")
        b.follow("v")
        assert await until(lambda: "v" in a.leading, 5)
        epoch = a.leading["v"]
        a.keeper._task.cancel()  # a stops renewing (as if etcd were unreachable from it)
        fenced_at = []
        a.on_fenced.append(lambda: fenced_at.append(time.monotonic()))
        assert await until(lambda: "v" in b.leading, TTL + 5)
        won_at = time.monotonic()
        assert b.leading["v"] > epoch
        assert fenced_at and fenced_at[0] < won_at
        assert not a.may_confirm("v", epoch)


async def test_a_node_outside_the_in_sync_set_cannot_win(etcd):
    async with nodes(etcd, ["a", "b", "c"], replicas=2) as (a, b, c):
        placement = await a.place_vhost("v")
        assert placement.members == ("a", "b")
        result = await c.campaign("v")
        assert not result.won and result.reason == "not in the in-sync set"
        assert (await a.campaign("v")).won
        epoch = a.leading["v"]
        assert await a.shrink_isr("v", epoch, "b") is IsrChange.DONE
        assert await until(lambda: a.in_sync("v") == ["a"], 5)
        await a.client.lease_revoke(a.lease)  # the only in-sync member dies
        for node in (b, c):
            node.follow("v")
            outcome = await node.campaign("v")
            assert not outcome.won and outcome.leader is None
        await asyncio.sleep(0.5)
        assert leaders([b, c], "v") == []  # unavailable rather than rolled back (invariant 3)


async def test_a_busy_preferred_leader_is_waited_for_unless_it_leaves_the_in_sync_set(etcd):
    """After a hand-over (prefer, then resign) the others wait for the preferred node while
    it is live and in sync, up to a lease's TTL by default: a loaded machine can hold its
    loop for longer than a fixed half second, and then a third node took the vhost."""
    async with nodes(etcd, ["a", "b", "c"], grace=None) as coords:
        a, b, c = coords
        assert a.campaign_grace == TTL
        await a.place_vhost("v")
        for node in coords:
            node.follow("v")
        assert await until(lambda: "v" in a.leading, 5)
        epoch = a.leading["v"]
        b.unfollow("v")  # live and in sync, but not campaigning yet (busy)
        assert await a.prefer("v", epoch, "b") is IsrChange.DONE
        assert await until(lambda: c.vhost_members("v")[0] == "b", 5)
        await a.resign("v")
        await asyncio.sleep(1.0)  # twice the old fixed grace
        assert leaders(coords, "v") == []
        b.follow("v")
        assert await until(lambda: "v" in b.leading, 5)
        assert leaders(coords, "v") == [b]
        # The preferred node out of the in-sync set (it could not win): nobody waits for it.
        epoch = b.leading["v"]
        assert await b.prefer("v", epoch, "a") is IsrChange.DONE
        assert await b.shrink_isr("v", epoch, "a") is IsrChange.DONE
        assert await until(lambda: c.in_sync("v") == ["b", "c"], 5)
        started = time.monotonic()
        await b.resign("v")
        assert await until(lambda: leaders(coords, "v"), 5)
        assert leaders(coords, "v") in ([b], [c])
        assert time.monotonic() - started < TTL  # not the grace: nobody waited for "a"


async def test_isr_changes_only_by_the_current_leader(etcd):
    async with nodes(etcd, ["a", "b", "c"]) as (a, b, c):
        await a.place_vhost("v")
        e1 = (await a.campaign("v")).epoch
        with pytest.raises(ValueError):
            await a.shrink_isr("v", e1, "a")
        await a.client.lease_revoke(a.lease)
        assert await until(lambda: b.leader("v") is None, 5)
        e2 = (await b.campaign("v")).epoch
        assert e2 > e1
        assert await a.shrink_isr("v", e1, "c") is IsrChange.NOT_LEADER
        assert await a.expand_isr("v", e1, "c", "copy-c") is IsrChange.NOT_LEADER
        assert json.loads((await b.client.get(b.vhost_key("v", "isr"))).value) == ["a", "b", "c"]
        assert await b.shrink_isr("v", e2, "c") is IsrChange.DONE
        assert await b.shrink_isr("v", e2, "a") is IsrChange.DONE
        assert await until(lambda: b.in_sync("v") == ["b"], 5)
        assert await b.expand_isr("v", e2, "c", "copy-c") is IsrChange.DONE
        assert await until(lambda: b.in_sync("v") == ["b", "c"], 5)
        # A node removed from the members (forget_cluster_node) that is still following
        # and catches up does not come back into the in-sync set.
        assert await b.remove_member("v", e2, "c") is IsrChange.DONE
        assert await b.expand_isr("v", e2, "c", "copy-c") is IsrChange.NOT_MEMBER
        isr = json.loads((await b.client.get(b.vhost_key("v", "isr"))).value)
        assert isr == ["b"]


async def test_placement_picks_the_node_leading_fewest_vhosts(etcd):
    async with nodes(etcd, ["a", "b", "c"], grace=0.3) as coords:
        led = []
        for vhost in ("v1", "v2", "v3", "v4"):
            placement = await coords[0].place_vhost(vhost)
            for c in coords:
                c.follow(vhost)
            assert await until(lambda v=vhost: len(leaders(coords, v)) == 1, 5)
            (leader,) = leaders(coords, vhost)
            assert leader.node == placement.members[0]
            for c in coords:
                assert await c.vhosts.synced()
            led.append(leader.node)
        assert sorted(led[:3]) == ["a", "b", "c"]  # one each before anyone gets a second
        again = await coords[1].place_vhost("v1")  # placement is written once
        assert again.members[0] == led[0]


@pytest.mark.slow
async def test_etcd_kill9_fences_then_leadership_resumes(etcd):
    ttl = 3
    async with nodes(etcd, ["a", "b"], ttl=ttl) as (a, b):
        await a.place_vhost("v")
        a.follow("v")
        b.follow("v")
        assert await until(lambda: "v" in a.leading, 5)
        epoch = a.leading["v"]
        assert a.may_confirm("v", epoch)
        fenced = []
        a.on_fenced.append(lambda: fenced.append(time.monotonic()))
        killed = time.monotonic()
        etcd.kill()
        # Measured on the clock, not by how promptly this loop wakes on a loaded machine:
        # once lease_ttl has passed since the kill, no confirm is allowed.
        await asyncio.sleep(max(0.0, killed + ttl - time.monotonic()))
        assert not a.may_confirm("v", epoch)
        assert not a.fencing.may_confirm() and not b.fencing.may_confirm()
        assert await until(lambda: fenced, 2), "on_fenced never ran"
        await asyncio.sleep(1.0)
        etcd.start()
        # etcd's leases survive its restart (renewed on recovery): a keeps the vhost, or
        # if it lost it, one node leads at a higher epoch.
        assert await until(lambda: len(leaders([a, b], "v")) == 1, 10), (a.leading, b.leading)
        assert await until(lambda: a.fencing.may_confirm() and b.fencing.may_confirm(), 5)
        (leader,) = leaders([a, b], "v")
        assert leader.leading["v"] == epoch or leader.leading["v"] > epoch
        assert leader.may_confirm("v", leader.leading["v"])
        assert await leader.vhosts.synced(5)
        assert leader.leader("v") == (leader.node, leader.leading["v"])


@pytest.mark.slow
async def test_frozen_leader_wakes_to_a_higher_epoch(etcd):
    script = Path(__file__).with_name("node_proc.py")
    async with nodes(etcd, ["b"]) as (b,):
        proc = subprocess.Popen(
            [sys.executable, str(script), etcd.url, "a", "v", str(TTL)],
            stdout=subprocess.PIPE,
            text=True,
        )
        lines: list[dict] = []
        loop = asyncio.get_running_loop()

        async def read() -> None:
            while line := await loop.run_in_executor(None, proc.stdout.readline):
                lines.append(json.loads(line))

        reader = asyncio.create_task(read())
        try:
            assert await until(lambda: any(x["event"] == "won" for x in lines), 10)
            epoch = next(x["epoch"] for x in lines if x["event"] == "won")
            b.follow("v")
            os.kill(proc.pid, signal.SIGSTOP)
            assert await until(lambda: "v" in b.leading, TTL + 5)
            new_epoch = b.leading["v"]
            assert new_epoch > epoch
            await asyncio.sleep(0.5)
            before = len(lines)
            os.kill(proc.pid, signal.SIGCONT)
            assert await until(lambda: any(x["event"] == "lost" for x in lines[before:]), 5)
            woke = lines[before:]
            lost = next(x for x in woke if x["event"] == "lost")
            assert lost["epoch"] == epoch and not lost["may_confirm"]
            # Whatever it printed after waking, it never claimed it may confirm.
            assert not any(x.get("may_confirm") for x in woke)
            # It learns the higher epoch and follows it.
            assert await until(lambda: lines[-1].get("leader") == ["b", new_epoch], 5)
            assert lines[-1]["epoch"] == 0  # leads nothing
            assert b.may_confirm("v", new_epoch)
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            await reader


async def test_a_leader_whose_watch_went_quiet_reads_its_key_back(etcd):
    """A leader must not learn of its successor only from its watch: with its watch
    stopped (a quiet stream), the deleted leader key is found by reading it back, within a
    third of a lease TTL and a round trip."""
    async with nodes(etcd, ["a", "b"]) as (a, b):
        await a.place_vhost("v")
        won = await a.campaign("v")
        assert won.won
        lost: list[str] = []
        a.on_lost.append(lambda _vhost, _epoch, reason: lost.append(reason))
        await a.vhosts.stop()  # nothing more reaches a's cache
        await b.client.delete(a.vhost_key("v", "leader"))
        started = time.monotonic()
        assert await until(lambda: "v" not in a.leading, TTL)
        assert time.monotonic() - started <= TTL / 3 + 0.5
        assert lost == ["leader key changed (read back)"]


async def test_a_resign_etcd_does_not_take_lets_go_at_once_and_gives_the_key_back_later(etcd):
    """A leader resigns while etcd is away (a move, a failed promotion, a failed log): it
    stops leading at once (its clients are not held) and deletes its key once etcd
    answers again, so the vhost is not left with a leader that does not lead."""
    async with nodes(etcd, ["a"]) as (a,):
        await a.place_vhost("v")
        won = await a.campaign("v")
        assert won.won
        lost: list[str] = []
        a.on_lost.append(lambda _vhost, _epoch, reason: lost.append(reason))
        etcd.kill()
        assert await a.resign("v", "its vhost log failed") is False
        assert lost == ["its vhost log failed"] and "v" not in a.leading
        etcd.start()
        key = a.vhost_key("v", "leader")

        async def key_gone() -> bool:
            try:
                return await a.client.get(key) is None
            except Exception:
                return False

        # Gone (deleted by the retry, or with the lease if etcd let it expire), and the
        # retry knows it is done.
        deadline = time.monotonic() + 20
        while not (await key_gone() and a.given_up == {}):
            assert time.monotonic() < deadline, ("never given back", a.given_up)
            await asyncio.sleep(0.1)
