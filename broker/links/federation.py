"""Federation, as RabbitMQ's rabbitmq_federation plugin does it: an exchange or a queue on
this broker (the downstream) receives what is published to its upstream on another
broker (RabbitMQ, RoarMQ, any AMQP 0-9-1 broker), over AMQP 0-9-1 alone.

What makes a link: `federation-upstream` parameters (an upstream's URIs and settings,
`federation_definition.py`), `federation-upstream-set` parameters (named lists of them),
and a policy whose definition has `federation-upstream-set` (a set's name, or `all`) or
`federation-upstream` (one upstream's name), applied to exchanges or queues. Each
(object, upstream) pair is a link (`ExchangeLink`, `QueueLink`), a `Relay` from the
upstream to this broker's vhost through its own in-process connection.

**Exchange federation**, as `rabbit_federation_exchange_link` does it: on the upstream,
the exchange (`exchange`, else the downstream's name) is declared like the downstream's
if it is missing; a durable queue `federation: X -> {cluster name}` (with the upstream's
`expires` and `message-ttl`) is bound to an internal exchange `{queue} A` (or `B`: the
name alternates, so a new session is bound before the old exchange goes), declared as
RabbitMQ's `x-federation-upstream` type where the upstream has it (it drops messages
past `max-hops` there) and as a fanout otherwise (RoarMQ, or RabbitMQ without the plugin:
the hop check is then made here); each binding of the downstream exchange is made on
the upstream from its exchange to the internal one, with the same key and arguments and
an `x-bound-from` entry that counts hops the way RabbitMQ counts them, and bindings made
and removed later follow (`bindings_changed`). Each message consumed is published to the
downstream exchange with its routing key and an `x-received-from` entry prepended (the
upstream's URI without credentials, exchange, `redelivered`, cluster name and vhost); one
that has travelled `max-hops` links, or has been here before, is dropped (acknowledged).

**Queue federation**, as `rabbit_federation_queue_link` does it: messages move from the
upstream queue (`queue`, else the downstream's name) to the downstream queue only while
the downstream queue has consumers and no ready messages (`QueueLink` consumes upstream
then, and cancels when that is no longer so), each with `x-received-from`.

Links run where their vhost is served (on a cluster, its leader), with the upstream's
`ack-mode` (`on-confirm` by default: acked upstream once this broker confirmed it),
`prefetch-count` and `reconnect-delay`. A link removed (its policy, upstream or object
gone) deletes what it made upstream, as RabbitMQ's does; a broker that stops leaves them,
so what the upstream receives meanwhile waits in the link's queue (RabbitMQ deletes them
on a clean shutdown too; `expires` bounds how long they stay either way).
`GET /api/federation-links` rows are `rows`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote

from roarmq.protocol import spec
from roarmq.protocol.errors import ACCESS_REFUSED, COMMAND_INVALID, NOT_FOUND
from roarmq.protocol.frames import ContentHeader
from roarmq.protocol.properties import BasicProperties

from ..core.erlang import Atom, phash2
from ..ops.tasks import cancel_and_wait
from .client import AmqpClient, ClientChannel, LinkClosed
from .federation_definition import Upstream, check_upstream, check_upstream_set
from .relay import Connect, Relay, ensure_queue, status_time
from .uri import AmqpUri, parse_uri

#: How long a broker's stop waits for removed links still deleting what they made upstream.
STOP_GRACE_SECONDS = 2.0

log = logging.getLogger("roarmq.federation")

#: The policy keys that federate an exchange or a queue.
UPSET_KEY = "federation-upstream-set"
UPSTREAM_KEY = "federation-upstream"
#: Headers RabbitMQ's federation writes: on messages, on bindings.
ROUTING_HEADER = "x-received-from"
BINDING_HEADER = "x-bound-from"
#: Seconds between two looks at which objects are federated (policies, declares and
#: deletes are seen within this; a parameter or policy change is seen at once).
RECONCILE_EVERY = 1.0
#: Seconds between two looks at a federated queue's demand.
DEMAND_EVERY = 0.1


def link_id(vhost: str, kind: str, name: str, upstream: str, upstream_name: str) -> str:
    """RabbitMQ's link id: erlang:phash2 of {#resource{}, UpstreamName, UpstreamXorQ} in
    eight hex digits (rabbit_federation_status:unique_id)."""
    resource = (Atom("resource"), vhost.encode(), Atom(kind), name.encode())
    return f"{phash2((resource, upstream.encode(), upstream_name.encode())):08x}"


def should_forward(headers: dict[str, Any] | None, max_hops: int, cluster: str, vhost: str) -> bool:
    """rabbit_federation_util:should_forward: fewer than `max_hops` links travelled, and
    never through this cluster's vhost before."""
    trail = (headers or {}).get(ROUTING_HEADER)
    if not isinstance(trail, list):
        return True
    return len(trail) < max_hops and not already_seen(cluster, vhost, trail)


def already_seen(cluster: str, vhost: str, trail: list[Any]) -> bool:
    return any(
        isinstance(t, dict) and t.get("cluster-name") == cluster and t.get("vhost") == vhost
        for t in trail
    )


def _hops(entry: dict[str, Any]) -> int:
    value = entry.get("hops")
    return int(value) if isinstance(value, int) else 0


def _internal(kind: str, obj: Any) -> bool:
    """Never federated, as RabbitMQ's: an internal exchange, a queue of federation's own
    (`x-internal-purpose`)."""
    if kind == "exchange":
        return bool(obj.internal)
    return "x-internal-purpose" in (obj.arguments or {})


class FederationLink(Relay):
    """What an exchange link and a queue link share: the upstream end, the local end, the
    `x-received-from` entry, the status row."""

    kind = "federation link"
    #: "exchange" or "queue"
    object_kind = ""

    def __init__(self, federation: Federation, vhost: str, target: Any, upstream: Upstream):
        super().__init__(
            vhost,
            target.name,
            ack_mode=upstream.ack_mode,
            prefetch=upstream.prefetch_count,
            reconnect_delay=upstream.reconnect_delay,
            connect=federation.connect,
        )
        self.federation = federation
        self.target = target
        self.upstream = upstream
        self.upstream_name = ""  # the upstream's own name for what it federates
        self.uri: str | None = None  # the session's upstream URI, without credentials
        self.upstream_cluster: str | None = None
        self.status = "starting"

    @property
    def id(self) -> str:
        return link_id(
            self.vhost, self.object_kind, self.target.name, self.upstream.name, self.upstream_name
        )

    async def _ends(self) -> tuple[AmqpClient, AmqpClient]:
        src = await self.connect_any(self.upstream.uris)
        self.uri = src.uri.redacted
        name = src.server_properties.get("cluster_name")
        self.upstream_cluster = name.decode() if isinstance(name, bytes) else name
        local = parse_uri("amqp:///" + quote(self.vhost, safe=""))
        dest = await self.connect_any((local,))
        return src, dest

    def _received_from(self, redelivered: bool, header: ContentHeader) -> ContentHeader:
        props = BasicProperties.decode(header.raw)
        headers = dict(props.headers or {})
        entry: dict[str, Any] = {
            "uri": self.uri or "",
            self.object_kind: self.upstream_name,
            "redelivered": redelivered,
        }
        if self.upstream_cluster is not None:
            entry["cluster-name"] = self.upstream_cluster
        entry["vhost"] = self.upstream.uris[0].vhost if self._src is None else self._src.uri.vhost
        earlier = headers.get(ROUTING_HEADER)
        headers[ROUTING_HEADER] = [entry, *(earlier if isinstance(earlier, list) else [])]
        props.headers = headers
        if not self.upstream.trust_user_id:
            props.user_id = None  # RabbitMQ's: a user id is the upstream's to vouch for
        return ContentHeader.from_properties(props, 60, header.body_size)

    def describe(self, exc: BaseException) -> str:
        """As RabbitMQ's federation status prints its errors (`econnrefused`, a refused
        login's `{auth_failure,...}`); others in our words."""
        if isinstance(exc, ConnectionRefusedError):
            return "econnrefused"
        if isinstance(exc, TimeoutError):
            return "timeout"
        if isinstance(exc, LinkClosed) and exc.reply_code == ACCESS_REFUSED and exc.by_server:
            return f'{{auth_failure,"{exc.reply_text}"}}'
        return super().describe(exc)

    def _set_state(self, state: str, reason: str | None = None) -> None:
        super()._set_state(state, reason)
        self.status = {"terminated": "error"}.get(state, state)

    def row(self) -> dict[str, Any]:
        """GET /api/federation-links' row (rabbit_federation_status's fields)."""
        row: dict[str, Any] = {"node": self.federation.node}
        if self.object_kind == "exchange":
            row.update({"exchange": self.target.name, "upstream_exchange": self.upstream_name})
        else:
            row.update(
                {
                    "queue": self.target.name,
                    "upstream_queue": self.upstream_name,
                    "consumer_tag": self.upstream.consumer_tag
                    or "federation-link-" + self.upstream.name,
                }
            )
        row.update(
            {
                "type": self.object_kind,
                "vhost": self.vhost,
                "upstream": self.upstream.name,
                "id": self.id,
                "status": self.status,
            }
        )
        if self.status == "running":
            row["local_connection"] = f"Federation link {self.id}"
        elif self.status == "error":
            row["error"] = self.reason
        row["uri"] = self.uri or self.upstream.uris[0].redacted
        row["timestamp"] = status_time(self.changed_at)
        return row

    async def remove(self) -> None:
        """The link is no longer wanted: stop it, and delete what it made upstream."""
        await self.stop()


class ExchangeLink(FederationLink):
    """One federated exchange's link to one upstream (module doc)."""

    object_kind = "exchange"

    def __init__(self, federation: Federation, vhost: str, target: Any, upstream: Upstream):
        super().__init__(federation, vhost, target, upstream)
        self.upstream_name = upstream.exchange or target.name
        #: Of the internal exchange: each session makes the one of the two names not in use
        #: upstream (`_unused_suffix`), binds it, then deletes the other. Read only while a
        #: session runs, which has set it first.
        self.suffix = ""
        self._cmd: ClientChannel | None = None
        self._bound: dict[tuple[str, Any], dict[str, Any]] = {}  # (key, args) -> args sent
        self._rebinding: asyncio.Task[None] | None = None

    @property
    def queue(self) -> str:
        """rabbit_federation_exchange_link:upstream_queue_name."""
        x, vhost = self.target.name, self.vhost
        up_vhost = self.upstream.uris[0].vhost
        down = "" if vhost == up_vhost and x == self.upstream_name else f":{x}"
        if vhost != up_vhost:
            down = f":{vhost}:{x}"
        return f"federation: {self.upstream_name} -> {self.federation.cluster_name()}{down}"

    async def _prepare(self) -> tuple[AmqpClient, ClientChannel, AmqpClient, str, int | None]:
        src, dest = await self._ends()
        ch = await src.channel()
        self._cmd = await src.channel()
        await self._ensure_upstream_exchange(src)
        queue = self.queue
        arguments: dict[str, Any] = {}
        if self.upstream.expires is not None:
            arguments["x-expires"] = self.upstream.expires
        if self.upstream.message_ttl is not None:
            arguments["x-message-ttl"] = self.upstream.message_ttl
        arguments["x-internal-purpose"] = "federation"
        await ch.call(spec.QueueDeclare(queue=queue, durable=True, arguments=arguments))
        self.suffix = await self._unused_suffix(src)
        old = f"{queue} {'B' if self.suffix == 'A' else 'A'}"
        internal = f"{queue} {self.suffix}"
        await self._declare_internal(src, internal)
        await ch.call(spec.QueueBind(queue=queue, exchange=internal))
        self._bound = {}
        await self._rebind(internal)
        await self._disposable(src, spec.ExchangeDelete(exchange=old))
        return src, ch, dest, queue, None

    async def _unused_suffix(self, src: AmqpClient) -> str:
        """The suffix of the internal exchange this session makes: one whose name the
        upstream has no exchange by, so that the one routing to the link's queue now (a link
        of this exchange's that ran before, on this node or, after a failover, another) goes
        on routing until the new one is bound, and only then is deleted: making it anew
        deletes it first, and whatever was published meanwhile would be routed nowhere.
        With both there (a session that ended between the two), "B": "A" routes meanwhile."""
        probe = spec.ExchangeDeclare(exchange=f"{self.queue} A", passive=True)
        return "A" if await self._disposable(src, probe) is not None else "B"

    async def _disposable(self, client: AmqpClient, method: Any) -> LinkClosed | None:
        """A call on a channel of its own (a refusal closes only that channel): the
        refusal, or None."""
        ch = await client.channel()
        try:
            await ch.call(method)
        except LinkClosed as exc:
            if exc.by_server and client.closed.done():
                raise
            return exc
        await ch.close()
        return None

    async def _ensure_upstream_exchange(self, src: AmqpClient) -> None:
        x = self.target
        passive = spec.ExchangeDeclare(exchange=self.upstream_name, passive=True)
        refused = await self._disposable(src, passive)
        if refused is None:
            return
        if refused.reply_code != NOT_FOUND:
            raise refused
        declare = spec.ExchangeDeclare(
            exchange=self.upstream_name,
            type=x.type,
            durable=x.durable,
            auto_delete=x.auto_delete,
            internal=x.internal,
            arguments=dict(x.arguments or {}),
        )
        refused = await self._disposable(src, declare)
        if refused is not None:
            raise refused

    async def _declare_internal(self, src: AmqpClient, name: str) -> None:
        """RabbitMQ's x-federation-upstream exchange where the upstream has the type (on a
        connection of its own: an unknown type closes the connection, 503), else a fanout."""
        await self._disposable(src, spec.ExchangeDelete(exchange=name))
        purpose = {"x-internal-purpose": "federation"}
        arguments = {
            "x-max-hops": self.upstream.max_hops,
            "x-downstream-name": self.federation.cluster_name(),
            "x-downstream-vhost": self.vhost,
            **purpose,
        }
        base: dict[str, Any] = {
            "exchange": name,
            "durable": True,
            "internal": True,
            "auto_delete": True,
        }
        try:
            probe = await self.connect(src.uri, f"Federation link {self.name} (declare)")
        except (LinkClosed, OSError, TimeoutError):
            probe = None
        if probe is not None:
            try:
                xfu = spec.ExchangeDeclare(
                    type="x-federation-upstream", arguments=arguments, **base
                )
                refused = await self._disposable(probe, xfu)
                if refused is None:
                    return
            except LinkClosed as exc:
                if exc.reply_code != COMMAND_INVALID:
                    raise
            finally:
                probe.abort("declared")
        ch = await src.channel()
        await ch.call(spec.ExchangeDeclare(type="fanout", arguments=purpose, **base))
        await ch.close()

    # -- bindings --------------------------------------------------------------------------

    def _binding_arguments(self, arguments: dict[str, Any] | None) -> dict[str, Any] | None:
        """rabbit_federation_exchange_link:update_binding: the binding's arguments with an
        `x-bound-from` entry prepended, or None when it should propagate no further."""
        arguments = dict(arguments or {})
        trail = arguments.get(BINDING_HEADER)
        max_hops = self.upstream.max_hops
        if isinstance(trail, list) and trail and isinstance(trail[0], dict):
            up_vhost = self.upstream.uris[0].vhost
            seen = self.upstream_cluster is not None and already_seen(
                self.upstream_cluster, up_vhost, trail
            )
            hops = 0 if seen else min(_hops(trail[0]) - 1, max_hops)
        else:
            trail, hops = [], max_hops
        if hops <= 0:
            return None
        entry = {
            "cluster-name": self.federation.cluster_name(),
            "vhost": self.vhost,
            "exchange": f"{self.vhost}:{self.target.name} {self.suffix}",
            "hops": hops,
        }
        arguments[BINDING_HEADER] = [entry, *trail]
        return arguments

    def _wanted(self) -> dict[tuple[str, Any], dict[str, Any] | None]:
        """(key, arguments) of each binding of the downstream exchange -> its arguments."""
        wanted: dict[tuple[str, Any], dict[str, Any] | None] = {}
        for key, _destination, arguments in self.target.index.bindings():
            frozen = repr(sorted((arguments or {}).items()))
            wanted[(key, frozen)] = arguments
        return wanted

    async def _rebind(self, internal: str | None = None) -> None:
        """Make the upstream's bindings to the internal exchange what the downstream's are."""
        ch = self._cmd
        if ch is None:
            return
        internal = internal or f"{self.queue} {self.suffix}"
        wanted = self._wanted()
        for key, sent in list(self._bound.items()):
            if key not in wanted:
                unbind = spec.ExchangeUnbind(
                    destination=internal,
                    source=self.upstream_name,
                    routing_key=key[0],
                    arguments=sent,
                )
                await ch.call(unbind)
                del self._bound[key]
        for key, arguments in wanted.items():
            if key in self._bound:
                continue
            made = self._binding_arguments(arguments)
            if made is None:
                continue
            bind = spec.ExchangeBind(
                destination=internal, source=self.upstream_name, routing_key=key[0], arguments=made
            )
            await ch.call(bind)
            self._bound[key] = made

    def bindings_changed(self) -> None:
        """The downstream exchange's bindings changed: follow on the upstream (one rebind
        at a time; another change meanwhile is seen by the next)."""
        if self.state != "running" or self._cmd is None:
            return
        if self._rebinding is not None and not self._rebinding.done():
            self._rebinding.add_done_callback(lambda _t: self.bindings_changed())
            return
        self._rebinding = asyncio.ensure_future(self._rebind_logged())

    async def _rebind_logged(self) -> None:
        try:
            await self._rebind()
        except (LinkClosed, OSError, TimeoutError) as exc:
            self._end(exc)

    # -- messages --------------------------------------------------------------------------

    def _target(
        self, exchange: str, routing_key: str, redelivered: bool, header: ContentHeader
    ) -> tuple[str, str, ContentHeader] | None:
        props = BasicProperties.decode(header.raw)
        cluster = self.federation.cluster_name()
        if not should_forward(props.headers, self.upstream.max_hops, cluster, self.vhost):
            return None
        return self.target.name, routing_key, self._received_from(redelivered, header)

    async def remove(self) -> None:
        await self.stop()
        if self.upstream.resource_cleanup_mode == "never":
            return
        await self._cleanup(
            [spec.QueueDelete(queue=self.queue)]
            + [spec.ExchangeDelete(exchange=f"{self.queue} {s}") for s in "AB"]
        )

    async def _cleanup(self, methods: Iterable[Any]) -> None:
        try:
            client = await self.connect_any(self.upstream.uris)
        except (LinkClosed, OSError, TimeoutError):
            return  # (the upstream's `expires` removes them)
        try:
            for method in methods:
                await self._disposable(client, method)
        except (LinkClosed, OSError, TimeoutError):
            pass
        finally:
            await self._close_clients()


class QueueLink(FederationLink):
    """One federated queue's link to one upstream (module doc): it consumes upstream only
    while the downstream queue has consumers and nothing ready for them."""

    object_kind = "queue"

    def __init__(self, federation: Federation, vhost: str, target: Any, upstream: Upstream):
        super().__init__(federation, vhost, target, upstream)
        self.upstream_name = upstream.queue or target.name
        self._consumer_arguments = {"x-priority": -1}  # the upstream's own consumers first
        self._watch: asyncio.Task[None] | None = None

    async def _prepare(self) -> tuple[AmqpClient, ClientChannel, AmqpClient, str, int | None]:
        src, dest = await self._ends()
        await ensure_queue(src, self.upstream_name, dict(self.target.arguments or {}))
        ch = await src.channel()
        return src, ch, dest, self.upstream_name, None

    async def _consume(self, channel: ClientChannel, queue: str) -> None:
        self._watch = asyncio.ensure_future(self._follow_demand(channel, queue))
        self._watch.add_done_callback(self._watch_over)

    def _watch_over(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._end(task.exception())  # type: ignore[arg-type]  # (checked: not None)

    def _demand(self) -> bool:
        q = self.target
        return q.consumer_count > 0 and q.message_count() == 0

    async def _follow_demand(self, channel: ClientChannel, queue: str) -> None:
        tag = self.upstream.consumer_tag or "federation-link-" + self.upstream.name
        consuming = False
        while True:
            want = self._demand()
            if want and not consuming:
                await channel.call(
                    spec.BasicConsume(
                        queue=queue,
                        consumer_tag=tag,
                        no_ack=self.ack_mode == "no-ack",
                        arguments=self._consumer_arguments,
                    )
                )
                consuming = True
            elif not want and consuming:
                await channel.call(spec.BasicCancel(consumer_tag=tag))
                consuming = False
            await asyncio.sleep(DEMAND_EVERY)

    async def stop(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.cancel()
        await super().stop()

    def _target(
        self, exchange: str, routing_key: str, redelivered: bool, header: ContentHeader
    ) -> tuple[str, str, ContentHeader]:
        return "", self.target.name, self._received_from(redelivered, header)


# -- the parameters and the links they make --------------------------------------------


class _FederationComponent:
    """A component of federation's runtime parameters (`federation-upstream`,
    `federation-upstream-set`): its checked values kept in one of the Federation's tables,
    and each change looked at at once."""

    def __init__(
        self,
        name: str,
        check: Callable[[str, Any], Any],
        table: dict[tuple[str, str], Any],
        federation: Federation,
    ) -> None:
        self.name, self._check, self._table, self.federation = name, check, table, federation

    def check(self, vhost: str, name: str, value: Any, user: str) -> Any:
        return self._check(name, value)

    def set(self, vhost: str, name: str, checked: Any) -> None:
        self._table[(vhost, name)] = checked
        self.federation.changed()

    def clear(self, vhost: str, name: str) -> None:
        self._table.pop((vhost, name), None)
        self.federation.changed()


LinkKey = tuple[str, str, str, str]  # (vhost, "exchange" | "queue", name, upstream)


class Federation:
    """A broker's federation: its upstreams, upstream sets and links (module doc)."""

    def __init__(
        self,
        *,
        node: str,
        cluster_name: Callable[[], str],
        vhosts: Callable[[], dict[str, Any]],
        serves: Callable[[str], bool],
        connect: Connect,
    ) -> None:
        self.node = node
        self.cluster_name = cluster_name
        self.vhosts = vhosts
        self.serves = serves
        self.connect = connect
        self.upstreams: dict[tuple[str, str], tuple[tuple[AmqpUri, ...], dict[str, Any]]] = {}
        self.sets: dict[tuple[str, str], list[tuple[str, dict[str, Any]]]] = {}
        self.links: dict[LinkKey, FederationLink] = {}
        self.active = False
        #: Messages moved by links since removed (Prometheus counters go on counting).
        self.moved_before = 0
        self._soon: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._removing: set[asyncio.Task[Any]] = set()

    def components(self) -> list[Any]:
        return [
            _FederationComponent("federation-upstream", check_upstream, self.upstreams, self),
            _FederationComponent("federation-upstream-set", check_upstream_set, self.sets, self),
        ]

    # -- when to look again --------------------------------------------------------------

    def activate(self) -> None:
        self.active = True
        self.changed()

    def changed(self) -> None:
        """Something links depend on changed (a parameter, a policy, who serves a vhost):
        look again on the next loop turn."""
        if not self.active or self._soon is not None:
            return
        self._soon = asyncio.get_running_loop().call_soon(self._look)

    def _look(self) -> None:
        self._soon = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.reconcile()
        if self.active and self.upstreams:  # declares and deletes are seen by looking
            self._timer = asyncio.get_running_loop().call_later(RECONCILE_EVERY, self._look)

    # -- which links there should be -------------------------------------------------------

    def upstreams_of(self, vhost: str, definition: dict[str, Any]) -> list[Upstream]:
        """The upstreams a policy definition names, with their settings (a set's override
        the upstream's)."""
        found: list[Upstream] = []
        name = definition.get(UPSTREAM_KEY)
        if isinstance(name, str):
            members: list[tuple[str, dict[str, Any]]] = [(name, {})]
        else:
            upset = definition.get(UPSET_KEY)
            if upset == "all":
                members = [(n, {}) for (v, n) in sorted(self.upstreams) if v == vhost]
            elif isinstance(upset, str):
                members = self.sets.get((vhost, upset), [])
            else:
                return found
        for member, overrides in members:
            upstream = self.upstreams.get((vhost, member))
            if upstream is not None:
                uris, settings = upstream
                found.append(Upstream.read(member, uris, {**settings, **overrides}))
        return found

    def wanted(self) -> dict[LinkKey, tuple[Any, Upstream]]:
        wanted: dict[LinkKey, tuple[Any, Upstream]] = {}
        if not self.upstreams:
            return wanted
        for vhost_name, vhost in self.vhosts().items():
            if not self.serves(vhost_name) or not any(v == vhost_name for v, _ in self.upstreams):
                continue
            for kind, objects in (("exchange", vhost.exchanges), ("queue", vhost.queues)):
                for obj in list(objects.values()):
                    policy = obj.policy
                    if policy is None or not obj.name or _internal(kind, obj):
                        continue
                    definition = policy.definition
                    if UPSET_KEY not in definition and UPSTREAM_KEY not in definition:
                        continue
                    if kind == "queue" and obj.queue_type == "stream":
                        continue  # (RabbitMQ federates classic and quorum queues)
                    for upstream in self.upstreams_of(vhost_name, definition):
                        wanted[(vhost_name, kind, obj.name, upstream.name)] = (obj, upstream)
        return wanted

    def reconcile(self) -> None:
        wanted = self.wanted() if self.active else {}
        for key, link in list(self.links.items()):
            want = wanted.get(key)
            if want is None or want[0] is not link.target or want[1] != link.upstream:
                del self.links[key]
                self.moved_before += link.moved
                self._background(link.remove())
        for key, (obj, upstream) in wanted.items():
            if key in self.links:
                continue
            link_class = ExchangeLink if key[1] == "exchange" else QueueLink
            link = self.links[key] = link_class(self, key[0], obj, upstream)
            link.start()

    def _background(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._removing.add(task)
        task.add_done_callback(self._removing.discard)

    def bindings_changed(self, vhost: str, exchange: str) -> None:
        for (v, kind, name, _), link in self.links.items():
            if v == vhost and kind == "exchange" and name == exchange:
                link.bindings_changed()  # type: ignore[attr-defined]  # (an ExchangeLink)

    async def stop_all(self) -> None:
        """The broker stops: every link ends, leaving what it made upstream."""
        self.active = False
        for handle in (self._soon, self._timer):
            if handle is not None:
                handle.cancel()
        self._soon = self._timer = None
        links, self.links = list(self.links.values()), {}
        for link in links:
            self.moved_before += link.moved
        await asyncio.gather(*(link.stop() for link in links), return_exceptions=True)
        # removed links still deleting what they made upstream: given STOP_GRACE_SECONDS,
        # then stopped where they are (an upstream that does not answer would otherwise
        # hold the broker's stop for the links' call timeout, or for good)
        if self._removing:
            await asyncio.wait(set(self._removing), timeout=STOP_GRACE_SECONDS)
        await asyncio.gather(
            *(cancel_and_wait(task, Exception) for task in list(self._removing)),
            return_exceptions=True,
        )

    # -- what the API shows ----------------------------------------------------------------

    def rows(self, vhost: str | None = None, down: bool = False) -> list[dict[str, Any]]:
        """The links of this node, RabbitMQ's rows; `down`: only those not running or
        starting (/state/down)."""
        rows = [
            link.row()
            for key, link in sorted(self.links.items())
            if vhost is None or key[0] == vhost
        ]
        return [r for r in rows if not down or r["status"] not in ("running", "starting")]

    async def restart(self, vhost: str, link_id_: str) -> bool:
        for (v, _, _, _), link in self.links.items():
            if v == vhost and link.id == link_id_:
                await link.restart()
                return True
        return False

    def moved(self) -> int:
        return self.moved_before + sum(link.moved for link in self.links.values())

    def reconnects(self) -> int:
        return sum(link.reconnects for link in self.links.values())


__all__ = ["ExchangeLink", "Federation", "QueueLink", "link_id", "should_forward"]
