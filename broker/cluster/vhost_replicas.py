"""A node's side of every clustered vhost's replicated log: leading, following, failover.

One replication listener per node (`replication_port`); a follower's HELLO names its vhost
and is routed to this node's `ReplicationLeader` for it (or refused: not leading here); a
HANDOFF frame is a client connection another node hands over (handoff.py).

* Following: a member that does not lead a vhost keeps its log in
  ``data/vhosts/<vhost>/log`` (`SegmentRecordStore`) with a `ReplicationFollower` pointed at
  the leader etcd names (fsync per batch, ack).
* Leading (`promote`, on winning the election, and at a first start): stop following,
  take the definitions, id floors and streams out of the log (`rebuild_from_log`), make
  the vhost's durable objects those of the log's last definitions snapshot, run the
  ordinary `MessageStore.recover` over the log's records, and lead the log at the new
  epoch. Until that is done the vhost
  is not served (`serving`), so no client writes to it half-recovered.
* Losing the leadership (`demote`): nack what waits, stop streaming, follow again.
* Upkeep (`_maintain`, every `MAINTAIN_EVERY` s): the logs' segments are compacted, and a
  led vhost whose log has grown past
  `checkpoint_bytes` and twice its live data gets a checkpoint (replicated_store.py), after
  which every member trims it: a failover rebuilds about the live data, not the history.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..cluster_hooks import NOT_REPLICATED
from ..config import majority
from ..core.delayed import dormant_schedules
from ..core.stream import Stream
from ..replog import wire
from ..replog.records import SegmentRecordStore
from ..replog.replication import LOST_CONNECTION, ReplicationFollower, ReplicationLeader
from ..store.segments import make_dirs_durably
from . import replicated_definitions as definitions
from .coordination import attach_coordinator, encode
from .etcd import EtcdError
from .handoff import HANDOFF
from .replicated_store import ReplicatedVhostStore, rebuild_from_log

if TYPE_CHECKING:
    from ..core.delayed import Schedule
    from ..core.queue import Queue
    from .node import ClusterNode

log = logging.getLogger("roarmq.cluster")

#: When a follower's connection ends: delays before each look at whether its replication
#: port refuses connections (its process is gone: it leaves the in-sync set at once).
GONE_RECHECKS = (0.0, 0.05, 0.2, 0.5)
#: Seconds between upkeep passes (compaction, and a look at whether a checkpoint is due).
MAINTAIN_EVERY = 5.0


class VhostReplicas:
    def __init__(self, node: ClusterNode) -> None:
        self.node = node
        self.broker = node.broker
        self.config = node.config
        self.leaders: dict[str, ReplicationLeader] = {}
        self.stores: dict[str, ReplicatedVhostStore] = {}
        self.followers: dict[str, ReplicationFollower] = {}
        self.logs: dict[str, SegmentRecordStore] = {}
        self.serving: set[str] = set()
        self._promoting: dict[str, asyncio.Task[None]] = {}
        self._demoting: dict[str, asyncio.Future[None]] = {}
        self._isr_tasks: list[set[asyncio.Task]] = []
        self._server: asyncio.Server | None = None
        self._maintainer: asyncio.Task[None] | None = None
        self._checking_leader: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[None]] = set()
        #: Per led vhost: the log's bytes_written when its last checkpoint ended.
        self._checkpointed_at: dict[str, int] = {}

    # -- life ----------------------------------------------------------------------------

    async def start(self, host: str) -> None:
        self._server = await asyncio.start_server(
            self._route, host, self.config.replication_port, reuse_address=True
        )
        self._maintainer = asyncio.get_running_loop().create_task(self._maintain())

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._maintainer is not None:
            self._maintainer.cancel()
        for task in self._promoting.values():
            task.cancel()
        for vhost in list(self.leaders):
            await self.demote(vhost)
        for follower in self.followers.values():
            await follower.stop()
        for records in self.logs.values():
            with contextlib.suppress(Exception):
                records.sync()
                records.close()

    def vhost_dir(self, vhost: str) -> Path:
        return Path(self.broker.config.storage.data_dir) / "vhosts" / encode(vhost)

    def log_of(self, vhost: str) -> SegmentRecordStore:
        """The vhost's replicated log, opened once per process (its directory is locked)."""
        records = self.logs.get(vhost)
        if records is None:
            path = self.vhost_dir(vhost) / "log"
            make_dirs_durably(path)
            records = self.logs[vhost] = SegmentRecordStore(
                path, segment_size=self.broker.config.storage.segment_size
            )
        return records

    # -- upkeep ----------------------------------------------------------------------------

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(MAINTAIN_EVERY)
            for vhost in list(self.logs):
                try:
                    await self.maintain(vhost)
                except Exception:
                    log.exception("vhost %r: upkeep failed", vhost)

    async def maintain(self, vhost: str) -> None:
        """Checkpoint a led vhost's log when due; compact the log's segments."""
        records = self.logs[vhost]
        store = self.stores.get(vhost)
        if store is not None:
            if self.checkpoint_due(vhost):
                if await store.checkpoint():
                    self._checkpointed_at[vhost] = records.log.bytes_written
        records.compact()

    def checkpoint_due(self, vhost: str) -> bool:
        """The log has grown past `checkpoint_bytes` and twice the live data since the
        last checkpoint (or, before the first one of this leadership, in all)."""
        store, records = self.stores[vhost], self.logs[vhost]
        room = max(self.config.checkpoint_bytes, 2 * store.live_bytes())
        if vhost in self._checkpointed_at:
            return records.log.bytes_written - self._checkpointed_at[vhost] > room
        return records.size_bytes() > room

    def min_copies(self, vhost: str) -> int:
        """Copies a confirm of this vhost needs: `min_in_sync`, or a majority of its
        members (invariant 9)."""
        c = self.node.coordinator
        members = len(c.vhost_members(vhost)) if c is not None else 1
        return self.config.min_in_sync or majority(max(members, 1))

    def members_changed(self) -> None:
        """The vhosts' keys changed in etcd: a led vhost's members may have (its default
        `min_copies` with them)."""
        for vhost, leader in self.leaders.items():
            leader.set_min_copies(self.min_copies(vhost))
            leader.members_changed()

    def log_status(self, vhost: str) -> dict[str, Any] | None:
        """This node's copy of the vhost's log, for the API (None: it holds none)."""
        records = self.logs.get(vhost)
        if records is None:
            return None
        store = self.stores.get(vhost)
        return {
            "node": self.node.name,
            "first_offset": records.first_offset,
            "last_offset": records.last_offset,
            "bytes": records.size_bytes(),
            "epoch": records.last_epoch(),
            "checkpoints": store.checkpoints if store is not None else None,
        }

    async def forget(self, vhost: str) -> None:
        """The vhost was deleted from the cluster: no more leading or following, and its
        copy (log and working copy) goes from the disk."""
        await self.unfollow(vhost)
        await self.demote(vhost)  # (or wait for the one the lost leadership started)
        self._checkpointed_at.pop(vhost, None)
        records = self.logs.pop(vhost, None)
        if records is not None:
            with contextlib.suppress(Exception):
                records.close()
        await asyncio.to_thread(shutil.rmtree, self.vhost_dir(vhost), True)

    # -- the listener ----------------------------------------------------------------------

    async def _route(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Hand a follower's connection to the leader of the vhost its HELLO names; a
        client connection handed over by another node (HANDOFF) becomes a Connection."""
        try:
            kind, body = await wire.read_frame(reader)
            if kind not in (HANDOFF, wire.HELLO):
                raise wire.ProtocolError(f"expected frame {wire.HELLO}, got {kind}")
            hello = wire.decode_control(body)
        except LOST_CONNECTION:
            writer.close()
            return
        if not self.node.cookie_matches(hello.pop("cookie", None)):
            peer = writer.get_extra_info("peername")
            log.warning("replication port: refused %s: not this cluster's cookie", peer)
            writer.write(wire.control(wire.REFUSE, {"reason": "bad cookie", "epoch": 0}))
            writer.close()
            return
        if kind == HANDOFF:
            self.node.handoff.adopt(hello, reader, writer)
            return
        leader = self.leaders.get(str(hello.get("vhost")))
        if leader is None or hello.get("vhost") not in self.serving:
            writer.write(wire.control(wire.REFUSE, {"reason": "not leading", "epoch": 0}))
            writer.close()
            return
        await leader.serve(hello, reader, writer)

    # -- following -------------------------------------------------------------------------

    def follow(self, vhost: str) -> None:
        """Keep a copy of the vhost's log from its leader as etcd names it (if it runs)."""
        c = self.node.coordinator
        assert c is not None
        leader = c.leader(vhost)
        if leader is None or leader[0] == self.node.name or vhost in self.leaders:
            return
        info = c.members().get(leader[0])
        if not info or not info.get("replication_port"):
            return
        address = (info["address"], int(info["replication_port"]))
        follower = self.followers.get(vhost)
        if follower is None:
            follower = ReplicationFollower(
                vhost,
                address,
                self.node.name,
                self.log_of(vhost),
                epoch=c.leader_term(vhost),
                cookie=self.node.cookie,
            )
            self.followers[vhost] = follower
            follower.on_leader_refused.append(functools.partial(self._leader_refused, vhost))
            follower.start()
            log.info("vhost %r: following %s at %s", vhost, leader[0], address)
        elif follower.leader != address or follower.epoch < c.leader_term(vhost):
            follower.follow(address, c.leader_term(vhost))
            log.info("vhost %r: following %s at %s", vhost, leader[0], address)

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _drop_if_gone(self, leader: ReplicationLeader, node: str) -> None:
        """A follower's connection ended: if its process is gone (its replication port
        refuses connections), it leaves the in-sync set now rather than after
        `replica_lag_ms` of confirms waiting for it. Leaving is always safe (invariant 2:
        etcd first); a follower only slow or cut off is left to the lag rule."""
        c = self.node.coordinator
        info = c.members().get(node) if c is not None else None
        if info is None:  # no lease any more: gone
            leader.report_lagging(node)
            return
        # A process being killed closes its sockets one by one: the replication connection
        # may end while its listener still completes handshakes for a moment (it resets
        # them as it closes). Ask again a little later before taking it for alive.
        address = (info["address"], int(info["replication_port"]))
        for delay in GONE_RECHECKS:
            await asyncio.sleep(delay)
            if await _refuses(address):
                leader.report_lagging(node)
                return

    def _leader_refused(self, vhost: str, address: tuple[str, int], epoch: int) -> None:
        if vhost not in self._checking_leader:
            task = asyncio.get_running_loop().create_task(
                self._revoke_if_gone(vhost, address, epoch)
            )
            self._checking_leader[vhost] = task
            task.add_done_callback(lambda _t: self._checking_leader.pop(vhost, None))

    async def _revoke_if_gone(self, vhost: str, address: tuple[str, int], epoch: int) -> None:
        """Fast failover when the leader's *process* is gone (kill -9, a crash): its
        replication port refuses connections, so nothing of it can confirm any more, and
        its lease is revoked at once instead of waiting out `lease_ttl`.

        Only a refusal counts: the kernel answers one for a port nobody listens on. A
        frozen leader (SIGSTOP) still accepts connections, a partitioned or powered-off
        machine answers nothing: those are replaced by lease expiry, which fencing
        (invariant 5) relies on, since a live leader may confirm until its lease runs out."""
        c = self.node.coordinator
        if c is None:
            return
        kv = c.vhosts.get(c.vhost_key(vhost, "leader"))
        if kv is None or c.leader_term(vhost) != epoch or not kv.lease:
            return  # another leadership already
        if not await _refuses(address):  # once more: not a restart under way
            return
        leader = c.leader(vhost)
        if leader is None or c.leader_term(vhost) != epoch:
            return
        log.warning(
            "vhost %r: leader %s's replication port %s refuses connections: its process is "
            "gone; revoking its lease for a fast failover",
            vhost,
            leader[0],
            address,
        )
        with contextlib.suppress(EtcdError):
            await c.client.lease_revoke(kv.lease)

    async def unfollow(self, vhost: str) -> None:
        follower = self.followers.pop(vhost, None)
        if follower is not None:
            await follower.stop()

    # -- leading ---------------------------------------------------------------------------

    def won(self, vhost: str, epoch: int) -> None:
        """Coordinator.on_won: recover from the log in the background, then serve."""
        task = asyncio.get_running_loop().create_task(self._promote_logged(vhost, epoch))
        self._promoting[vhost] = task
        task.add_done_callback(lambda _t: self._promoting.pop(vhost, None))

    async def _promote_logged(self, vhost: str, epoch: int) -> None:
        """Every leadership ends serving or giving its key back (invariant 11): a promotion
        that fails or finds itself fenced resigns, so another member can take over."""
        try:
            await self.promote(vhost, epoch)
        except Exception:
            log.exception("vhost %r: could not take over as leader", vhost)
        if vhost not in self.serving:
            self._resign(vhost, epoch, "could not take over as leader")

    async def _after_deposed(self, vhost: str, epoch: int, known: int, by: str) -> None:
        """A member knows a later term than ours: usually a successor's (etcd has it
        already), but after a restore of etcd it may be one etcd no longer knows; then the
        base is raised past it, and either way this leadership gives its key back. (This
        node deposing itself, as it stops leading, names no term anyone holds.)"""
        c = self.node.coordinator
        if c is None:
            return
        if by != self.node.name:
            try:
                await c.raise_base(known)
            except EtcdError as exc:
                log.warning("vhost %r: raising the epoch base: %s", vhost, exc)
        if c.leading.get(vhost) == epoch:
            await c.resign(vhost, f"a member knows a later term ({known})")

    def _resign(self, vhost: str, epoch: int, reason: str) -> None:
        c = self.node.coordinator
        if c is not None and c.leading.get(vhost) == epoch:
            self._spawn(c.resign(vhost, reason))

    async def promote(self, vhost: str, epoch: int) -> None:
        c = self.node.coordinator
        assert c is not None
        await self.unfollow(vhost)
        if vhost in self.leaders:
            await self.demote(vhost)
        # Recovery takes as long as the live data is big, much of it on the loop
        # (`MessageStore.recover`) or holding the GIL (the rebuild's thread): the lease is
        # kept alive from a thread meanwhile, or this node loses the leadership it is
        # recovering for and the vhost goes through another election.
        keeper = c.keeper
        busy = keeper.renewing_in_thread() if keeper is not None else contextlib.nullcontext()
        with busy:
            await self._recover_as_leader(vhost, epoch)

    async def _recover_as_leader(self, vhost: str, epoch: int) -> None:
        c = self.node.coordinator
        assert c is not None
        records = self.log_of(vhost)
        await asyncio.to_thread(records.sync)
        term = c.terms.get(vhost, epoch)
        held = max((e for _, e in records.epoch_starts()), default=0)
        if held >= term:  # etcd was restored to an older revision: see coordination.py
            log.warning(
                "vhost %r: our log holds term %d >= this leadership's %d: etcd went back "
                "in time; raising the epoch base and resigning",
                vhost,
                held,
                term,
            )
            await c.raise_base(held)
            await c.resign(vhost, f"its log holds a later term ({held})")
            return
        messages = self.vhost_dir(vhost) / "messages"  # not created: VhostLogView
        rebuilt = await asyncio.to_thread(rebuild_from_log, records, self.vhost_dir(vhost))
        if not c.may_confirm(vhost, epoch):
            log.warning("vhost %r: leadership at epoch %d lost while recovering", vhost, epoch)
            return
        if vhost not in self.broker.vhosts:  # led here before this node applied it
            self.broker.add_vhost(vhost)
        vhost_obj = self.broker.vhosts[vhost]
        saved = rebuilt.definitions
        if saved is None:  # a new log: this node's own definitions start it
            saved = definitions.snapshot(vhost_obj)
        queues = definitions.apply(self.broker, vhost_obj, saved)
        # The in-sync set and pins the campaign read, not the cache: a watch may lag.
        won_with = c.won_with.pop(vhost, None)
        in_sync, copies = won_with or (c.in_sync(vhost), c.copies(vhost))
        leader = ReplicationLeader(
            vhost,
            term,
            records,
            node=self.node.name,
            in_sync=set(in_sync),
            copies=copies,
            min_copies=self.min_copies(vhost),
            replica_lag_ms=self.config.replica_lag_ms,
        )
        store = self._open_store(vhost, epoch, messages, leader, vhost_obj)
        self._recover(
            vhost, store, queues, vhost_obj.stored_schedules(), list(vhost_obj.exchanges.values())
        )
        # Ids named below a checkpoint are not given again.
        store.store.next_id = max(store.store.next_id, rebuilt.next_id)
        store.next_queue_id = max(store.next_queue_id, rebuilt.next_queue_id)
        self._checkpointed_at.pop(vhost, None)
        store.start_epoch()
        vhost_obj.replicated = store
        vhost_obj.message_store = store.store
        leader.start_routed()
        self._isr_tasks.append(attach_coordinator(c, leader))
        leader.on_too_few.append(
            lambda: store.nack_waiting("fewer copies in sync than min_in_sync")
        )
        leader.leadership = epoch
        store.on_log_failed.append(lambda: self._resign(vhost, epoch, "its vhost log failed"))
        leader.on_deposed.append(
            lambda known, by: self._spawn(self._after_deposed(vhost, epoch, known, by))
        )
        leader.on_follower_gone.append(lambda node: self._spawn(self._drop_if_gone(leader, node)))
        live = c.members()
        for node in sorted(leader.in_sync):  # gone (its lease with it): no waiting for lag
            if node not in live:
                leader.report_lagging(node)
        self.leaders[vhost] = leader
        self.stores[vhost] = store
        self.serving.add(vhost)
        store.definitions_changed()  # this epoch's log starts with the definitions
        self.node.broker.vhost_served(vhost)  # its shovels run here now
        log.info(
            "vhost %r: leading at epoch %d from its replicated log (offsets %d..%d)",
            vhost,
            epoch,
            records.first_offset,
            records.last_offset,
        )

    def _open_store(
        self, vhost: str, epoch: int, directory: Path, leader: ReplicationLeader, vhost_obj: Any
    ) -> ReplicatedVhostStore:
        c = self.node.coordinator
        assert c is not None
        return ReplicatedVhostStore(
            directory,
            replication=leader,
            may_confirm=lambda: c.may_confirm(vhost, epoch),
            snapshot=lambda: definitions.snapshot(vhost_obj),
            streams=lambda: [
                q for q in vhost_obj.queues.values() if isinstance(q, Stream) and not q.deleted
            ],
            loop=asyncio.get_running_loop(),
        )

    @staticmethod
    def _recover(
        vhost: str,
        store: ReplicatedVhostStore,
        queues: dict[int, Queue],
        schedules: list[Schedule],
        exchanges: list[Any],
    ) -> None:
        """Fill the vhost's durable queues and its delayed exchanges' schedules from its
        log (a schedule forgets what an earlier leadership here left in it first; an
        exchange a policy no longer makes delayed gets its schedule back for what it
        held: `dormant_schedules`)."""
        store.next_queue_id = max(queues, default=0) + 1
        holders: dict[int, Queue] = dict(queues)
        for queue in queues.values():
            queue.store = store.store
        for schedule in schedules:
            assert schedule.store_id is not None  # a durable exchange's: set at creation
            schedule.forget()
            schedule.use_store(store.store)
            holders[schedule.store_id] = schedule
        for store_id, dormant in dormant_schedules(exchanges, store.store).items():
            holders.setdefault(store_id, dormant)  # type: ignore[arg-type]  # what recovery asks of a queue
        counts = store.store.recover(holders)
        log.info("vhost %r: recovered %d messages from its log", vhost, counts["messages"])

    async def demote(self, vhost: str) -> None:
        """This node no longer leads the vhost: confirm nothing more, stop streaming. One
        at a time per vhost: a second caller waits for the first to have finished (a
        deleted vhost's copy is removed only after its store is closed)."""
        task = self._demoting.get(vhost)
        if task is None:
            task = self._demoting[vhost] = asyncio.ensure_future(self._demote(vhost))
            task.add_done_callback(lambda _t: self._demoting.pop(vhost, None))
        await asyncio.shield(task)

    async def _demote(self, vhost: str) -> None:
        self.serving.discard(vhost)
        self.node.broker.vhost_served(vhost)  # its shovels stop here
        leader = self.leaders.pop(vhost, None)
        store = self.stores.pop(vhost, None)
        if leader is not None:
            leader.depose(leader.epoch + 1, self.node.name)
            await leader.stop()
        if store is not None:
            vhost_obj = self.broker.vhosts.get(vhost)
            if vhost_obj is not None and vhost_obj.replicated is store:
                vhost_obj.replicated = NOT_REPLICATED
                vhost_obj.message_store = self.broker.store
            await store.close_replicated()
            for queue in vhost_obj.queues.values() if vhost_obj is not None else ():
                if isinstance(queue, Stream):  # its files: a working copy, rebuilt if we lead again
                    queue.close()
            for schedule in vhost_obj.stored_schedules() if vhost_obj is not None else ():
                schedule.forget()  # the next leader routes them: none from here

    # -- hooks from the broker (persistence) ------------------------------------------------

    def queue_created(self, queue: Queue) -> None:
        """A durable queue in a vhost led here: it lives in the vhost's store, with an id
        from the vhost's log."""
        store = self.stores.get(queue.vhost.name)
        if store is not None:
            queue.store = store.store
            queue.store_id = store.new_queue_id()
            store.definitions_changed()

    def definitions_changed(self, vhost: str) -> None:
        store = self.stores.get(vhost)
        if store is not None:
            store.definitions_changed()


async def _refuses(address: tuple[str, int]) -> bool:
    """Nothing listens at `address`: the kernel refused the connection (a process that is
    alive, even frozen, accepts; an unreachable machine does not answer: False)."""
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(*address), 1.0)
    except ConnectionRefusedError:
        return True
    except (TimeoutError, OSError):
        return False
    writer.close()
    return False
