"""Operator metadata in etcd, its one home (invariant 6), applied by every node.

What operators manage -- users, vhosts (their metadata; placement is the coordinator's),
permissions, topic permissions, vhost and user limits, policies, operator policies and
global parameters -- lives under `/{name}/meta/` as JSON, one key per item:

    users/{user}                              {"password_hash", "tags", "loopback_only"}
    vhosts/{vhost}                            {"description", "tags", "default_queue_type"}
    permissions/{vhost}/{user}                {"configure", "write", "read"}
    topic_permissions/{vhost}/{user}/{exch}   {"write", "read"}
    limits/{vhost|user}/{owner}/{limit}       an integer
    policies/{vhost}/{name}                   the policy's row (GET /api/policies)
    operator_policies/{vhost}/{name}          the same
    global_parameters/{name}                  any JSON (cluster_name)
    parameters/{vhost}/{component}/{name}     a runtime parameter's value (shovel, ...)
    seeded                                    {"node"}: who copied its local users in

with each segment percent-encoded. `Metadata` is that key scheme over a `PrefixCache` (a
watch from a known revision: after a reconnect it resumes, after a compaction it reloads).

`OperatorMetadata` makes it the broker's source of truth on a cluster node:

* writes (the management API, hence `roarmq ctl`, and definitions imports) go to etcd,
  one txn per change (an import: a few, 120 operations each), and are answered once etcd
  has taken them and every live node has applied them (APPLY_WAIT at most), as RabbitMQ
  answers a change once every node has it: a permission changed through one node holds
  on the next check of a connection open on another. Each node says what it applied
  under `/{name}/meta_applied/{node}` (the revision, on its lease: a dead node's goes);
  when etcd cannot be reached they raise `MetadataUnavailable` (the API's 503) and change
  nothing;
* every node applies what its cache holds through the broker's own methods, the ones a
  single node's API calls (`Broker.put_user`, `set_permission`, `set_policy`,
  `set_limit`...), all of one watch batch in one SQLite transaction (`Broker.changing`):
  `apply()` compares the cache with the node's users, permissions, limits and policies and
  makes the difference. The node's SQLite is thereby its cached copy: a node restarted
  while etcd is away serves with what it last applied;
* the first node of a new cluster copies its local users, permissions, limits, policies
  and vhost metadata in (the `seeded` key, created by a txn only if absent: put-if-absent);
  every other node then takes etcd's copy, its own SQLite's users included.

Policies of a vhost this node does not hold yet are applied when it gets the vhost
(`poke()`, from `ClusterNode.vhost_added`). Nothing here runs per message.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from ..core.definitions_json import limit_value, tags_of
from ..core.definitions_json import vhost_metadata as metadata_of
from ..errors import MetadataUnavailable
from .cache import PrefixCache
from .etcd import EtcdClient, EtcdError, compare, delete_op, put_op

if TYPE_CHECKING:
    from ..server import Broker
    from .coordination import Coordinator

log = logging.getLogger("roarmq.cluster")

KINDS = (
    "users",
    "vhosts",
    "permissions",
    "topic_permissions",
    "limits",
    "policies",
    "operator_policies",
    "global_parameters",
    "parameters",
)

#: Operations per etcd txn (etcd refuses more than --max-txn-ops, 128 by default).
TXN_OPS = 120
#: Seconds a write waits for this node to apply it (etcd has it already: it succeeds).
APPLY_WAIT = 5.0


class Metadata:
    def __init__(self, client: EtcdClient, name: str = "roarmq") -> None:
        self.client = client
        self.prefix = f"/{name}/meta/"
        self.cache = PrefixCache(client, self.prefix)

    def key(self, kind: str, *path: str) -> str:
        if kind not in KINDS:
            raise ValueError(f"unknown metadata kind {kind!r} (known: {', '.join(KINDS)})")
        return self.prefix + "/".join([kind, *(quote(p, safe="") for p in path)])

    def under(self, kind: str, *path: str) -> str:
        """The prefix of every key below kind/path (its segments then a slash)."""
        return self.key(kind, *path) + "/"

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
        out = {}
        for k, kv in self.cache.under(head).items():
            try:
                out[tuple(unquote(p) for p in k[len(head) :].split("/"))] = json.loads(kv.value)
            except ValueError:
                log.warning("etcd key %s: not JSON; ignored", k)
        return out

    @property
    def revision(self) -> int:
        return self.cache.revision


def _put(meta: Metadata, kind: str, *path: str, value: Any) -> dict:
    return put_op(meta.key(kind, *path), json.dumps(value, sort_keys=True))


class OperatorMetadata:
    """The broker's users, permissions, limits, policies and vhost metadata, kept in etcd.

    The write methods have the names and answers of the Broker's own (the management API
    calls one or the other: `management.context.change`)."""

    def __init__(self, broker: Broker, client: EtcdClient, name: str, node: str) -> None:
        self.broker = broker
        self.node = node
        self.meta = Metadata(client, name)
        self.meta.cache.on_change.append(self._changed)
        self.started = False  # applying: from the first load on
        self.running = False
        self.applied = 0  # the cache revision the last apply() made this node reflect
        self._retry: asyncio.TimerHandle | None = None
        #: Every node's word of what it applied (`_say_applied`); the live nodes and this
        #: node's lease come from the coordinator (`use`), None outside a cluster node.
        self.acks = PrefixCache(client, f"/{name}/meta_applied/")
        self.coordinator: Coordinator | None = None
        self._said: tuple[int, int] = (0, 0)  # (lease, revision) last written
        self._saying = False

    @property
    def client(self) -> EtcdClient:
        return self.meta.client

    # -- life ------------------------------------------------------------------------------

    def use(self, coordinator: Coordinator) -> None:
        """The coordinator whose live nodes a write waits for, and whose lease this node's
        word of what it applied is written on."""
        self.coordinator = coordinator

    async def start(self) -> None:
        """Seed etcd if nobody has, load it, apply it, watch it (idempotent)."""
        if self.running:
            return
        await self._seed()
        self.started = True
        try:
            await self.acks.start()
            await self.meta.start()  # its load applies (on_change None), then each event
        except BaseException:
            self.started = False  # ClusterNode's join tries again
            raise
        self.running = True

    async def stop(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
        await self.meta.stop()
        await self.acks.stop()

    def ack_key(self, node: str) -> str:
        return self.acks.prefix + quote(node, safe="")

    def _say_applied(self) -> None:
        """Write (in a task) the revision this node has applied, on its lease, unless it
        has said so already on this lease."""
        if self.coordinator is None or self._saying:
            return
        if (self.coordinator.lease, self.applied) == self._said:
            return
        self._saying = True
        asyncio.get_running_loop().create_task(self._write_applied())

    async def _write_applied(self) -> None:
        try:
            while self.coordinator is not None:
                said = (self.coordinator.lease, self.applied)
                if not said[0] or said == self._said:
                    return
                await self.client.put(self.ack_key(self.node), json.dumps(said[1]), lease=said[0])
                self._said = said
        except EtcdError as exc:  # the next apply says it again
            log.warning("operator metadata: cannot say what this node applied: %s", exc)
        finally:
            self._saying = False

    async def _applied_everywhere(self, revision: int, what: str) -> None:
        """Wait (APPLY_WAIT at most) until every live node says it applied `revision`."""
        coordinator = self.coordinator
        if coordinator is None:
            return

        def behind() -> list[str]:
            late = []
            for node in coordinator.members():
                kv = self.acks.get(self.ack_key(node))
                if kv is None or json.loads(kv.value) < revision:
                    late.append(node)
            return late

        if not await self.acks.wait_for(lambda: not behind(), APPLY_WAIT):
            log.warning(
                "operator metadata: %s is in etcd but not applied yet on %s",
                what,
                ", ".join(behind()) or "a node that left",
            )

    async def barrier(self) -> None:
        """Before a write is checked: this node's copy as new as etcd's now (so a user
        created on another node a moment ago is known here). MetadataUnavailable if etcd
        cannot be reached, or this node has not loaded it yet (it has not joined)."""
        if not self.running:
            raise MetadataUnavailable(
                f"node '{self.node}' has not joined the cluster yet: it cannot change "
                "users, permissions or policies; nothing was changed"
            )
        try:
            await self.meta.cache.synced(APPLY_WAIT)
        except EtcdError as exc:
            what = "check a change against the cluster's metadata"
            raise MetadataUnavailable(_unavailable(what, exc)) from None

    # -- seeding -----------------------------------------------------------------------------

    def _local_ops(self) -> list[dict]:
        """This node's own users, permissions, limits, policies and vhost metadata."""
        b, m = self.broker, self.meta
        store = b.persistence.definitions
        ops = [
            _put(
                m,
                "users",
                u.name,
                value={
                    "password_hash": u.password_hash,
                    "tags": list(u.tags),
                    "loopback_only": u.loopback_only,
                },
            )
            for u in b.auth.users.values()
        ]
        for p in store.permissions():
            value = {"configure": p.configure, "write": p.write, "read": p.read}
            ops.append(_put(m, "permissions", p.vhost, p.user, value=value))
        for t in store.topic_permissions():
            value = {"write": t.write, "read": t.read}
            ops.append(_put(m, "topic_permissions", t.vhost, t.user, t.exchange, value=value))
        for (kind, owner), values in b.limits.items():
            for name, limit in values.items():
                ops.append(_put(m, "limits", kind, owner, name, value=limit))
        for vhost in b.vhosts.values():
            for policy in vhost.policies.values():
                ops.append(_put(m, "policies", vhost.name, policy.name, value=policy.row()))
            for policy in vhost.operator_policies.values():
                row = policy.row()
                ops.append(_put(m, "operator_policies", vhost.name, policy.name, value=row))
        for (vhost_name, component, name), value in b.parameters.values.items():
            ops.append(_put(m, "parameters", vhost_name, component, name, value=value))
        if "cluster_name" in store.settings():
            ops.append(_put(m, "global_parameters", "cluster_name", value=b.cluster_name))
        # The vhosts first: the seeding txn (with the `seeded` marker) carries them, so a
        # node that finds the marker knows every seeded vhost (one it lacks was deleted).
        vhosts = [_put(m, "vhosts", v.name, value=v.metadata) for v in b.vhosts.values()]
        return vhosts + ops

    async def _seed(self) -> None:
        """The first node of a new cluster copies its own in: one txn that creates the
        `seeded` key only if it is absent, with the first TXN_OPS items; the rest after."""
        marker = self.meta.prefix + "seeded"
        ops = self._local_ops()
        first, rest = ops[: TXN_OPS - 1], ops[TXN_OPS - 1 :]
        result = await self.client.txn(
            [compare(marker, "CREATE", 0)],
            [put_op(marker, json.dumps({"node": self.node})), *first],
        )
        if not result.succeeded:
            return  # seeded already (by us before, or another node): etcd's copy wins
        for i in range(0, len(rest), TXN_OPS):
            await self.client.txn([], rest[i : i + TXN_OPS])
        log.info("operator metadata: etcd was empty; copied this node's %d items in", len(ops))

    # -- applying what etcd holds ----------------------------------------------------------

    def _changed(self, _events: object) -> None:
        if self.started:
            self.apply()

    def poke(self) -> None:
        """Apply again soon (a vhost arrived here: its policies and metadata)."""
        if self.started:
            asyncio.get_running_loop().call_soon(self.apply)

    def apply(self) -> None:
        """Make this node's users, permissions, limits, policies, vhost metadata and
        cluster name what the cache says, through the broker's own methods, in one
        transaction. A failure (the disk) is retried in a second."""
        try:
            changes = self._diff()
            if changes:
                with self.broker.changing("apply the operator metadata from etcd"):
                    for change in changes:
                        change()
                log.info("operator metadata: applied %d changes from etcd", len(changes))
        except Exception:
            log.exception("operator metadata: cannot apply etcd's copy; retrying")
            if self._retry is None or self._retry.cancelled():
                loop = asyncio.get_running_loop()
                self._retry = loop.call_later(1.0, self._apply_again)
            return
        self.applied = self.meta.revision
        self._say_applied()

    def _apply_again(self) -> None:
        self._retry = None
        self.apply()

    def _diff(self) -> list[Any]:
        """The broker calls that make this node reflect the cache, puts before deletes."""
        b, m = self.broker, self.meta
        store = b.persistence.definitions
        puts: list[Any] = []
        deletes: list[Any] = []

        users = {path[0]: v for path, v in m.items("users").items() if len(path) == 1}
        for name, v in users.items():
            have = b.auth.users.get(name)
            want = (
                v.get("password_hash", ""),
                tuple(v.get("tags", ())),
                bool(v.get("loopback_only")),
            )
            if have is None or (have.password_hash, have.tags, have.loopback_only) != want:
                puts.append(lambda n=name, w=want: b.put_user(n, *w))
        for name in set(b.auth.users) - set(users):
            deletes.append(lambda n=name: b.delete_user(n))

        perms = {
            (path[1], path[0]): (v.get("configure", ""), v.get("write", ""), v.get("read", ""))
            for path, v in m.items("permissions").items()
            if len(path) == 2
        }
        have_perms = {
            (p.user, p.vhost): (p.configure, p.write, p.read) for p in store.permissions()
        }
        for (user, vhost), v in perms.items():
            if have_perms.get((user, vhost)) != v:
                puts.append(lambda u=user, h=vhost, v=v: b.set_permission(u, h, *v))
        for user, vhost in set(have_perms) - set(perms):
            deletes.append(lambda u=user, h=vhost: b.clear_permission(u, h))

        topics = {
            (path[1], path[0], path[2]): (v.get("write", ""), v.get("read", ""))
            for path, v in m.items("topic_permissions").items()
            if len(path) == 3
        }
        have_topics = {
            (t.user, t.vhost, t.exchange): (t.write, t.read) for t in store.topic_permissions()
        }
        for (user, vhost, exchange), v in topics.items():
            if have_topics.get((user, vhost, exchange)) != v:
                puts.append(
                    lambda u=user, h=vhost, x=exchange, v=v: b.set_topic_permission(u, h, x, *v)
                )
        for user, vhost, exchange in set(have_topics) - set(topics):
            deletes.append(lambda u=user, h=vhost, x=exchange: b.clear_topic_permissions(u, h, x))

        limits = {
            path: v
            for path, v in m.items("limits").items()
            if len(path) == 3 and type(v) is int and path[0] in ("vhost", "user")
        }
        have_limits = {
            (kind, owner, name): value
            for (kind, owner), values in b.limits.items()
            for name, value in values.items()
        }
        for (kind, owner, name), value in limits.items():
            if have_limits.get((kind, owner, name)) != value:
                puts.append(lambda k=kind, o=owner, n=name, v=value: b.set_limit(k, o, n, v))
        for kind, owner, name in set(have_limits) - set(limits):
            deletes.append(lambda k=kind, o=owner, n=name: b.clear_limit(k, o, n))

        for kind, operator in (("policies", False), ("operator_policies", True)):
            want_policies = {
                (path[0], path[1]): v
                for path, v in m.items(kind).items()
                if len(path) == 2 and path[0] in b.vhosts  # the others: when the vhost comes
            }
            have_policies = {
                (vhost.name, name): p.row()
                for vhost in b.vhosts.values()
                for name, p in (vhost.operator_policies if operator else vhost.policies).items()
            }
            for (vhost, name), row in want_policies.items():
                if have_policies.get((vhost, name)) != row:
                    puts.append(
                        lambda h=vhost, n=name, r=row, o=operator: self._set_policy(h, n, r, o)
                    )
            for vhost, name in set(have_policies) - set(want_policies):
                deletes.append(lambda h=vhost, n=name, o=operator: b.clear_policy(h, n, o))

        want_parameters = {
            path: v
            for path, v in m.items("parameters").items()
            if len(path) == 3 and path[0] in b.vhosts  # the others: when the vhost comes
        }
        for (vhost, component, name), value in want_parameters.items():
            if b.parameters.values.get((vhost, component, name)) != value:
                puts.append(
                    lambda h=vhost, c=component, n=name, v=value: self._set_parameter(h, c, n, v)
                )
        for vhost, component, name in set(b.parameters.values) - set(want_parameters):
            deletes.append(lambda h=vhost, c=component, n=name: b.clear_parameter(h, c, n))

        for path, v in m.items("vhosts").items():
            here = b.vhosts.get(path[0]) if len(path) == 1 else None
            if (
                here is not None
                and isinstance(v, dict)
                and any(here.metadata.get(k) != x for k, x in v.items())
            ):
                puts.append(lambda n=path[0], v=v: b.add_vhost(n, v))

        name = m.get("global_parameters", "cluster_name")
        if isinstance(name, str) and name and name != b.cluster_name:
            puts.append(lambda n=name: b.set_cluster_name(n))
        return puts + deletes

    def _set_parameter(self, vhost: str, component: str, name: str, value: Any) -> None:
        """etcd's value, checked when it was written there: one this node cannot take (a
        component it does not know) is logged, never retried in a loop."""
        from ..core.parameters import ParameterError

        try:
            self.broker.set_parameter(vhost, component, name, value)
        except ParameterError as exc:
            log.error(
                "operator metadata: cannot apply %s parameter %r of vhost %r: %s",
                component,
                name,
                vhost,
                exc,
            )

    def _set_policy(self, vhost: str, name: str, row: dict[str, Any], operator: bool) -> None:
        from ..core.policy import PolicyError

        try:
            self.broker.set_policy(vhost, name, row, operator)
        except PolicyError as exc:  # written by a newer node, or by hand: not ours to take
            log.error("operator metadata: cannot apply policy %r in %r: %s", name, vhost, exc)

    # -- writes (the management API) -----------------------------------------------------

    async def _write(self, ops: list[dict], what: str) -> None:
        """ops in etcd (one txn, or several of TXN_OPS), then applied here (APPLY_WAIT at
        most: etcd has them, so the write has succeeded either way)."""
        if not ops:
            return
        revision = 0  # of the last txn that changed something (a delete may not)
        try:
            for i in range(0, len(ops), TXN_OPS):
                result = await self.client.txn([], ops[i : i + TXN_OPS])
                if any(_changed(r) for r in result.responses):
                    revision = result.revision
        except EtcdError as exc:
            raise MetadataUnavailable(_unavailable(what, exc)) from None
        cache = self.meta.cache
        if not await cache.wait_for(lambda: self.applied >= revision, APPLY_WAIT):
            log.warning("operator metadata: %s is in etcd but not applied here yet", what)
            return
        await self._applied_everywhere(revision, what)

    def has_vhost(self, name: str) -> bool:
        """Known to the cluster: here, in etcd's metadata, or placed."""
        return (
            name in self.broker.vhosts
            or self.meta.get("vhosts", name) is not None
            or name in self.broker.cluster.placements()
        )

    def knows_vhost(self, name: str) -> bool:
        """etcd's metadata has the vhost (seeded with every vhost, and written before any
        vhost is made: one it lacks was deleted)."""
        return self.meta.get("vhosts", name) is not None

    async def put_user(
        self, name: str, password_hash: str, tags: tuple[str, ...], loopback_only: bool = False
    ) -> None:
        value = {"password_hash": password_hash, "tags": list(tags), "loopback_only": loopback_only}
        await self._write([_put(self.meta, "users", name, value=value)], f"store user '{name}'")

    async def delete_user(self, name: str) -> bool:
        """The user, its permissions, topic permissions and limits, in one txn."""
        m = self.meta
        existed = m.get("users", name) is not None or name in self.broker.auth.users
        ops = [delete_op(m.key("users", name)), delete_op(m.under("limits", "user", name), True)]
        ops += [
            delete_op(m.key("permissions", *path))
            for path in m.items("permissions")
            if path[1:] == (name,)
        ]
        ops += [
            delete_op(m.key("topic_permissions", *path))
            for path in m.items("topic_permissions")
            if len(path) == 3 and path[1] == name
        ]
        await self._write(ops, f"delete user '{name}'")
        return existed

    async def set_permission(self, user: str, vhost: str, configure: str, write: str, read: str):
        value = {"configure": configure, "write": write, "read": read}
        what = f"store permissions of user '{user}' in vhost '{vhost}'"
        await self._write([_put(self.meta, "permissions", vhost, user, value=value)], what)

    async def clear_permission(self, user: str, vhost: str) -> None:
        what = f"delete permissions of user '{user}' in vhost '{vhost}'"
        await self._write([delete_op(self.meta.key("permissions", vhost, user))], what)

    async def set_topic_permission(
        self, user: str, vhost: str, exchange: str, write: str, read: str
    ) -> None:
        value = {"write": write, "read": read}
        op = _put(self.meta, "topic_permissions", vhost, user, exchange, value=value)
        await self._write([op], f"store topic permissions of user '{user}' in vhost '{vhost}'")

    async def clear_topic_permissions(
        self, user: str, vhost: str, exchange: str | None = None
    ) -> int:
        m = self.meta
        held = [
            path
            for path in m.items("topic_permissions")
            if path[:2] == (vhost, user) and (exchange is None or path[2:] == (exchange,))
        ]
        if exchange is None:
            op = delete_op(m.under("topic_permissions", vhost, user), True)
        else:
            op = delete_op(m.key("topic_permissions", vhost, user, exchange))
        await self._write([op], f"delete topic permissions of user '{user}' in vhost '{vhost}'")
        return len(held)

    async def set_policy(
        self, vhost: str, name: str, body: dict[str, Any], operator: bool = False
    ) -> bool:
        """Validated here (PolicyError, as the Broker's); True if new."""
        from ..core.policy import make_policy

        policy = make_policy(vhost, name, body, operator)
        if not self.has_vhost(vhost):
            raise KeyError(vhost)
        kind = "operator_policies" if operator else "policies"
        new = self.meta.get(kind, vhost, name) is None
        op = _put(self.meta, kind, vhost, name, value=policy.row())
        await self._write([op], f"store policy '{name}' in vhost '{vhost}'")
        return new

    async def clear_policy(self, vhost: str, name: str, operator: bool = False) -> bool:
        kind = "operator_policies" if operator else "policies"
        host = self.broker.vhosts.get(vhost)
        table = (host.operator_policies if operator else host.policies) if host else {}
        existed = self.meta.get(kind, vhost, name) is not None or name in table
        if existed:
            op = delete_op(self.meta.key(kind, vhost, name))
            await self._write([op], f"delete policy '{name}' in vhost '{vhost}'")
        return existed

    async def set_parameter(
        self, vhost: str, component: str, name: str, value: Any, user: str = "none"
    ) -> bool:
        """Checked here (ParameterError, as the Broker's), then kept in etcd; True if new.
        Every node applies it; a shovel runs where its vhost is served."""
        if not self.has_vhost(vhost):
            raise KeyError(vhost)
        self.broker.parameters.check(vhost, component, name, value, user)
        new = self.meta.get("parameters", vhost, component, name) is None
        op = _put(self.meta, "parameters", vhost, component, name, value=value)
        await self._write([op], f"store {component} parameter '{name}' in vhost '{vhost}'")
        return new

    async def clear_parameter(self, vhost: str, component: str, name: str) -> bool:
        existed = (
            self.meta.get("parameters", vhost, component, name) is not None
            or (vhost, component, name) in self.broker.parameters.values
        )
        if existed:
            op = delete_op(self.meta.key("parameters", vhost, component, name))
            await self._write([op], f"delete {component} parameter '{name}' in vhost '{vhost}'")
        return existed

    async def set_limit(self, kind: str, owner: str, name: str, value: int) -> None:
        op = _put(self.meta, "limits", kind, owner, name, value=value)
        await self._write([op], f"store {kind} limit '{name}' of '{owner}'")

    async def clear_limit(self, kind: str, owner: str, name: str) -> bool:
        existed = self.meta.get("limits", kind, owner, name) is not None
        op = delete_op(self.meta.key("limits", kind, owner, name))
        await self._write([op], f"delete {kind} limit '{name}' of '{owner}'")
        return existed

    async def set_cluster_name(self, name: str) -> None:
        op = _put(self.meta, "global_parameters", "cluster_name", value=name)
        await self._write([op], "store the cluster name")

    async def add_vhost(self, name: str, metadata: dict[str, Any] | None = None) -> bool:
        """Its metadata in etcd, then the vhost here (its placement: `ClusterNode.placed`).
        True if the cluster did not know it."""
        b = self.broker
        created = not self.has_vhost(name)
        known = self.meta.get("vhosts", name)
        if known is None or metadata is not None:
            local = b.vhosts.get(name)
            base = known if known is not None else (local.metadata if local is not None else {})
            value = {**base, **(metadata or {})}
            await self._write(
                [_put(self.meta, "vhosts", name, value=value)], f"store vhost '{name}'"
            )
        b.add_vhost(name, metadata)
        return created

    async def delete_vhost(self, name: str) -> bool:
        """Its metadata, permissions, topic permissions, policies, limits and placement go
        from etcd in one txn; the vhost itself from this node (as the Broker's), and from
        every other node when it sees the placement go (`ClusterNode._vhost_gone`)."""
        m = self.meta
        coordinator = getattr(self.broker.cluster, "coordinator", None)  # (this ClusterNode's)
        placement = [delete_op(coordinator.vhost_key(name, ""), True)] if coordinator else []
        ops = [delete_op(m.key("vhosts", name)), *placement] + [
            delete_op(m.under(kind, *path), True)
            for kind, path in (
                ("permissions", (name,)),
                ("topic_permissions", (name,)),
                ("policies", (name,)),
                ("operator_policies", (name,)),
                ("parameters", (name,)),
                ("limits", ("vhost", name)),
            )
        ]
        if name not in self.broker.vhosts:
            return False
        await self._write(ops, f"delete vhost '{name}'")
        self.broker.delete_vhost(name)  # unless seeing its placement go deleted it already
        return True

    async def import_definitions(self, doc: dict[str, Any]) -> None:
        """A definitions file's operator metadata: its vhosts, users, limits, permissions,
        topic permissions and policies into etcd (validated first, written in as few txns
        as fit). Its exchanges, queues and bindings are each vhost's leader's: the
        management API sends them there (`import_at_the_leaders`)."""
        from ..core.auth import hash_password
        from ..core.policy import make_policy

        m = self.meta
        ops: list[dict] = []
        vhosts: list[tuple[str, dict[str, Any] | None]] = []
        for v in doc.get("vhosts", []):
            has_meta = any(
                k in v for k in ("description", "tags", "metadata", "default_queue_type")
            )
            vhosts.append((v["name"], metadata_of(v) if has_meta else None))
        named = {name for name, _ in vhosts}

        def limits(kind: str, owner: str, values: Any) -> None:
            if not isinstance(values, dict):
                raise ValueError(f"{kind} limits of {owner!r} must be an object")
            for name, value in values.items():
                ops.append(
                    _put(m, "limits", kind, owner, name, value=limit_value(kind, name, value))
                )

        for u in doc.get("users", []):
            value = {
                "password_hash": u.get("password_hash") or hash_password(u["password"]),
                "tags": list(tags_of(u)),
                "loopback_only": False,
            }
            ops.append(_put(m, "users", u["name"], value=value))
            if u.get("limits"):
                limits("user", u["name"], u["limits"])
        for param in doc.get("parameters", []):
            if param.get("component") == "vhost-limits":
                limits("vhost", param["vhost"], param.get("value"))
                continue
            vhost = param.get("vhost", "/")
            if vhost not in named and not self.has_vhost(vhost):
                raise KeyError(vhost)
            component, name, value = param["component"], param["name"], param.get("value")
            self.broker.parameters.check(vhost, component, name, value, "none")
            ops.append(_put(m, "parameters", vhost, component, name, value=value))
        for p in doc.get("permissions", []):
            value = {k: p.get(k, ".*") for k in ("configure", "write", "read")}
            ops.append(_put(m, "permissions", p["vhost"], p["user"], value=value))
        for t in doc.get("topic_permissions", []):
            value = {k: t.get(k, ".*") for k in ("write", "read")}
            ops.append(
                _put(m, "topic_permissions", t["vhost"], t["user"], t["exchange"], value=value)
            )
        for p in doc.get("policies", []):
            vhost = p.get("vhost", "/")
            if vhost not in named and not self.has_vhost(vhost):
                raise KeyError(vhost)
            policy = make_policy(vhost, p["name"], p)
            ops.append(_put(m, "policies", vhost, p["name"], value=policy.row()))
        for name, meta in vhosts:
            await self.add_vhost(name, meta)
        await self._write(ops, "import the definitions")


def _changed(response: dict[str, Any]) -> bool:
    """A txn response that wrote: any put, a delete that deleted something."""
    if "response_put" in response:
        return True
    return int(response.get("response_delete_range", {}).get("deleted", 0) or 0) > 0


def _unavailable(what: str, exc: BaseException) -> str:
    return (
        f"cannot {what}: etcd, where the cluster keeps users, permissions and policies, "
        f"cannot be reached ({exc}); nothing was changed"
    )
