"""Operator metadata (users, vhosts, permissions, policies) kept in etcd, cached per node.

Invariant 6: etcd is the one home; a node reads its `PrefixCache` of `/{name}/meta/`,
which resumes from its revision after a reconnect or reloads after a compaction. Keys are
`/{name}/meta/{kind}/{segment}[/{segment}...]` with each segment percent-encoded, values
JSON. Not yet the broker's source of truth: it still keeps these in SQLite.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote, unquote

from .cache import PrefixCache
from .etcd import EtcdClient

KINDS = ("users", "vhosts", "permissions", "topic_permissions", "policies", "parameters")


class Metadata:
    def __init__(self, client: EtcdClient, name: str = "roarmq") -> None:
        self.client = client
        self.prefix = f"/{name}/meta/"
        self.cache = PrefixCache(client, self.prefix)

    def key(self, kind: str, *path: str) -> str:
        if kind not in KINDS:
            raise ValueError(f"unknown metadata kind {kind!r} (known: {', '.join(KINDS)})")
        return self.prefix + "/".join([kind, *(quote(p, safe="") for p in path)])

    async def start(self) -> None:
        await self.cache.start()

    async def stop(self) -> None:
        await self.cache.stop()

    async def put(self, kind: str, *path: str, value: Any) -> int:
        """Write one item; returns the revision (wait for the cache to reach it to read it)."""
        return await self.client.put(self.key(kind, *path), json.dumps(value))

    async def delete(self, kind: str, *path: str) -> bool:
        return await self.client.delete(self.key(kind, *path)) > 0

    def get(self, kind: str, *path: str) -> Any:
        kv = self.cache.get(self.key(kind, *path))
        return json.loads(kv.value) if kv else None

    def items(self, kind: str) -> dict[tuple[str, ...], Any]:
        """Every item of a kind in the cache: its path segments -> its value."""
        head = self.key(kind) + "/"
        return {
            tuple(unquote(p) for p in k[len(head) :].split("/")): json.loads(kv.value)
            for k, kv in self.cache.under(head).items()
        }

    @property
    def revision(self) -> int:
        return self.cache.revision
