"""This broker as a node of the cluster: the `Coordinator` wired to the `Broker`.

Owned by the Broker when `[cluster]` is set (imported there, lazily, and nowhere else:
invariant 7). What it does now (docs/cluster.md, "The node in the cluster"):

* registers the node in etcd with its addresses (advertise, AMQP, management and
  replication ports) and watches membership;
* gives every vhost its placement keys (`place_vhost`: the leader is the live node leading
  the fewest vhosts, then up to `replicas` members) and follows it (campaigns while it is
  leaderless and this node is in its in-sync set); a vhost placed on this node that it does
  not have yet is created locally;
* as a vhost's leader, adds live nodes to a vhost placed before they joined, up to
  `replicas`, and then to its in-sync set once `catch_up` says they have its data;
* a connection for a vhost led elsewhere is handed to its leader at `connection.open`
  (`handoff`, handoff.py: its socket passed to a leader on this machine, else a relay over
  the leader's replication port), or refused with a
  530 (`refusal`) while nobody leads it or the leader cannot be reached; a lost leadership
  closes that vhost's connections (320); a fenced lease blocks publishers.

* keeps users, permissions, limits and policies as etcd has them (`metadata`,
  metadata.py: the API writes there, every node applies its watch);
* replicates each vhost's log (`VhostReplicas`, vhost_replicas.py): it follows the vhosts
  it is a member of, and a vhost it wins is recovered from its replicated log before it is
  served; a member added later joins the in-sync set once it has caught up (the leader's
  `on_caught_up` -> `expand_isr`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from ..config import ClusterConfig, majority
from ..errors import StartupError
from ..ops.tasks import cancel_and_wait
from .coordination import Coordinator, IsrChange, NodeNameTaken, remove_then_forget
from .etcd import EtcdClient, EtcdError, compare, put_op
from .handoff import Handoffs
from .metadata import OperatorMetadata
from .vhost_replicas import VhostReplicas

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..amqp.connection import Connection
    from ..core.queue import Queue
    from ..server import Broker

log = logging.getLogger("roarmq.cluster")

#: Seconds between attempts to join when etcd cannot be reached at start.
JOIN_RETRY = 1.0
#: Seconds before a vhost whose bookkeeping failed here (not etcd's fault) is looked at again.
VHOST_RETRY = 5.0
#: The file in the data dir naming this node's instance: a node name already live in the
#: cluster under another instance is another machine's (or data dir's), not our last life.
INSTANCE_FILE = "cluster-instance"


def _hostport(host: str, port: object) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class ClusterNode:
    """This node in a cluster: the broker's `ClusterHooks` (broker/cluster_hooks.py)."""

    name: str

    def __init__(self, broker: Broker, config: ClusterConfig) -> None:
        self.broker = broker
        self.config = config
        self.name = config.node
        self.client = EtcdClient(list(config.etcd))
        self.coordinator: Coordinator | None = None
        #: The vhosts placed when the cluster was last looked at (their going = deletion).
        self._placed_seen: set[str] = set()
        self.joined = asyncio.Event()
        #: The cluster's shared secret (etcd's `{p}/cookie`, made by the first node): every
        #: connection to a replication port (a follower's HELLO, a relayed client's
        #: HANDOFF) must carry it, as Erlang nodes show their cookie. Empty until joined.
        self.cookie = ""
        self._reconcile_task: asyncio.Task[None] | None = None
        self._dirty = False
        self._placing: dict[str, asyncio.Task[None]] = {}
        self._stopped = False
        self._moves: dict[str, str] = {}  # vhost -> why its clients are closed (move_leader)
        self.replicas = VhostReplicas(self)
        self.handoff = Handoffs(self)
        #: Users, permissions, limits, policies: etcd's, applied here (metadata.py).
        self.metadata = OperatorMetadata(broker, self.client, config.name, config.node)

    # -- life ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Join the cluster, or stop the broker with one line saying why: etcd does not
        answer within `join_timeout`, this node's name is live under another instance, or
        the replication port is taken. (Until it has joined, every connection.open is
        refused: this node does not know who leads.)"""
        if self.replicas._server is None:
            address = self.config.advertise or self._address()
            try:
                await self.replicas.start(address)
            except OSError as exc:
                raise StartupError(
                    f"[cluster] replication_port {self.config.replication_port} on {address}: "
                    f"{exc.strerror or exc}"
                ) from None
        deadline = asyncio.get_running_loop().time() + self.config.join_timeout
        while True:
            try:
                await self._join()
                return
            except NodeNameTaken as exc:
                raise StartupError(str(exc)) from None
            except (EtcdError, OSError) as exc:
                if asyncio.get_running_loop().time() > deadline:
                    raise StartupError(
                        f"[cluster] etcd {', '.join(self.config.etcd)} did not answer in "
                        f"{self.config.join_timeout} s (join_timeout): {exc}"
                    ) from None
                log.warning("cannot join the cluster yet (%s); retrying", exc)
                await asyncio.sleep(JOIN_RETRY)

    def _address(self) -> str:
        b = self.broker
        return b.bound[0] if b.bound else b.config.amqp.bind[0]

    async def _join(self) -> None:
        b, cfg = self.broker, self.config
        address = cfg.advertise or self._address()
        c = Coordinator(
            self.client,
            node=self.name,
            address=address,
            replication_port=cfg.replication_port,
            name=cfg.name,
            lease_ttl=cfg.lease_ttl,
            replicas=cfg.replicas,
        )
        await self.handoff.listen()  # the Unix socket nodes on this machine pass clients to
        c.info = {
            "amqp_port": b.port,
            "management_port": b.mgmt_port,
            "stream_port": b.stream_port,
            "instance": self._instance(),
            **self.handoff.advertised(),
        }
        c.on_lost.append(self._lost)
        c.on_won.append(self.replicas.won)
        c.copy_of = lambda vhost: self.replicas.log_of(vhost).copy_id
        c.copy_works = lambda vhost: not self.replicas.log_of(vhost).log.failed
        c.vhosts.on_change.append(lambda _events: self.replicas.members_changed())
        # The watch may show our leader key before the campaign's reply makes us leader: a
        # reconcile run on that event saw no leadership and filled no members. Run again.
        c.on_won.append(lambda _vhost, _epoch: self._poke())
        c.fencing.on_restored.append(self._release_confirms)
        c.on_fenced.append(lambda: b.set_cluster_fenced(True))
        c.fencing.on_restored.append(lambda: b.set_cluster_fenced(False))
        c.on_members.append(lambda _: self._poke())
        c.vhosts.on_change.append(lambda _: self._poke())
        try:
            self.cookie = await self._cluster_cookie()
            await c.start()
            await c.nodes.synced()
            self.metadata.use(c)
            await self.metadata.start()  # users & co. as etcd has them before any open
            for name in list(b.vhosts):
                if not self.metadata.knows_vhost(name) and not c.vhost_members(name):
                    log.info("vhost %r: deleted from the cluster while away; deleting it", name)
                    b.delete_vhost(name)
                    await self.replicas.forget(name)
                else:
                    await c.place_vhost(name)
        except BaseException:
            with contextlib.suppress(Exception):
                await c.stop()
            raise
        self.coordinator = c
        self.joined.set()
        log.info("joined the cluster as %r (lease %x)", self.name, c.lease)
        self._poke()

    def _instance(self) -> str:
        """This data dir's identity as a cluster node (made once; see INSTANCE_FILE)."""
        path = Path(self.broker.config.storage.data_dir) / INSTANCE_FILE
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            instance = secrets.token_hex(16)
            path.write_text(instance + "\n")
            return instance

    async def _cluster_cookie(self) -> str:
        """The cluster's cookie, made (put-if-absent) by the first node to ask."""
        key = f"/{self.config.name}/cookie"
        await self.client.txn([compare(key, "CREATE", 0)], [put_op(key, secrets.token_hex(32))])
        kv = await self.client.get(key)
        if kv is None:
            raise EtcdError(f"{key} vanished")
        return kv.value.decode() if isinstance(kv.value, bytes) else str(kv.value)

    def cookie_matches(self, offered: object) -> bool:
        """What a peer offered on the replication port is this cluster's cookie."""
        return bool(self.cookie) and hmac.compare_digest(str(offered or ""), self.cookie)

    async def stop(self) -> None:
        """Leave: the lease is revoked, so this node's leaderships go at once."""
        self._stopped = True
        for task in [self._reconcile_task, *self._placing.values()]:
            if task is not None:
                await cancel_and_wait(task, Exception)
        self.handoff.close()
        await self.replicas.stop()
        await self.metadata.stop()
        if self.coordinator is not None:
            self.coordinator.on_fenced.clear()  # leaving is not being fenced
            with contextlib.suppress(EtcdError):
                await self.coordinator.stop()
        self.broker.set_cluster_fenced(False)
        await self.client.close()

    # -- what the broker and the management API ask -------------------------------------

    def leader_of(self, vhost: str) -> str | None:
        """The vhost's leader as etcd names it; never this node unless it leads it (a
        node that gave its leadership up, fenced, keeps its key in its copy of etcd's
        keys until etcd answers again)."""
        c = self.coordinator
        if c is None:
            return None
        leader = c.leader(vhost)
        if leader is None or (leader[0] == self.name and vhost not in c.leading):
            return None
        return leader[0]

    def members(self, vhost: str) -> list[str]:
        return self.coordinator.vhost_members(vhost) if self.coordinator is not None else []

    def stream_leader(self, vhost: str) -> tuple[str, int] | None:
        c = self.coordinator
        if c is None or vhost in c.leading:
            return None
        leader = self.leader_of(vhost)
        info = c.members().get(leader) if leader is not None else None
        if not info or not info.get("stream_port"):
            return None
        return info["address"], int(info["stream_port"])

    def in_sync(self, vhost: str) -> list[str]:
        return self.coordinator.in_sync(vhost) if self.coordinator is not None else []

    def nodes(self) -> list[dict[str, Any]]:
        """Every node etcd knows of: the live ones (their lease holds) and the members of
        some vhost that are not (`running` false), with the vhosts each leads."""
        c = self.coordinator
        if c is None:
            return [{"name": self.name, "running": True, "leaders": []}]
        live = c.members()
        leaders: dict[str, list[str]] = {}
        known = set(live) | {self.name}
        for vhost, members in self.placements().items():
            known.update(members)
            leader = self.leader_of(vhost)
            if leader is not None:
                leaders.setdefault(leader, []).append(vhost)
        rows = []
        for name in sorted(known):
            info = live.get(name, {})
            rows.append(
                {
                    "name": name,
                    "running": name in live,
                    "leaders": sorted(leaders.get(name, [])),
                    "address": info.get("address"),
                    "amqp_port": info.get("amqp_port"),
                    "management_port": info.get("management_port"),
                    "replication_port": info.get("replication_port"),
                }
            )
        return rows

    def replica_count(self, vhost: str) -> int:
        """The copies the vhost should have (its own setting, else [cluster] replicas)."""
        c = self.coordinator
        return c.vhost_replicas(vhost) if c is not None else self.config.replicas

    def replica_status(self, vhost: str) -> list[dict[str, Any]] | None:
        """Each other member as this node sees it while leading `vhost` (None: it does
        not lead it; the leader answers, the API forwards there)."""
        leader = self.replicas.leaders.get(vhost)
        if leader is None or self.coordinator is None:
            return None
        return leader.member_status(self.coordinator.vhost_members(vhost))

    async def definitions_durable(self, vhost: str) -> str | None:
        """After a change to the definitions of `vhost`, led here: None once its in-sync
        set holds them (the management API answers then, as an AMQP declare's reply
        waits); otherwise why they may not survive a failover (it answers 503)."""
        c = self.coordinator
        store = self.replicas.stores.get(vhost)
        leader = self.replicas.leaders.get(vhost)
        epoch = c.leading.get(vhost) if c is not None else None
        if store is None or leader is None or epoch is None:
            return f"vhost '{vhost}' is not led by node '{self.name}' any more"
        offset = store.append_definitions_if_changed()
        wait = 2 * self.config.lease_ttl + self.config.replica_lag_ms / 1000
        try:
            await asyncio.wait_for(leader.wait_confirmed(offset), wait)
        except TimeoutError:
            return (
                f"the change to vhost '{vhost}' was not confirmed by its in-sync copies in "
                f"{wait:.0f} s (min_in_sync {leader.min_copies})"
            )
        if c is None or not c.may_confirm(vhost, epoch):
            return f"node '{self.name}' lost vhost '{vhost}' before the change was confirmed"
        return None

    def quorum_critical(self) -> list[str]:
        """The vhosts that could no longer confirm, or not be led at all, if this node
        stopped now: it is in their in-sync set, and the other live in-sync members are
        fewer than the vhost's `min_in_sync` (or none)."""
        c = self.coordinator
        if c is None:
            return []
        live = c.members()
        critical = []
        for vhost, members in sorted(self.placements().items()):
            in_sync = c.in_sync(vhost)
            if self.name not in in_sync:
                continue
            others = [n for n in in_sync if n != self.name and n in live]
            need = self.config.min_in_sync or majority(max(len(members), 1))
            if not others or len(others) < need:
                critical.append(vhost)
        return critical

    def placements(self) -> dict[str, list[str]]:
        """vhost -> members, from this node's cache of etcd."""
        c = self.coordinator
        if c is None:
            return {}
        cut = len(c.vhosts.prefix)
        out = {}
        for key, kv in c.vhosts.data.items():
            segment, _, leaf = key[cut:].partition("/")
            if leaf == "members":
                out[unquote(segment)] = json.loads(kv.value)
        return out

    def recovering(self, vhost: str) -> bool:
        """This node leads `vhost` but is still recovering its copy (not serving yet)."""
        c = self.coordinator
        return c is not None and vhost in c.leading and vhost not in self.replicas.serving

    def leader_silent(self, vhost: str) -> bool:
        """This node follows `vhost` and has not heard from its leader for two of the
        leader's heartbeats (it sends one after `replica_lag_ms` / 4 of quiet): frozen, cut
        off or dead. A client is not handed to it (it would wait on a socket nobody reads)
        but held until the next leader serves or the leader speaks again."""
        follower = self.replicas.followers.get(vhost)
        if follower is None:
            return False
        return time.monotonic() - follower.heard_at > self.config.replica_lag_ms / 2000

    def vhost_down(self, vhost: str, user: str) -> str | None:
        """RabbitMQ's words (541 INTERNAL_ERROR) for a connection.open of a vhost that etcd
        names this node the leader of while this node does not lead it: it gave the
        leadership up (it could not renew its lease) and its key is not gone yet. Handing
        the client on would come back here; the client should try again elsewhere."""
        c = self.coordinator
        if c is None or vhost in c.leading:
            return None
        if vhost not in c.given_up and c.fencing.remaining() > 0:
            return None  # (a campaign just won shows in the cache before its reply)
        leader = c.leader(vhost)
        if leader is None or leader[0] != self.name:
            return None
        return f"access to vhost '{vhost}' refused for user '{user}': vhost '{vhost}' is down"

    def refusal(self, vhost: str) -> str | None:
        """Why a connection.open for this vhost is refused here (530 NOT_ALLOWED), or None
        when this node leads it (or the cluster has never heard of it: the caller's own
        'not found' answers). `Connection._open` hands the client to the leader instead
        when it can (handoff.py); this text is its 530 when it cannot."""
        c = self.coordinator
        if c is not None and vhost in c.leading:
            if vhost in self.replicas.serving:
                return None
            return f"vhost '{vhost}' is being recovered on node '{self.name}'; try again"
        leader = c.leader(vhost) if c is not None else None
        if leader is not None and leader[0] == self.name:
            # Our key, but we do not lead (given back, and the watch has not shown it
            # gone yet): never send a client back here.
            return f"vhost '{vhost}' has no leader at the moment (an election is under way)"
        if leader is not None:
            node = leader[0]
            info = c.members().get(node) if c is not None else None
            where = (
                _hostport(info["address"], info.get("amqp_port"))
                if info
                else "an address not known here (the node is not running)"
            )
            return f"vhost '{vhost}' is led by node '{node}' at {where}"
        if c is None:
            if vhost in self.broker.vhosts:
                return f"vhost '{vhost}': node '{self.name}' has not joined the cluster yet"
            return None
        if vhost in self.broker.vhosts or vhost in self.placements():
            return f"vhost '{vhost}' has no leader at the moment (an election is under way)"
        return None

    def vhost_added(self, name: str) -> None:
        """A vhost created on this node (management API, definitions import): placed in the
        background; `placed(name)` waits for it."""
        self.metadata.poke()  # its policies and metadata from etcd
        if self.coordinator is None or name in self._placing:
            return
        self._placing[name] = asyncio.get_running_loop().create_task(self._place(name))

    async def placed(self, name: str) -> None:
        task = self._placing.get(name)
        if task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(task)

    async def _place(self, name: str) -> None:
        try:
            assert self.coordinator is not None
            await self.coordinator.place_vhost(name)
            await self.coordinator.vhosts.synced()
        except EtcdError as exc:
            log.warning("vhost %r: placement failed: %s", name, exc)
        finally:
            self._placing.pop(name, None)
        self._poke()

    # -- the rest of ClusterHooks (broker/cluster_hooks.py) -------------------------------

    #: A stream's own files are a working copy: the vhost's replicated log is durable and
    #: a new leader rebuilds them from it.
    streams_fsync = False

    def definitions_changed(self, vhost: str) -> None:
        self.replicas.definitions_changed(vhost)

    def queue_created(self, queue: Queue) -> None:
        self.replicas.queue_created(queue)

    def stream_home(self, vhost: str) -> Path:
        return self.replicas.vhost_dir(vhost)  # beside the vhost's log, which rebuilds them

    def must_wait(self, vhost: str) -> bool:
        return self.recovering(vhost) or self.leader_silent(vhost)

    def hand_off(self, conn: Connection, vhost: str, refusal: str) -> bool:
        return self.handoff.start(conn, vhost, refusal)

    def running(self) -> set[str]:
        return {row["name"] for row in self.nodes() if row.get("running")}

    def node_rows(self, own: dict[str, Any]) -> list[dict[str, Any]]:
        """Every node etcd knows of; this one's row keeps its own fields and gains its
        hand-off counters (connections passed / relayed to leaders)."""
        own = {**own, **self.handoff.stats()}
        return [{**row, **own} if row["name"] == own["name"] else row for row in self.nodes()]

    def vhost_placement(self, vhost: str) -> dict[str, Any]:
        return {
            "leader": self.leader_of(vhost),
            "members": self.members(vhost),
            "in_sync": self.in_sync(vhost),
            "replicas": self.replica_count(vhost),
            "member_status": self.replica_status(vhost),
            "replicated_log": self.replicas.log_status(vhost),
        }

    async def change(self, method: str, *args: Any) -> Any:
        """Through etcd, the home of operator metadata (metadata.py): answered once etcd
        has it and this node has applied it; 503 when etcd cannot be reached."""
        return await getattr(self.metadata, method)(*args)

    def knows_vhost(self, name: str) -> bool:
        return self.metadata.has_vhost(name)

    async def barrier(self) -> None:
        await self.metadata.barrier()

    def operator_refusal(self) -> str | None:
        return None

    async def import_metadata(
        self, doc: dict[str, Any], import_here: Callable[[dict[str, Any]], None]
    ) -> None:
        await self.metadata.import_definitions(doc)

    def _release_confirms(self) -> None:
        """The lease is renewed again: publishes replicated meanwhile may be confirmed."""
        for store in self.replicas.stores.values():
            store.release_confirmed()

    # -- reacting to etcd ----------------------------------------------------------------

    def _poke(self) -> None:
        self._dirty = True
        if self._stopped or self.coordinator is None:
            return
        if self._reconcile_task is None or self._reconcile_task.done():
            self._reconcile_task = asyncio.get_running_loop().create_task(self._reconcile())

    async def _reconcile(self) -> None:
        """Follow the vhosts placed on this node; as a leader, fill a vhost's members up."""
        while self._dirty and not self._stopped:
            self._dirty = False
            c = self.coordinator
            assert c is not None
            try:
                placements = self.placements()
                for vhost in self._placed_seen - set(placements) - set(self._placing):
                    await self._vhost_gone(vhost)  # only a vhost's deletion removes it
                self._placed_seen = set(placements)
                for vhost, members in placements.items():
                    try:
                        await self._reconcile_vhost(c, vhost, members)
                    except EtcdError:
                        raise
                    except Exception as exc:
                        # One vhost's trouble (its copy of the log cannot be opened) must
                        # not keep this node from following and leading the others.
                        log.error(
                            "vhost %r: %s; looked at again in %.0f s", vhost, exc, VHOST_RETRY
                        )
                        self.broker.clock.loop.call_later(VHOST_RETRY, self._poke)
            except EtcdError as exc:
                log.warning("cluster bookkeeping failed (%s); retrying", exc)
                self._dirty = True
                await asyncio.sleep(0.5)

    async def _reconcile_vhost(self, c: Coordinator, vhost: str, members: list[str]) -> None:
        if self.name in members:
            if vhost not in self.broker.vhosts:
                log.info("vhost %r: placed on this node; creating it", vhost)
                self.broker.add_vhost(vhost)
            if vhost not in c.following:
                c.follow(vhost)
            if vhost not in c.leading:
                self.replicas.follow(vhost)
        elif vhost in c.following:
            c.unfollow(vhost)
            await self.replicas.unfollow(vhost)
        epoch = c.leading.get(vhost)
        if epoch is not None:
            await self._fill(c, vhost, epoch, members)

    async def _vhost_gone(self, vhost: str) -> None:
        """The vhost was deleted from the cluster (its placement went with its metadata,
        metadata.delete_vhost): stop replicating it, delete it here and its copy."""
        c = self.coordinator
        assert c is not None
        if vhost in c.following:
            c.unfollow(vhost)
        if vhost in self.broker.vhosts:
            log.info("vhost %r: deleted from the cluster; deleting it here", vhost)
            self.broker.delete_vhost(vhost)
        await self.replicas.forget(vhost)

    async def _fill(self, c: Coordinator, vhost: str, epoch: int, members: list[str]) -> None:
        """Bring the vhost's members to its replica count: add live nodes (each joins the
        in-sync set once it has caught up with the log: the replication leader's
        on_caught_up -> expand_isr), or remove the ones least in sync (never this
        leader; a member leaves the in-sync set first, `remove_member`)."""
        live = c.members()
        target = c.vhost_replicas(vhost)
        if len(members) > target:
            in_sync = set(c.in_sync(vhost))
            extra = sorted(
                (n for n in members if n != self.name),
                key=lambda n: (n in in_sync and n in live, members.index(n)),
            )[: len(members) - target]
            for node in extra:
                await self.remove_member(vhost, node)
                log.info("vhost %r: node %r removed from its members", vhost, node)
            return
        room = target - len(members)
        for node in sorted(n for n in live if n not in members)[: max(room, 0)]:
            if await c.is_forgotten(node):  # forget_cluster_node: being decommissioned
                continue
            if await c.add_member(vhost, epoch, node) is not IsrChange.DONE:
                return
            log.info("vhost %r: node %r added to its members", vhost, node)

    def _lost(self, vhost: str, epoch: int, reason: str) -> None:
        """Deposed: this vhost's clients must reconnect (to the new leader)."""
        self.replicas.serving.discard(vhost)
        task = asyncio.get_running_loop().create_task(self.replicas.demote(vhost))
        self._placing[f"demote {vhost}"] = task
        task.add_done_callback(lambda _t: self._placing.pop(f"demote {vhost}", None))
        text = self._moves.pop(vhost, None) or (
            f"vhost '{vhost}' is no longer led by this node ({reason})"
        )
        for conn in list(self.broker.connections):
            if conn.vhost is not None and conn.vhost.name == vhost:
                conn.force_close(text)
        self._poke()

    # -- operating the cluster (roarmq ctl move_vhost_leader, forget_cluster_node) -------

    async def move_leader(self, vhost: str, target: str, timeout: float = 10.0) -> None:
        """A clean hand-over of a vhost this node leads to `target`, an in-sync member: stop
        reading its publishers, wait until target has acked our last durable offset, make
        target the preferred leader, resign (an epoch-guarded delete of the leader key), and
        close the vhost's clients with 320 naming target. Raises MoveRefused, in words."""
        c = self.coordinator
        if c is None:
            raise MoveRefused(f"node '{self.name}' has not joined the cluster")
        epoch = c.leading.get(vhost)
        leader = self.replicas.leaders.get(vhost)
        if epoch is None:
            raise MoveRefused(f"node '{self.name}' does not lead vhost '{vhost}'")
        if leader is None or vhost not in self.replicas.serving:
            raise MoveRefused(f"vhost '{vhost}' is being recovered on '{self.name}'; try again")
        members, isr = c.vhost_members(vhost), c.in_sync(vhost)
        if target not in members:
            raise MoveRefused(
                f"node '{target}' is not a member of vhost '{vhost}' "
                f"(members: {', '.join(members)}); only an in-sync member can lead it"
            )
        if target not in isr or target not in leader.in_sync:
            raise MoveRefused(
                f"node '{target}' is not in sync for vhost '{vhost}' (in sync: {', '.join(isr)});"
                " wait until it has caught up"
            )
        if target not in c.members():
            raise MoveRefused(f"node '{target}' is not running")
        held = [
            conn
            for conn in self.broker.connections
            if conn.vhost is not None and conn.vhost.name == vhost
        ]
        for conn in held:  # publishes stop here; consumers' acks wait too (they reconnect)
            conn.flow.hold(MOVING)
        resigned = False
        try:
            store = self.replicas.stores.get(vhost)
            if store is not None:
                store.append_definitions_if_changed()
            last = await leader.flush()
            deadline = asyncio.get_running_loop().time() + timeout
            while leader.holds_confirmed(target) < last or target not in leader.in_sync:
                if not c.may_confirm(vhost, epoch):
                    raise MoveRefused(f"node '{self.name}' lost vhost '{vhost}' during the move")
                if asyncio.get_running_loop().time() > deadline:
                    raise MoveRefused(
                        f"node '{target}' did not catch up with vhost '{vhost}' in {timeout} s"
                    )
                await asyncio.sleep(0.01)
            # Everything target has is confirmed once the other in-sync members have it too;
            # what they do not ack in a second is nacked when we resign (target has it).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(leader.wait_confirmed(last), 1.0)
            await asyncio.sleep(0.05)  # the confirms go out before the connection.close
            if await c.prefer(vhost, epoch, target) is not IsrChange.DONE:
                raise MoveRefused(f"node '{self.name}' lost vhost '{vhost}' during the move")
            self._moves[vhost] = (
                f"vhost '{vhost}' moved to node '{target}' (move_vhost_leader); reconnect"
            )
            resigned = True
            await c.resign(vhost)
            log.info("vhost %r: leadership handed over to %r", vhost, target)
        finally:
            self._moves.pop(vhost, None)
            if not resigned:
                for conn in held:
                    conn.flow.release(MOVING)

    async def add_vhost_member(self, vhost: str, node: str) -> None:
        """Give a vhost this node leads a copy on `node` (a live node, not forgotten): it
        joins the members now and the in-sync set once caught up; the vhost's replica
        count grows with it if it was full."""
        c = self.coordinator
        epoch = c.leading.get(vhost) if c is not None else None
        if c is None or epoch is None:
            raise MoveRefused(f"node '{self.name}' does not lead vhost '{vhost}'")
        members = c.vhost_members(vhost)
        if node in members:
            return
        if node not in c.members():
            raise MoveRefused(f"node '{node}' is not running")
        if await c.is_forgotten(node):
            raise MoveRefused(f"node '{node}' was forgotten (forget_cluster_node); start it again")
        if len(members) + 1 > c.vhost_replicas(vhost):
            await c.set_vhost_replicas(vhost, len(members) + 1)
        if await c.add_member(vhost, epoch, node) is not IsrChange.DONE:
            raise MoveRefused(f"node '{self.name}' lost vhost '{vhost}' meanwhile")

    async def delete_vhost_member(self, vhost: str, node: str) -> None:
        """Take `node`'s copy out of a vhost this node leads (not this node: move the
        leadership first); the vhost's replica count shrinks with it, so the copy is not
        made again elsewhere."""
        c = self.coordinator
        if c is None or vhost not in c.leading:
            raise MoveRefused(f"node '{self.name}' does not lead vhost '{vhost}'")
        if node == self.name:
            raise MoveRefused(f"node '{node}' leads vhost '{vhost}': move its leadership first")
        members = c.vhost_members(vhost)
        if node not in members:
            return
        await c.set_vhost_replicas(vhost, max(1, min(len(members) - 1, c.vhost_replicas(vhost))))
        await self.remove_member(vhost, node)

    async def remove_member(self, vhost: str, node: str) -> None:
        """Take node out of a vhost this node leads (members and in-sync set)."""
        c = self.coordinator
        epoch = c.leading.get(vhost) if c is not None else None
        if c is None or epoch is None:
            raise MoveRefused(f"node '{self.name}' does not lead vhost '{vhost}'")
        if vhost not in self.replicas.serving:
            raise MoveRefused(f"vhost '{vhost}' is being recovered on '{self.name}'; try again")
        leader = self.replicas.leaders.get(vhost)
        if leader is not None:
            result = await remove_then_forget(c, leader, node)
        else:
            result = await c.remove_member(vhost, epoch, node)
        if result is not IsrChange.DONE:
            raise MoveRefused(f"node '{self.name}' lost vhost '{vhost}' meanwhile")


class MoveRefused(Exception):
    """A cluster operation refused, with the reason in words."""


#: Flow reason: the vhost's leadership is being handed over (ClusterNode.move_leader).
MOVING = "cluster: vhost leadership moving"
