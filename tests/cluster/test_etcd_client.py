"""The v3 JSON-gateway client against a real etcd: kv, txn, leases, watch, failover."""

from __future__ import annotations

import asyncio

import pytest

from roarmq.broker.cluster.etcd import (
    EtcdClient,
    EtcdError,
    EtcdUnavailable,
    WatchCompacted,
    compare,
    prefix_end,
    put_op,
    range_op,
)


def test_prefix_end():
    assert prefix_end("/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff") == b"\0"


async def test_put_get_range_delete(etcd):
    async with EtcdClient([etcd.url]) as c:
        rev = await c.put("/t/a", "1")
        await c.put("/t/b", b"\x00\xffbinary")
        await c.put("/u/c", "other")
        kv = await c.get("/t/a")
        assert kv is not None and kv.value == b"1" and kv.create_revision == rev
        kvs, current = await c.range("/t/", prefix=True)
        assert [k.key for k in kvs] == ["/t/a", "/t/b"]
        assert kvs[1].value == b"\x00\xffbinary"
        assert current >= rev + 2
        assert await c.get("/missing") is None
        assert await c.delete("/t/", prefix=True) == 2
        assert (await c.range("/t/", prefix=True))[0] == []
        assert await c.get("/u/c") is not None


async def test_txn_create_if_absent(etcd):
    async with EtcdClient([etcd.url]) as c:
        first = await c.txn(
            [compare("/lock", "CREATE", 0)], [put_op("/lock", "me")], [range_op("/lock")]
        )
        assert first.succeeded
        second = await c.txn(
            [compare("/lock", "CREATE", 0)], [put_op("/lock", "you")], [range_op("/lock")]
        )
        assert not second.succeeded
        (current,) = second.ranges()
        assert current[0].value == b"me" and current[0].create_revision == first.revision
        by_value = await c.txn([compare("/lock", "VALUE", "me")], [put_op("/lock", "me2")])
        assert by_value.succeeded
        assert (await c.get("/lock")).value == b"me2"


async def test_lease_keys_go_with_the_lease(etcd):
    async with EtcdClient([etcd.url]) as c:
        lease = await c.lease_grant(10)
        await c.put("/leased", "x", lease=lease)
        assert (await c.get("/leased")).lease == lease
        assert await c.lease_keepalive(lease) == 10
        assert await c.lease_revoke(lease)
        assert await c.get("/leased") is None
        assert await c.lease_keepalive(lease) == 0  # gone
        assert not await c.lease_revoke(lease)


async def test_watch_events_and_compaction(etcd):
    async with EtcdClient([etcd.url]) as c:
        start = await c.put("/w/a", "1")
        await c.put("/w/a", "2")
        await c.delete("/w/a")
        seen = []
        async with asyncio.timeout(5):
            async for _, events in c.watch("/w/", prefix=True, start_revision=start):
                seen += [(e.kind, e.kv.key, e.kv.value) for e in events]
                if len(seen) >= 3:
                    break
        assert seen == [("put", "/w/a", b"1"), ("put", "/w/a", b"2"), ("delete", "/w/a", b"")]
        await c.compact(start + 1)
        with pytest.raises(WatchCompacted) as info:
            async with asyncio.timeout(5):
                async for _ in c.watch("/w/", prefix=True, start_revision=start):
                    pass
        assert info.value.compact_revision == start + 1


async def test_failover_to_a_live_endpoint(etcd):
    dead = "http://127.0.0.1:1"  # nothing listens on port 1
    async with EtcdClient([dead, etcd.url], timeout=1.0) as c:
        await c.put("/f", "ok")
        assert c.endpoints[0] == etcd.url  # the one that answered is tried first next time
    async with EtcdClient([dead]) as c:
        with pytest.raises(EtcdUnavailable):
            await c.get("/f")


async def test_errors_from_etcd_are_not_failover(etcd):
    async with EtcdClient([etcd.url]) as c:
        with pytest.raises(EtcdError) as info:
            await c.txn([{"key": "eA==", "target": "BOGUS"}], [])
        assert not isinstance(info.value, EtcdUnavailable)
