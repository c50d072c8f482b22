"""The `shovel` component of runtime parameters: a `Shovel` per parameter, started when
one is set (again, with the new definition, when it changes), stopped when it is
cleared; a shovel whose `src-delete-after` is reached clears its own parameter, as
RabbitMQ's does. `rows` is GET /api/shovels.

Shovels run once the broker has started (`activate`): a parameter restored from the store
at start waits for the listeners and the message store, as a client would. On a cluster
every node knows every shovel (its parameter is operator metadata, in etcd), and one runs
only where its vhost is served, on the vhost's leader (`serves`): each change of who
serves a vhost is told to `reconsider`, so a shovel moves with a failover. `connect` makes
its connections (the broker's reaches a URI with no host without a socket:
broker/links/local.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .relay import Connect
from .shovel import Shovel
from .shovel_definition import ShovelDefinition, check_shovel

log = logging.getLogger("roarmq.shovel")


class Shovels:
    """The shovels of a broker (a runtime-parameter `Component`)."""

    name = "shovel"

    def __init__(
        self,
        *,
        node: str,
        cluster_name: Callable[[], str],
        may_use_vhost: Callable[[str, str], bool],
        clear: Callable[[str, str], Awaitable[object]],
        connect: Connect,
        serves: Callable[[str], bool] = lambda vhost: True,
    ) -> None:
        """`may_use_vhost(user, vhost)`: a local URI's check; `clear(vhost, name)`: remove
        a parameter, where parameters live (a finished shovel's)."""
        self.node = node
        self.cluster_name = cluster_name
        self.may_use_vhost = may_use_vhost
        self._clear = clear
        self.connect = connect
        self.serves = serves
        #: Every shovel set, running here or not (`Shovel.started`).
        self.running: dict[tuple[str, str], Shovel] = {}
        self.active = False
        #: Messages moved and sessions started again by shovels since removed (the
        #: Prometheus counters go on counting across a shovel's removal).
        self.moved_before = 0
        self.reconnects_before = 0
        self._stopping: set[asyncio.Task[Any]] = set()

    def check(self, vhost: str, name: str, value: Any, user: str) -> ShovelDefinition:
        return check_shovel(
            name, value, user=user, may_use_vhost=lambda v: self.may_use_vhost(user, v)
        )

    def set(self, vhost: str, name: str, checked: ShovelDefinition) -> None:
        self._stop((vhost, name))
        shovel = Shovel(
            vhost,
            name,
            checked,
            cluster_name=self.cluster_name(),
            node=self.node,
            connect=self.connect,
            on_finished=lambda: self._finished(vhost, name),
        )
        self.running[(vhost, name)] = shovel
        if self.active and self.serves(vhost):
            shovel.start()

    def clear(self, vhost: str, name: str) -> None:
        self._stop((vhost, name))

    def activate(self) -> None:
        """The broker has started: every shovel set so far starts, and those set from now
        on at once."""
        self.active = True
        for (vhost, _), shovel in self.running.items():
            if self.serves(vhost):
                shovel.start()

    def reconsider(self, vhost: str) -> None:
        """Who serves `vhost` changed: its shovels start here if this node serves it now,
        and stop if it no longer does (a deposed leader's end it; the new leader's go on
        from what the source still holds)."""
        here = self.active and self.serves(vhost)
        for (v, _), shovel in self.running.items():
            if v != vhost or shovel.started == here:
                continue
            if here:
                shovel.start()
            else:
                self._halt(shovel)

    def _finished(self, vhost: str, name: str) -> None:
        """`src-delete-after` reached: its parameter goes (where parameters live: on a
        cluster, etcd, hence a coroutine); if that fails, the shovel stops all the same."""
        self._stop((vhost, name))
        task = asyncio.ensure_future(self._clear(vhost, name))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)
        task.add_done_callback(lambda t: self._not_cleared(t, vhost, name))

    @staticmethod
    def _not_cleared(task: asyncio.Future[Any], vhost: str, name: str) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "shovel %r in vhost %r finished; its parameter could not be removed: %s",
                name,
                vhost,
                task.exception(),
            )

    def _stop(self, key: tuple[str, str]) -> None:
        shovel = self.running.pop(key, None)
        if shovel is None:
            return
        self.moved_before += shovel.moved
        self.reconnects_before += shovel.reconnects
        self._halt(shovel)

    def _halt(self, shovel: Shovel) -> None:
        task = asyncio.ensure_future(shovel.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def restart(self, vhost: str, name: str) -> bool:
        shovel = self.running.get((vhost, name))
        if shovel is None:
            return False
        await shovel.restart()
        return True

    async def stop_all(self) -> None:
        self.active = False
        for key in list(self.running):
            self._stop(key)
        if self._stopping:
            await asyncio.gather(*self._stopping, return_exceptions=True)

    def rows(self, vhost: str | None = None) -> list[dict[str, Any]]:
        """The shovels running on this node (RabbitMQ's nodes each report their own)."""
        return [
            s.row()
            for (v, _), s in sorted(self.running.items())
            if s.started and (vhost is None or v == vhost)
        ]

    def moved(self) -> int:
        return self.moved_before + sum(s.moved for s in self.running.values())

    def reconnects(self) -> int:
        return self.reconnects_before + sum(s.reconnects for s in self.running.values())
