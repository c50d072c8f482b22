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
from roarmq.broker.store.messages import decode_mark
from roarmq.broker.store.record_tags import ACK_TAG, DEFINITIONS_TAG, PUBLISH_TAG
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
