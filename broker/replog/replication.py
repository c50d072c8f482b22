"""The replication transport of one vhost's log: a leader streams, followers append and ack.

Design (docs/cluster.md; frames in wire.py):

* The log is a sequence of (offset, payload) records, offsets 1, 2, 3... per vhost. The
  leader's owner calls `ReplicationLeader.append(payload) -> offset`, makes its own log
  durable and says so with `local_durable(offset)` (or `await flush()`).
* A follower connects, says (vhost, node, epoch it knows, durable offset), and gets the
  records after its offset. Per follower the leader keeps one pump task: it reads a batch
  from the store, writes it as one frame, and awaits `drain()`, which blocks only while the
  socket's buffer is over `high_water`: a slow follower stops the reading for itself only.
* A follower appends a whole batch, fsyncs once (group commit: batches arriving during an
  fsync go out in the next one) and acks (epoch, durable offset).
* `confirmed_offset()` = min(leader's durable offset, every in-sync member's acked offset)
  (invariant 1), and it moves only while the set holds `min_copies` copies, the leader's
  included (invariant 9; fewer: `on_too_few`, and the owner nacks what waits). It never
  moves past a member that is still in the set: the owner removes a member only after
  `coordination.shrink_isr` succeeded (invariant 2; `shrink_then_forget`).
* A member's acked offset is what it acks on its current connection, starting with what
  its HELLO says it holds durably, never a remembered maximum; and it counts only from the
  copy of the log the member was admitted with (`copies`, its HELLO's `copy`): a wiped,
  reset or rolled-back copy under an in-sync name is reported and leaves the set
  (invariant 8).
* Lag: a member that has not acked an offset `replica_lag_ms` after the leader made it
  durable is reported once through `on_lagging(node)`; a follower outside the set that has
  acked up to the leader's durable offset through `on_caught_up(node)`, and so is a member
  whose shrink etcd did not answer (etcd may have applied it: `report_again`).
* Epochs (invariant 4): a follower that knows a higher epoch deposes the leader
  (`on_deposed(epoch, node)`, after which nothing more is confirmed); a follower refuses a
  leader with a lower epoch than it knows.
* Catch-up from a compacted leader: if a follower's offset is below what the leader still
  holds (or above its head: a divergent tail), the leader sends RESET(start) and streams
  from `start`. `snapshot_start()` is the hook for a real snapshot later.

* A diverged tail (Kafka's KIP-101, KIP-279): a follower may hold records a deposed leader
  wrote that the new leader never had, even at the same length, and after two leader
  changes in a row the parting may lie inside an older epoch than its newest. Its HELLO
  sends its epoch history; the leader finds the first offset where the two histories name
  different epochs (`agreed_offset`, invariant 10) and, if the follower holds more,
  answers TRUNCATE(last) before the stream.
* Checkpoints (records.py): once every in-sync member holds a checkpoint record,
  the leader trims below its base; a follower trims once it holds one durably.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ..ops.tasks import cancel_and_wait
from ..store.segments import LogFailed
from . import wire
from .records import RecordStore, agreed_offset

log = logging.getLogger("roarmq.cluster.replication")

#: Bytes of the newest records a leader keeps in memory to stream from (per vhost).
TAIL_BYTES = 4 << 20

LOST_CONNECTION = (ConnectionError, asyncio.IncompleteReadError, wire.ProtocolError, OSError)


@dataclass(eq=False)
class _Follower:
    """The leader's view of one follower (kept across its reconnections)."""

    node: str
    acked: int = 0  # what it acked on its current connection (never a remembered maximum)
    copy: str = ""  # the identity of its copy of the log, from its HELLO
    lag_reported: bool = False
    caught_up_reported: bool = False
    #: A shrink of it went unanswered (`report_again`): etcd may have applied it all the
    #: same (a txn times out after it was sent), so etcd's set may hold it out while this
    #: leader still counts it in. Cleared by the next answered change either way.
    shrink_unanswered: bool = False
    writer: asyncio.StreamWriter | None = None
    next_offset: int = 1
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    #: When it last acked (or said HELLO), and when a frame last went to it (monotonic).
    heard_at: float = field(default_factory=time.monotonic)
    sent_at: float = field(default_factory=time.monotonic)


class ReplicationLeader:
    """Serves one vhost's log to its followers at one epoch (see module doc)."""

    def __init__(
        self,
        vhost: str,
        epoch: int,
        store: RecordStore,
        *,
        node: str = "",
        in_sync: set[str] | frozenset[str] = frozenset(),
        copies: dict[str, str] | None = None,
        min_copies: int = 1,
        replica_lag_ms: float = 10_000,
        batch_bytes: int = 256 << 10,
        high_water: int = 1 << 20,
    ) -> None:
        self.vhost = vhost
        self.epoch = epoch
        #: The etcd leadership this replication serves (the leader key's create revision,
        #: which etcd's guarded txns compare): the epoch itself unless etcd was restored
        #: to an older revision (coordination.py, "terms").
        self.leadership = epoch
        self.store = store
        self.node = node
        self.in_sync: set[str] = set(in_sync) - {node}  # followers; the leader is implicit
        #: The copy of the log each in-sync follower was admitted with (etcd's pins): acks
        #: from another copy under the same name (a replaced disk) never count.
        self.copies: dict[str, str] = dict(copies or {})
        #: Caught-up followers whose entry into the in-sync set is proposed to etcd, with
        #: the copy proposed (`propose_join`). etcd lists one in sync as soon as it applies
        #: the txn, before its answer comes back here, and it may then lead: so confirms
        #: wait for it from the proposal on (Kafka's "maximal ISR"), while it does not count
        #: towards `min_copies` until etcd has answered. An unanswered proposal keeps it
        #: here (etcd may have applied it) until an answered change settles it.
        self.joining: dict[str, str] = {}
        #: Copies (the leader's included) a confirm needs when it is released.
        self.min_copies = min_copies
        #: How an in-sync follower's copy is pinned before its acks count (the owner writes
        #: it to etcd; None: pinned here at once, for a leader without an owner).
        self.pin_copy: Callable[[str, str], Awaitable[bool]] | None = None
        self.replica_lag_ms = replica_lag_ms
        self.batch_bytes = batch_bytes
        self.high_water = high_water
        self.durable = store.durable_offset
        self.deposed_by: int | None = None
        self.on_lagging: list[Callable[[str], object]] = []
        self.on_caught_up: list[Callable[[str], object]] = []
        self.on_deposed: list[Callable[[int, str], object]] = []
        self.on_confirmed: list[Callable[[int], object]] = []
        #: The in-sync set fell below `min_copies`: what waits will not be confirmed.
        self.on_too_few: list[Callable[[], object]] = []
        #: A follower's connection ended (the owner may find its process gone).
        self.on_follower_gone: list[Callable[[str], object]] = []
        self._followers: dict[str, _Follower] = {}
        self._durable_at: list[tuple[int, float]] = []  # (offset, when durable), by offset
        self._confirmed = 0
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._tie = itertools.count()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        #: The newest records appended, from offset `_tail_first` (TAIL_BYTES or so): a
        #: follower keeping up is streamed from here, not read back from the log's files.
        self._tail: list[bytes] = []
        self._tail_first = store.last_offset + 1
        self._tail_bytes = 0
        self._lag_task: asyncio.Task[None] | None = None
        self._recompute()

    # -- life --------------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen on the replication port (0: any free one); return the port."""
        self._server = await asyncio.start_server(self._serve, host, port)
        self._lag_task = asyncio.create_task(self._watch_lag())
        return self._server.sockets[0].getsockname()[1]

    def start_routed(self) -> None:
        """Serve through a node's shared replication listener (`serve`) instead of a port
        of its own: only the lag watch runs here."""
        self._lag_task = asyncio.create_task(self._watch_lag())

    async def serve(
        self, hello: dict, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """One follower's session whose HELLO the node's listener already read (routed here
        by its vhost)."""
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._session(reader, writer, hello)
        except LOST_CONNECTION as exc:
            log.info("vhost %r: follower connection ended: %r", self.vhost, exc)
        except asyncio.CancelledError:
            pass  # stop(): the listener's task ends quietly (asyncio logs a cancelled one)
        finally:
            self._tasks.discard(task)
            _close(writer)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in [*self._tasks, self._lag_task]:
            if task is not None:
                await cancel_and_wait(task)
        for follower in self._followers.values():
            _close(follower.writer)
        if self._server is not None:
            await self._server.wait_closed()

    # -- the owner's side --------------------------------------------------------------------

    def append(self, payload: bytes) -> int:
        """Add a record to the log (not yet durable anywhere); return its offset."""
        offset = self.store.last_offset + 1
        self.store.append(offset, payload)
        self._tail.append(payload)
        self._tail_bytes += len(payload)
        if self._tail_bytes > 2 * TAIL_BYTES:
            self._trim_tail()
        for follower in self._followers.values():
            follower.wake.set()
        return offset

    def _trim_tail(self) -> None:
        """Keep about TAIL_BYTES of the newest records (trimmed in bulk: amortized)."""
        tail, kept, size = self._tail, 0, 0
        for payload in reversed(tail):
            if size >= TAIL_BYTES:
                break
            size += len(payload)
            kept += 1
        cut = len(tail) - kept
        self._tail = tail[cut:]
        self._tail_first += cut
        self._tail_bytes = size

    def _read(self, start: int) -> list[tuple[int, bytes]]:
        """A batch from `start`: from the in-memory tail when it still holds it."""
        i = start - self._tail_first
        tail = self._tail
        if 0 <= i < len(tail):
            out, size = [], 0
            for payload in tail[i:]:
                out.append((start, payload))
                start += 1
                size += len(payload)
                if size >= self.batch_bytes:
                    break
            return out
        return self.store.read(start, self.batch_bytes)

    def local_durable(self, offset: int) -> None:
        """The owner made the leader's own log durable up to `offset`."""
        if offset <= self.durable:
            return
        self.durable = offset
        self._durable_at.append((offset, time.monotonic()))
        self._check_caught_up_all()
        self._recompute()

    async def flush(self) -> int:
        """Make the store durable (one fsync, in a thread) and advance `local_durable`."""
        durable = await asyncio.to_thread(self.store.sync)
        self.local_durable(durable)
        return durable

    def confirmed_offset(self) -> int:
        return self._confirmed

    async def wait_confirmed(self, offset: int) -> None:
        """Return once `offset` is confirmed (durable on the leader and every in-sync member)."""
        if offset <= self._confirmed:
            return
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (offset, next(self._tie), future))
        await future

    def counts(self, node: str) -> bool:
        """Whether confirms wait for `node`: in the in-sync set, or proposed to it."""
        return node in self.in_sync or node in self.joining

    def remove_from_isr(self, node: str) -> None:
        """The owner's etcd txn removed `node` (and its pin) from the in-sync set: stop
        waiting for it. Too few copies left: what waits is nacked (`on_too_few`)."""
        self.in_sync.discard(node)
        self.copies.pop(node, None)
        self.joining.pop(node, None)
        follower = self._followers.get(node)
        if follower is not None:
            follower.caught_up_reported = False
            follower.shrink_unanswered = False
        self._recompute()
        if not self.enough_copies():
            _run_all(self.on_too_few)
        self._check_caught_up_all()

    def propose_join(self, node: str) -> str:
        """The owner is about to ask etcd to add caught-up `node` to the in-sync set: from
        now on confirms wait for it too (`joining`). Called when it is reported caught up,
        before anything else runs: a record confirmed in between without it would be
        missing from a member etcd may let lead. Returns the copy proposed ("": it names
        none; nothing is proposed)."""
        copy = self.copy_of(node)
        if copy and node not in self.in_sync:
            self.joining[node] = copy
            self._follower(node).lag_reported = False  # a lag now is reported again
        return copy

    def join_refused(self, node: str) -> None:
        """etcd answered that `node` did not enter the in-sync set: stop waiting for it."""
        if node not in self.in_sync and self.joining.pop(node, None) is not None:
            self._recompute()

    def add_to_isr(self, node: str, copy: str) -> None:
        """The owner's etcd txn added `node` with its `copy` to the in-sync set: confirms
        wait for it."""
        self.joining.pop(node, None)
        self.in_sync.add(node)
        self.copies[node] = copy
        follower = self._follower(node)
        follower.lag_reported = False
        follower.shrink_unanswered = False
        self._recompute()

    def pinned(self, node: str, copy: str) -> None:
        """The owner recorded that in-sync `node` holds `copy`: its acks count from now."""
        if node in self.in_sync and self.copies.get(node) is None:
            self.copies[node] = copy
            self._recompute()

    def member_status(self, members: list[str]) -> list[dict[str, object]]:
        """This leader's own view of each other member (not etcd's): in the set or not,
        connected, what it holds durably of this copy of the log, how far behind the
        leader's durable offset that is, and how long since it was last heard from."""
        now = time.monotonic()
        rows: list[dict[str, object]] = []
        for node in members:
            if node == self.node:
                continue
            follower = self._followers.get(node)
            held = follower.acked if follower is not None else 0
            rows.append(
                {
                    "node": node,
                    "in_sync": node in self.in_sync,
                    "connected": follower is not None and follower.writer is not None,
                    "holds": held,
                    "behind": max(0, self.durable - held),
                    "last_heard_ms": (
                        round((now - follower.heard_at) * 1000) if follower is not None else None
                    ),
                }
            )
        return rows

    def copy_of(self, node: str) -> str:
        """The copy of the log `node` last said it holds ("": not connected yet)."""
        follower = self._followers.get(node)
        return follower.copy if follower is not None else ""

    def set_min_copies(self, copies: int) -> None:
        """The owner's `min_in_sync` for this vhost changed (its members did)."""
        if copies != self.min_copies:
            self.min_copies = copies
            self._recompute()
            if not self.enough_copies():
                _run_all(self.on_too_few)

    def enough_copies(self) -> bool:
        """Whether a confirm may be released now: the in-sync set (this leader with it)
        holds at least `min_copies` copies (Kafka's min.insync.replicas, checked when a
        confirm is released as when a record is appended)."""
        return 1 + len(self.in_sync) >= self.min_copies

    def holds_confirmed(self, node: str) -> int:
        """The offset up to which `node`'s pinned copy holds the log durably, as it acked
        on its current connection (0: another copy, or none yet)."""
        follower = self._followers.get(node)
        admitted = self.copies.get(node) if node in self.in_sync else self.joining.get(node)
        if follower is None or not follower.copy or admitted != follower.copy:
            return 0
        return follower.acked

    def acked(self, node: str) -> int:
        follower = self._followers.get(node)
        return follower.acked if follower else 0

    # -- confirm rule ------------------------------------------------------------------------

    def _recompute(self) -> None:
        if self.deposed_by is not None:
            return  # a deposed leader confirms nothing more (invariant 4)
        if not self.enough_copies():
            return
        confirmed = self.durable
        for node in itertools.chain(self.in_sync, self.joining):
            confirmed = min(confirmed, self.holds_confirmed(node))
        if confirmed <= self._confirmed:
            return
        self._confirmed = confirmed
        self._prune_durable_times()
        self.store.trim_checkpointed(confirmed)  # every in-sync member holds those
        while self._waiters and self._waiters[0][0] <= confirmed:
            future = heapq.heappop(self._waiters)[2]
            if not future.done():
                future.set_result(None)
        _run_all(self.on_confirmed, confirmed)

    def _prune_durable_times(self) -> None:
        """Drop the times of offsets every member has acked: lag is only measured beyond."""
        counted = itertools.chain(self.in_sync, self.joining)
        floor = min([self.holds_confirmed(n) for n in counted], default=self.durable)
        cut = bisect.bisect_right(self._durable_at, (floor, float("inf")))
        if cut:
            del self._durable_at[:cut]

    # -- lag and catch-up --------------------------------------------------------------------

    async def _watch_lag(self) -> None:
        period = max(0.005, self.replica_lag_ms / 4000)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            self._heartbeat(now)
            self._check_lag(now)

    def _heartbeat(self, now: float) -> None:
        """An empty batch to each follower that got nothing for a quarter of the lag limit:
        it acks it, so that an idle vhost still hears from every member (`_check_lag`)."""
        quiet = self.lag_limit / 4
        for follower in self._followers.values():
            writer = follower.writer
            if writer is not None and now - follower.sent_at > quiet and not writer.is_closing():
                follower.sent_at = now
                writer.write(wire.records_frame(self.epoch, ()))

    def _check_lag(self, now: float) -> None:
        """An in-sync member leaves when it has not acked an offset `replica_lag_ms` after
        the leader made it durable, or has not been heard from at all for that long (on an
        idle vhost too: a powered-off follower is not in sync)."""
        for node in [*self.in_sync, *self.joining]:
            follower = self._follower(node)
            if follower.lag_reported:
                continue
            held = self.holds_confirmed(node)
            i = bisect.bisect_right(self._durable_at, (held, float("inf")))
            if i < len(self._durable_at) and now - self._durable_at[i][1] > self.lag_limit:
                why = f"lags (holds {held})"
            elif now - follower.heard_at > self.lag_limit:
                why = f"silent for {now - follower.heard_at:.1f} s"
            else:
                continue
            follower.lag_reported = True
            log.warning("vhost %r: follower %s %s", self.vhost, node, why)
            _run_all(self.on_lagging, node)

    def report_again(self, node: str) -> None:
        """The owner could not act on `node`'s report (etcd did not answer): report it
        again at the next lag check if it is still lagging, silent or gone.

        An unanswered txn may still have been applied (etcd was slow, not down: its answer
        came after the client had given up), so etcd's set may hold `node` out while this
        set keeps it. If `node` does not lag any more, no lag check reports it again, and
        a member counted in here is never reported caught up: it stayed out of etcd's set
        for good. So once it has caught up it is reported caught up as well
        (`on_caught_up`: the owner's expansion puts it back in etcd's set, or finds it
        there), and the first answered change, either way, settles which set it is in."""
        if self.counts(node):
            follower = self._follower(node)
            follower.lag_reported = False
            follower.shrink_unanswered = True
            follower.caught_up_reported = False

    def report_caught_up_again(self, node: str) -> None:
        """The owner could not act on `node`'s catching up (etcd did not answer): report it
        again at its next ack (heartbeats bring one on an idle vhost) if it is still out
        (or may be out in etcd: `report_again`)."""
        follower = self._followers.get(node)
        if follower is not None and (node not in self.in_sync or follower.shrink_unanswered):
            follower.caught_up_reported = False

    def report_lagging(self, node: str) -> None:
        """Take `node` out of the in-sync set through the owner now (`on_lagging`), without
        waiting `replica_lag_ms`: the owner knows it is gone (its lease expired, or its
        process: its replication port refuses connections)."""
        follower = self._follower(node)
        if self.counts(node) and not follower.lag_reported:
            follower.lag_reported = True
            log.warning("vhost %r: in-sync member %s is not running", self.vhost, node)
            _run_all(self.on_lagging, node)

    @property
    def lag_limit(self) -> float:
        return self.replica_lag_ms / 1000

    def members_changed(self) -> None:
        """The vhost's members changed: a caught-up follower that was not a member when it
        was reported (it stayed out) is reported again, now that it may be one."""
        for follower in self._followers.values():
            if follower.node not in self.in_sync or follower.shrink_unanswered:
                follower.caught_up_reported = False
        self._check_caught_up_all()

    def _check_caught_up_all(self) -> None:
        for follower in self._followers.values():
            self._check_caught_up(follower)

    def _check_caught_up(self, follower: _Follower) -> None:
        if (
            (follower.node not in self.in_sync or follower.shrink_unanswered)
            and not follower.caught_up_reported
            and follower.writer is not None
            and follower.acked >= self.durable
        ):
            follower.caught_up_reported = True
            _run_all(self.on_caught_up, follower.node)

    # -- one follower's connection -----------------------------------------------------------

    def _follower(self, node: str) -> _Follower:
        follower = self._followers.get(node)
        if follower is None:
            follower = self._followers[node] = _Follower(node)
        return follower

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._session(reader, writer)
        except LOST_CONNECTION as exc:
            log.info("vhost %r: follower connection ended: %r", self.vhost, exc)
        finally:
            self._tasks.discard(task)
            _close(writer)

    async def _session(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        hello: dict | None = None,
    ) -> None:
        if hello is None:
            hello = await _expect_control(reader, wire.HELLO)
        node, epoch, offset = str(hello["node"]), int(hello["epoch"]), int(hello["offset"])
        copy = str(hello.get("copy", ""))
        if hello.get("vhost") != self.vhost or self.deposed_by is not None:
            writer.write(wire.control(wire.REFUSE, {"reason": "not leading", "epoch": self.epoch}))
            return
        unsupported = wire.unsupported(hello)
        if unsupported is not None:
            log.error("vhost %r: follower %s refused: %s", self.vhost, node, unsupported)
            writer.write(wire.control(wire.REFUSE, {"reason": unsupported, "epoch": self.epoch}))
            return
        newest = max([epoch, *(int(e) for _, e in hello.get("epochs", ()))])
        if newest > self.epoch:  # it knows, or holds records of, a later term than ours
            writer.write(wire.control(wire.REFUSE, {"reason": "deposed", "epoch": self.epoch}))
            self.depose(newest, node)
            return
        follower = self._follower(node)
        _close(follower.writer)  # a reconnection replaces the old connection
        follower.writer = writer
        # What it holds is what it says now: a wiped, restored or reset copy is not what
        # this name acked before.
        follower.acked = 0
        follower.copy = copy
        follower.heard_at = time.monotonic()
        if node in self.in_sync:
            self._check_copy(follower)
        writer.transport.set_write_buffer_limits(high=self.high_water)
        welcome = {"epoch": self.epoch, "start": offset + 1, **wire.VERSIONS}
        writer.write(wire.control(wire.WELCOME, welcome))
        agreed = self._agreed(hello, offset)
        if self._needs_snapshot(agreed):
            self._start_snapshot(follower)
        else:
            if agreed < offset:
                writer.write(wire.pair_frame(wire.TRUNCATE, self.epoch, agreed))
                log.warning(
                    "vhost %r: follower %s diverged after %d (it held %d): truncated",
                    self.vhost,
                    node,
                    agreed,
                    offset,
                )
            follower.next_offset = agreed + 1
            if self.counts(node) and agreed < self._confirmed:
                log.warning(
                    "vhost %r: in-sync %s holds %d < confirmed %d: it leaves the set",
                    self.vhost,
                    node,
                    agreed,
                    self._confirmed,
                )
                self.report_lagging(node)
            self._on_ack(follower, agreed)
        pump = asyncio.create_task(self._pump(follower, writer))
        try:
            await self._read_acks(follower, reader, writer)
        finally:
            await cancel_and_wait(pump, *LOST_CONNECTION)
            if follower.writer is writer:
                follower.writer = None
                if self.deposed_by is None:
                    _run_all(self.on_follower_gone, follower.node)

    def _agreed(self, hello: dict, offset: int) -> int:
        """Where the follower's log stops agreeing with ours: from its whole epoch history
        (KIP-279, `agreed_offset`), or from its newest epoch alone for a peer that sends
        no history."""
        if offset <= 0:
            return offset
        if "epochs" in hello:
            theirs = [(int(start), int(epoch)) for start, epoch in hello["epochs"]]
            return agreed_offset(self.store.epoch_starts(), self.store.last_offset, theirs, offset)
        if "last_epoch" in hello:
            return min(offset, self.store.end_of_epoch(int(hello["last_epoch"])))
        return offset

    def _check_copy(self, follower: _Follower) -> None:
        """An in-sync follower connects: its copy must be the one pinned for it. Another
        copy under its name (a replaced disk, a reset) leaves the set; an unpinned one (a
        member since the vhost was placed, its log empty then) is pinned before its acks
        count."""
        node, pinned = follower.node, self.copies.get(follower.node)
        if pinned is None and follower.copy:
            if self.pin_copy is None:
                self.pinned(node, follower.copy)
            else:
                self._pin_later(node, follower.copy)
        elif pinned != follower.copy:
            log.warning(
                "vhost %r: %s connects with a new copy of the log: it leaves the in-sync set",
                self.vhost,
                node,
            )
            self.report_lagging(node)

    def _pin_later(self, node: str, copy: str) -> None:
        async def pin() -> None:
            assert self.pin_copy is not None
            if await self.pin_copy(node, copy):
                self.pinned(node, copy)

        task = asyncio.get_running_loop().create_task(pin())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _needs_snapshot(self, offset: int) -> bool:
        """The follower's offset is older than what we hold, or beyond our head (divergent)."""
        return offset + 1 < self.store.first_offset or offset > self.store.last_offset

    def snapshot_start(self) -> int:
        """Where a snapshot starts. Here: every record still held. Next step: the live
        segments plus the definitions (override this and what `_pump` sends after RESET)."""
        return self.store.first_offset

    def _start_snapshot(self, follower: _Follower) -> None:
        start = self.snapshot_start()
        assert follower.writer is not None
        follower.writer.write(wire.pair_frame(wire.RESET, self.epoch, start))
        follower.next_offset = start
        follower.acked = 0  # it holds nothing until it acks again
        if self.counts(follower.node):  # it is about to drop what it holds
            self.report_lagging(follower.node)
        log.info("vhost %r: follower %s gets a snapshot from %d", self.vhost, follower.node, start)

    async def _pump(self, follower: _Follower, writer: asyncio.StreamWriter) -> None:
        """Stream batches to one follower; blocks in drain() while its socket is full."""
        while True:
            if follower.next_offset < self.store.first_offset:
                self._start_snapshot(follower)  # compacted under a slow follower
            if follower.next_offset > self.store.last_offset:
                follower.wake.clear()
                await follower.wake.wait()
                continue
            batch = self._read(follower.next_offset)
            writer.write(wire.records_frame(self.epoch, batch))
            follower.sent_at = time.monotonic()
            follower.next_offset = batch[-1][0] + 1
            await writer.drain()

    async def _read_acks(
        self, follower: _Follower, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            kind, body = await wire.read_frame(reader)
            if kind == wire.REFUSE:  # the follower knows a higher epoch than ours
                epoch = int(wire.decode_control(body).get("epoch", 0))
                if epoch > self.epoch:
                    self.depose(epoch, follower.node)
                return
            if kind != wire.ACK:
                raise wire.ProtocolError(f"unexpected frame {kind} from a follower")
            epoch, offset = wire.decode_pair(body)
            if epoch > self.epoch:
                self.depose(epoch, follower.node)
                return
            if epoch == self.epoch and follower.writer is writer:  # not a replaced session's
                follower.heard_at = time.monotonic()
                self._on_ack(follower, offset)

    def _on_ack(self, follower: _Follower, offset: int) -> None:
        if offset > follower.acked:
            follower.acked = offset
            if self.counts(follower.node):
                self._recompute()
        self._check_caught_up(follower)  # also on a reconnect that brings nothing new

    def depose(self, epoch: int, node: str) -> None:
        if self.deposed_by is not None:
            return
        self.deposed_by = epoch
        log.warning("vhost %r: %s knows epoch %d > ours %d", self.vhost, node, epoch, self.epoch)
        for follower in self._followers.values():
            _close(follower.writer)  # stop streaming: our records may not be the log any more
        _run_all(self.on_deposed, epoch, node)


class ReplicationFollower:
    """Keeps a copy of one vhost's log from its leader: connect, append, fsync, ack."""

    def __init__(
        self,
        vhost: str,
        leader: tuple[str, int],
        node: str,
        store: RecordStore,
        *,
        epoch: int = 0,
        backoff: tuple[float, float] = (0.05, 1.0),
        cookie: str = "",
    ) -> None:
        self.vhost = vhost
        self.cookie = cookie  # the cluster's shared secret, for a node's listener
        self.leader = leader
        self.node = node
        self.store = store
        self.epoch = epoch  # the highest epoch known; raised by WELCOME or by the owner
        self.backoff = backoff
        self.acked = 0
        self.failed: BaseException | None = None
        self.connected = asyncio.Event()
        #: When the leader was last heard from (a frame of its session, or it was named):
        #: a leader silent for two heartbeats is not handed clients (`ClusterNode`).
        self.heard_at = time.monotonic()
        self.on_stale_leader: list[Callable[[int], object]] = []
        self.on_refused: list[Callable[[str, int], object]] = []
        self.on_reset: list[Callable[[int], object]] = []
        #: (address, epoch): connecting to the leader was refused (its process is gone).
        self.on_leader_refused: list[Callable[[tuple[str, int], int], object]] = []
        self._task: asyncio.Task[None] | None = None
        self._dirty = asyncio.Event()
        self._writer: asyncio.StreamWriter | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        # `_task` is cleared first: a `follow` meanwhile must not start a session that
        # nobody will stop.
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    def observe_epoch(self, epoch: int) -> None:
        """The owner saw a higher epoch in etcd: from now on a lower one is refused."""
        self.epoch = max(self.epoch, epoch)

    def follow(self, leader: tuple[str, int], epoch: int) -> None:
        """The owner learnt (from etcd) who leads now: reconnect there at once."""
        self.leader, self.epoch = leader, max(self.epoch, epoch)
        self.heard_at = time.monotonic()
        if self._task is not None:
            self._task.cancel()
            self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        """Connect, stream, and reconnect with backoff when the leader goes away or refuses.

        A failed store (fsync error, disk full) ends the follower: it stops acking, so the
        leader reports it lagging and takes it out of the in-sync set."""
        delay = self.backoff[0]
        while True:
            try:
                if await self._connect_once():
                    delay = self.backoff[0]  # it streamed: the next break is a new one
            except LOST_CONNECTION as exc:
                log.info("vhost %r: replication from %s ended: %r", self.vhost, self.leader, exc)
                if isinstance(exc, ConnectionRefusedError):  # no process listens there
                    _run_all(self.on_leader_refused, self.leader, self.epoch)
            except Exception as exc:
                log.error("vhost %r: follower store failed, stopping: %r", self.vhost, exc)
                self.failed = exc
                return
            finally:
                self.connected.clear()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.backoff[1])

    async def _connect_once(self) -> bool:
        """One session; False when the leader refused us or we refused it."""
        reader, writer = await asyncio.open_connection(*self.leader)
        self._writer = writer
        syncer: asyncio.Task[None] | None = None
        try:
            offset = await asyncio.to_thread(self.store.sync)
            hello = {
                "vhost": self.vhost,
                "node": self.node,
                "epoch": self.epoch,
                "offset": offset,
                "last_epoch": self.store.last_epoch(),
                "epochs": self.store.epoch_starts(),
                "copy": self.store.copy_id,
                **wire.VERSIONS,
            }
            if self.cookie:
                hello["cookie"] = self.cookie
            writer.write(wire.control(wire.HELLO, hello))
            if not await self._welcomed(reader, writer):
                return False
            self.connected.set()
            syncer = asyncio.create_task(self._sync_and_ack(writer))
            await self._receive(reader, syncer)
            return True
        finally:
            # Closed first: the await below re-raises a cancellation of this task (stop()),
            # and a socket left open would keep the leader counting on a follower gone.
            _close(writer)
            if syncer is not None:
                await cancel_and_wait(syncer, *LOST_CONNECTION)

    async def _welcomed(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        kind, body = await wire.read_frame(reader)
        fields = wire.decode_control(body)
        epoch = int(fields.get("epoch", 0))
        if kind == wire.REFUSE:
            log.warning("vhost %r: leader refused us: %s", self.vhost, fields.get("reason"))
            _run_all(self.on_refused, str(fields.get("reason")), epoch)
            return False
        if kind != wire.WELCOME:
            raise wire.ProtocolError(f"expected WELCOME, got frame {kind}")
        unsupported = wire.unsupported(fields)
        if unsupported is not None:
            log.error("vhost %r: leader refused: %s", self.vhost, unsupported)
            _run_all(self.on_refused, unsupported, epoch)
            return False
        if epoch < self.epoch:
            self._refuse_stale(writer, epoch)
            return False
        self.epoch = epoch
        self.heard_at = time.monotonic()
        return True

    def _refuse_stale(self, writer: asyncio.StreamWriter | None, epoch: int) -> None:
        """Invariant 4: a leader below the epoch we know is deposed; take nothing from it."""
        log.warning("vhost %r: refusing leader at epoch %d < %d", self.vhost, epoch, self.epoch)
        if writer is not None and not writer.is_closing():
            writer.write(wire.control(wire.REFUSE, {"reason": "stale epoch", "epoch": self.epoch}))
        _run_all(self.on_stale_leader, epoch)

    async def _receive(self, reader: asyncio.StreamReader, syncer: asyncio.Task[None]) -> None:
        while True:
            kind, body = await wire.read_frame(reader)
            self.heard_at = time.monotonic()
            if syncer.done():
                syncer.result()  # the fsync failed: raise it (the connection is dropped)
            if kind == wire.RECORDS:
                epoch, records = wire.decode_records(body)
                self._check_epoch(epoch)
                for offset, payload in records:
                    if offset != self.store.last_offset + 1:
                        raise wire.ProtocolError(f"record {offset} after {self.store.last_offset}")
                    self.store.append(offset, payload)
            elif kind == wire.RESET:
                epoch, start = wire.decode_pair(body)
                self._check_epoch(epoch)
                self.store.reset(start)
                _run_all(self.on_reset, start)
                # A new copy now (reset renews its identity): connect again, so the leader
                # pins this copy, not the one the last HELLO named, when it is caught up.
                raise wire.ProtocolError(f"reset to {start}: reconnecting as a new copy")
            elif kind == wire.TRUNCATE:
                epoch, last = wire.decode_pair(body)
                self._check_epoch(epoch)
                log.warning("vhost %r: our records after %d diverged: dropped", self.vhost, last)
                self.store.truncate(last)
                if self.store.last_offset != last:  # it lost its checkpoint: start over
                    raise wire.ProtocolError(f"truncated below our checkpoint to {last}")
            else:
                raise wire.ProtocolError(f"unexpected frame {kind} from the leader")
            self._dirty.set()

    def _check_epoch(self, epoch: int) -> None:
        """Batches carry the session's epoch; one below what we know now (the owner raised
        it with `observe_epoch` mid-session) comes from a deposed leader: refuse it."""
        if epoch < self.epoch:
            self._refuse_stale(self._writer, epoch)
            raise wire.ProtocolError(f"stale leader epoch {epoch} < {self.epoch}")
        if epoch != self.epoch:
            raise wire.ProtocolError(f"record batch at epoch {epoch}, session at {self.epoch}")

    async def _sync_and_ack(self, writer: asyncio.StreamWriter) -> None:
        """One fsync per batch; batches that arrive during an fsync share the next one.

        The log's own writer thread does the fsync and answers through `sync_soon`: a
        thread-pool hop per batch (`to_thread(store.sync)`, a thread blocked on the writer)
        cost a follower about a third of its CPU."""
        loop = asyncio.get_running_loop()
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            synced: asyncio.Future[int] = loop.create_future()
            self.store.sync_soon(functools.partial(_settle_from_thread, loop, synced))
            durable = await synced
            self.store.trim_checkpointed(durable)
            self.acked = durable
            writer.write(wire.pair_frame(wire.ACK, self.epoch, durable))
            await writer.drain()


# -- small helpers ----------------------------------------------------------------------------


async def _expect_control(reader: asyncio.StreamReader, kind: int) -> dict:
    got, body = await wire.read_frame(reader)
    if got != kind:
        raise wire.ProtocolError(f"expected frame {kind}, got {got}")
    return wire.decode_control(body)


def _settle_from_thread(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[int],
    offset: int,
    error: BaseException | None,
) -> None:
    """The log's writer thread says the sync is done: settle `future` on its loop."""
    loop.call_soon_threadsafe(_settle, future, offset, error)


def _settle(future: asyncio.Future[int], offset: int, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:  # as `sync` raises it: the follower stops (no reconnecting)
        failed = LogFailed(f"segment log failed: {error}")
        failed.__cause__ = error
        future.set_exception(failed)
    else:
        future.set_result(offset)


def _close(writer: asyncio.StreamWriter | None) -> None:
    if writer is not None and not writer.is_closing():
        writer.close()


def _run_all(callbacks: list[Callable[..., object]], *args: object) -> None:
    for callback in list(callbacks):
        try:
            callback(*args)
        except Exception:
            log.exception("replication callback failed")
