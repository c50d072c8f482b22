"""Durable definitions under real disk faults: stored first, in memory second.

A real broker subprocess; strace makes its system calls on definitions.sqlite3-wal fail
(the commit's fdatasync with EIO, or every write with EROFS or ENOSPC). A durable declare,
bind or delete during the fault is refused with RabbitMQ's 541 naming what failed, nothing
of it is applied (in memory or, after kill -9 and a restart, on disk), a retry fails the
same way while the fault lasts, and once strace detaches the store writes again by itself.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable

import pika
import pytest
from support.faultlib import PERSISTENT, BrokerProcess, connect, drain, inject
from support.waiting import wait_for

from roarmq.broker.store.definitions import DefinitionStore, DefinitionsWriteFailed

# slow (injected disk faults): `make check` leaves it out
pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

#: strace rules, the SQLite error they cause, and the errno it is logged as.
FAULTS = {
    "fsync-eio": (("fdatasync:error=EIO",), "SQLITE_IOERR_FSYNC", "EIO"),
    "write-erofs": (("pwrite64:error=EROFS", "write:error=EROFS"), "SQLITE_IOERR_WRITE", "EIO"),
}
ENOSPC = (("pwrite64:error=ENOSPC", "write:error=ENOSPC"), "SQLITE_FULL", "ENOSPC")


@pytest.fixture(params=sorted(FAULTS))
def fault(request: pytest.FixtureRequest) -> tuple[tuple[str, ...], str, str]:
    return FAULTS[request.param]


def faulty(broker: BrokerProcess, rules: tuple[str, ...]):  # type: ignore[no-untyped-def]
    return inject(broker.pid, broker.data_dir / "definitions.sqlite3-wal", *rules)


def refused(broker: BrokerProcess, operation: Callable[[pika.channel.Channel], object]) -> str:
    """Run `operation` on a new connection: the broker closes it with 541; its text."""
    conn = connect(broker.port)
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err:
        operation(ch)
    assert err.value.reply_code == 541, err.value
    return err.value.reply_text


def refused_twice(broker: BrokerProcess, operation, what: str, sqlite: str) -> None:  # type: ignore[no-untyped-def]
    """The first try and a retry (a new connection) fail alike, naming what failed."""
    for _ in range(2):
        text = refused(broker, operation)
        assert text == (
            f"INTERNAL_ERROR - cannot {what}: definitions.sqlite3: "
            f"{'database or disk is full' if sqlite == 'SQLITE_FULL' else 'disk I/O error'} "
            f"({sqlite})"
        )


def absent(broker: BrokerProcess, check: Callable[[pika.channel.Channel], object]) -> None:
    """A passive declare answers 404: nothing of the failed declare is in memory."""
    conn = connect(broker.port)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        check(conn.channel())
    assert err.value.reply_code == 404
    conn.close()


def publish(broker: BrokerProcess, exchange: str, key: str, n: int) -> None:
    """n persistent messages, each confirmed (and routed: mandatory)."""
    conn = connect(broker.port)
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(n):
        ch.basic_publish(exchange, key, b"m%d" % i, PERSISTENT, mandatory=True)
    conn.close()


def unroutable(broker: BrokerProcess, exchange: str, key: str) -> bool:
    conn = connect(broker.port)
    ch = conn.channel()
    ch.confirm_delivery()
    try:
        ch.basic_publish(exchange, key, b"x", PERSISTENT, mandatory=True)
    except pika.exceptions.UnroutableError:
        return True
    finally:
        conn.close()
    return False


def restart(broker: BrokerProcess) -> None:
    broker.kill9()
    broker.start()


def error_lines(broker: BrokerProcess, what: str) -> list[str]:
    return [
        line
        for line in broker.log_text().splitlines()
        if re.match(r"\S+ error ", line) and f"cannot {what}" in line
    ]


def test_queue_declare_is_refused_and_not_half_applied(broker, fault) -> None:
    rules, sqlite, errno = fault
    declare = lambda ch: ch.queue_declare("q", durable=True)  # noqa: E731
    with faulty(broker, rules):
        refused_twice(broker, declare, "store queue 'q' in vhost '/'", sqlite)
        absent(broker, lambda ch: ch.queue_declare("q", passive=True))
    publish_and_survive(broker)
    lines = error_lines(broker, "store queue 'q' in vhost '/'")
    assert len(lines) == 2, lines  # one line per failure
    for line in lines:
        assert f"file={broker.data_dir / 'definitions.sqlite3'}" in line
        assert f"errno={errno}" in line and f"sqlite={sqlite}" in line
    assert "Traceback" not in broker.log_text()


def publish_and_survive(broker: BrokerProcess) -> None:
    """After the fault the declare works; 40 confirmed messages outlive kill -9."""
    conn = connect(broker.port)
    conn.channel().queue_declare("q", durable=True)
    conn.close()
    publish(broker, "", "q", 40)
    restart(broker)
    assert [body for body, _ in drain(broker.port, "q")] == [b"m%d" % i for i in range(40)]


def test_a_full_disk_is_named_as_such(broker) -> None:
    rules, sqlite, errno = ENOSPC
    with faulty(broker, rules):
        refused(broker, lambda ch: ch.queue_declare("q", durable=True))
    (line,) = error_lines(broker, "store queue 'q' in vhost '/'")
    assert f"errno={errno}" in line and f"sqlite={sqlite}" in line
    publish_and_survive(broker)


def test_exchange_declare_is_refused_and_not_half_applied(broker, fault) -> None:
    rules, sqlite, _ = fault
    declare = lambda ch: ch.exchange_declare("x", "direct", durable=True)  # noqa: E731
    with faulty(broker, rules):
        refused_twice(broker, declare, "store exchange 'x' in vhost '/'", sqlite)
        absent(broker, lambda ch: ch.exchange_declare("x", passive=True))
    conn = connect(broker.port)
    ch = conn.channel()
    declare(ch)
    ch.queue_declare("q", durable=True)
    ch.queue_bind("q", "x", "k")
    conn.close()
    publish(broker, "x", "k", 40)
    restart(broker)
    conn = connect(broker.port)
    conn.channel().exchange_declare("x", passive=True)
    conn.close()
    assert len(drain(broker.port, "q")) == 40


def setup_durable(broker: BrokerProcess) -> None:
    conn = connect(broker.port)
    ch = conn.channel()
    ch.exchange_declare("x", "direct", durable=True)
    ch.exchange_declare("x2", "direct", durable=True)
    ch.queue_declare("q", durable=True)
    conn.close()


def api_up(broker: BrokerProcess, path: str) -> tuple[int, object]:
    """broker.call once the management listener is up (it opens after the AMQP port)."""
    return wait_for(lambda: broker.call(path), what="the management API")


def stored_bindings(broker: BrokerProcess) -> set[tuple[str, str, str]]:
    status, rows = api_up(broker, "/api/bindings/%2F")
    assert status == 200
    return {(r["source"], r["destination"], r["routing_key"]) for r in rows if r["source"]}  # type: ignore[union-attr, index]


BINDS = {
    "queue": (lambda ch: ch.queue_bind("q", "x", "k"), "x", "queue 'q'", ("x", "q", "k")),
    "exchange": (
        lambda ch: ch.exchange_bind("x", "x2", "k"),  # x2 -> x -> q
        "x2",
        "exchange 'x'",
        ("x2", "x", "k"),
    ),
}


@pytest.mark.parametrize("kind", sorted(BINDS))
def test_bind_is_refused_and_routes_nothing(broker, fault, kind: str) -> None:
    rules, sqlite, _ = fault
    bind, publish_to, dest, row = BINDS[kind]
    setup_durable(broker)
    if kind == "exchange":
        connect(broker.port).channel().queue_bind("q", "x", "k")
    what = f"store binding from exchange '{row[0]}' to {dest} with routing key 'k' in vhost '/'"
    with faulty(broker, rules):
        refused_twice(broker, bind, what, sqlite)
        assert unroutable(broker, publish_to, "k")  # no false bind-ok
    assert row not in stored_bindings(broker)
    restart(broker)
    assert row not in stored_bindings(broker)
    assert unroutable(broker, publish_to, "k")
    conn = connect(broker.port)
    bind(conn.channel())
    conn.close()
    publish(broker, publish_to, "k", 40)
    restart(broker)
    assert row in stored_bindings(broker)
    assert len(drain(broker.port, "q")) == 40


def test_queue_delete_is_refused_and_the_queue_stays(broker, fault) -> None:
    rules, sqlite, _ = fault
    conn = connect(broker.port)
    conn.channel().queue_declare("q", durable=True)
    conn.close()
    publish(broker, "", "q", 40)
    with faulty(broker, rules):
        refused_twice(
            broker, lambda ch: ch.queue_delete("q"), "delete queue 'q' in vhost '/'", sqlite
        )
        conn = connect(broker.port)
        assert conn.channel().queue_declare("q", passive=True).method.message_count == 40
        conn.close()
    restart(broker)
    assert len(drain(broker.port, "q")) == 40


def api_put(broker: BrokerProcess, path: str, body: dict) -> tuple[int, object]:
    return broker.call(path, "PUT", body)


def test_management_put_queue_is_a_500_and_no_queue(broker) -> None:
    rules, sqlite, _ = FAULTS["fsync-eio"]
    api_up(broker, "/api/overview")
    with faulty(broker, rules):
        status, body = api_put(broker, "/api/queues/%2F/mq", {"durable": True})
        assert status == 500
        assert body == {
            "error": "internal_error",
            "reason": "cannot store queue 'mq' in vhost '/': definitions.sqlite3: "
            f"disk I/O error ({sqlite})",
        }
        assert broker.call("/api/queues/%2F/mq")[0] == 404
        status, _ = api_put(broker, "/api/vhosts/v2", {})
        assert status == 500
        assert broker.call("/api/vhosts/v2")[0] == 404
    assert api_put(broker, "/api/queues/%2F/mq", {"durable": True})[0] == 201
    assert "Traceback" not in broker.log_text()


def test_deletes_the_broker_decides_wait_for_the_store(broker) -> None:
    """Auto-delete queues and exchanges, x-expires, and a vhost deleted through the API:
    while the store cannot write, each is logged and left undone, whole; x-expires tries
    again afterwards."""
    rules, _, _ = FAULTS["fsync-eio"]
    api_up(broker, "/api/overview")
    assert api_put(broker, "/api/vhosts/v2", {})[0] == 201
    conn = connect(broker.port)
    ch = conn.channel()
    ch.queue_declare("ad", durable=True, auto_delete=True)
    ch.queue_declare("ex", durable=True, arguments={"x-expires": 400})
    ch.exchange_declare("ax", "direct", durable=True, auto_delete=True)
    ch.queue_declare("tq", durable=False)
    ch.queue_bind("tq", "ax", "k")  # a transient queue's binding: never stored
    tag = ch.basic_consume("ad", lambda *a: None)
    with faulty(broker, rules):
        ch.basic_cancel(tag)  # the last consumer goes: the delete fails, the queue stays
        ch.queue_unbind("tq", "ax", "k")  # unbind-ok, but the exchange's delete fails
        ch.exchange_declare("ax", passive=True)
        conn.sleep(1.0)  # and x-expires comes and goes
        assert broker.call("/api/queues/%2F/ad")[0] == 200
        assert broker.call("/api/queues/%2F/ex")[0] == 200
        status, body = broker.call("/api/vhosts/v2", method="DELETE")
        assert status == 500 and body["error"] == "internal_error"  # type: ignore[index]
        assert broker.call("/api/vhosts/v2")[0] == 200
    conn.close()
    for what in (
        "delete queue 'ad' in vhost '/'",
        "delete queue 'ex' in vhost '/'",
        "delete exchange 'ax' in vhost '/'",
    ):
        assert error_lines(broker, what), what
    wait_for(lambda: broker.call("/api/queues/%2F/ex")[0] == 404, what="x-expires again")
    restart(broker)
    assert api_up(broker, "/api/queues/%2F/ad")[0] == 200
    assert broker.call("/api/queues/%2F/ex")[0] == 404
    assert broker.call("/api/vhosts/v2")[0] == 200
    assert "Traceback" not in broker.log_text()


def test_a_failed_transaction_leaves_nothing_and_the_store_reopens(tmp_path, monkeypatch) -> None:
    """The helper itself: all statements or none, a new connection, and a reopen that
    fails too is tried again on next use (by a read as much as by a write)."""
    store = DefinitionStore(tmp_path / "definitions.sqlite3")
    first = store.db
    with pytest.raises(DefinitionsWriteFailed) as err:
        with store.writing("store two queues"):
            store.put_queue("/", "a", False, {})  # joins the outer transaction
            store.db.execute(
                "INSERT INTO queues (id, vhost, name, auto_delete, arguments) "
                "VALUES (1, '/', 'b', 0, x'')"
            )  # id 1 is taken: IntegrityError
    assert err.value.sqlite_name == "SQLITE_CONSTRAINT_PRIMARYKEY"
    assert str(err.value).startswith("cannot store two queues: definitions.sqlite3: ")
    assert store.queues() == [] and store.db is not first

    real = DefinitionStore._connect
    fail = sqlite3.OperationalError("unable to open database file")
    fail.sqlite_errorname = "SQLITE_CANTOPEN"  # type: ignore[attr-defined]
    monkeypatch.setattr(DefinitionStore, "_connect", lambda self: (_ for _ in ()).throw(fail))
    with pytest.raises(DefinitionsWriteFailed):
        with store.writing("store a setting"):
            store.db.execute("SELECT nothing FROM nowhere")
    with pytest.raises(DefinitionsWriteFailed) as err:
        store.users()  # the reopen fails again: said so, not an AttributeError
    assert err.value.sqlite_name == "SQLITE_CANTOPEN" and err.value.errno_name == "EIO"
    monkeypatch.setattr(DefinitionStore, "_connect", real)
    store.put_setting("cluster_name", "c")
    assert store.settings() == {"cluster_name": "c"}
    store.close()
