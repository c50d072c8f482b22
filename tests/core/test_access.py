"""Access control as RabbitMQ 3.10.8: configure/write/read on every method, topic
permissions, user_id and the impersonator tag. Every expected text below is what RabbitMQ
sent for the same frames (a user with ^lim-.* for all three, checked with a raw client)."""

from __future__ import annotations

import asyncio
import logging
import re

import aio_pika
import aiormq
import pytest
from support.rawclient import RawClient

from roarmq.broker.core.auth import hash_password
from roarmq.broker.testing import BrokerThread, ephemeral_config, running_broker
from roarmq.protocol import spec
from roarmq.protocol.frames import PROTOCOL_HEADER
from roarmq.protocol.properties import BasicProperties

pytestmark = pytest.mark.timeout(60)


def add_user(broker, name: str, configure=".*", write=".*", read=".*", tags=()) -> None:
    broker.put_user(name, hash_password("pw"), tuple(tags))
    broker.set_permission(name, "/", configure, write, read)


async def confirming(port: int, user: str) -> RawClient:
    """A user's raw client (password "pw") with channel 1 open in confirm mode."""
    c = await RawClient.connect(port, user=user, password="pw")
    await c.open_channel(1)
    c.send(1, spec.ConfirmSelect())
    await c.expect(spec.ConfirmSelectOk)
    return c


async def outcome(port: int, user: str, *methods, publish=None) -> list[str]:
    """What the broker answers, as "Name" or "Name code text", up to the first close."""
    c = await confirming(port, user)
    for m in methods:
        c.send(1, m)
    if publish is not None:
        c.publish(1, *publish)
    out = []
    for _ in range(len(methods) + (publish is not None)):
        ev = await c.next_method()
        if hasattr(ev, "reply_code"):
            out.append(f"{type(ev).__name__} {ev.reply_code} {ev.reply_text}")
            break
        out.append(type(ev).__name__)
    await c.close()
    return [re.sub(r"amq\.gen-[\w-]+", "amq.gen-X", line) for line in out]


def refused(kind: str, name: str, user: str = "lim") -> str:
    return (
        f"ChannelClose 403 ACCESS_REFUSED - access to {kind} '{name}' in vhost '/' refused "
        f"for user '{user}'"
    )


@pytest.fixture
async def lim(broker):
    b = broker.broker
    add_user(b, "lim", "^lim-.*", "^lim-.*", "^lim-.*")
    vhost = b.vhosts["/"]
    vhost.declare_queue("other", None)
    vhost.declare_queue("lim-q", None)
    vhost.declare_exchange("other-x", "topic")
    vhost.declare_exchange("lim-x", "topic")
    # Made by someone allowed to: redeclaring them is not checking their arguments again.
    vhost.declare_exchange("lim-xae", "topic", arguments={"alternate-exchange": "other-x"})
    vhost.declare_queue("lim-qdlx", None, arguments={"x-dead-letter-exchange": "other-x"})
    # Everything but read: read is what a new queue's DLX or exchange's AE also needs.
    add_user(b, "nor", ".*", ".*", "^nothing$")
    return broker


DEFAULT_REFUSED = (
    "ChannelClose 403 ACCESS_REFUSED - operation not permitted on the default exchange"
)


CASES = [
    ([spec.ExchangeDeclare(exchange="other2", type="direct")], None, refused("exchange", "other2")),
    ([spec.ExchangeDeclare(exchange="other-x", passive=True)], None, "ExchangeDeclareOk"),
    ([spec.QueueDeclare(queue="other2")], None, refused("queue", "other2")),
    ([spec.QueueDeclare(queue="other", passive=True)], None, "QueueDeclareOk"),
    ([spec.QueueDeclare(queue="")], None, refused("queue", "amq.gen-X")),
    ([], ("", "x", b"x"), refused("exchange", "amq.default")),
    ([], ("amq.topic", "x", b"x"), refused("exchange", "amq.topic")),
    ([], ("lim-x", "x", b"x"), "BasicAck"),
    (
        [spec.QueueBind(queue="lim-q", exchange="amq.topic", routing_key="a")],
        None,
        refused("exchange", "amq.topic"),
    ),
    (
        [spec.QueueBind(queue="other", exchange="lim-x", routing_key="a")],
        None,
        refused("queue", "other"),
    ),
    (
        [spec.QueueUnbind(queue="lim-q", exchange="amq.topic", routing_key="a")],
        None,
        refused("exchange", "amq.topic"),
    ),
    (
        [spec.QueueDeclare(queue="lim-q2", arguments={"x-dead-letter-exchange": "other-x"})],
        None,
        refused("exchange", "other-x"),
    ),
    (
        [spec.QueueDeclare(queue="lim-q3", arguments={"x-dead-letter-exchange": ""})],
        None,
        refused("exchange", "amq.default"),
    ),
    (
        [
            spec.ExchangeDeclare(
                exchange="lim-x2", type="topic", arguments={"alternate-exchange": "other-x"}
            )
        ],
        None,
        refused("exchange", "other-x"),
    ),
    ([spec.BasicGet(queue="other")], None, refused("queue", "other")),
    ([spec.BasicConsume(queue="other")], None, refused("queue", "other")),
    ([spec.QueuePurge(queue="other")], None, refused("queue", "other")),
    ([spec.QueueDelete(queue="other")], None, refused("queue", "other")),
    ([spec.ExchangeDelete(exchange="other-x")], None, refused("exchange", "other-x")),
    (
        [spec.ExchangeBind(destination="lim-x", source="other-x", routing_key="a")],
        None,
        refused("exchange", "other-x"),
    ),
    (
        [spec.ExchangeBind(destination="other-x", source="lim-x", routing_key="a")],
        None,
        refused("exchange", "other-x"),
    ),
    (
        [spec.ExchangeDeclare(exchange="amq.foo", type="direct")],
        None,
        refused("exchange", "amq.foo"),
    ),
    # RabbitMQ's order: what is refused for every user comes before the permission check.
    ([spec.ExchangeDeclare(exchange="", type="direct")], None, DEFAULT_REFUSED),
    (
        [spec.ExchangeDeclare(exchange="other3", type="bogus")],
        None,
        "ConnectionClose 503 COMMAND_INVALID - unknown exchange type 'bogus'",
    ),
    ([spec.ExchangeDelete(exchange="")], None, DEFAULT_REFUSED),
    (
        [spec.ExchangeDelete(exchange="amq.direct")],
        None,
        "ChannelClose 403 ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost "
        "'/' not allowed",
    ),
    ([spec.ExchangeDelete(exchange="lim-none")], None, "ExchangeDeleteOk"),
    ([spec.ExchangeDelete(exchange="none-other")], None, refused("exchange", "none-other")),
    (
        [spec.QueueDeclare(queue="amq.foo")],
        None,
        "ChannelClose 403 ACCESS_REFUSED - queue name 'amq.foo' contains reserved prefix 'amq.*'",
    ),
    ([spec.QueueBind(queue="lim-q", exchange="", routing_key="a")], None, DEFAULT_REFUSED),
    ([spec.QueueUnbind(queue="lim-q", exchange="", routing_key="a")], None, DEFAULT_REFUSED),
    (
        [spec.ExchangeBind(destination="lim-x", source="", routing_key="a")],
        None,
        DEFAULT_REFUSED,
    ),
    (
        [spec.ExchangeBind(destination="", source="lim-x", routing_key="a")],
        None,
        refused("exchange", "amq.default"),  # write on the destination comes first
    ),
    (
        [spec.ExchangeUnbind(destination="lim-x", source="", routing_key="a")],
        None,
        DEFAULT_REFUSED,
    ),
    # Write on the exchange is checked before it is looked up.
    ([], ("other-nox", "x", b"x"), refused("exchange", "other-nox")),
    (
        [],
        ("lim-nox", "x", b"x"),
        "ChannelClose 404 NOT_FOUND - no exchange 'lim-nox' in vhost '/'",
    ),
    ([spec.QueueDelete(queue="other-none")], None, refused("queue", "other-none")),
    ([spec.BasicConsume(queue="other-none")], None, refused("queue", "other-none")),
    # The arguments naming another exchange are checked for new objects only.
    (
        [
            spec.ExchangeDeclare(
                exchange="lim-xae", type="topic", arguments={"alternate-exchange": "other-x"}
            )
        ],
        None,
        "ExchangeDeclareOk",
    ),
    (
        [spec.QueueDeclare(queue="lim-qdlx", arguments={"x-dead-letter-exchange": "other-x"})],
        None,
        "QueueDeclareOk",
    ),
    (
        [spec.QueueDeclare(queue="lim-q4", arguments={"x-dead-letter-exchange": "lim-x"})],
        None,
        "QueueDeclareOk",
    ),
    (
        [
            spec.ExchangeDeclare(
                exchange="lim-x3", type="topic", arguments={"alternate-exchange": 100000}
            )
        ],
        None,
        # 100000 travels as a signedint, as clients send an int (a decoded value's type is
        # not kept: broker/core/queue_arguments.py's amqp_type_name)
        "ChannelClose 406 PRECONDITION_FAILED - invalid type 'signedint' for arg "
        "'alternate-exchange' "
        "in exchange 'lim-x3' in vhost '/'",
    ),
    (
        [spec.QueueDeclare(queue="lim-q4", arguments={"x-dead-letter-exchange": 100000})],
        None,
        "ChannelClose 406 PRECONDITION_FAILED - invalid type 'signedint' for arg "
        "'x-dead-letter-exchange' in queue 'lim-q4' in vhost '/'",
    ),
]

# A user with configure and write everywhere but no read: a new exchange with an alternate
# exchange, or a new queue with a dead-letter exchange, also needs read on itself.
NOR_CASES = [
    (
        [
            spec.ExchangeDeclare(
                exchange="ae1", type="topic", arguments={"alternate-exchange": "amq.direct"}
            )
        ],
        refused("exchange", "ae1", "nor"),
    ),
    ([spec.ExchangeDeclare(exchange="ae1", type="topic")], "ExchangeDeclareOk"),
    (
        [spec.QueueDeclare(queue="dq", arguments={"x-dead-letter-exchange": "amq.direct"})],
        refused("queue", "dq", "nor"),
    ),
    ([spec.QueueDeclare(queue="dq")], "QueueDeclareOk"),
]


@pytest.mark.parametrize(("methods", "publish", "expected"), CASES)
async def test_each_method_checks_what_rabbitmq_checks(lim, methods, publish, expected):
    assert (await outcome(lim.port, "lim", *methods, publish=publish))[-1] == expected


@pytest.mark.parametrize(("methods", "expected"), NOR_CASES)
async def test_new_dead_letter_and_alternate_exchanges_need_read_on_the_new_object(
    lim, methods, expected
):
    assert (await outcome(lim.port, "nor", *methods))[-1] == expected


async def test_fast_reply_to_is_checked_before_user_id(broker):
    add_user(broker.broker, "u1")
    props = BasicProperties(user_id="boss", reply_to="amq.rabbitmq.reply-to")
    assert await outcome(broker.port, "u1", publish=("amq.topic", "k", b"x", props)) == [
        "ChannelClose 406 PRECONDITION_FAILED - fast reply consumer does not exist"
    ]


async def test_expressions_are_searched_not_matched_and_empty_allows_no_name(broker):
    add_user(broker.broker, "rx", configure="lim", write="", read="")
    ok = await outcome(broker.port, "rx", spec.QueueDeclare(queue="xlimx", auto_delete=True))
    assert ok == ["QueueDeclareOk"]
    no = await outcome(broker.port, "rx", publish=("amq.topic", "k", b"x"))
    assert no == [refused("exchange", "amq.topic", "rx")]


async def test_a_permission_change_reaches_open_connections(broker):
    add_user(broker.broker, "ch")
    c = await confirming(broker.port, "ch")
    c.publish(1, "amq.topic", "k", b"x")
    assert isinstance(await c.next_method(), spec.BasicAck)
    broker.broker.set_permission("ch", "/", ".*", "^nothing$", ".*")
    c.publish(1, "amq.topic", "k", b"x")
    close = await c.expect(spec.ChannelClose)
    assert close.reply_text == refused("exchange", "amq.topic", "ch").split(" ", 2)[2]
    await c.close()


# -- topic permissions ------------------------------------------------------------------


@pytest.fixture
async def tp(broker):
    add_user(broker.broker, "tp")
    broker.broker.set_topic_permission("tp", "/", "amq.topic", r"^{username}\..*", r"^r\.{vhost}.*")
    return broker


def topic_refused(key: str) -> str:
    return (
        f"ChannelClose 403 ACCESS_REFUSED - access to topic '{key}' in exchange 'amq.topic' "
        "in vhost '/' refused for user 'tp'"
    )


TOPIC_CASES = [
    ([], ("amq.topic", "tp.a", b"x"), "BasicAck"),
    ([], ("amq.topic", "other.a", b"x"), topic_refused("other.a")),
    # Only the routing key is checked, not CC; only on topic exchanges.
    ([], ("amq.topic", "tp.a", b"x", BasicProperties(headers={"CC": ["other.b"]})), "BasicAck"),
    ([], ("amq.direct", "other.a", b"x"), "BasicAck"),
    (
        [
            spec.QueueDeclare(queue="tpq"),
            spec.QueueBind(queue="tpq", exchange="amq.topic", routing_key="r./x"),
        ],
        None,
        "QueueBindOk",
    ),
    (
        [
            spec.QueueDeclare(queue="tpq"),
            spec.QueueBind(queue="tpq", exchange="amq.topic", routing_key="zz"),
        ],
        None,
        topic_refused("zz"),
    ),
    (
        [
            spec.QueueDeclare(queue="tpq"),
            spec.QueueUnbind(queue="tpq", exchange="amq.topic", routing_key="zz"),
        ],
        None,
        topic_refused("zz"),
    ),
    (
        [
            spec.ExchangeDeclare(exchange="tpx", type="fanout"),
            spec.ExchangeBind(destination="tpx", source="amq.topic", routing_key="zz"),
        ],
        None,
        topic_refused("zz"),
    ),
    (
        [
            spec.ExchangeDeclare(exchange="tpx", type="fanout"),
            spec.ExchangeBind(destination="amq.topic", source="tpx", routing_key="zz"),
        ],
        None,
        "ExchangeBindOk",
    ),
]


@pytest.mark.parametrize(("methods", "publish", "expected"), TOPIC_CASES)
async def test_topic_permissions_as_rabbitmq(tp, methods, publish, expected):
    assert (await outcome(tp.port, "tp", *methods, publish=publish))[-1] == expected


async def test_an_empty_topic_expression_allows_the_empty_key_only(broker):
    """RabbitMQ reads the empty expression as `^$`: the empty routing key passes."""
    add_user(broker.broker, "te")
    broker.broker.vhosts["/"].declare_exchange("te-x", "topic")
    broker.broker.vhosts["/"].declare_queue("te-q", None)
    broker.broker.set_topic_permission("te", "/", "te-x", "", "")
    assert await outcome(broker.port, "te", publish=("te-x", "", b"x")) == ["BasicAck"]
    bind = spec.QueueBind(queue="te-q", exchange="te-x", routing_key="")
    assert await outcome(broker.port, "te", bind) == ["QueueBindOk"]
    assert await outcome(broker.port, "te", publish=("te-x", "a", b"x")) == [
        "ChannelClose 403 ACCESS_REFUSED - access to topic 'a' in exchange 'te-x' in vhost '/' "
        "refused for user 'te'"
    ]


async def test_regex_characters_in_the_user_name_are_not_escaped(broker):
    """{username} is replaced by the name as it is: `a+b` reads as a regex (RabbitMQ)."""
    add_user(broker.broker, "a+b")
    broker.broker.set_topic_permission("a+b", "/", "amq.topic", r"^{username}\.", ".*")
    assert await outcome(broker.port, "a+b", publish=("amq.topic", "aab.x", b"x")) == ["BasicAck"]
    assert await outcome(broker.port, "a+b", publish=("amq.topic", "a+b.x", b"x")) == [
        "ChannelClose 403 ACCESS_REFUSED - access to topic 'a+b.x' in exchange 'amq.topic' in "
        "vhost '/' refused for user 'a+b'"
    ]


async def test_a_topic_permission_change_reaches_open_connections(broker):
    add_user(broker.broker, "tc")
    c = await confirming(broker.port, "tc")
    c.publish(1, "amq.topic", "k", b"x")
    assert isinstance(await c.next_method(), spec.BasicAck)
    broker.broker.set_topic_permission("tc", "/", "amq.topic", "^ok$", ".*")
    c.publish(1, "amq.topic", "ok", b"x")
    assert isinstance(await c.next_method(), spec.BasicAck)
    c.publish(1, "amq.topic", "k", b"x")
    close = await c.expect(spec.ChannelClose)
    assert close.reply_text == (
        "ACCESS_REFUSED - access to topic 'k' in exchange 'amq.topic' in vhost '/' refused for "
        "user 'tc'"
    )
    await c.close()


async def test_topic_permissions_survive_a_restart(tmp_path):
    cfg = ephemeral_config(data_dir=str(tmp_path / "data"))
    async with running_broker(cfg) as b:
        add_user(b.broker, "tp")
        b.broker.set_topic_permission("tp", "/", "amq.topic", r"^{username}\.", ".*")
    async with running_broker(ephemeral_config(data_dir=str(tmp_path / "data"))) as b:
        assert (await outcome(b.port, "tp", publish=("amq.topic", "x.a", b"x"))) == [
            topic_refused("x.a")
        ]


def test_topic_permissions_api_and_definitions(tmp_path):
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "data")), management=True) as b:
        body = {"password": "pw", "tags": ""}
        assert b.api("PUT", "/api/users/tp", body)[0] == 201
        perms = {"configure": ".*", "write": ".*", "read": ".*"}
        assert b.api("PUT", "/api/permissions/%2F/tp", perms)[0] == 204  # made: 3.10.8's 204
        put = {"exchange": "amq.topic", "write": "^{username}", "read": "b"}
        assert b.api("PUT", "/api/topic-permissions/%2F/tp", put)[0] == 201
        put2 = {"exchange": "amq.direct", "write": "a", "read": "b"}
        assert b.api("PUT", "/api/topic-permissions/%2F/tp", put2)[0] == 204
        row = {
            "user": "tp",
            "vhost": "/",
            "exchange": "amq.topic",
            "write": "^{username}",
            "read": "b",
        }
        status, rows = b.api("GET", "/api/topic-permissions/%2F/tp")
        assert status == 200 and row in rows and len(rows) == 2
        assert b.api("GET", "/api/users/tp/topic-permissions")[1] == rows
        assert b.api("GET", "/api/vhosts/%2F/topic-permissions")[1] == rows
        assert row in b.api("GET", "/api/definitions")[1]["topic_permissions"]
        bad = {"exchange": "amq.topic", "write": "(", "read": "b"}
        assert b.api("PUT", "/api/topic-permissions/%2F/tp", bad)[0] == 400
        assert b.api("PUT", "/api/topic-permissions/%2F/nouser", put) == (
            400,
            {"error": "bad_request", "reason": "vhost_or_user_not_found"},
        )
        assert b.api("PUT", "/api/topic-permissions/%2F/tp", {"read": "a"}) == (
            400,
            {"error": "bad_request", "reason": "[{key_missing,exchange},{key_missing,write}]"},
        )
        assert b.api("DELETE", "/api/topic-permissions/%2F/tp/amq.topic")[0] == 204
        assert len(b.api("GET", "/api/topic-permissions/%2F/tp")[1]) == 1
        # RabbitMQ: 204 for an exchange without one, while the user has some in the vhost.
        assert b.api("DELETE", "/api/topic-permissions/%2F/tp/amq.fanout")[0] == 204
        assert len(b.api("GET", "/api/topic-permissions/%2F/tp")[1]) == 1
        assert b.api("DELETE", "/api/topic-permissions/%2F/tp")[0] == 204
        assert b.api("GET", "/api/topic-permissions/%2F/tp")[0] == 404
        assert b.api("DELETE", "/api/topic-permissions/%2F/tp")[0] == 404
        assert b.api("DELETE", "/api/topic-permissions/%2F/tp/amq.topic")[0] == 404
        # Importing RabbitMQ's export format brings them back.
        doc = {"topic_permissions": [row]}
        assert b.api("POST", "/api/definitions", doc)[0] == 204
        assert b.api("GET", "/api/topic-permissions")[1] == [row]


def test_permissions_api_as_rabbitmq(tmp_path):
    """GET/PUT/DELETE /api/permissions/{vhost}/{user} and the per-user and per-vhost lists,
    with RabbitMQ 3.10.8's statuses and bodies."""
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "data")), management=True) as b:
        assert b.api("PUT", "/api/users/pu", {"password": "pw", "tags": ""})[0] == 201
        perms = {"configure": "^c", "write": "", "read": ".*"}
        row = {"user": "pu", "vhost": "/", **perms}
        assert b.api("GET", "/api/permissions/%2F/pu")[0] == 404
        assert b.api("PUT", "/api/permissions/%2F/pu", perms)[0] == 204  # made: 204 too
        assert b.api("PUT", "/api/permissions/%2F/pu", perms)[0] == 204
        assert b.api("GET", "/api/permissions/%2F/pu") == (200, row)
        assert b.api("GET", "/api/users/pu/permissions") == (200, [row])
        assert row in b.api("GET", "/api/vhosts/%2F/permissions")[1]
        assert row in b.api("GET", "/api/permissions")[1]  # the empty expression as written
        assert row in b.api("GET", "/api/definitions")[1]["permissions"]
        for path in ("/api/users/nouser/permissions", "/api/vhosts/novhost/permissions"):
            assert b.api("GET", path)[0] == 404
        assert b.api("PUT", "/api/permissions/%2F/pu", {"configure": "a"}) == (
            400,
            {"error": "bad_request", "reason": "[{key_missing,write},{key_missing,read}]"},
        )
        assert b.api("PUT", "/api/permissions/%2F/pu", {**perms, "read": "("})[0] == 400
        for path in ("/api/permissions/%2F/nouser", "/api/permissions/novhost/pu"):
            assert b.api("PUT", path, perms) == (
                400,
                {"error": "bad_request", "reason": "vhost_or_user_not_found"},
            )
        assert b.api("DELETE", "/api/permissions/%2F/pu")[0] == 204
        assert b.api("DELETE", "/api/permissions/%2F/pu")[0] == 404
        assert b.api("GET", "/api/permissions/%2F/pu")[0] == 404
        assert b.api("DELETE", "/api/permissions/%2F/nouser")[0] == 404


# -- user_id ---------------------------------------------------------------------------


async def test_user_id_must_be_the_authenticated_user(broker):
    add_user(broker.broker, "u1")
    add_user(broker.broker, "imp", tags=("impersonator",))
    own = await outcome(
        broker.port, "u1", publish=("amq.topic", "k", b"x", BasicProperties(user_id="u1"))
    )
    assert own == ["BasicAck"]
    other = await outcome(
        broker.port, "u1", publish=("amq.topic", "k", b"x", BasicProperties(user_id="boss"))
    )
    assert other == [
        "ChannelClose 406 PRECONDITION_FAILED - user_id property set to 'boss' but "
        "authenticated user was 'u1'"
    ]
    impersonated = await outcome(
        broker.port, "imp", publish=("amq.topic", "k", b"x", BasicProperties(user_id="boss"))
    )
    assert impersonated == ["BasicAck"]


async def test_a_client_library_sees_the_refusals(broker):
    """aio-pika, as an application would: the channel closes with RabbitMQ's code and text."""
    add_user(broker.broker, "ap", configure="^ap-", write="^ap-", read="^ap-")
    url = f"amqp://ap:pw@127.0.0.1:{broker.port}/"
    async with await aio_pika.connect(url) as conn:
        ch = await conn.channel()
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused) as info:
            await ch.declare_queue("not-ap", auto_delete=True)
        assert "access to queue 'not-ap' in vhost '/' refused for user 'ap'" in str(info.value)
        ch = await conn.channel()
        x = await ch.get_exchange("amq.topic")
        msg = aio_pika.Message(b"x", user_id="boss")
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused) as info:
            await x.publish(msg, "k")
        assert "access to exchange 'amq.topic' in vhost '/' refused for user 'ap'" in str(
            info.value
        )
        ch = await conn.channel()
        x = await ch.declare_exchange("ap-x", aio_pika.ExchangeType.TOPIC, auto_delete=True)
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as info:
            await x.publish(msg, "k")
        assert "user_id property set to 'boss' but authenticated user was 'ap'" in str(info.value)


# -- authentication failures --------------------------------------------------------------


async def start_ok(port: int, mechanism: str, response: bytes, failure_close: bool = True):
    """Send connection.start-ok; what comes back: a ConnectionClose, or None if the socket
    was closed without one."""
    c = await RawClient.connect(port, handshake=False)
    c.write(PROTOCOL_HEADER)
    await c.expect(spec.ConnectionStart)
    caps = {"authentication_failure_close": True} if failure_close else {}
    c.send(
        0,
        spec.ConnectionStartOk(
            client_properties={"capabilities": caps},
            mechanism=mechanism,
            response=response,
            locale="en_US",
        ),
    )
    try:
        close = await c.expect(spec.ConnectionClose)
    except (ConnectionError, EOFError, asyncio.IncompleteReadError):
        close = None
    c.writer.close()
    return close


REFUSED_PLAIN = (
    "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
    "For details see the broker logfile."
)


@pytest.mark.parametrize(
    ("mechanism", "response", "expected"),
    [
        ("PLAIN", b"\0guest\0s3cret-guess", (403, REFUSED_PLAIN)),
        ("PLAIN", b"\0nobody\0s3cret-guess", (403, REFUSED_PLAIN)),  # same words: no oracle
        (
            "FOO",
            b"\0guest\0guest",
            (503, "COMMAND_INVALID - unknown authentication mechanism 'FOO'"),
        ),
        ("PLAIN", b"s3cret-guess", (502, "SYNTAX_ERROR - malformed PLAIN response")),
    ],
)
async def test_login_failures_as_rabbitmq_and_logged_without_secrets(
    broker, caplog, mechanism, response, expected
):
    caplog.set_level(logging.INFO)
    close = await start_ok(broker.port, mechanism, response)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        *expected,
        0,
        0,
    )
    lines = [r for r in caplog.records if r.getMessage() == "login refused"]
    assert len(lines) == 1
    assert lines[0].conn.startswith("127.0.0.1:")  # the peer address, for fail2ban and people
    everything = " ".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert "s3cret-guess" not in everything
    user = broker.broker.auth.users["guest"]
    assert user.password_hash not in everything


async def test_without_failure_close_the_socket_is_just_closed(broker):
    assert await start_ok(broker.port, "PLAIN", b"\0guest\0wrong", failure_close=False) is None
