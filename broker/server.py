"""The Broker: configuration, vhosts, listeners, and the few things shared by all connections.

Shared state lives here so connections stay small: the set of connections
with output waiting (flushed once per loop iteration), the memory alarm that
blocks publishers, and the direct reply-to registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roarmq.protocol.tables import RECURSION_LIMIT

from . import __version__
from .amqp.tls import TlsListener, server_context
from .cluster_hooks import ClusterHooks, SingleNode
from .config import Config
from .core.auth import INTERNAL_USER, NO_PERMISSION, Authenticator
from .core.delayed import dormant_schedules
from .core.parameters import ParameterError, Parameters
from .core.persistence import Persistence
from .core.policy import PolicyError, make_policy
from .core.stream import close_all as close_streams
from .core.vhost import VirtualHost
from .links.federation import Federation
from .links.local import connect_local
from .links.relay import connect_network
from .links.shovels import Shovels
from .management.metrics import Totals
from .ops.alarms import CLUSTER, DISK, ResourceMonitor
from .ops.clock import Clock
from .ops.logs import NOTICE
from .ops.stalls import GC_WATCH, JobTimes, LoopLag
from .store.messages import MessageStore, SegmentDurability

if TYPE_CHECKING:
    from .amqp.channel import Consumer
    from .amqp.connection import Connection

log = logging.getLogger("roarmq.server")


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


#: Seconds between message-log compaction passes.
COMPACT_EVERY = 30.0
#: Seconds before a failed message store is tried again, doubling up to the most.
STORE_RETRY_FIRST = 0.05
STORE_RETRY_MAX = 5.0


class Broker:
    def __init__(self, config: Config | None = None, *, clock: Clock | None = None) -> None:
        # Field tables as deep as RabbitMQ takes (protocol/tables.py, MAX_NESTING) must
        # decode, re-encode and compare: raise Python's default limit of 1,000 to cover them.
        sys.setrecursionlimit(max(sys.getrecursionlimit(), RECURSION_LIMIT))
        self.config = config or Config()
        self.clock = clock or Clock()
        self.node_name = f"roarmq@{socket.gethostname()}"
        #: What the core asks of the cluster (broker/cluster_hooks.py): a lone node's
        #: answers, or broker/cluster/node.py's ClusterNode when [cluster] is set (made
        #: below, imported only then; restoring the definitions asks the lone node's).
        self.cluster: ClusterHooks = SingleNode(self)
        self.persistence = Persistence(self, self.config.storage.data_dir)
        self.persistence.seed_from_config()
        settings = self.persistence.definitions.settings()
        #: RabbitMQ's cluster name: the node's name until set (PUT /api/cluster-name).
        self.cluster_name: str = settings.get("cluster_name", self.node_name)
        self.auth: Authenticator = self.persistence.load_auth()
        self._auth_deferred = 0  # changing() blocks open: reload_auth waits for the last
        #: RabbitMQ's vhost and user limits: ("vhost" | "user", name) -> {limit: value}.
        self.limits: dict[tuple[str, str], dict[str, int]] = {}
        for limit in self.persistence.definitions.limits():
            self.limits.setdefault((limit.kind, limit.owner), {})[limit.name] = limit.value
        self.store: MessageStore | None = None  # opened by start(): it needs the loop
        self.vhosts: dict[str, VirtualHost] = {
            name: VirtualHost(self, name) for name in self.persistence.vhost_names()
        }
        for name, metadata in self.persistence.definitions.vhost_metadata().items():
            if name in self.vhosts:
                self.vhosts[name].metadata.update(metadata)
        self._load_policies()
        #: Runtime parameters (shovels): their values, and what each component runs.
        self.parameters = Parameters()
        self.shovels = Shovels(
            node=self.node_name,
            cluster_name=lambda: self.cluster_name,
            may_use_vhost=self.may_use_vhost,
            clear=lambda vhost, name: self.cluster.change("clear_parameter", vhost, "shovel", name),
            connect=self._connect_link,
            serves=lambda vhost: self.cluster.refusal(vhost) is None,
        )
        self.parameters.register(self.shovels)
        self.federation = Federation(
            node=self.node_name,
            cluster_name=lambda: self.cluster_name,
            vhosts=lambda: self.vhosts,
            serves=lambda vhost: self.cluster.refusal(vhost) is None,
            connect=self._connect_link,
        )
        for component in self.federation.components():
            self.parameters.register(component)
        self._load_parameters()
        self.totals = (
            Totals()
        )  # broker/management/metrics.py: churn and what deleted objects counted
        self.persistence.restore()
        self.totals.queues_at_start = sum(len(v.queues) for v in self.vhosts.values())
        self.connections: set[Connection] = set()
        self.draining: set[Connection] = set()  # sent close-ok, waiting for the client to hang up
        self.reply_to: dict[str, Consumer] = {}
        self.queued_bytes = 0
        self.memory_check_at = 0  # queued_bytes at which the memory estimate is checked again
        self.alarms: set[str] = set()  # resource alarms set now ("memory", "disk")
        self.resources = ResourceMonitor(self)
        self.loop_lag: LoopLag | None = None  # [diagnostics] loop_lag_probe_ms
        #: broker/ops/gc_schedule.py's GcSchedule in a `roarmq serve` process (None in-process)
        self.gc_schedule: Any = None
        self._dirty: list[Connection] = []
        self._flush_scheduled = False
        self._servers: list[asyncio.base_events.Server] = []
        self.ports: list[int] = []
        self.bound: list[str] = []  # the addresses listened on
        self.tls: TlsListener | None = None  # [amqp.tls]: the amqps listener
        self.mgmt_port: int | None = None
        self._management: Any = None
        self.started_at: float | None = None
        # the stream protocol ([stream]): its connections, listeners and port
        self.stream_connections: set[Any] = set()
        self._stream_servers: list[asyncio.base_events.Server] = []
        self.stream_port: int | None = None
        self.stream_tls: TlsListener | None = None
        self.recovery: dict[str, int] = {}
        self.archive: Any = None  # broker/archive.py's Archive when [archive] enabled
        self._compaction_timer: Any = None
        self._store_retry: Any = None  # the next attempt to resume a failed message store
        self._store_retry_delay = STORE_RETRY_FIRST
        self._store_resumed_at = float("-inf")
        if self.config.cluster is not None:
            from .cluster.node import ClusterNode

            self.node_name = self.config.cluster.node
            self.cluster = ClusterNode(self, self.config.cluster)

    # -- lifecycle --------------------------------------------------------------------

    async def start(self, *, management: bool | None = None) -> None:
        """Bind every configured address; port 0 picks one free port shared by all."""
        from .amqp.connection import Connection

        amqp = self.config.amqp
        # Before anything is opened: a certificate that does not load stops the start here.
        tls_context = server_context(amqp.tls, "amqp.tls") if amqp.tls.enabled else None
        loop = asyncio.get_running_loop()
        self.clock.loop  # bind the clock to this loop  # noqa: B018
        self.started_at = self.clock.wall()
        GC_WATCH.install()  # the roarmq_gc_* metrics: always on
        self._open_message_store(loop)  # recovery holds the loop: before the probe starts
        self.resources.start()
        diagnostics = self.config.diagnostics
        if diagnostics.loop_lag_probe_ms:  # started once start-up is over, below
            jobs = self.clock.jobs = JobTimes()  # timers, slices and store callbacks timed
            self.persistence.definitions.jobs = jobs
            if self.store is not None:
                self.store.jobs = jobs
            self.loop_lag = LoopLag(
                loop,
                diagnostics.loop_lag_probe_ms / 1000,
                diagnostics.stall_threshold_ms / 1000,
                jobs=jobs,
            )
        if self.config.archive.enabled:
            from .archive import Archive

            self.archive = Archive(self.config.archive, clock=self.clock)
        if amqp.plain:
            await self._listen(lambda: Connection(self))
        if tls_context is not None:
            self.tls = TlsListener(tls_context, lambda: Connection(self))
            await self.tls.listen(amqp.tls.bind or amqp.bind, amqp.tls.port, amqp.backlog)
        if self.config.stream.enabled:
            await self._listen_streams()
        want_mgmt = self.config.management.enabled if management is None else management
        if want_mgmt:
            from .management import ManagementServer

            self._management = ManagementServer(self)
            self.mgmt_port = await self._management.start()
        await self.cluster.start()  # after the listeners: a cluster node registers their ports
        # One line that says where to connect. Scripts and benchmarks read the plain port as
        # the number after the line's last " port ", so the other listeners do not say "port".
        where = []
        if self.ports:
            hosts = ", ".join(_host(h) for h in self.bound)
            where.append(f"AMQP on {hosts} port {self.port}")
        if self.tls is not None:
            where.append(
                "amqps on " + ", ".join(f"{_host(h)}:{self.tls.port}" for h in self.tls.bound)
            )
        if self.stream_port is not None:
            listened = self.config.stream.bind or tuple(self.bound) or self.config.amqp.bind
            where.append(
                "streams on " + ", ".join(f"{_host(h)}:{self.stream_port}" for h in listened)
            )
        if self.stream_tls is not None:
            where.append(
                "stream TLS on "
                + ", ".join(f"{_host(h)}:{self.stream_tls.port}" for h in self.stream_tls.bound)
            )
        if self.mgmt_port:
            scheme = "https" if self.config.management.tls.enabled else "http"
            where.append(f"management {scheme}://{self.config.management.bind}:{self.mgmt_port}")
        log.log(NOTICE, "RoarMQ %s: %s", __version__, ", ".join(where))
        if self.loop_lag is not None:
            self.loop_lag.start()
        self.shovels.activate()  # once everything a link's local end needs is up
        self.federation.activate()

    async def _listen(self, factory: Callable[[], Any]) -> None:
        """The plain listener on every [amqp] address; port 0 picks one free port for all.
        (`factory` makes a Connection: an asyncio protocol by its methods, not by its class,
        being compiled.)"""
        loop = asyncio.get_running_loop()
        hosts, port = self.config.amqp.bind, self.config.amqp.port
        for host in hosts:
            try:
                server = await loop.create_server(
                    factory, host, port, backlog=self.config.amqp.backlog, reuse_address=True
                )
            except OSError as exc:
                if host == "::1" and len(hosts) > 1 and exc.errno in (97, 99):
                    log.warning("IPv6 loopback unavailable; not listening on [::1]")
                    continue
                raise
            self.bound.append(host)
            _no_delay(server)
            self._servers.append(server)
            if port == 0:
                port = server.sockets[0].getsockname()[1]
            self.ports.append(port)

    async def _listen_streams(self) -> None:
        """The stream protocol's listeners ([stream]; its addresses default to [amqp]'s):
        plain on `listen_port`, TLS on [stream.tls] port when enabled."""
        from .stream_protocol.connection import StreamConnection

        config = self.config.stream
        hosts = config.bind or tuple(self.bound) or self.config.amqp.bind
        port = config.listen_port(self.config.amqp.port)
        loop = asyncio.get_running_loop()
        for host in hosts:
            server = await loop.create_server(
                lambda: StreamConnection(self),
                host,
                port,
                backlog=self.config.amqp.backlog,
                reuse_address=True,
            )
            _no_delay(server)
            self._stream_servers.append(server)
            if port == 0:
                port = server.sockets[0].getsockname()[1]
        self.stream_port = port
        if config.tls.enabled:
            context = server_context(config.tls, "stream.tls")
            self.stream_tls = TlsListener(context, lambda: StreamConnection(self, tls=True))
            await self.stream_tls.listen(hosts, config.tls.port, self.config.amqp.backlog)

    def vhost_connection_count(self, vhost: str) -> int:
        """Open connections to a vhost, over AMQP and the stream protocol (its limit counts
        both)."""
        return sum(
            1 for c in self.connections if c.vhost is not None and c.vhost.name == vhost
        ) + sum(1 for c in self.stream_connections if c.vhost is not None and c.vhost.name == vhost)

    def user_connection_count(self, user: str) -> int:
        return len(self.user_connections(user)) + sum(
            1 for c in self.stream_connections if c.vhost is not None and c.user.name == user
        )

    def _open_message_store(self, loop: asyncio.AbstractEventLoop) -> None:
        """Open the message log and put recovered messages back in their durable queues."""
        storage = self.config.storage
        started = time.monotonic()
        self.store = MessageStore(
            Path(storage.data_dir) / "messages",
            durability=SegmentDurability(
                segment_size=storage.segment_size, sync_interval_ms=storage.sync_interval_ms
            ),
            loop=loop,
            ack_sync_delay=storage.ack_sync_delay_ms / 1000,
        )
        queues = {}
        holders: dict[int, Any] = {}  # and what a schedule no exchange has now held
        for vhost in self.vhosts.values():
            vhost.message_store = self.store
            for queue in vhost.queues.values():
                if queue.store_id is not None:
                    queue.store = self.store
                    queues[queue.store_id] = queue
            for schedule in vhost.stored_schedules():
                assert schedule.store_id is not None  # a durable exchange's: set at creation
                schedule.use_store(self.store)
                queues[schedule.store_id] = schedule
            holders.update(dormant_schedules(vhost.exchanges.values(), self.store))
        counts = self.store.recover({**holders, **queues})
        report = self.store.log.recovery
        if report.segments and not self.store.clean_start:
            log.warning(
                "recovering after an unclean shutdown (a crash or kill): every recovered "
                "message is marked redelivered",
                extra={"data_dir": storage.data_dir},
            )
        if report.corrupt_regions:
            for region in report.corrupt_regions:
                log.error(
                    "message log damage %s",
                    "truncated" if region.truncated else "skipped",
                    extra={
                        "segment": region.segment,
                        "offset": region.offset,
                        "bytes": region.length,
                        "reason": region.reason,
                    },
                )
        held = sum(1 for q in queues.values() if q.ready.n)
        ms = round((time.monotonic() - started) * 1000, 1)
        if not report.segments and not self.store.clean_start:  # first boot: no shutdown yet
            log.log(NOTICE, "message store is new: nothing to recover", extra={"ms": ms})
        else:
            log.log(
                NOTICE,
                "message store recovered %d persistent messages in %d durable queues; "
                "%d records no queue needed any more were released",
                counts["messages"],
                held,
                counts["released"],
                extra={
                    **counts,
                    "clean": self.store.clean_start,
                    "data_dir": storage.data_dir,
                    "ms": ms,
                },
            )
        self.recovery = counts
        self.store.on_failure = self._store_failed
        self.store.on_disk_check = self.resources.check_disk_now
        self._compaction_timer = self.clock.call_later(COMPACT_EVERY, self._compact)

    # -- the message store failing and resuming --------------------------------------------

    def _store_failed(self, exc: BaseException) -> None:
        """A store write failed (its waiting publishes are nacked): look at the disk, resume.

        On ENOSPC the free-disk sample is taken at once, so the disk alarm blocks publishers
        now; the store resumes when the alarm clears (set_alarm). Any other error is tried
        again at once, then less and less often, while consumers go on being served.
        """
        self.resources.check_disk_now()
        now = self.clock.loop.time()
        if now - self._store_resumed_at > STORE_RETRY_MAX * 4:
            self._store_retry_delay = STORE_RETRY_FIRST  # a new fault: try at once
            self._schedule_store_resume(0.0)
        else:  # failed again soon after resuming: the fault persists, back off
            self._store_retry_delay = min(self._store_retry_delay * 2, STORE_RETRY_MAX)
            self._schedule_store_resume(self._store_retry_delay)

    def _schedule_store_resume(self, delay: float) -> None:
        if self._store_retry is not None:
            self._store_retry.cancel()
        self._store_retry = self.clock.loop.call_later(delay, self._resume_store)

    def _resume_store(self) -> None:
        self._store_retry = None
        store = self.store
        if store is None or store.failed is None:
            return
        if DISK in self.alarms:
            return  # set_alarm(DISK, False) tries again when space is back
        if store.resume():
            self._store_resumed_at = self.clock.loop.time()
        else:
            self._store_retry_delay = min(self._store_retry_delay * 2, STORE_RETRY_MAX)
            self._schedule_store_resume(self._store_retry_delay)

    def store_status(self) -> dict[str, Any]:
        """The message store's health, for management, /metrics and health checks."""
        store = self.store
        if store is None:
            return {"state": "closed"}
        failed = store.failed
        return {
            "state": "ok" if failed is None else "failed",
            "error": None if failed is None else str(failed),
            "failures": store.failures,
            "resumes": store.log.resumes,
            "nacked": store.nacked,
            "refused": store.refused,
        }

    def _compact(self) -> None:
        if self.store is None:
            return
        try:
            self.store.compact()
        except Exception:
            log.exception("message store compaction failed")
        self._compaction_timer = self.clock.call_later(COMPACT_EVERY, self._compact)

    @property
    def port(self) -> int:
        return self.ports[0] if self.ports else self.config.amqp.port

    @property
    def tls_port(self) -> int:
        return self.tls.port if self.tls is not None else self.config.amqp.tls.port

    async def stop(self) -> None:
        open_connections = len(self.connections)
        await self.cluster.stop()  # first: a cluster node's lease is revoked, another leads now
        await self.shovels.stop_all()  # each link closes its own connections, cleanly
        await self.federation.stop_all()
        self.resources.stop()
        if self.loop_lag is not None:
            self.loop_lag.stop()
        GC_WATCH.uninstall()
        for server in self._servers + self._stream_servers:
            server.close()
        if self.tls is not None:
            await self.tls.close()
        if self.stream_tls is not None:
            await self.stream_tls.close()
        for stream_conn in list(self.stream_connections):
            stream_conn.force_close("broker shutdown")
        # At INFO each: the notice at the end counts them (a WARNING per client would page
        # whoever alerts on warnings at every planned restart).
        for conn in list(self.connections):
            conn.force_close("broker shutdown", level=logging.INFO)
        for conn in list(self.draining):  # closed by their clients, sockets still open
            conn.force_close("broker shutdown", level=logging.INFO)
        self._flush_dirty()
        for server in self._servers + self._stream_servers:
            await server.wait_closed()
        self._servers.clear()
        self._stream_servers.clear()
        if self._management is not None:
            await self._management.stop()
            self._management = None
        if self._compaction_timer is not None:
            self._compaction_timer.cancel()
        if self._store_retry is not None:
            self._store_retry.cancel()
            self._store_retry = None
        if self.store is not None:
            self.store.close()
            self.store = None
        close_streams(self)
        if self.archive is not None:
            self.archive.close()
            self.archive = None
        self.persistence.close()
        if self.started_at is not None:
            log.log(
                NOTICE,
                "RoarMQ stopped: %d connections closed, message store synced and closed",
                open_connections,
                extra={"connections": open_connections},
            )

    # -- users, vhosts, permissions (management API) --------------------------------------

    def add_vhost(self, name: str, metadata: dict[str, Any] | None = None) -> bool:
        """Create a vhost (True), or update an existing one's metadata (description, tags,
        default queue type) when given, as RabbitMQ's PUT does."""
        vhost = self.vhosts.get(name)
        created = vhost is None
        if vhost is None:
            vhost = VirtualHost(self, name)
        if created or metadata is not None:
            # stored first: the vhost is made, or its metadata changed, once it is on disk
            stored = {**vhost.metadata, **(metadata or {})}
            self.persistence.definitions.put_vhost(name, stored)
            vhost.metadata = stored
        self.vhosts[name] = vhost
        if created:
            self.cluster.vhost_added(name)  # a cluster's placement keys in etcd
        return created

    def set_cluster_name(self, name: str) -> None:
        self.persistence.definitions.put_setting("cluster_name", name)
        self.cluster_name = name

    def delete_vhost(self, name: str) -> bool:
        """Delete a vhost: from the store first, in one transaction, then from memory (its
        queues and exchanges then write nothing more: `VirtualHost.deleted`)."""
        vhost = self.vhosts.get(name)
        if vhost is None:
            return False
        self.persistence.vhost_deleted(name)
        vhost.deleted = True
        del self.vhosts[name]
        for conn in [*self.connections, *self.stream_connections]:
            if conn.vhost is vhost:
                conn.force_close(f"vhost '{name}' is deleted")
        for queue in list(vhost.queues.values()):
            vhost.delete_queue(queue, reason="vhost deleted")
        for schedule in vhost.schedules():  # delayed exchanges' messages go as queues' do
            schedule.on_deleted()
        self.parameters.vhost_deleted(name)  # (the store dropped them with the vhost)
        self.limits.pop(("vhost", name), None)
        self.reload_auth()
        return True

    def put_user(
        self, name: str, password_hash: str, tags: tuple[str, ...], loopback_only: bool = False
    ) -> None:
        from .store.definitions import UserDef

        self.persistence.definitions.put_user(UserDef(name, password_hash, tags, loopback_only))
        self.reload_auth()

    def delete_user(self, name: str) -> bool:
        if name not in self.auth.users:
            return False
        self.persistence.definitions.delete_user(name)
        self.limits.pop(("user", name), None)
        self.reload_auth()
        for conn in [*self.connections, *self.stream_connections]:
            if conn.user is not None and conn.user.name == name:
                conn.force_close(f"user '{name}' was deleted")
        return True

    def set_permission(self, user: str, vhost: str, configure: str, write: str, read: str) -> None:
        from .store.definitions import PermissionDef

        self.persistence.definitions.put_permission(
            PermissionDef(user, vhost, configure, write, read)
        )
        self.reload_auth()

    def clear_permission(self, user: str, vhost: str) -> None:
        self.persistence.definitions.delete_permission(user, vhost)
        self.reload_auth()

    def set_topic_permission(
        self, user: str, vhost: str, exchange: str, write: str, read: str
    ) -> None:
        from .store.definitions import TopicPermissionDef

        self.persistence.definitions.put_topic_permission(
            TopicPermissionDef(user, vhost, exchange, write, read)
        )
        self.reload_auth()

    def clear_topic_permissions(self, user: str, vhost: str, exchange: str | None = None) -> int:
        removed = self.persistence.definitions.delete_topic_permissions(user, vhost, exchange)
        self.reload_auth()
        return removed

    # -- policies ---------------------------------------------------------------------------

    def _load_policies(self) -> None:
        for vhost_name, name, operator, body in self.persistence.definitions.policies():
            vhost = self.vhosts.get(vhost_name)
            if vhost is None:
                continue
            try:
                policy = make_policy(vhost_name, name, body, operator)
            except PolicyError as exc:
                log.error("cannot restore policy", extra={"policy": name, "error": str(exc)})
                continue
            (vhost.operator_policies if operator else vhost.policies)[name] = policy
        for vhost in self.vhosts.values():
            if vhost.policies or vhost.operator_policies:
                vhost.reapply_policies()  # the built-in exchanges exist already

    def set_policy(self, vhost: str, name: str, body: dict, operator: bool = False) -> bool:
        """Create or replace a policy (PolicyError if RabbitMQ would refuse it); True if new."""
        policy = make_policy(vhost, name, body, operator)
        host = self.vhosts[vhost]
        new = name not in (host.operator_policies if operator else host.policies)
        self.persistence.definitions.put_policy(vhost, name, operator, policy.row())
        host.set_policy(policy)
        self.federation.changed()  # a policy may federate exchanges and queues
        return new

    def clear_policy(self, vhost: str, name: str, operator: bool = False) -> bool:
        host = self.vhosts.get(vhost)
        if host is None or name not in (host.operator_policies if operator else host.policies):
            return False
        self.persistence.definitions.delete_policy(vhost, name, operator)
        cleared = host.clear_policy(name, operator)
        self.federation.changed()
        return cleared

    # -- runtime parameters (shovels) ------------------------------------------------------

    def _load_parameters(self) -> None:
        """The stored runtime parameters, checked again (a component's rules may have
        changed since); shovels start with the broker (`Shovels.activate`)."""
        for vhost, component, name, value in self.persistence.definitions.parameters():
            if vhost not in self.vhosts:
                continue
            try:
                checked = self.parameters.check(vhost, component, name, value, INTERNAL_USER.name)
            except ParameterError as exc:
                log.error(
                    "cannot restore runtime parameter",
                    extra={"component": component, "parameter": name, "error": str(exc)},
                )
                continue
            self.parameters.apply(vhost, component, name, value, checked)

    def set_parameter(
        self, vhost: str, component: str, name: str, value: Any, user: str = INTERNAL_USER.name
    ) -> bool:
        """Set a runtime parameter as `user` (ParameterError if RabbitMQ would refuse it,
        KeyError for an unknown vhost); True if new. Stored first: a refusal or a failed
        write changes nothing."""
        if vhost not in self.vhosts:
            raise KeyError(vhost)
        checked = self.parameters.check(vhost, component, name, value, user)
        if self.parameters.values.get((vhost, component, name)) != value:
            self.persistence.definitions.put_parameter(vhost, component, name, value)
        return self.parameters.apply(vhost, component, name, value, checked)

    def clear_parameter(self, vhost: str, component: str, name: str) -> bool:
        if (vhost, component, name) not in self.parameters.values:
            return False
        self.persistence.definitions.delete_parameter(vhost, component, name)
        return self.parameters.remove(vhost, component, name)

    def vhost_served(self, vhost: str) -> None:
        """Whether this node serves `vhost` changed (a cluster node won or lost its
        leadership): its links run where it is served."""
        self.shovels.reconsider(vhost)
        self.federation.changed()

    def may_use_vhost(self, user: str, vhost: str) -> bool:
        """Whether `user` may reach `vhost` (a local link URI's check; the broker itself,
        restoring what it stored, may)."""
        if user == INTERNAL_USER.name:
            return True
        found = self.auth.users.get(user)
        return found is not None and vhost in found.permissions

    async def _connect_link(self, uri: Any, name: str) -> Any:
        """A shovel's or federation link's connection: to this broker for a URI with no
        host (`amqp://`, no socket), else over the network."""
        from .amqp.connection import Connection

        if uri.local:
            return await connect_local(lambda: Connection(self), INTERNAL_USER, uri, name)
        return await connect_network(uri, name)

    # -- limits (rabbitmqctl set_vhost_limits / set_user_limits) ---------------------------

    def limit(self, kind: str, owner: str, name: str) -> int | None:
        """A vhost's or user's limit; None when there is none (a negative value is none too)."""
        value = self.limits.get((kind, owner), {}).get(name)
        return None if value is None or value < 0 else value

    def set_limit(self, kind: str, owner: str, name: str, value: int) -> None:
        from .store.definitions import LimitDef

        self.persistence.definitions.put_limit(LimitDef(kind, owner, name, value))
        self.limits.setdefault((kind, owner), {})[name] = value

    def clear_limit(self, kind: str, owner: str, name: str) -> bool:
        self.persistence.definitions.delete_limit(kind, owner, name)
        return self.limits.get((kind, owner), {}).pop(name, None) is not None

    def user_connections(self, user: str) -> list[Connection]:
        return [c for c in self.connections if c.vhost is not None and c.user.name == user]

    @contextlib.contextmanager
    def changing(self, operation: str) -> Iterator[None]:
        """Several changes to users, permissions, limits and policies through the methods
        above as one transaction of the definitions store and one reload of the users at
        the end (a cluster node applying etcd's copy: broker/cluster/metadata.py)."""
        self._auth_deferred += 1
        try:
            with self.persistence.definitions.writing(operation):
                yield
        finally:
            self._auth_deferred -= 1
            if not self._auth_deferred:
                self.reload_auth()

    def reload_auth(self) -> None:
        """Re-read users and permissions; open connections see the change at once (their
        next check), as the publish-exchange caches of their channels are dropped."""
        if self._auth_deferred:
            return  # changing(): once, at its end
        self.auth = self.persistence.load_auth()
        for conn in self.connections:
            if self._regrant(conn):
                for channel in conn.channels.values():
                    channel.permissions_changed()
        for stream_conn in self.stream_connections:
            self._regrant(stream_conn)

    def _regrant(self, conn: Any) -> bool:
        """An open connection's user and permissions as the definitions now say; False for
        one not logged in to a vhost, or whose user is gone (delete_user closes those)."""
        if conn.user is None or conn.vhost is None:
            return False
        user = self.auth.users.get(conn.user.name)
        if user is None:
            return False
        conn.user = user
        conn.permission = user.permissions.get(conn.vhost.name, NO_PERMISSION)
        return True

    # -- connections ------------------------------------------------------------------

    def connection_opened(self, conn: Connection) -> None:
        self.totals.connections_opened += 1
        limit = self.config.limits.max_connections
        self.connections.add(conn)
        if limit and len(self.connections) > limit:
            conn.force_close("connection limit reached")

    def connection_closed(self, conn: Connection) -> None:
        self.connections.discard(conn)

    def mark_dirty(self, conn: Connection) -> None:
        """Queue a connection's output for the once-per-iteration flush."""
        self._dirty.append(conn)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.clock.loop.call_soon(self._flush_dirty)

    def _flush_dirty(self) -> None:
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, []
        for conn in dirty:
            conn.flush()

    # -- resource alarms ----------------------------------------------------------------

    @property
    def blocked(self) -> bool:
        """Publishers are blocked: a memory or disk alarm is set."""
        return bool(self.alarms)

    def account_bytes(self, delta: int) -> None:
        """Bodies entered (or left) the queues' memory; a large burst may set the alarm early."""
        queued = self.queued_bytes = self.queued_bytes + delta
        if queued > self.memory_check_at:
            self.resources.queued_grew()

    def set_alarm(self, alarm: str, on: bool, *, used: int, limit: int) -> None:
        """Set or clear one resource alarm; publishers are blocked while any is set."""
        was_blocked = bool(self.alarms)
        if on:
            self.alarms.add(alarm)
        else:
            self.alarms.discard(alarm)
        log.warning(
            "%s alarm %s", alarm, "set" if on else "cleared", extra={"used": used, "limit": limit}
        )
        if was_blocked and not self.alarms:
            for conn in [*self.connections, *self.stream_connections]:
                conn.unblock()
        if alarm == DISK and not on and self.store is not None and self.store.failed is not None:
            self._schedule_store_resume(0.0)  # space is back: the store goes on
        # While set, each connection is blocked when it next publishes (Connection._block).

    def set_cluster_fenced(self, on: bool) -> None:
        """The cluster lease was not renewed within its TTL (or is renewed again): block
        (unblock) publishers, reason "cluster: leadership not confirmed".

        Done as one more alarm in `alarms` rather than a flow reason of its own, because the
        alarm path already does exactly what fencing needs: only publishing connections stop
        being read and get connection.blocked / unblocked, consumers keep draining, and the
        publish path pays nothing more (its `if alarms` test is already there).
        """
        if (CLUSTER in self.alarms) != on:
            self.set_alarm(CLUSTER, on, used=0, limit=0)


def _no_delay(server: asyncio.base_events.Server) -> None:
    """A listener's sockets send small frames at once (the broker coalesces its writes)."""
    for sock in server.sockets:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
