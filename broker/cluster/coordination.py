"""Membership, vhost leadership with epochs, the in-sync set, placement: all through etcd.

The keys (`{p}` is `/{name}`, vhost and node names percent-encoded, so "/" is "%2F"):

    {p}/nodes/{node}            {"address", "replication_port"}  on the node's lease
    {p}/vhosts/{vhost}/members  ["a", "b", "c"]  the vhost's replicas, first = preferred leader
    {p}/vhosts/{vhost}/isr      ["a", "b"]       the in-sync set (never empty)
    {p}/vhosts/{vhost}/replicas N                the vhost's own replica count (operator's;
                                absent: [cluster] replicas)
    {p}/vhosts/{vhost}/copies   {"a": id, ...}   the copy of the log each in-sync member was
                                admitted with (replog/records.py's COPY); written in
                                the same txns as `isr`. An in-sync member with no entry
                                has held nothing confirmed yet (the set as placed).
    {p}/vhosts/{vhost}/leader   {"node", "address", "base"} on the leader's lease; its
                                create revision is the leadership's epoch, and that plus
                                `base` its term (below)
    {p}/epoch_base              N: what terms add to etcd's revisions (absent: 0)

Terms: the replicated logs number their epochs by term, not by etcd revision, because a
restored etcd snapshot takes the revisions back: a new leadership could then get an epoch
a log already holds. A term is the leader key's create revision plus the `epoch_base` the
campaign read (in its value, so every node computes the same term). A node that meets a
term etcd never issued in this history (in its own log when it wins, or from a follower
that knows more) raises the base past it (`raise_base`) and resigns: the next leadership's
term is above every term any copy holds. etcd's guarded txns compare the epoch (the create
revision) as before.

Invariants (docs/cluster.md) and where each is kept:
2. the in-sync set changes only in a txn comparing the leader key's create revision with
   the caller's epoch (`shrink_isr`, `expand_isr`);
3. `campaign` creates the leader key only in a txn comparing the isr and copies keys' mod
   revisions with those whose values listed this node and its copy (a replaced disk under
   an in-sync name cannot lead: invariant 8); the leader pins its own copy in that txn;
4. the epoch is the leader key's create revision; a node that sees the key gone or created
   again (a higher epoch) for a vhost it leads drops the leadership at once;
5. `may_confirm(vhost, epoch)` needs the lease's `Fencing` open and the leadership held.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from ..ops.tasks import cancel_and_wait
from .cache import PrefixCache
from .etcd import EtcdClient, EtcdError, Event, KeyValue, compare, delete_op, put_op, range_op
from .lease import Fencing, LeaseKeeper

if TYPE_CHECKING:
    from ..replog.replication import ReplicationLeader

log = logging.getLogger("roarmq.cluster")


def encode(name: str) -> str:
    """A vhost or node name as one key segment."""
    return quote(name, safe="")


class NodeNameTaken(Exception):
    """Another instance (another data dir) is live in the cluster under this node's name."""


class IsrChange(enum.Enum):
    DONE = "done"
    NOT_LEADER = "not leader any more"
    NOT_MEMBER = "not a member of the vhost"
    UNANSWERED = "etcd did not answer"


@dataclass(frozen=True, slots=True)
class Campaign:
    """The outcome of a campaign: who leads (None: nobody) and since which epoch."""

    won: bool
    leader: str | None
    epoch: int
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Placement:
    vhost: str
    members: tuple[str, ...]  # first: the preferred leader


class Coordinator:
    """One node's view of, and part in, the cluster's decisions.

    Callbacks (plain functions, run on the loop):
      on_won(vhost, epoch), on_lost(vhost, epoch, reason), on_fenced(), on_members(members).
    """

    def __init__(
        self,
        client: EtcdClient,
        *,
        node: str,
        address: str = "",
        replication_port: int = 0,
        name: str = "roarmq",
        lease_ttl: int = 5,
        replicas: int = 3,
        campaign_grace: float | None = None,
    ) -> None:
        self.client = client
        self.node = node
        self.address = address
        self.replication_port = replication_port
        self.prefix = f"/{name}"
        self.lease_ttl = lease_ttl
        self.replicas = replicas
        # A candidate other than the preferred leader waits up to this long before
        # campaigning while the preferred one is live and in sync, so placement (or a
        # move_vhost_leader) decides who leads. By default a lease's TTL: a preferred node
        # that cannot win within it is waited for no longer than a dead leader would be,
        # and a busy one (a loaded machine can hold its loop for a second) still wins.
        self.campaign_grace = float(lease_ttl) if campaign_grace is None else campaign_grace
        #: More of this node's facts for its membership key (the broker's ports).
        self.info: dict[str, object] = {}
        self.fencing = Fencing(lease_ttl)
        self.keeper: LeaseKeeper | None = None
        self.nodes = PrefixCache(client, f"{self.prefix}/nodes/")
        self.vhosts = PrefixCache(client, f"{self.prefix}/vhosts/")
        self.leading: dict[str, int] = {}  # vhost -> epoch
        self.following: set[str] = set()  # vhosts this node campaigns for when leaderless
        self.on_won: list[Callable[[str, int], None]] = []
        self.on_lost: list[Callable[[str, int, str], None]] = []
        self.on_fenced: list[Callable[[], None]] = []
        self.on_members: list[Callable[[dict[str, dict]], None]] = []
        #: The identity of this node's copy of a vhost's log (the node sets it: the log's
        #: COPY); "" for a node that holds none.
        self.copy_of: Callable[[str], str] = lambda vhost: ""
        #: Whether this node's copy of a vhost's log can serve (a log whose writes failed
        #: cannot: it must not campaign, or it would win, fail and resign again).
        self.copy_works: Callable[[str], bool] = lambda vhost: True
        #: vhost -> (in-sync set, copies) as the winning campaign read them in etcd: what a
        #: new leader starts from (the cache may lag behind a watch).
        self.won_with: dict[str, tuple[list[str], dict[str, str]]] = {}
        #: vhost -> the term of this node's leadership (epoch + the base it was won with).
        self.terms: dict[str, int] = {}
        self._campaigns: dict[str, asyncio.Task[None]] = {}
        #: vhost -> epoch: leaderships given up while fenced whose key may still be ours in
        #: etcd (our lease may have outlived the cut): deleted once etcd answers again.
        self.given_up: dict[str, int] = {}
        self._giving_back: asyncio.Task[None] | None = None
        self._reading_back: asyncio.Task[None] | None = None
        self._rejoin: asyncio.Task[None] | None = None
        self._stopped = False
        self.fencing.on_fenced.append(self._fenced)
        self.fencing.on_restored.append(self._restored)
        self.nodes.on_change.append(lambda _: self._members_changed())
        self.vhosts.on_change.append(self._vhosts_changed)

    # -- keys ----------------------------------------------------------------------------

    def node_key(self, node: str) -> str:
        return f"{self.prefix}/nodes/{encode(node)}"

    def vhost_key(self, vhost: str, leaf: str) -> str:
        return f"{self.prefix}/vhosts/{encode(vhost)}/{leaf}"

    # -- life ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Take a lease, register this node, and start watching members and vhosts."""
        await self._join(starting=True)
        await self.nodes.start()
        await self.vhosts.start()
        self._reading_back = asyncio.get_running_loop().create_task(self._read_back_loop())

    async def stop(self) -> None:
        """Leave: the lease is revoked, so this node's keys (membership, leaderships) go."""
        self._stopped = True
        tasks = [*self._campaigns.values(), self._rejoin, self._giving_back, self._reading_back]
        for task in tasks:
            if task is not None:
                await cancel_and_wait(task)
        await self.nodes.stop()
        await self.vhosts.stop()
        self.leading.clear()
        if self.keeper is not None:
            await self.keeper.stop(revoke=True)

    async def _join(self, starting: bool = False) -> None:
        """A lease and this node's membership key. Starting the node (re)adds it to the
        cluster, so it clears a `forget_cluster_node` mark; a rejoin after a lost lease
        (frozen, cut off from etcd) does not: a node being drained stays forgotten."""
        if starting:
            await self._check_name_free()
        keeper = LeaseKeeper(self.client, self.lease_ttl, self.fencing)
        keeper.on_lost.append(self._lease_lost)
        await keeper.start()
        self.keeper = keeper
        info = {**self.info, "address": self.address, "replication_port": self.replication_port}
        await self.client.put(self.node_key(self.node), json.dumps(info), lease=keeper.lease)
        if starting:
            await self.client.delete(self.forgotten_key(self.node))

    async def _check_name_free(self) -> None:
        """A live key under this node's name is either our own last life (the same
        instance: killed, its lease not expired yet), whose lease is revoked so that its
        leaderships go now, or another node's (NodeNameTaken)."""
        kv = await self.client.get(self.node_key(self.node))
        if kv is None:
            return
        held = json.loads(kv.value)
        mine = self.info.get("instance")
        if mine and held.get("instance") not in (None, mine):
            # Another data dir: a node elsewhere, or this node's own last life on a disk
            # since replaced, whose lease then expires within a TTL. Wait that long.
            deadline = asyncio.get_running_loop().time() + self.lease_ttl + 1
            while kv is not None and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.2)
                kv = await self.client.get(self.node_key(self.node))
            if kv is None:
                return
            raise NodeNameTaken(
                f"[cluster] node {self.node!r} is already live in the cluster at "
                f"{held.get('address')} (another data dir, its lease renewed for "
                f"{self.lease_ttl + 1} s); give this node another name"
            )
        if kv.lease:
            log.info("node %r: revoking the lease of this node's last life", self.node)
            with contextlib.suppress(EtcdError):
                await self.client.lease_revoke(kv.lease)

    @property
    def lease(self) -> int:
        return self.keeper.lease if self.keeper is not None else 0

    def members(self) -> dict[str, dict]:
        """Live nodes (their lease is alive): name -> {"address", "replication_port"}."""
        cut = len(self.nodes.prefix)
        return {unquote(k[cut:]): json.loads(kv.value) for k, kv in self.nodes.data.items()}

    # -- leadership ----------------------------------------------------------------------

    def may_confirm(self, vhost: str, epoch: int) -> bool:
        """True only while this node holds the vhost at that epoch and its lease is fresh."""
        return self.leading.get(vhost) == epoch and self.fencing.may_confirm()

    def leader(self, vhost: str) -> tuple[str, int] | None:
        """(node, epoch) of the vhost's leader as this node's cache knows it."""
        kv = self.vhosts.get(self.vhost_key(vhost, "leader"))
        return (json.loads(kv.value)["node"], kv.create_revision) if kv else None

    def leader_term(self, vhost: str) -> int:
        """The term of the vhost's leadership as this node's cache knows it (0: none)."""
        kv = self.vhosts.get(self.vhost_key(vhost, "leader"))
        return kv.create_revision + int(json.loads(kv.value).get("base", 0)) if kv else 0

    def base_key(self) -> str:
        return f"{self.prefix}/epoch_base"

    async def raise_base(self, term: int) -> None:
        """etcd was restored to an older revision (`term` was issued by a later history):
        raise `epoch_base` so that every leadership from now on has a higher term."""
        key = self.base_key()
        for _ in range(10):
            kvs, revision = await self.client.range(key)
            base = int(json.loads(kvs[0].value)) if kvs else 0
            if revision + base > term:
                return  # already past it (another node raised it, or etcd moved on)
            wanted = term + 1 - revision
            result = await self.client.txn(
                [compare(key, "MOD", kvs[0].mod_revision if kvs else 0)],
                [put_op(key, json.dumps(wanted))],
            )
            if result.succeeded:
                log.warning(
                    "term %d was issued by etcd before a restore: epoch_base %d -> %d",
                    term,
                    base,
                    wanted,
                )
                return
        raise EtcdError("epoch_base kept changing under us")

    def in_sync(self, vhost: str) -> list[str]:
        kv = self.vhosts.get(self.vhost_key(vhost, "isr"))
        return json.loads(kv.value) if kv else []

    def copies(self, vhost: str) -> dict[str, str]:
        kv = self.vhosts.get(self.vhost_key(vhost, "copies"))
        return json.loads(kv.value) if kv else {}

    def may_lead(self, vhost: str) -> bool:
        """In the in-sync set with the copy of the log it was admitted with (or none
        pinned yet), as this node's cache knows it."""
        if self.node not in self.in_sync(vhost) or not self.copy_works(vhost):
            return False
        pinned = self.copies(vhost).get(self.node)
        return pinned is None or pinned == self.copy_of(vhost)

    def vhost_replicas(self, vhost: str) -> int:
        """How many members the vhost should have: its own setting, else `replicas`."""
        kv = self.vhosts.get(self.vhost_key(vhost, "replicas"))
        return int(json.loads(kv.value)) if kv else self.replicas

    async def set_vhost_replicas(self, vhost: str, replicas: int) -> None:
        """The operator's replica count for one vhost (its leader adds or removes members
        to match: ClusterNode._fill)."""
        await self.client.put(self.vhost_key(vhost, "replicas"), json.dumps(replicas))

    def vhost_members(self, vhost: str) -> list[str]:
        kv = self.vhosts.get(self.vhost_key(vhost, "members"))
        return json.loads(kv.value) if kv else []

    async def campaign(self, vhost: str) -> Campaign:
        """Try once to become the vhost's leader. Only an in-sync member can (invariant 3)."""
        leader_key, isr_key = self.vhost_key(vhost, "leader"), self.vhost_key(vhost, "isr")
        copies_key = self.vhost_key(vhost, "copies")
        if self.keeper is None or self.keeper.lost or not self.fencing.may_confirm():
            return Campaign(False, None, 0, "no live lease")
        isr = await self.client.get(isr_key)
        if isr is None or self.node not in json.loads(isr.value):
            current = await self.client.get(leader_key)
            return _campaign_failed(current, "not in the in-sync set")
        if not self.copy_works(vhost):
            current = await self.client.get(leader_key)
            return _campaign_failed(current, "this node's copy of the log failed")
        copies_kv = await self.client.get(copies_key)
        copies = json.loads(copies_kv.value) if copies_kv else {}
        mine = self.copy_of(vhost)
        if copies.get(self.node) not in (None, mine):
            current = await self.client.get(leader_key)
            return _campaign_failed(current, "this node's copy of the log is not the in-sync one")
        base_kv = await self.client.get(self.base_key())
        base = int(json.loads(base_kv.value)) if base_kv else 0
        info = {"node": self.node, "address": self.address, "base": base}
        success = [put_op(leader_key, json.dumps(info), lease=self.keeper.lease)]
        if mine and copies.get(self.node) is None:
            copies = {**copies, self.node: mine}
            success.append(put_op(copies_key, json.dumps(copies)))
        result = await self.client.txn(
            [
                compare(leader_key, "CREATE", 0),
                compare(isr_key, "MOD", isr.mod_revision),
                compare(copies_key, "MOD", copies_kv.mod_revision if copies_kv else 0),
                compare(self.base_key(), "MOD", base_kv.mod_revision if base_kv else 0),
            ],
            success,
            [range_op(leader_key)],
        )
        if not result.succeeded:
            (found,) = result.ranges()
            if found and found[0].lease == self.keeper.lease:
                # Ours already: an earlier try of this txn was applied but its reply lost.
                base = int(json.loads(found[0].value).get("base", 0))
                return self._won(vhost, found[0].create_revision, base)
            why = "a leader exists" if found else "the in-sync set changed"
            return _campaign_failed(found[0] if found else None, why)
        self.won_with[vhost] = (json.loads(isr.value), copies)
        return self._won(vhost, result.revision, base)  # the txn's: the key's create revision

    def _won(self, vhost: str, epoch: int, base: int = 0) -> Campaign:
        self.leading[vhost] = epoch
        self.terms[vhost] = epoch + base
        log.info("vhost %r: leader at epoch %d (term %d)", vhost, epoch, epoch + base)
        _run_all(self.on_won, vhost, epoch)
        return Campaign(True, self.node, epoch)

    async def resign(self, vhost: str, reason: str = "resigned") -> bool:
        """Give the leadership up: this node stops leading at once (`on_lost`: its clients
        are not held), and the leader key is deleted if it is still ours. True when that
        delete was done now; when etcd does not answer, it is retried in the background
        until done (`_give_back`), so no failed resign keeps the vhost leaderless."""
        epoch = self.leading.pop(vhost, None)
        if epoch is None:
            return False
        self.given_up[vhost] = epoch
        _run_all(self.on_lost, vhost, epoch, reason)
        key = self.vhost_key(vhost, "leader")
        try:
            result = await self.client.txn([compare(key, "CREATE", epoch)], [delete_op(key)])
        except EtcdError as exc:
            log.warning("vhost %r: resigning: %s; retrying", vhost, exc)
            self._give_back_later()
            return False
        if self.given_up.get(vhost) == epoch:
            del self.given_up[vhost]
        return result.succeeded

    def _give_back_later(self) -> None:
        if self._giving_back is None or self._giving_back.done():
            self._giving_back = asyncio.get_running_loop().create_task(self._give_back())

    def follow(self, vhost: str) -> None:
        """Campaign for this vhost whenever it has no leader and this node is in sync."""
        self.following.add(vhost)
        self._evaluate(vhost)

    def unfollow(self, vhost: str) -> None:
        self.following.discard(vhost)
        task = self._campaigns.pop(vhost, None)
        if task is not None:
            task.cancel()

    # -- the in-sync set (invariant 2) ---------------------------------------------------

    async def shrink_isr(self, vhost: str, epoch: int, node: str) -> IsrChange:
        """Remove node (and its copy's pin) from the in-sync set, only while leading at
        epoch."""
        if node == self.node:
            raise ValueError("the leader does not leave its own in-sync set")

        return await self._change_in_sync(vhost, epoch, _without(node))

    async def expand_isr(self, vhost: str, epoch: int, node: str, copy: str) -> IsrChange:
        """Add a caught-up node with its `copy` of the log to the in-sync set, only while
        leading at epoch and only if it is still one of the vhost's members: a node just
        removed (forget_cluster_node) may still be following and acking, and must not
        come back."""

        def add(isr: list[str], copies: dict[str, str]) -> tuple[list[str], dict[str, str]]:
            return (isr if node in isr else [*isr, node]), {**copies, node: copy}

        return await self._change_in_sync(vhost, epoch, add, member=node)

    async def pin_copy(self, vhost: str, epoch: int, node: str, copy: str) -> IsrChange:
        """Record that in-sync `node` holds `copy` (it had no pin: a member since the vhost
        was placed), only while leading at epoch; NOT_MEMBER if it left the set or another
        copy is pinned for it meanwhile."""

        def pin(isr: list[str], copies: dict[str, str]) -> tuple[list[str], dict[str, str]] | None:
            if node not in isr or copies.get(node) not in (None, copy):
                return None
            return isr, {**copies, node: copy}

        return await self._change_in_sync(vhost, epoch, pin)

    async def add_member(self, vhost: str, epoch: int, node: str) -> IsrChange:
        """Add a node to the vhost's members (its replicas, not yet in sync), only while
        leading at epoch: how a vhost placed before the other nodes joined gets its copies."""
        return await self._change_members(
            vhost, epoch, lambda members: members if node in members else [*members, node]
        )

    async def _change_in_sync(
        self,
        vhost: str,
        epoch: int,
        change: Callable[[list[str], dict[str, str]], tuple[list[str], dict[str, str]] | None],
        member: str | None = None,
    ) -> IsrChange:
        """One guarded write of the in-sync set and its copies' pins together."""
        return await self._guarded_write(
            vhost, epoch, ("isr", "copies"), lambda values: change(*values), member
        )

    async def _change_members(
        self, vhost: str, epoch: int, change: Callable[[list[str]], list[str]]
    ) -> IsrChange:
        return await self._guarded_write(
            vhost, epoch, ("members",), lambda values: (change(values[0]),)
        )

    async def _guarded_write(
        self,
        vhost: str,
        epoch: int,
        leaves: tuple[str, ...],
        change: Callable[[list], tuple | None],
        member: str | None = None,
    ) -> IsrChange:
        """One write of the vhost's `leaves` (read, changed, written back in one txn), only
        while leading at epoch and while none of them changed since the read; `change`
        returning None: no write (NOT_MEMBER). With `member`, also only while that node is
        in the vhost's members (checked in the same txn)."""
        leader_key = self.vhost_key(vhost, "leader")
        keys = [self.vhost_key(vhost, leaf) for leaf in leaves]
        members_key = self.vhost_key(vhost, "members")
        for _ in range(10):  # only the leader writes these: a lost race here is rare
            current = [await self.client.get(key) for key in keys]
            before = [
                json.loads(kv.value) if kv else ({} if leaf == "copies" else [])
                for leaf, kv in zip(leaves, current, strict=True)
            ]
            after = change(before)
            if after is None:
                return IsrChange.NOT_MEMBER
            guards = [compare(leader_key, "CREATE", epoch)] + [
                compare(key, "MOD", kv.mod_revision if kv else 0)
                for key, kv in zip(keys, current, strict=True)
            ]
            if member is not None:
                members = await self.client.get(members_key)
                if members is None or member not in json.loads(members.value):
                    return IsrChange.NOT_MEMBER
                guards.append(compare(members_key, "MOD", members.mod_revision))
            result = await self.client.txn(
                guards,
                [put_op(key, json.dumps(value)) for key, value in zip(keys, after, strict=True)],
                [range_op(leader_key)],
            )
            if result.succeeded:
                return IsrChange.DONE
            (leader,) = result.ranges()
            if not leader or leader[0].create_revision != epoch:
                self._lose(vhost, epoch, "not leader any more")
                return IsrChange.NOT_LEADER
        raise EtcdError(f"vhost {vhost!r}: its {'/'.join(leaves)} kept changing under us")

    async def prefer(self, vhost: str, epoch: int, node: str) -> IsrChange:
        """Make node the vhost's preferred leader (first of its members), only while leading
        at epoch: after the leader resigns, the others give it `campaign_grace` to win."""
        return await self._change_members(
            vhost, epoch, lambda members: [node, *(n for n in members if n != node)]
        )

    async def remove_member(self, vhost: str, epoch: int, node: str) -> IsrChange:
        """Take node out of the vhost's members (it stops following), then out of its
        in-sync set (a node being forgotten), only while leading at epoch. A leader calls
        it through `remove_then_forget`, which makes its replication's set follow."""
        if node == self.node:
            raise ValueError("the leader does not remove itself; move the leadership first")
        result = await self._change_members(
            vhost, epoch, lambda names: [n for n in names if n != node]
        )
        if result is IsrChange.DONE:
            result = await self._change_in_sync(vhost, epoch, _without(node))
        return result

    def forgotten_key(self, node: str) -> str:
        return f"{self.prefix}/forgotten/{encode(node)}"

    async def forget(self, node: str) -> None:
        """Mark node as decommissioned: leaders stop adding it to members. A node clears its
        own mark when it starts (starting a node with [cluster] adds it), not when it
        rejoins after losing its lease while running."""
        await self.client.put(self.forgotten_key(node), "{}")

    async def is_forgotten(self, node: str) -> bool:
        return await self.client.get(self.forgotten_key(node)) is not None

    # -- placement -----------------------------------------------------------------------

    async def place_vhost(self, vhost: str) -> Placement:
        """Choose a new vhost's members: the preferred leader is the live node leading the
        fewest vhosts, then the nodes holding the fewest replicas. Written once (a txn that
        creates `members` and `isr` only if absent); an existing placement is returned."""
        members_key = self.vhost_key(vhost, "members")
        existing = await self.client.get(members_key)
        if existing is not None:
            return Placement(vhost, tuple(json.loads(existing.value)))
        kvs, _ = await self.client.range(f"{self.prefix}/vhosts/", prefix=True)
        nodes, _ = await self.client.range(f"{self.prefix}/nodes/", prefix=True)
        live = sorted(unquote(kv.key.rsplit("/", 1)[1]) for kv in nodes)
        if not live:
            raise EtcdError("no live node to place a vhost on")
        leads = dict.fromkeys(live, 0)
        holds = dict.fromkeys(live, 0)
        for kv in kvs:
            if kv.key.endswith("/leader"):
                node = json.loads(kv.value)["node"]
                if node in leads:
                    leads[node] += 1
            elif kv.key.endswith("/members"):
                for node in json.loads(kv.value):
                    if node in holds:
                        holds[node] += 1
        first = min(live, key=lambda n: (leads[n], holds[n], n))
        rest = sorted((n for n in live if n != first), key=lambda n: (holds[n], leads[n], n))
        members = [first, *rest[: self.replicas - 1]]
        # A new vhost's log is empty, so every member starts in sync, none of its copies
        # pinned yet (each is pinned as it first connects, before its acks count).
        body = json.dumps(members)
        isr_key, copies_key = self.vhost_key(vhost, "isr"), self.vhost_key(vhost, "copies")
        result = await self.client.txn(
            [compare(members_key, "CREATE", 0)],
            [put_op(members_key, body), put_op(isr_key, body), put_op(copies_key, "{}")],
            [range_op(members_key)],
        )
        if not result.succeeded:
            (current,) = result.ranges()
            members = json.loads(current[0].value)
        return Placement(vhost, tuple(members))

    # -- reacting to etcd ----------------------------------------------------------------

    def _members_changed(self) -> None:
        members = self.members()
        for callback in list(self.on_members):
            try:
                callback(members)
            except Exception:
                log.exception("members callback failed")
        for vhost in self.following:
            self._evaluate(vhost)

    def _vhosts_changed(self, events: list[Event] | None) -> None:
        if events is None:
            touched = self.following | set(self.leading)
        else:
            cut = len(self.vhosts.prefix)
            touched = {unquote(ev.kv.key[cut:].split("/", 1)[0]) for ev in events}
        for vhost in touched:
            self._evaluate(vhost)

    def _evaluate(self, vhost: str) -> None:
        kv = self.vhosts.get(self.vhost_key(vhost, "leader"))
        epoch = self.leading.get(vhost)
        if epoch is not None and self.vhosts.revision >= epoch:
            if kv is None:
                self._lose(vhost, epoch, "leader key gone")
            elif kv.create_revision != epoch:
                self._lose(vhost, epoch, f"higher epoch {kv.create_revision}")
        if (
            kv is None
            and vhost in self.following
            and vhost not in self.leading
            and self.may_lead(vhost)
            and vhost not in self._campaigns
            and not self._stopped
        ):
            self._campaigns[vhost] = asyncio.create_task(self._campaign_soon(vhost))

    async def _campaign_soon(self, vhost: str) -> None:
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.campaign_grace
            while loop.time() < deadline and self.leader(vhost) is None:
                # Wait while the preferred node could win (live and in sync); at once when
                # placement makes this node the preferred one (a move back to it), or the
                # preferred one dies or leaves the in-sync set.
                preferred = (self.vhost_members(vhost) or [self.node])[0]
                if (
                    preferred == self.node
                    or preferred not in self.members()
                    or preferred not in self.in_sync(vhost)
                ):
                    break
                await asyncio.sleep(min(0.05, self.campaign_grace))
            if self.leader(vhost) is None and vhost in self.following:
                try:
                    await self.campaign(vhost)
                except EtcdError as exc:
                    log.warning("vhost %r: campaign failed: %s", vhost, exc)
        finally:
            self._campaigns.pop(vhost, None)
        # What changed while we campaigned (or a failed attempt) is looked at again.
        if vhost not in self.leading:
            await asyncio.sleep(0.1)
            self._evaluate(vhost)

    def _lose(self, vhost: str, epoch: int, reason: str) -> None:
        if self.leading.get(vhost) != epoch:
            return
        del self.leading[vhost]
        log.warning("vhost %r: leadership at epoch %d lost: %s", vhost, epoch, reason)
        _run_all(self.on_lost, vhost, epoch, reason)

    def _fenced(self) -> None:
        if self.leading:
            log.warning("lease not renewed for %ss: confirming nothing", self.lease_ttl)
            with contextlib.suppress(RuntimeError):  # (no loop: nothing runs to give up)
                # Not from inside whatever asked may_confirm() (a confirm path).
                asyncio.get_running_loop().call_soon(self._give_up_while_fenced)
        for callback in list(self.on_fenced):
            try:
                callback()
            except Exception:
                log.exception("fenced callback failed")

    def _give_up_while_fenced(self) -> None:
        """Invariant 11: a leader that can no longer confirm says so at once instead of
        holding its clients until etcd answers again: every leadership is dropped here (the
        owner nacks what waits and closes the vhost's connections), and its key is given
        back when etcd answers (`_give_back`) or goes with the lease."""
        if self.fencing.may_confirm():
            return  # renewed meanwhile
        for vhost, epoch in list(self.leading.items()):
            self.given_up[vhost] = epoch
            self._lose(vhost, epoch, f"its lease was not renewed within {self.lease_ttl} s")

    async def _give_back(self) -> None:
        """Delete the leader keys given up while fenced that are still ours (the lease
        outlived the cut), so that an election follows at once; retried until etcd takes
        it or the key is not ours any more."""
        delay = 0.1
        while self.given_up and not self._stopped:
            for vhost, epoch in list(self.given_up.items()):
                key = self.vhost_key(vhost, "leader")
                try:
                    await self.client.txn([compare(key, "CREATE", epoch)], [delete_op(key)])
                except EtcdError as exc:
                    log.warning("vhost %r: giving back its leader key: %s", vhost, exc)
                    continue
                if self.given_up.get(vhost) == epoch:
                    del self.given_up[vhost]
                log.info("vhost %r: leader key of epoch %d given back", vhost, epoch)
                self._evaluate(vhost)
            if self.given_up:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _restored(self) -> None:
        """The lease was renewed after a fenced spell: check each leadership still stands,
        and give back the keys of those given up."""
        if self.leading:
            asyncio.get_running_loop().create_task(self._recheck())
        if self.given_up:
            self._give_back_later()

    async def _read_back_loop(self) -> None:
        """Every third of a lease TTL, read back the keys of the vhosts this node leads: a
        watch can go quiet without breaking (a member that lost its peers before
        require-leader cancels it, a proxy holding the stream), and a leader must not
        learn of its successor only from it."""
        while True:
            await asyncio.sleep(self.lease_ttl / 3)
            if self.leading:
                await self._recheck("leader key changed (read back)")

    async def _recheck(self, reason: str = "leader key changed while fenced") -> None:
        for vhost, epoch in list(self.leading.items()):
            try:
                kv = await self.client.get(self.vhost_key(vhost, "leader"))
            except EtcdError:
                continue  # fenced again, or soon: the next renewal rechecks
            if kv is None or kv.create_revision != epoch:
                self._lose(vhost, epoch, reason)

    def _lease_lost(self) -> None:
        for vhost, epoch in list(self.leading.items()):
            self._lose(vhost, epoch, "lease expired")
        if not self._stopped and (self._rejoin is None or self._rejoin.done()):
            self._rejoin = asyncio.get_running_loop().create_task(self._rejoin_loop())

    async def _rejoin_loop(self) -> None:
        """A new lease and membership after the old lease expired (we were frozen or cut off
        from etcd too long); this node comes back as a follower."""
        delay = 0.1
        while not self._stopped:
            try:
                await self._join()
            except EtcdError as exc:
                log.warning("rejoining the cluster: %s", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            log.info("rejoined the cluster with lease %x", self.lease)
            for vhost in list(self.following):
                self._evaluate(vhost)
            return


def _without(node: str) -> Callable[[list[str], dict[str, str]], tuple[list[str], dict[str, str]]]:
    """An in-sync set change: `node` and its copy's pin leave."""

    def drop(isr: list[str], copies: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        return [n for n in isr if n != node], {n: c for n, c in copies.items() if n != node}

    return drop


def _campaign_failed(current: KeyValue | None, reason: str) -> Campaign:
    if current is None:
        return Campaign(False, None, 0, reason)
    return Campaign(False, json.loads(current.value)["node"], current.create_revision, reason)


def _run_all(callbacks: list[Callable[..., None]], *args: object) -> None:
    for callback in list(callbacks):
        try:
            callback(*args)
        except Exception:
            log.exception("cluster callback failed")


# -- a vhost's replication leader wired to etcd (invariant 2) ---------------------------------


async def shrink_then_forget(
    coordinator: Coordinator, leader: ReplicationLeader, node: str
) -> IsrChange:
    """Remove a lagging follower from the in-sync set in etcd, then stop waiting for it.

    `coordinator.shrink_isr` is a txn that checks this node still leads at
    `leader.leadership`;
    only after it succeeded does `confirmed_offset` go on without `node` (invariant 2). A
    NOT_LEADER answer deposes the leader: it confirms nothing more. If etcd does not answer,
    the follower stays in the set (what waits for it keeps waiting) and is reported again at
    the leader's next lag check: a shrink that failed once is not forgotten."""
    try:
        result = await coordinator.shrink_isr(leader.vhost, leader.leadership, node)
    except EtcdError as exc:
        log.warning("vhost %r: %s could not leave the in-sync set yet: %s", leader.vhost, node, exc)
        leader.report_again(node)
        return IsrChange.UNANSWERED
    if result is IsrChange.DONE:
        leader.remove_from_isr(node)
    else:
        leader.depose(leader.epoch + 1, coordinator.node)
    return result


async def expand_then_include(
    coordinator: Coordinator, leader: ReplicationLeader, node: str, copy: str
) -> IsrChange:
    """A caught-up follower, proposed with its `copy` (`leader.propose_join`: confirms
    wait for it from then on), rejoins the in-sync set in etcd, and then counts towards
    `min_copies` too. Refused (not a member, not leading): confirms stop waiting for it.
    If etcd does not answer it may have applied the txn all the same, so confirms keep
    waiting for it, and it is reported again at its next ack: an expansion that failed
    once is not forgotten (the follower would stay out for good)."""
    try:
        result = await coordinator.expand_isr(leader.vhost, leader.leadership, node, copy)
    except EtcdError as exc:
        log.warning(
            "vhost %r: %s could not rejoin the in-sync set yet: %s", leader.vhost, node, exc
        )
        leader.report_caught_up_again(node)
        return IsrChange.UNANSWERED
    if result is IsrChange.DONE:
        leader.add_to_isr(node, copy)
        return result
    leader.join_refused(node)
    if result is IsrChange.NOT_LEADER:
        leader.depose(leader.epoch + 1, coordinator.node)
    else:
        log.info("vhost %r: %s caught up but is not a member: stays out", leader.vhost, node)
    return result


async def remove_then_forget(
    coordinator: Coordinator, leader: ReplicationLeader, node: str
) -> IsrChange:
    """Take `node`'s copy out of the vhost (`delete_vhost_member`, fewer replicas, a
    forgotten node): out of the in-sync set (`shrink_then_forget`: confirms stop waiting
    for it), then out of the members and, in the same call, out of etcd's in-sync set
    again, and then out of the leader's set too.

    That second removal is why: between the shrink and the members' change the node is
    still a member and usually still caught up, so its expansion can put it back in both
    sets, or the shrink went unanswered though etcd applied it. etcd's set then lost the
    node while the leader's kept it; a node added back later (more replicas) reconnects,
    acks as an in-sync member, is never reported caught up, and stays out of etcd's set
    for good (the leader confirms with it, but it can never lead). The leader's set may
    shrink here only after etcd's has (invariant 2): the removal's txn is that shrink."""
    if leader.counts(node):
        await shrink_then_forget(coordinator, leader, node)
    result = await coordinator.remove_member(leader.vhost, leader.leadership, node)
    if result is IsrChange.DONE:
        if leader.counts(node):
            leader.remove_from_isr(node)
    elif result is IsrChange.NOT_LEADER:
        leader.depose(leader.epoch + 1, coordinator.node)
    return result


def attach_coordinator(coordinator: Coordinator, leader: ReplicationLeader) -> set[asyncio.Task]:
    """Wire lagging -> shrink_isr and caught up -> expand_isr; returns the live task set."""
    tasks: set[asyncio.Task] = set()

    def spawn(change: Coroutine[Any, Any, IsrChange]) -> None:
        task = asyncio.get_running_loop().create_task(change)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def expand(node: str) -> None:
        copy = leader.propose_join(node)  # now, not when the task runs: see propose_join
        if copy:  # a peer that names no copy is never pinned
            spawn(expand_then_include(coordinator, leader, node, copy))

    leader.on_lagging.append(lambda node: spawn(shrink_then_forget(coordinator, leader, node)))
    leader.on_caught_up.append(expand)

    async def pin_copy(node: str, copy: str) -> bool:
        """False if not pinned: the member's acks do not count, so it lags, leaves the set
        (shrink) and rejoins with its copy pinned once caught up (expand)."""
        try:
            result = await coordinator.pin_copy(leader.vhost, leader.leadership, node, copy)
        except EtcdError as exc:
            log.warning("vhost %r: %s's copy could not be pinned: %s", leader.vhost, node, exc)
            return False
        if result is IsrChange.NOT_LEADER:
            leader.depose(leader.epoch + 1, coordinator.node)
        return result is IsrChange.DONE

    leader.pin_copy = pin_copy
    return tasks
