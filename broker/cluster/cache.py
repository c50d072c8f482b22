"""A local copy of every key under an etcd prefix, kept current by a watch.

Invariant 6 (docs/cluster.md): each node's copy is a cache fed by a watch from
a known revision. The copy remembers the revision it reflects; when the watch breaks
(etcd restarted, the connection reset, `stop()` then `start()`), it resumes from that
revision + 1 and receives exactly what it missed. If etcd has compacted past that revision
it reloads the whole prefix (`reloads` counts the full loads) and watches from the reload;
so it does when etcd's revision is now below it (etcd restored from an older backup: a
watch from a future revision would wait, silent, showing keys etcd no longer has).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from ..ops.tasks import cancel_and_wait
from .etcd import EtcdClient, EtcdError, Event, KeyValue, WatchCompacted

log = logging.getLogger("roarmq.cluster")

#: After a broken watch: first retry delay, doubled up to the cap.
RETRY_FIRST = 0.1
RETRY_CAP = 1.0


class PrefixCache:
    """`data` maps each key under the prefix to its KeyValue, as of `revision`."""

    def __init__(self, client: EtcdClient, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.data: dict[str, KeyValue] = {}
        self.revision = 0
        self.reloads = 0
        self.reconnects = 0
        #: Called after each change: the events applied, or None after a full reload.
        self.on_change: list[Callable[[list[Event] | None], None]] = []
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Load (first time only) and watch. After `stop()`, resumes from `revision`."""
        if self._task is not None:
            return
        if not self.revision:
            await self.load()
        self._task = asyncio.create_task(self._run(), name=f"etcd-watch {self.prefix}")

    async def stop(self) -> None:
        """Stop watching; the data and its revision stay, so `start()` resumes."""
        if self._task is not None:
            task, self._task = self._task, None
            await cancel_and_wait(task)

    async def load(self) -> None:
        kvs, revision = await self.client.range(self.prefix, prefix=True)
        self.data = {kv.key: kv for kv in kvs}
        self.revision = revision
        self.reloads += 1
        self._notify(None)

    def get(self, key: str) -> KeyValue | None:
        return self.data.get(key)

    def under(self, prefix: str) -> dict[str, KeyValue]:
        return {k: v for k, v in self.data.items() if k.startswith(prefix)}

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait (at most timeout s) until predicate() holds after some change; its value."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():
            left = deadline - loop.time()
            if left <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)
        return True

    async def synced(self, timeout: float = 5.0) -> bool:
        """Wait until the cache holds what etcd holds under the prefix now: it has seen
        etcd's current revision, or its keys and their mod revisions are the ones a read
        now returns (a watch reports no revision for writes outside its prefix, so after
        those the revision alone would wait for the next change under it)."""
        kvs, current = await self.client.range(self.prefix, prefix=True)
        now = {kv.key: kv.mod_revision for kv in kvs}

        def caught_up() -> bool:
            return self.revision >= current or (
                len(self.data) == len(now)
                and all(now.get(k) == kv.mod_revision for k, kv in self.data.items())
            )

        return await self.wait_for(caught_up, timeout)

    def apply(self, events: list[Event]) -> None:
        for ev in events:
            if ev.kind == "put":
                self.data[ev.kv.key] = ev.kv
            else:
                self.data.pop(ev.kv.key, None)
            self.revision = max(self.revision, ev.kv.mod_revision)
        self._notify(events)

    def _notify(self, events: list[Event] | None) -> None:
        self._changed.set()
        for callback in list(self.on_change):
            try:
                callback(events)
            except Exception:
                log.exception("cache callback failed (%s)", self.prefix)

    async def _run(self) -> None:
        delay = RETRY_FIRST
        while True:
            try:
                _, current = await self.client.range(self.prefix)  # etcd's revision now
                if current < self.revision:
                    log.warning(
                        "watch %s: etcd is at revision %d, below ours %d (restored from an "
                        "older backup?); reloading",
                        self.prefix,
                        current,
                        self.revision,
                    )
                    await self.load()
                async for _, events in self.client.watch(
                    self.prefix, prefix=True, start_revision=self.revision + 1
                ):
                    self.apply(events)
                    delay = RETRY_FIRST
            except WatchCompacted as exc:
                log.warning("watch %s: %s; reloading", self.prefix, exc)
                with contextlib.suppress(EtcdError):
                    await self.load()
                    continue
            except EtcdError as exc:
                log.info("watch %s broke (%s); resuming from %d", self.prefix, exc, self.revision)
            self.reconnects += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_CAP)
