"""The stored bindings of a deleted queue or exchange: deleted UNBIND_BATCH per write
(``unbound``), never restored, and gone before a queue or exchange of that name is stored
again; a stop half-way is finished at the next start."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import aio_pika
import pytest
from aio_pika import ExchangeType
from support.waiting import until

from roarmq.broker.core.persistence import Persistence
from roarmq.broker.store import definitions
from roarmq.broker.store.definitions import BindingDef, DefinitionStore
from roarmq.broker.testing import ephemeral_config, running_broker

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]


def rows(store: DefinitionStore) -> list[tuple[str, str, str, str]]:
    return sorted(
        (b.source, b.destination, b.destination_type, b.routing_key) for b in store.bindings()
    )


def bind(store: DefinitionStore, source: str, dest: str, kind: str, keys: range) -> None:
    with store.writing("seed"):
        for i in keys:
            store.put_binding(BindingDef("/", source, dest, kind, f"k{i}", {}))


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(definitions, "UNBIND_BATCH", 10)
    s = DefinitionStore(tmp_path / "defs.sqlite3")
    yield s
    s.close()


def test_a_few_bindings_go_with_their_queue_in_one_write(store):
    store.put_queue("/", "q", False, {})
    bind(store, "x", "q", "queue", range(9))
    bind(store, "x", "other", "queue", range(3))
    assert store.delete_queue("/", "q") is False
    assert rows(store) == [("x", "other", "queue", f"k{i}") for i in range(3)]
    assert store.sweep_unbound() is False


def test_many_go_a_batch_a_write_and_a_new_queue_of_the_name_starts_clean(store):
    store.put_queue("/", "q", False, {})
    bind(store, "x", "q", "queue", range(35))
    bind(store, "y", "q", "queue", range(5))
    bind(store, "x", "q2", "queue", range(3))
    bind(store, "q", "q2", "exchange", range(2))  # an exchange named q: not the queue's
    assert store.delete_queue("/", "q") is True
    assert len([r for r in rows(store) if r[1] == "q"]) == 30
    assert store.sweep_unbound() is True
    assert len([r for r in rows(store) if r[1] == "q"]) == 20
    store.put_queue("/", "q", False, {})  # the same name again: the rest goes first
    bind(store, "x", "q", "queue", range(1))
    assert store.sweep_unbound() is False
    assert rows(store) == sorted(
        [("x", "q", "queue", "k0")]
        + [("x", "q2", "queue", f"k{i}") for i in range(3)]
        + [("q", "q2", "exchange", f"k{i}") for i in range(2)]
    )


def test_an_exchange_takes_the_bindings_from_it_and_to_it(store):
    bind(store, "x", "q", "queue", range(25))
    bind(store, "src", "x", "exchange", range(7))
    bind(store, "src", "q", "queue", range(2))
    assert store.delete_exchange("/", "x") is True
    while store.sweep_unbound():
        pass
    assert rows(store) == [("src", "q", "queue", "k0"), ("src", "q", "queue", "k1")]


async def delete_a_bound_queue(b) -> tuple:
    """Durable queue ``dq`` bound 40 times from durable ``dx``, then deleted."""
    conn = await aio_pika.connect(b.url)
    ch = await conn.channel()
    x = await ch.declare_exchange("dx", ExchangeType.TOPIC, durable=True)
    q = await ch.declare_queue("dq", durable=True)
    for i in range(40):
        await q.bind(x, f"old{i}.#")
    await q.delete()
    return conn, ch, x


async def test_a_stop_before_the_sweep_is_finished_at_the_next_start(tmp_path, monkeypatch):
    monkeypatch.setattr(definitions, "UNBIND_BATCH", 10)
    cfg = ephemeral_config(data_dir=str(tmp_path / "d"))
    with monkeypatch.context() as m:
        m.setattr(Persistence, "_unbind_later", lambda self: None)  # the stop comes first
        async with running_broker(cfg) as b:
            conn, _, _ = await delete_a_bound_queue(b)
            await conn.close()
            store = b.broker.persistence.definitions
            assert len(store.bindings()) == 30  # a batch went with the queue
    async with running_broker(cfg) as b:
        assert b.broker.persistence.definitions.bindings() == []
        conn = await aio_pika.connect(b.url)
        ch = await conn.channel()
        with pytest.raises(aio_pika.exceptions.ChannelClosed):
            await ch.declare_queue("dq", durable=True, passive=True)
        await conn.close()


async def test_a_queue_declared_again_before_the_sweep_keeps_only_its_own(tmp_path, monkeypatch):
    monkeypatch.setattr(definitions, "UNBIND_BATCH", 10)
    cfg = ephemeral_config(data_dir=str(tmp_path / "d"))
    with monkeypatch.context() as m:
        m.setattr(Persistence, "_unbind_later", lambda self: None)
        async with running_broker(cfg) as b:
            conn, ch, x = await delete_a_bound_queue(b)
            q = await ch.declare_queue("dq", durable=True)
            await q.bind(x, "new.#")
            await conn.close()
    async with running_broker(cfg) as b:
        index = b.broker.vhosts["/"].exchanges["dx"].index
        assert [(k, d.name) for k, d, _ in index.bindings()] == [("new.#", "dq")]
        assert [b.routing_key for b in b.broker.persistence.definitions.bindings()] == ["new.#"]


def run(script: str, *args: object) -> str:
    """`script` in a new Python process (it ends with os._exit: no clean close); stdout."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


SWEEP = """
    import os, sys
    from roarmq.broker.store import definitions
    from roarmq.broker.store.definitions import BindingDef, DefinitionStore, ExchangeDef
    definitions.UNBIND_BATCH = 10
    store = DefinitionStore(sys.argv[1])
"""


@pytest.mark.slow  # a FUSE filesystem
def test_the_sweep_is_not_fsynced_and_what_a_power_loss_takes_of_it_is_swept_again(fs):
    """The sweep's writes commit without an fsync (a sweep of 100,000 bindings is 200
    writes, each an fsync on the event loop before): the delete's own write is durable, a
    power loss takes the sweep's writes since the last fsync, and the next start sweeps
    them again. A durable write after them still fsyncs, and makes them durable too."""
    path = fs.path / "defs.sqlite3"
    left = run(
        SWEEP
        + """
    store.put_queue("/", "q", False, {})
    with store.writing("seed"):
        for i in range(45):
            store.put_binding(BindingDef("/", "x", "q", "queue", f"k{i}", {}))
    store.put_binding(BindingDef("/", "x", "other", "queue", "kept", {}))
    assert store.delete_queue("/", "q")  # durable: 10 of them go with it
    store.sweep_unbound()
    store.sweep_unbound()
    print(len(store.bindings()), flush=True)
    os._exit(0)
    """,
        path,
    )
    assert int(left) == 16  # 15 of q's, and the other queue's
    fs.power_loss()
    left = run(
        SWEEP
        + """
    assert [q.name for q in store.queues()] == []
    print(len(store.bindings()), flush=True)
    store.sweep_unbound()  # not durable, but the durable write after it fsyncs it too
    store.put_exchange(ExchangeDef("/", "after", "topic"))
    os._exit(0)
    """,
        path,
    )
    assert int(left) == 36  # the sweep's two writes were lost, not the delete's
    fs.power_loss()
    store = DefinitionStore(path)
    try:
        assert [x.name for x in store.exchanges()] == ["after"]
        assert len(store.bindings()) == 26
        while store.sweep_unbound():  # as the next start does (Persistence._finish_unbinding)
            pass
        assert rows(store) == [("x", "other", "queue", "kept")]
    finally:
        store.close()


def test_wal_checkpoints_are_the_threads_not_the_commits(tmp_path, monkeypatch):
    """A commit that takes the WAL past CHECKPOINT_FRAMES does not copy it into the
    database itself (on the event loop: ~4 MB written and two fsyncs, five times in a
    sweep of 100,000 stored bindings); the store's checkpoint thread does, PASSIVE."""
    pokes = []
    monkeypatch.setattr(definitions._Checkpoints, "poke", lambda self: pokes.append(self))
    store = DefinitionStore(tmp_path / "defs.sqlite3")
    try:
        for n in range(10):
            bind(store, "x", "q", "queue", range(n * 10_000, (n + 1) * 10_000))
        frames, copied = definitions.wal_frames(store.path)
        assert frames > definitions.CHECKPOINT_FRAMES and copied == 0 and len(pokes) == 10
        monkeypatch.undo()
        store._checkpoints.poke()
        assert until(lambda: definitions.wal_frames(store.path)[1] == frames, 10)
        bind(store, "x", "q", "queue", range(100_000, 100_001))  # starts the WAL over
        assert definitions.wal_frames(store.path)[0] < 10
    finally:
        store.close()
