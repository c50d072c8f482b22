"""A clustered vhost's message store on its leader, in process, without a cluster: a plain
MessageStore whose Durability is the vhost's replicated log (broker/cluster/replicated_store.py)
over a real ReplicationLeader and a real log on disk. The channel is the one stand-in: it
records what the store tells it."""

from __future__ import annotations

import asyncio

import pytest
from support.waiting import until_async

from roarmq.broker.cluster.replicated_store import ReplicatedVhostStore
from roarmq.broker.core.message import Message
from roarmq.broker.replog.records import SegmentRecordStore
from roarmq.broker.replog.replication import ReplicationLeader
from roarmq.broker.store.messages import decode_mark, decode_returned
from roarmq.broker.store.record_tags import ACK_TAG, DEFINITIONS_TAG, PUBLISH_TAG, RETURNED_TAG
from roarmq.broker.store.segments import LogFailed
from roarmq.protocol.frames import ContentHeader

EMPTY_PROPERTIES = b"\x00\x00"


class Channel:
    """What a store tells a publisher's channel, in order."""

    def __init__(self) -> None:
        self.told: list[tuple[str, int]] = []
        self.conn = self

    def confirm_later(self, seq: int) -> None:
        self.told.append(("waiting", seq))

    def disk_confirmed(self, seq: int) -> None:
        self.told.append(("ack", seq))

    def disk_failed(self, seq: int) -> None:
        self.told.append(("nack", seq))

    def flush_confirms(self) -> None:
        pass

    def flush(self) -> None:
        pass


class DurableQueue:
    """What the message store reads of a durable queue: its id, and its TTL (None)."""

    message_ttl = None

    def __init__(self, store_id: int) -> None:
        self.store_id = store_id


class RecoveringQueue(DurableQueue):
    """A durable queue a recovery hands its messages to: what it was told of each."""

    def __init__(self, store_id: int) -> None:
        super().__init__(store_id)
        self.restored_with: list[tuple[int, bool, tuple[int, int] | None]] = []

    def restore_stored(self, msg_id, size, priority, ttl, redelivered, entered, returned=None):
        back = (returned.count, returned.ready_at_ms) if returned is not None else None
        self.restored_with.append((msg_id, redelivered, back))

    def restored(self) -> None:
        pass


def message(body: bytes) -> Message:
    return Message("", "q", ContentHeader(60, len(body), EMPTY_PROPERTIES), body)


@pytest.fixture
async def vhost_log(tmp_path):
    records = SegmentRecordStore(tmp_path / "log")
    leader = ReplicationLeader("/", 7, records, node="n1", min_copies=1)
    allowed = {"confirm": True}
    store = ReplicatedVhostStore(
        tmp_path / "messages",
        replication=leader,
        may_confirm=lambda: allowed["confirm"],
        snapshot=lambda: {"exchanges": [], "queues": [], "bindings": []},
        loop=asyncio.get_running_loop(),
    )
    store.allowed = allowed  # type: ignore[attr-defined]  # the test's fencing switch
    try:
        yield store
    finally:
        await leader.stop()
        records.close()


async def test_a_publish_is_confirmed_once_the_log_is_durable_and_while_it_may_confirm(vhost_log):
    store, leader = vhost_log.store, vhost_log.replication
    channel, queue = Channel(), DurableQueue(1)
    vhost_log.allowed["confirm"] = False  # fenced: durable is not enough
    token = store.persist(message(b"one"), [queue], False)
    assert type(token) is int and token == leader.store.last_offset  # the log offset itself
    store.confirm_after(token, channel, 1)
    assert await until_async(lambda: leader.confirmed_offset() >= token, 10)
    await asyncio.sleep(0.05)
    assert channel.told == [("waiting", 1)] and not store.durable(token)
    vhost_log.allowed["confirm"] = True  # the lease renewed: the node releases what waits
    vhost_log.release_confirmed()
    assert channel.told == [("waiting", 1), ("ack", 1)] and store.durable(token)


async def test_a_deposed_leader_nacks_what_waits(vhost_log):
    store, leader = vhost_log.store, vhost_log.replication
    channel = Channel()
    vhost_log.allowed["confirm"] = False
    store.confirm_after(store.persist(message(b"two"), [DurableQueue(1)], False), channel, 5)
    leader.depose(8, "n2")
    assert channel.told == [("waiting", 5), ("nack", 5)]


async def test_too_few_copies_in_sync_refuses_the_message_before_it_is_stored(vhost_log):
    store, leader = vhost_log.store, vhost_log.replication
    leader.set_min_copies(2)  # no follower in sync: one copy, the leader's
    before = leader.store.last_offset
    with pytest.raises(LogFailed, match="min_in_sync=2"):
        store.persist(message(b"three"), [DurableQueue(1)], False)
    assert leader.store.last_offset == before and len(store.index) == 0


async def test_records_in_the_log_definitions_first_acks_but_no_delivered_markers(vhost_log):
    store, leader = vhost_log.store, vhost_log.replication
    vhost_log.definitions_changed()
    first, second = DurableQueue(1), DurableQueue(2)
    msg = message(b"four")
    store.persist(msg, [first, second], False)
    msg_id = msg.store_id
    store.delivered(first, msg_id)  # read by nobody on a clustered vhost: not written
    store.settled(first, msg_id)
    tags = [payload[:1] for _, payload in leader.store.read(1, 1 << 20)]
    assert tags == [DEFINITIONS_TAG, PUBLISH_TAG, ACK_TAG]
    assert decode_mark(leader.store.read(3, 1 << 20)[0][1]) == (ACK_TAG, 1, msg_id)
    # The other queue still holds it: a checkpoint must copy the ack with the message.
    assert vhost_log.live_bytes() == store.index.bytes > 0
    store.settled(second, msg_id)
    assert len(store.index) == 0 and store.index.bytes == 0 and vhost_log.live_bytes() == 0


async def test_a_checkpoint_copies_the_latest_returned_record_and_the_next_leader_reads_it(
    vhost_log, tmp_path
):
    """A quorum queue's delivery count and delayed retry (returned records) are records of
    the vhost's log: a checkpoint copies each holding queue's latest (a queue that acked
    the message has none left), so a leader recovering from the log trimmed at the
    checkpoint still knows them."""
    store, leader = vhost_log.store, vhost_log.replication
    first, second = DurableQueue(1), DurableQueue(2)
    msg = message(b"five")
    store.persist(msg, [first, second], False)
    msg_id = msg.store_id
    store.returned(first, msg_id, 1, 0)
    store.returned(first, msg_id, 2, 1_700_000_123_456)
    store.returned(second, msg_id, 1, 0)
    store.settled(second, msg_id)
    base = leader.store.last_offset + 1
    assert await vhost_log.checkpoint()
    copied = [payload for _, payload in leader.store.read(base, 1 << 30)]
    returned = [decode_returned(p) for p in copied if p[:1] == RETURNED_TAG]
    assert returned == [(1, msg_id, 2, 1_700_000_123_456)]
    trimmed = SegmentRecordStore(tmp_path / "trimmed")  # the log from the checkpoint on
    trimmed.reset(base)
    for offset, payload in leader.store.read(base, 1 << 30):
        trimmed.append(offset, payload)
    next_leader = ReplicationLeader("/", 8, trimmed, node="n2", min_copies=1)
    try:
        next_store = ReplicatedVhostStore(
            tmp_path / "next",
            replication=next_leader,
            may_confirm=lambda: True,
            snapshot=lambda: {"exchanges": [], "queues": [], "bindings": []},
            loop=asyncio.get_running_loop(),
        )
        queues = {1: RecoveringQueue(1), 2: RecoveringQueue(2)}
        next_store.store.recover(queues)  # type: ignore[arg-type]  # what recovery reads
        assert queues[1].restored_with == [(msg_id, True, (2, 1_700_000_123_456))]
        assert queues[2].restored_with == []
    finally:
        await next_leader.stop()
        trimmed.close()
