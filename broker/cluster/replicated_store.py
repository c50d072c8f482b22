"""Message stores of a cluster node: one per clustered vhost it leads, its records replicated.

Shape (docs/cluster.md, "Replicated messages"):

* The vhost's **replicated log** (`SegmentRecordStore` in ``data/vhosts/<vhost>/log``) is
  the durable truth on every member. Its payloads are exactly the MessageStore's records
  (P, A, D; messages.py) plus definition snapshots (J; replicated_definitions.py).
* On the leader, `ReplicatedMessageStore` is an ordinary MessageStore (in
  ``data/vhosts/<vhost>/messages``, a working copy) that also appends every record it
  writes to the vhost's `ReplicationLeader`. A publish is confirmed when the replication's
  `confirmed_offset()` covers it (the leader's fsync of the log and every in-sync member's
  ack: invariant 1), not at the working copy's fsync.
* When a node becomes leader, the working copy is rebuilt from the replicated log
  (`rebuild_message_dir`) and read by the ordinary `MessageStore.recover`: a failover and a
  restart are the same recovery.
* `ClusterMessageStore` is the node-wide `broker.store` in cluster mode: callers that do not
  know the vhost's store (the channel's confirm and delivery paths) reach it through the
  token and the queue.

Bodies stay in memory (no paging) in these stores: `broker.store.body(msg)` is called
without the queue, so a paged-out body could not be found in the right store.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..store.messages import _MARK, MessageStore, confirm_waiting, encode_publish, nack_waiting
from ..store.segments import LogFailed, SegmentLog
from . import replicated_definitions as definitions

if TYPE_CHECKING:
    from ..channel import Channel
    from ..message import Message
    from ..queue import Queue
    from .replication import ReplicationLeader
    from .replication_store import SegmentRecordStore

log = logging.getLogger("roarmq.cluster")


class ReplicatedMessageStore(MessageStore):
    """A clustered vhost's message store on its leader (see module doc)."""

    def __init__(
        self,
        directory: str | Path,
        *,
        replication: ReplicationLeader,
        may_confirm: Callable[[], bool],
        min_in_sync: int,
        snapshot: Callable[[], dict],
        **options: Any,
    ) -> None:
        super().__init__(directory, **options)
        self.replication = replication
        self.may_confirm = may_confirm
        self.min_in_sync = min_in_sync
        self.snapshot = snapshot
        self.next_queue_id = 1
        self.definitions_dirty = False
        self._replicated_waiting: deque[tuple[int, Channel, int]] = deque()
        self._flusher: asyncio.Task[None] | None = None
        replication.on_confirmed.append(lambda _offset: self.release_confirmed())
        replication.on_deposed.append(lambda _epoch, _node: self.nack_waiting("deposed"))

    # -- writes ---------------------------------------------------------------------------

    def persist(self, msg: Message, queues: list[Queue], page_out: bool) -> Any:
        """Append the publish record here and to the replicated log; the token names the
        log offset whose confirmation confirms it. Refused (LogFailed: the channel nacks)
        while fewer than `min_in_sync` copies are in sync."""
        if 1 + len(self.replication.in_sync) < self.min_in_sync:
            raise LogFailed(f"fewer than min_in_sync={self.min_in_sync} copies in sync")
        self.append_definitions_if_changed()
        msg_id = self.next_id
        self.next_id += 1
        payload = encode_publish(msg_id, [q.store_id for q in queues], msg, msg.body)
        loc, _ = self.log.append(payload)
        msg.store_id = msg_id
        self.index.add(msg_id, loc, len(queues))
        self._want_sync()
        return (self, self._replicate(payload))

    def _write_mark(self, kind: bytes, qid: int, msg_id: int, seg: int) -> None:
        super()._write_mark(kind, qid, msg_id, seg)
        self.append_definitions_if_changed()
        self._replicate(_MARK.pack(kind, qid, msg_id))

    def load(self, msg_id: int, body_max: int) -> Message:
        return super().load(msg_id, 1 << 62)  # bodies stay in memory (module doc)

    def _replicate(self, payload: bytes) -> int:
        offset = self.replication.append(payload)
        if self._flusher is None or self._flusher.done():
            self._flusher = self.loop.create_task(self._flush_log())
        return offset

    async def _flush_log(self) -> None:
        """Group commit of the replicated log: one fsync covers everything appended."""
        leader = self.replication
        try:
            while leader.store.last_offset > leader.durable:
                await leader.flush()
        except Exception as exc:  # the leader's own log failed: nothing more is confirmed
            log.error("vhost %r: replicated log fsync failed: %r", leader.vhost, exc)
            self.nack_waiting("log failed")

    # -- definitions ----------------------------------------------------------------------

    def new_queue_id(self) -> int:
        """A message-log id for a new durable queue, unique in this vhost's log."""
        qid = self.next_queue_id
        self.next_queue_id += 1
        return qid

    def definitions_changed(self) -> None:
        """A durable definition changes now (the vhost is about to change its memory): the
        snapshot goes into the log before the next record, or on the next loop turn."""
        if not self.definitions_dirty:
            self.definitions_dirty = True
            self.loop.call_soon(self.append_definitions_if_changed)

    def append_definitions_if_changed(self) -> None:
        if self.definitions_dirty:
            self.definitions_dirty = False
            self._replicate(definitions.encode(self.snapshot()))

    # -- confirms -------------------------------------------------------------------------

    def confirm_replicated(self, offset: int, channel: Channel, seq: int) -> None:
        channel.confirm_later(seq)
        self._replicated_waiting.append((offset, channel, seq))
        self.release_confirmed()

    def release_confirmed(self) -> None:
        """Confirm every publish the replication has confirmed, while we may (fencing)."""
        waiting = self._replicated_waiting
        if not waiting or not self.may_confirm():
            return
        confirm_waiting(waiting, self.replication.confirmed_offset())

    def nack_waiting(self, reason: str) -> None:
        """Nothing waiting will be confirmed by this leadership: nack it."""
        waiting, self._replicated_waiting = self._replicated_waiting, deque()
        if nack_waiting(waiting):
            log.warning("%d publishes nacked: %s", len(waiting), reason)

    async def close_replicated(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
        self.nack_waiting("leadership ended")
        self.close()


class ClusterMessageStore(MessageStore):
    """`broker.store` of a cluster node: dispatches to the vhost's store where the caller
    cannot name it (confirm by token, delivered markers by queue). Holds no clustered
    message itself."""

    def confirm_after(self, token: Any, channel: Channel, seq: int) -> None:
        if type(token) is tuple:
            token[0].confirm_replicated(token[1], channel, seq)
        else:
            super().confirm_after(token, channel, seq)

    def delivered(self, queue: Queue, msg_id: int) -> None:
        store = queue.store
        if store is self or store is None:
            super().delivered(queue, msg_id)
        else:
            store.delivered(queue, msg_id)


def rebuild_message_dir(records: SegmentRecordStore, directory: Path) -> dict | None:
    """Write the replicated log's message records into a fresh MessageStore directory (the
    input of the ordinary recovery); return the last definitions snapshot in the log."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    last_definitions = None
    with SegmentLog.open(directory) as out:
        offset = records.first_offset
        while offset <= records.last_offset:
            batch = records.read(offset, 4 << 20)
            for _, payload in batch:
                if payload[:1] == definitions.DEFINITIONS_TAG:
                    last_definitions = payload
                else:
                    out.append(payload)
            offset = batch[-1][0] + 1
        out.sync_now()
    return definitions.decode(last_definitions) if last_definitions is not None else None
