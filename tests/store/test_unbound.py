"""The stored bindings of a deleted queue or exchange: deleted UNBIND_BATCH per write
(``unbound``), never restored, and gone before a queue or exchange of that name is stored
again; a stop half-way is finished at the next start."""

from __future__ import annotations

import aio_pika
import pytest
from aio_pika import ExchangeType

from roarmq.broker.core.persistence import Persistence
from roarmq.broker.store import definitions
from roarmq.broker.store.definitions import BindingDef, DefinitionStore
from roarmq.broker.testing import ephemeral_config, running_broker

pytestmark = pytest.mark.timeout(60)


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
