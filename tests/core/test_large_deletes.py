"""Deleting a queue or an exchange with tens of thousands of bindings: exact at once, and
never one long event-loop turn (broker/routing/bindings.py's lazy removal, the vhost's sweep,
the definitions store's ``unbound`` batches).

After queue.delete-ok no message reaches the queue, whatever is still to sweep: a mandatory
publish that only it matched comes back 312 NO_ROUTE, the counts and listings have none of
its bindings, an auto-delete exchange left without bindings goes, and a queue declared again
under the same name gets only its own bindings.
"""

from __future__ import annotations

import asyncio

import aio_pika
import pytest
from aio_pika import ExchangeType, Message
from aio_pika.exceptions import ChannelClosed, DeliveryError
from support.rawclient import RawClient
from support.timer_witness import TimerWitness

from roarmq.broker.routing import bindings
from roarmq.broker.testing import ephemeral_config, running_broker
from roarmq.protocol import spec

pytestmark = pytest.mark.timeout(120)


def patterns(n: int) -> list[str]:
    """``n`` wildcard patterns; ``s{i}.a.x`` matches exactly the ``i``-th."""
    return [f"s{i}.*.x" if i % 2 else f"s{i}.#" for i in range(n)]


async def bind_many(port: int, queue: str, exchange: str, keys: list[str]) -> None:
    """Bind over a socket, pipelined (no_wait), and wait until the broker has them all."""
    client = await RawClient.connect(port)
    await client.open_channel(1)
    await client.bind_all(1, queue, exchange, [(key, None) for key in keys])
    await client.close()


async def swept(index) -> None:
    while index.to_sweep():
        await asyncio.sleep(0.01)
    index.check_ids()


async def test_publishes_after_a_large_queue_delete_are_returned_and_a_new_queue_is_exact(broker):
    n = 20_000
    assert n >= 2 * bindings.LAZY_REMOVAL  # the lazy path, swept over several loop turns
    conn = await aio_pika.connect(broker.url)
    ch = await conn.channel()
    x = await ch.declare_exchange("big-t", ExchangeType.TOPIC)
    big = await ch.declare_queue("big")
    other = await ch.declare_queue("other")
    await other.bind(x, "other.#")
    await bind_many(broker.port, "big", "big-t", patterns(n))
    exchange = broker.broker.vhosts["/"].exchanges["big-t"]
    index = exchange.index
    assert len(index) == n + 1

    pub = await conn.channel(publisher_confirms=True, on_return_raises=True)
    px = await pub.get_exchange("big-t")
    deleted = asyncio.Event()
    outcomes: list[tuple[bool, str]] = []  # (sent after delete-ok, what came back)

    async def publish(i: int) -> None:
        after = deleted.is_set()  # publish writes its frames before it first waits
        try:
            await px.publish(Message(b"m"), routing_key=f"s{i % n}.a.x", mandatory=True)
            outcomes.append((after, "routed"))
        except DeliveryError as exc:
            assert (exc.frame.reply_code, exc.frame.reply_text) == (312, "NO_ROUTE")
            outcomes.append((after, "returned"))

    async def publisher() -> None:
        i = 0
        while sum(after for after, _ in outcomes) < 2000:
            await asyncio.gather(*(publish(i + k) for k in range(50)))
            i += 50

    task = asyncio.create_task(publisher())
    while len(outcomes) < 500:
        await asyncio.sleep(0.001)
    await big.delete(if_unused=False, if_empty=False)
    deleted.set()
    assert len(index) == 1 and index.has_bindings()
    assert [(k, d.name) for k, d, _ in index.bindings()] == [("other.#", "other")]
    await task

    before = [what for after, what in outcomes if not after]
    after = [what for after, what in outcomes if after]
    assert "routed" in before  # the queue was there, and took messages, until the delete
    assert len(after) >= 2000 and set(after) == {"returned"}
    assert exchange.stats_in == len(outcomes)
    assert exchange.stats_unroutable == before.count("returned") + len(after)
    assert await other.get(fail=False) is None  # nothing went anywhere else

    # The same name again, bound again at once, while the old bindings may still be swept.
    big2 = await ch.declare_queue("big")
    await big2.bind(x, "s1.*.x")
    await px.publish(Message(b"new"), routing_key="s1.a.x", mandatory=True)
    with pytest.raises(DeliveryError):
        await px.publish(Message(b"old"), routing_key="s2.a.x", mandatory=True)
    got = await big2.get(no_ack=True)
    assert got.body == b"new"
    assert await big2.get(fail=False) is None
    assert sorted((k, d.name) for k, d, _ in index.bindings()) == [
        ("other.#", "other"),
        ("s1.*.x", "big"),
    ]
    await swept(index)
    index.check_invariants()
    assert len(index) == 2
    await px.publish(Message(b"again"), routing_key="s1.a.x", mandatory=True)
    assert (await big2.get(no_ack=True)).body == b"again"
    await conn.close()


async def test_an_auto_delete_exchange_goes_with_the_queue_that_held_its_bindings(broker):
    conn = await aio_pika.connect(broker.url)
    ch = await conn.channel()
    await ch.declare_exchange("ad-t", ExchangeType.TOPIC, auto_delete=True)
    queue = await ch.declare_queue("ad-q")
    await bind_many(broker.port, "ad-q", "ad-t", patterns(2 * bindings.LAZY_REMOVAL))
    index = broker.broker.vhosts["/"].exchanges["ad-t"].index
    await queue.delete()
    assert "ad-t" not in broker.broker.vhosts["/"].exchanges
    with pytest.raises(ChannelClosed) as info:
        await (await conn.channel()).get_exchange("ad-t", ensure=True)
    assert "NOT_FOUND" in str(info.value)
    await swept(index)  # the deleted exchange's index is swept all the same
    await conn.close()


async def test_a_large_exchange_delete_routes_nothing_more(broker):
    conn = await aio_pika.connect(broker.url)
    ch = await conn.channel()
    src = await ch.declare_exchange("src", ExchangeType.TOPIC)
    mid = await ch.declare_exchange("mid", ExchangeType.TOPIC)
    await mid.bind(src, "#")
    queue = await ch.declare_queue("behind")
    await bind_many(broker.port, "behind", "mid", patterns(3 * bindings.LAZY_REMOVAL))
    await src.publish(Message(b"through"), routing_key="s3.a.x")
    assert (await queue.get(no_ack=True)).body == b"through"
    index = broker.broker.vhosts["/"].exchanges["mid"].index
    await mid.delete()
    assert not broker.broker.vhosts["/"].exchanges["src"].index.has_bindings()
    await src.publish(Message(b"lost"), routing_key="s3.a.x")
    assert await queue.get(fail=False) is None
    await swept(index)
    await conn.close()


def held_by_the_loop(stall, timers_late: float) -> float:
    """A stall's time the loop held its core: not its wait for a core another process had,
    nor its virtual CPU's steal, nor (a stall off CPU, reading pages back: `page_in`) its
    time off CPU, nor the time off CPU it waited to hand the GIL to a thread of the broker's
    that was waiting for a core (CPython's forced switch: once 176 ms, right after the loop
    itself had waited 199 ms for one), nor the time off CPU the machine delivered timers
    late to sleepers that did nothing else (`timers_late`, what a `TimerWitness` lost in the
    stall's window: the loop, asleep in epoll_wait past its probe's timer, looks "blocked"
    as a write of its own would); all five are the
    machine's (the VMs here page out cold file pages, the broker's code among them, with
    DAMON, and a page read back waits for a busy disk)."""
    waited = stall.run_queue or 0.0
    machine_took = waited + (stall.steal or 0.0)
    blocked = max(0.0, stall.window - stall.cpu - waited)
    machine_took += min(stall.others_run_queue + timers_late, blocked)
    if stall.kind == "page_in":
        machine_took = max(machine_took, stall.window - stall.cpu)
    return stall.lag - machine_took


@pytest.fixture
def machine():
    with TimerWitness() as witness:
        yield witness


@pytest.mark.slow  # 100,000 bindings, twice: seconds
@pytest.mark.parametrize("what", ["queue", "durable queue", "exchange", "durable exchange"])
async def test_deleting_100k_bindings_never_stalls_the_loop(tmp_path, what, machine):
    """Before the lazy removal this was one turn of 140-260 ms (200+ with the store).

    What is bounded is the loop's own holding of its core: a stall's time waiting for a
    core that another process had (the stall probe's run-queue figure, from the kernel's
    schedstat) is the machine's, not the broker's (a parallel test run, or a peer broker,
    once made a 60-ms stall of 48 ms of work), and so are the time the hypervisor gave the
    VM's CPU to another guest and the time the loop waited for pages of its own the kernel
    had reclaimed (`held_by_the_loop`: once a 97-ms stall with the loop neither on CPU nor
    waiting for a core, no job of the broker's running, the sweep's slices 5-9 ms), and the
    time the machine delivered the loop's timer late, as it did to processes that only sleep
    (`machine`, a `TimerWitness`)."""
    cfg = ephemeral_config(data_dir=str(tmp_path / "d"), diagnostics={"loop_lag_probe_ms": 1})
    durable = what.startswith("durable")
    async with running_broker(cfg) as b:
        client = await RawClient.connect(b.port)
        await client.open_channel(1)
        client.send(1, spec.ExchangeDeclare(exchange="t", type="topic", durable=durable))
        await client.expect(spec.ExchangeDeclareOk)
        client.send(1, spec.QueueDeclare(queue="big", durable=durable))
        await client.expect(spec.QueueDeclareOk)
        store = b.broker.persistence.definitions
        vhost = b.broker.vhosts["/"]
        # One transaction for the 100,000 stored bindings rather than one fsync each (~40 s):
        # the binds' own writes join it, as a config seed's puts do (`writing` nests). Made
        # here, on the broker's loop: a client's durable bind would write in the store's
        # writes thread, outside this transaction.
        big, t = vhost.queues["big"], vhost.exchanges["t"]
        with store.writing("store the test's bindings"):
            for key in patterns(100_000):
                vhost.bind_queue(big, t, key, None)
        store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # as the binds' own commits would
        # Routing keys in the cache, which the delete must empty, from a connection that is
        # gone before it (a channel's exchange cache would keep a deleted exchange alive).
        publisher = await RawClient.connect(b.port)
        await publisher.open_channel(1)
        for i in range(3000):
            publisher.publish(1, "t", f"s{i}.a.x", b"")
        publisher.send(1, spec.QueueDeclare(queue="big", passive=True))
        await publisher.expect(spec.QueueDeclareOk)
        await publisher.close()
        assert vhost.exchanges["t"].index.cached_keys() == 3000
        await asyncio.sleep(0.05)
        probe = b.broker.loop_lag
        probe.take_max()
        seen = probe.recorded
        if what.endswith("queue"):
            client.send(1, spec.QueueDelete(queue="big"))
            await client.expect(spec.QueueDeleteOk, timeout=30)
        else:
            client.send(1, spec.ExchangeDelete(exchange="t"))
            await client.expect(spec.ExchangeDeleteOk, timeout=30)
        # No reference to the index here: freeing a deleted exchange's is part of the cost.
        # The wait reads both sweeps' state in memory: a query of the store's from this loop
        # while the sweep thread commits batch after batch is the test's own work on the
        # broker's loop (up to 12 ms a query under two busy loops: SQLite's read retries
        # and the GIL's hand-over), once a 64-ms "blocked" stall the broker was blamed for.
        while vhost._sweeping or store.sweeping:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.01)
        longest = probe.take_max()
        stalls = list(probe.stalls)[-(probe.recorded - seen) :] if probe.recorded > seen else []
        late = {stall.id: machine.late(stall.at - stall.window, stall.at) for stall in stalls}
        held_of = {stall.id: held_by_the_loop(stall, late[stall.id]) for stall in stalls}
        worst = max(stalls, key=lambda stall: held_of[stall.id], default=None)
        held = 0.0 if worst is None else held_of[worst.id]
        print(f"{what}: longest loop stall {longest * 1000:.1f} ms, {held * 1000:.1f} ms its own")
        for stall in stalls:
            print(stall.as_json(), f"timers late {late[stall.id] * 1000:.1f} ms")
        assert probe.recorded - seen <= len(probe.stalls), "the stall ring overflowed"
        assert worst is None or held < 0.05, (
            f"the event loop held its core {held * 1000:.0f} ms: {worst.as_json()}, "
            f"timers late {late[worst.id] * 1000:.0f} ms"
        )
        if what.endswith("queue"):
            assert "big" not in vhost.queues and not vhost.exchanges["t"].index.has_bindings()
        else:
            assert "t" not in vhost.exchanges
        assert store._run("SELECT count(*) FROM bindings").fetchone()[0] == 0
        assert store._run("SELECT 1 FROM unbound").fetchone() is None  # the sweep finished
        await client.close()
