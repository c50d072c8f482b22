"""The core <-> cluster seam (broker/cluster_hooks.py), in process and without a cluster.

Both sides answer every hook; and the core asks the hooks where it must: a durable change
is told to them, connection.open takes their refusal (530), their "down" (541), their
"wait" (held, then answered) and their hand-off, and a stream's files go where they say.
A fake `ClusterHooks` (the single node's answers, recording and overridable) stands in for
a cluster: what a real cluster answers is tests/cluster's."""

from __future__ import annotations

import asyncio
import inspect
import time
from pathlib import Path

import aio_pika
from support.rawclient import RawClient

from roarmq.broker.cluster.node import ClusterNode
from roarmq.broker.cluster.replicated_store import ReplicatedVhostStore
from roarmq.broker.cluster_hooks import (
    NOT_REPLICATED,
    ClusterHooks,
    SingleNode,
    VhostReplication,
)
from roarmq.protocol import spec


def _members(protocol: type) -> set[str]:
    own = {n for n, v in vars(protocol).items() if inspect.isfunction(v) or isinstance(v, property)}
    return (own | set(protocol.__annotations__)) - {"__init__"}


def _answers(side: type, member: str) -> bool:
    """A method or class attribute, or an attribute its instances are declared to have."""
    return hasattr(side, member) or member in getattr(side, "__annotations__", {})


def test_every_hook_is_answered_on_both_sides():
    hooks = _members(ClusterHooks)
    assert {"name", "refusal", "must_wait", "hand_off", "stream_home", "streams_fsync"} <= hooks
    for side in (SingleNode, ClusterNode):
        missing = {h for h in hooks if not _answers(side, h)}
        assert not missing, (side.__name__, missing)
    for side in (type(NOT_REPLICATED), ReplicatedVhostStore):
        missing = {h for h in _members(VhostReplication) if not _answers(side, h)}
        assert not missing, (side.__name__, missing)


class FakeCluster(SingleNode):
    """A single node's answers, recording what the core tells, with answers to set."""

    def __init__(self, broker, home: Path) -> None:  # type: ignore[no-untyped-def]
        super().__init__(broker)
        self.told: list[tuple[str, str]] = []
        self.home = home
        self.refuse: str | None = None
        self.down: str | None = None
        self.wait_until = 0.0
        self.handed: list[str] = []
        self.take_hand_off = False

    def definitions_changed(self, vhost: str) -> None:
        self.told.append(("definitions", vhost))

    def queue_created(self, queue) -> None:  # type: ignore[no-untyped-def]
        self.told.append(("queue", queue.name))

    def stream_home(self, vhost: str) -> Path:
        return self.home

    def vhost_down(self, vhost: str, user: str) -> str | None:
        return self.down

    def refusal(self, vhost: str) -> str | None:
        if self.must_wait(vhost):
            return "being recovered here"
        return self.refuse

    def must_wait(self, vhost: str) -> bool:
        return time.monotonic() < self.wait_until

    def hand_off(self, conn, vhost: str, refusal: str) -> bool:  # type: ignore[no-untyped-def]
        self.handed.append(vhost)
        return self.take_hand_off


async def test_durable_changes_are_told_to_the_seam(broker, tmp_path):
    fake = broker.broker.cluster = FakeCluster(broker.broker, tmp_path)
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{broker.port}/")
    async with conn:
        ch = await conn.channel()
        await ch.declare_queue("transient", durable=False)
        assert fake.told == []
        await ch.declare_queue("kept", durable=True)
        assert ("queue", "kept") in fake.told and ("definitions", "/") in fake.told
        fake.told.clear()
        await ch.declare_exchange("kept-x", durable=True)
        assert fake.told == [("definitions", "/")]


async def test_streams_live_where_the_seam_says(broker, tmp_path):
    home = tmp_path / "elsewhere"
    broker.broker.cluster = FakeCluster(broker.broker, home)
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{broker.port}/")
    async with conn:
        ch = await conn.channel()
        await ch.declare_queue("s", durable=True, arguments={"x-queue-type": "stream"})
        await ch.default_exchange.publish(aio_pika.Message(b"m"), routing_key="s")
    assert list((home / "streams").iterdir()), "no stream directory under the seam's home"


async def test_connection_open_takes_the_seams_answers(broker, tmp_path):
    fake = broker.broker.cluster = FakeCluster(broker.broker, tmp_path)

    # Refused and nobody to hand to: 530 with the seam's words.
    fake.refuse = "vhost '/' is led by node 'n2' at 192.0.2.1:5672"
    client = await RawClient.connect(broker.port, handshake=False)
    got = await client.handshake()
    assert isinstance(got, spec.ConnectionClose), got
    assert (got.reply_code, got.reply_text) == (530, f"NOT_ALLOWED - {fake.refuse}")
    assert fake.handed == ["/"]

    # Down here: 541 with its words, before any refusal.
    fake.down = "access to vhost '/' refused for user 'guest': vhost '/' is down"
    client = await RawClient.connect(broker.port, handshake=False)
    got = await client.handshake()
    assert (got.reply_code, got.reply_text) == (541, f"INTERNAL_ERROR - {fake.down}")
    assert fake.handed == ["/"]  # never handed on from a node where it is down
    fake.down = None

    # Handed off: this node answers nothing (the leader will).
    fake.take_hand_off = True
    client = await RawClient.connect(broker.port, handshake=False)
    with_answer = asyncio.ensure_future(client.handshake())
    await asyncio.sleep(0.3)
    assert not with_answer.done() and fake.handed == ["/", "/"]
    with_answer.cancel()
    await client.close()
    fake.take_hand_off = False

    # Wait: held while the seam says so, then served here.
    fake.refuse = None
    fake.wait_until = time.monotonic() + 0.4
    started = time.monotonic()
    client = await RawClient.connect(broker.port, handshake=False)
    got = await client.handshake()
    assert isinstance(got, spec.ConnectionOpenOk), got
    assert time.monotonic() - started >= 0.35
    await client.close()
