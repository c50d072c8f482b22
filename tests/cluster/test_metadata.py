"""Operator metadata in etcd: the per-node cache follows a watch, resumes from its revision
after a reconnect, and reloads when etcd compacted past it (invariant 6)."""

from __future__ import annotations

import pytest

from roarmq.broker.cluster.etcd import EtcdClient
from roarmq.broker.cluster.metadata import Metadata

pytestmark = pytest.mark.timeout(60)


async def test_cache_follows_writes(etcd):
    async with EtcdClient([etcd.url]) as c:
        writer, reader = Metadata(c), Metadata(EtcdClient([etcd.url]))
        try:
            await writer.put("users", "alice", value={"tags": ["administrator"]})
            await reader.start()
            assert reader.get("users", "alice") == {"tags": ["administrator"]}
            rev = await writer.put("permissions", "/", "alice", value={"configure": ".*"})
            await writer.put("policies", "/", "ha", value={"pattern": "^q"})
            assert await reader.cache.wait_for(lambda: reader.revision >= rev + 1, 5)
            assert reader.items("permissions") == {("/", "alice"): {"configure": ".*"}}
            assert reader.get("policies", "/", "ha") == {"pattern": "^q"}
            await writer.delete("users", "alice")
            assert await reader.cache.wait_for(lambda: not reader.items("users"), 5)
            assert reader.cache.reloads == 1
            with pytest.raises(ValueError):
                writer.key("nonsense", "x")
        finally:
            await reader.stop()
            await reader.client.close()


async def test_cache_resumes_from_its_revision_after_a_reconnect(etcd):
    async with EtcdClient([etcd.url]) as c:
        writer, reader = Metadata(c), Metadata(EtcdClient([etcd.url]))
        try:
            await writer.put("vhosts", "a", value={})
            await writer.put("vhosts", "b", value={})
            await reader.start()
            await reader.stop()  # disconnected: what happens now it must get on return
            await writer.put("vhosts", "c", value={"description": "new"})
            await writer.delete("vhosts", "a")
            rev = await writer.put("vhosts", "b", value={"description": "changed"})
            await reader.start()
            assert await reader.cache.wait_for(lambda: reader.revision >= rev, 5)
            assert reader.items("vhosts") == {
                ("b",): {"description": "changed"},
                ("c",): {"description": "new"},
            }
            assert reader.cache.reloads == 1  # caught up from the watch, not by a reload
        finally:
            await reader.stop()
            await reader.client.close()


async def test_cache_reloads_when_etcd_compacted_past_it(etcd):
    async with EtcdClient([etcd.url]) as c:
        writer, reader = Metadata(c), Metadata(EtcdClient([etcd.url]))
        try:
            await writer.put("users", "a", value=1)
            await reader.start()
            await reader.stop()
            await writer.delete("users", "a")
            rev = await writer.put("users", "b", value=2)
            await c.compact(rev)
            await reader.start()
            assert await reader.cache.wait_for(lambda: reader.cache.reloads == 2, 5)
            assert reader.items("users") == {("b",): 2}
            rev = await writer.put("users", "c", value=3)  # and it watches on from the reload
            assert await reader.cache.wait_for(lambda: reader.revision >= rev, 5)
            assert reader.get("users", "c") == 3
        finally:
            await reader.stop()
            await reader.client.close()


@pytest.mark.slow
async def test_cache_survives_an_etcd_kill9(etcd):
    async with EtcdClient([etcd.url]) as c:
        writer, reader = Metadata(c), Metadata(EtcdClient([etcd.url], timeout=1.0))
        try:
            await writer.put("users", "a", value=1)
            await reader.start()
            etcd.kill()
            etcd.start()
            rev = await writer.put("users", "b", value=2)
            assert await reader.cache.wait_for(lambda: reader.revision >= rev, 10)
            assert reader.items("users") == {("a",): 1, ("b",): 2}
            assert reader.cache.reconnects >= 1 and reader.cache.reloads == 1
        finally:
            await reader.stop()
            await reader.client.close()
