"""A node's etcd lease, renewed at a third of its TTL, and the fencing it implies.

Invariant 5 (docs/cluster.md): a leader that cannot renew its lease stops
confirming before the lease can expire on etcd's side. etcd extends a lease when it
*processes* a keep-alive, which is after we *sent* it, so measuring the TTL from the moment
the last successful renewal was sent (on this node's monotonic clock, which keeps counting
while the process is frozen) ends our right to confirm no later than etcd can expire us.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator

from ..ops.tasks import cancel_and_wait
from .etcd import EtcdClient, EtcdError

log = logging.getLogger("roarmq.cluster")


class Fencing:
    """Says whether this node may confirm: only while its last renewal is younger than TTL.

    `may_confirm()` is a clock read and a compare, cheap enough to ask per confirm batch.
    `on_fenced` callbacks run once each time the window closes (checked by a timer armed at
    each renewal, and by every `may_confirm()` call); `on_restored` ones when a renewal
    reopens it: the lease survived, but what hung on it must be checked again before use."""

    __slots__ = ("ttl", "clock", "_renewed_at", "_fenced", "_timer", "on_fenced", "on_restored")

    def __init__(self, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.clock = clock
        self._renewed_at: float | None = None
        self._fenced = True
        self._timer: asyncio.TimerHandle | None = None
        self.on_fenced: list[Callable[[], None]] = []
        self.on_restored: list[Callable[[], None]] = []

    def renewed(self, sent_at: float) -> None:
        """A keep-alive sent at `sent_at` (this clock) succeeded."""
        if self._renewed_at is None or sent_at > self._renewed_at:
            self._renewed_at = sent_at
        was_fenced, self._fenced = self._fenced, False
        if self._timer is not None:
            self._timer.cancel()
        with contextlib.suppress(RuntimeError):  # no running loop: may_confirm() still checks
            loop = asyncio.get_running_loop()
            delay = max(0.0, self._renewed_at + self.ttl - self.clock())
            self._timer = loop.call_later(delay, self._check)
        if was_fenced:
            _run_all(self.on_restored, "fencing-restored")

    def renewed_in_thread(self, sent_at: float) -> None:
        """A keep-alive sent at `sent_at` by `LeaseKeeper.renewing_in_thread` succeeded while
        the loop was busy: only the window moves (one float store, safe from another thread);
        the loop's own timer sees it when it runs. A fenced window stays fenced until a
        renewal on the loop reopens it (and rechecks the leaderships)."""
        at = self._renewed_at
        if not self._fenced and at is not None and sent_at > at:
            self._renewed_at = sent_at

    def expire(self) -> None:
        """The lease is gone (revoked, expired on etcd, or we are shutting down)."""
        self._renewed_at = None
        self._check()

    def may_confirm(self) -> bool:
        at = self._renewed_at
        if at is not None and self.clock() - at < self.ttl:
            return True
        self._check()
        return False

    def remaining(self) -> float:
        """Seconds this node may still confirm without another renewal (0 when fenced)."""
        if self._renewed_at is None:
            return 0.0
        return max(0.0, self._renewed_at + self.ttl - self.clock())

    def _check(self) -> None:
        if self._fenced:
            return
        left = self.remaining()
        if left > 0:
            # A loop timer may fire a little early (uvloop rounds to the millisecond, and
            # its clock is not this one): look again when the window really closes.
            with contextlib.suppress(RuntimeError):
                self._timer = asyncio.get_running_loop().call_later(left + 0.001, self._check)
            return
        self._fenced = True
        _run_all(self.on_fenced, "fencing")


class LeaseKeeper:
    """Grants a lease and keeps it alive: a renewal every ttl/3; after a failed one, retries
    every ttl/10. When etcd says the lease is gone, `on_lost` callbacks run and the keeper
    stops: whatever hung on the lease (membership, leaderships) is gone with it, and the
    owner starts over with a new keeper."""

    def __init__(self, client: EtcdClient, ttl: int, fencing: Fencing | None = None) -> None:
        if ttl < 2:
            raise ValueError("lease TTL must be at least 2 s")  # etcd's own minimum
        self.client = client
        self.ttl = ttl
        self.lease = 0
        # Shared across successive leases of one node, so its callbacks stay registered.
        self.fencing = fencing or Fencing(ttl)
        self.on_lost: list[Callable[[], None]] = []
        self._task: asyncio.Task[None] | None = None
        self.lost = False

    async def start(self) -> int:
        sent = self.fencing.clock()
        self.lease = await self.client.lease_grant(self.ttl)
        self.fencing.renewed(sent)
        self._task = asyncio.create_task(self._run(), name=f"etcd-lease-{self.lease:x}")
        return self.lease

    async def stop(self, revoke: bool = True) -> None:
        if self._task is not None:
            task, self._task = self._task, None
            await cancel_and_wait(task)
        if revoke and self.lease and not self.lost:
            with contextlib.suppress(EtcdError):
                await self.client.lease_revoke(self.lease)
        self.fencing.expire()

    async def renew_once(self) -> bool:
        """One keep-alive. True if renewed; False if etcd was unreachable; marks the lease
        lost (and runs on_lost) if etcd no longer has it."""
        sent = self.fencing.clock()
        try:
            ttl = await self.client.lease_keepalive(self.lease, timeout=self.ttl / 3)
        except EtcdError as exc:
            log.warning("lease %x: renewal failed: %s", self.lease, exc)
            return False
        if ttl <= 0:
            self._lose()
            return False
        self.fencing.renewed(sent)
        return True

    @contextlib.contextmanager
    def renewing_in_thread(self) -> Iterator[None]:
        """Keep the lease alive from a thread while the event loop is starved by a long step
        (a promotion: the rebuild's thread holding the GIL, then `MessageStore.recover` over
        the whole vhost log on the loop): the loop's keep-alives are late or time out
        meanwhile, and a busy new leader whose lease expires hands the vhost to yet another
        election. Renewals are timed from when they were sent, as on the loop; a frozen
        process freezes this thread too, so fencing (invariant 5) is kept. Scoped to the
        step: a loop that is wedged for good still loses its lease."""
        stop = threading.Event()
        lease, endpoints, timeout = self.lease, list(self.client.endpoints), self.ttl / 3

        def keepalive() -> bool | None:
            body = json.dumps({"ID": lease}).encode()
            for endpoint in endpoints:
                try:
                    req = urllib.request.Request(
                        endpoint + "/v3/lease/keepalive",
                        data=body,
                        headers={"Content-Type": "application/json"},
                    )
                    with urllib.request.urlopen(req, timeout=timeout) as resp:
                        reply = json.loads(resp.read() or b"{}")
                    return int(reply.get("result", {}).get("TTL", 0)) > 0
                except (OSError, ValueError):
                    continue
            return None  # no endpoint answered: the loop's keeper will say what it means

        def run() -> None:
            while not stop.is_set():
                sent = self.fencing.clock()
                alive = keepalive()
                if alive is False:
                    return  # gone on etcd: the loop's next renewal finds out and runs on_lost
                if alive:
                    self.fencing.renewed_in_thread(sent)
                stop.wait(self.ttl / 3 if alive else self.ttl / 10)

        if lease and not self.lost:
            threading.Thread(target=run, name=f"etcd-lease-{lease:x}-busy", daemon=True).start()
        try:
            yield
        finally:
            stop.set()

    def _lose(self) -> None:
        if self.lost:
            return
        self.lost = True
        log.warning("lease %x: gone on etcd (expired or revoked)", self.lease)
        self.fencing.expire()
        _run_all(self.on_lost, "lease-lost")

    async def _run(self) -> None:
        interval = self.ttl / 3
        while not self.lost:
            await asyncio.sleep(interval)
            ok = await self.renew_once()
            interval = self.ttl / 3 if ok else self.ttl / 10


def _run_all(callbacks: list[Callable[[], None]], what: str) -> None:
    for callback in list(callbacks):
        try:
            callback()
        except Exception:
            log.exception("%s callback failed", what)
