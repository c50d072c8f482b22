"""RabbitMQ's vhost and user limits and the global connection limit, each refusal with the
code and text RabbitMQ 3.10.8 sends (checked with the same raw frames against it)."""

from __future__ import annotations

import asyncio

import aio_pika
import aiormq
import pika
import pika.exceptions
import pytest
from support.rawclient import RawClient

from roarmq.broker.core.auth import hash_password
from roarmq.broker.testing import BrokerThread, ephemeral_config, running_broker
from roarmq.protocol import spec
from roarmq.protocol.frames import PROTOCOL_HEADER

pytestmark = pytest.mark.timeout(60)


async def opened(port: int, user: str = "guest", vhost: str = "/") -> tuple[RawClient, object]:
    """A client and the broker's answer to its connection.open."""
    c = await RawClient.connect(port, handshake=False)
    answer = await c.handshake(
        user=user, password="guest" if user == "guest" else "pw", vhost=vhost
    )
    return c, answer


def setup(broker) -> None:
    broker.add_vhost("v1")
    broker.put_user("lu", hash_password("pw"), ())
    for vhost in ("/", "v1"):
        broker.set_permission("lu", vhost, ".*", ".*", ".*")
    broker.set_permission("guest", "v1", ".*", ".*", ".*")


async def test_vhost_connection_limit(broker):
    setup(broker.broker)
    broker.broker.set_limit("vhost", "v1", "max-connections", 1)
    first, answer = await opened(broker.port, vhost="v1")
    assert isinstance(answer, spec.ConnectionOpenOk)
    second, answer = await opened(broker.port, vhost="v1")
    assert (answer.reply_code, answer.reply_text, answer.class_id, answer.method_id) == (
        530,
        "NOT_ALLOWED - access to vhost 'v1' refused for user 'guest': connection limit (1) is reached",
        10,
        40,
    )
    other, answer = await opened(broker.port, vhost="/")  # another vhost is not counted
    assert isinstance(answer, spec.ConnectionOpenOk)
    await first.close()
    await asyncio.sleep(0.05)
    third, answer = await opened(broker.port, vhost="v1")  # a freed place can be taken
    assert isinstance(answer, spec.ConnectionOpenOk)
    for c in (second, other, third):
        c.writer.close()


async def test_vhost_queue_limit(broker):
    setup(broker.broker)
    broker.broker.set_limit("vhost", "v1", "max-queues", 1)
    c, _ = await opened(broker.port, vhost="v1")
    await c.open_channel(1)
    c.send(1, spec.QueueDeclare(queue="q1"))
    await c.expect(spec.QueueDeclareOk)
    c.send(1, spec.QueueDeclare(queue="q1"))  # redeclaring is not declaring a new one
    await c.expect(spec.QueueDeclareOk)
    c.send(1, spec.QueueDeclare(queue="q2", exclusive=True))
    close = await c.expect(spec.ChannelClose)
    assert (close.reply_code, close.reply_text) == (
        406,
        "PRECONDITION_FAILED - cannot declare queue 'q2': queue limit in vhost 'v1' (1) is reached",
    )
    await c.close()


async def test_user_connection_and_channel_limits(broker):
    setup(broker.broker)
    broker.broker.set_limit("user", "lu", "max-connections", 2)
    broker.broker.set_limit("user", "lu", "max-channels", 2)
    a, _ = await opened(broker.port, "lu")
    b, _ = await opened(broker.port, "lu", vhost="v1")  # counted across vhosts
    c, answer = await opened(broker.port, "lu")
    assert (answer.reply_code, answer.reply_text) == (
        530,
        "NOT_ALLOWED - connection refused for user 'lu': user connection limit (2) is reached",
    )
    await a.open_channel(1)
    await b.open_channel(1)  # counted across connections
    a.send(2, spec.ChannelOpen())
    close = await a.expect(spec.ConnectionClose)
    assert (close.reply_code, close.reply_text) == (
        530,
        "NOT_ALLOWED - number of channels opened for user 'lu' has reached the maximum "
        "allowed user limit of (2)",
    )
    guest, answer = await opened(broker.port)  # other users are not limited
    assert isinstance(answer, spec.ConnectionOpenOk)
    await guest.open_channel(1)
    await guest.open_channel(2)
    await guest.open_channel(3)
    for client in (a, b, c, guest):
        client.writer.close()


async def test_negative_or_cleared_limits_are_no_limits(broker):
    setup(broker.broker)
    broker.broker.set_limit("vhost", "v1", "max-queues", -1)
    c, _ = await opened(broker.port, vhost="v1")
    await c.open_channel(1)
    for name in ("a", "b"):
        c.send(1, spec.QueueDeclare(queue=name))
        await c.expect(spec.QueueDeclareOk)
    broker.broker.set_limit("vhost", "v1", "max-queues", 0)
    c.send(1, spec.QueueDeclare(queue="c"))
    assert (await c.expect(spec.ChannelClose)).reply_code == 406
    c.send(1, spec.ChannelCloseOk())
    assert broker.broker.clear_limit("vhost", "v1", "max-queues")
    await c.open_channel(2)
    c.send(2, spec.QueueDeclare(queue="c"))
    await c.expect(spec.QueueDeclareOk)
    await c.close()


async def test_limits_survive_a_restart(tmp_path):
    async with running_broker(ephemeral_config(data_dir=str(tmp_path / "d"))) as b:
        setup(b.broker)
        b.broker.set_limit("vhost", "v1", "max-connections", 0)
    async with running_broker(ephemeral_config(data_dir=str(tmp_path / "d"))) as b:
        c, answer = await opened(b.port, vhost="v1")
        assert answer.reply_code == 530
        c.writer.close()


async def test_global_max_connections(tmp_path):
    cfg = ephemeral_config(data_dir=str(tmp_path / "d"), limits={"max_connections": 1})
    async with running_broker(cfg) as b:
        first, answer = await opened(b.port)
        assert isinstance(answer, spec.ConnectionOpenOk)
        reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed at once
        writer.close()
        await first.open_channel(1)  # the one within the limit is untouched
        await first.close()


def test_limits_api_and_definitions(tmp_path):
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        assert b.api("PUT", "/api/vhosts/v1")[0] == 201
        assert b.api("PUT", "/api/users/lu", {"password": "pw", "tags": ""})[0] == 201
        for path, value in [
            ("/api/vhost-limits/v1/max-connections", 1),
            ("/api/vhost-limits/v1/max-queues", 1),
            ("/api/user-limits/lu/max-connections", 2),
            ("/api/user-limits/lu/max-channels", 2),
        ]:
            assert b.api("PUT", path, {"value": value})[0] == 204
        vhost_rows = [{"vhost": "v1", "value": {"max-connections": 1, "max-queues": 1}}]
        user_rows = [{"user": "lu", "value": {"max-channels": 2, "max-connections": 2}}]
        assert b.api("GET", "/api/vhost-limits") == (200, vhost_rows)
        assert b.api("GET", "/api/vhost-limits/v1") == (200, vhost_rows)
        assert b.api("GET", "/api/vhost-limits/%2F") == (200, [])
        assert b.api("GET", "/api/user-limits") == (200, user_rows)
        assert b.api("GET", "/api/user-limits/lu") == (200, user_rows)
        assert b.api("PUT", "/api/vhost-limits/v1/bogus", {"value": 5}) == (
            400,
            {
                "error": "bad_request",
                "reason": 'Validation failed\n\nUnrecognised terms [{<<"bogus">>,5}] in limits\n',
            },
        )
        status, body = b.api("PUT", "/api/vhost-limits/v1/max-queues", {"value": "x"})
        assert status == 400 and "max-queues should be a number" in body["reason"]
        assert b.api("PUT", "/api/vhost-limits/nope/max-queues", {"value": 1})[0] == 404

        doc = b.api("GET", "/api/definitions")[1]
        assert {
            "value": {"max-connections": 1, "max-queues": 1},
            "vhost": "v1",
            "component": "vhost-limits",
            "name": "limits",
        } in doc["parameters"]
        lu = next(u for u in doc["users"] if u["name"] == "lu")
        assert lu["limits"] == {"max-channels": 2, "max-connections": 2}
        assert lu["tags"] == []
        guest = next(u for u in doc["users"] if u["name"] == "guest")
        assert guest["limits"] == {}  # RabbitMQ lists an empty object, in /api/users too
        assert b.api("GET", "/api/users/guest")[1]["limits"] == {}

        assert b.api("DELETE", "/api/vhost-limits/v1/max-queues")[0] == 204
        assert b.api("DELETE", "/api/user-limits/lu/max-channels")[0] == 204
        assert b.api("GET", "/api/vhost-limits/v1")[1][0]["value"] == {"max-connections": 1}
        assert b.api("POST", "/api/definitions", doc)[0] == 204  # RabbitMQ's format back in
        assert b.api("GET", "/api/vhost-limits") == (200, vhost_rows)
        assert b.api("GET", "/api/user-limits") == (200, user_rows)


def test_limits_api_refusals_as_rabbitmq(tmp_path):
    """RabbitMQ 3.10.8's answers, word for word: vhost limits go through its parameter
    validation ("Validation failed"), user limits do not; values print as Erlang terms."""
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        assert b.api("PUT", "/api/vhosts/v1")[0] == 201
        assert b.api("PUT", "/api/users/lu", {"password": "pw", "tags": ""})[0] == 201

        def reason(path, body):
            status, answer = b.api("PUT", path, body)
            assert status == 400 and answer["error"] == "bad_request", (path, answer)
            return answer["reason"]

        vhost, user = "/api/vhost-limits/v1", "/api/user-limits/lu"
        failed = "Validation failed\n\n{}\n".format
        for value, term in [("5", '<<"5">>'), (1.5, "1.5"), (True, "true"), (None, "null")]:
            assert reason(f"{vhost}/max-queues", {"value": value}) == failed(
                f"max-queues should be a number, actually was {term}"
            )
            assert reason(f"{user}/max-channels", {"value": value}) == (
                f"max-channels should be a number, actually was {term}"
            )
        assert reason(f"{vhost}/max-queues", {"value": {"a": 1}}) == failed(
            'max-queues should be a number, actually was #{<<"a">> => 1}'
        )
        assert reason(f"{vhost}/bogus", {"value": "x"}) == failed(
            'Unrecognised terms [{<<"bogus">>,<<"x">>}] in limits'
        )
        assert reason(f"{user}/bogus", {"value": 1}) == (
            'Unrecognised terms [{<<"bogus">>,1}] in user-limits'
        )
        assert reason(f"{vhost}/max-queues", {}) == "[{key_missing,value}]"
        assert reason(f"{user}/max-channels", {}) == "[{key_missing,value}]"
        assert reason("/api/user-limits/nope/max-channels", {"value": 1}) == [
            "no_such_user",
            "nope",
        ]
        assert b.api("PUT", "/api/vhost-limits/nope/max-queues", {"value": 1}) == (
            404,
            {"error": "not_found", "reason": "vhost_not_found"},
        )
        assert b.api("GET", "/api/vhost-limits/nope")[0] == 404
        assert b.api("GET", "/api/user-limits/nope")[0] == 404
        assert b.api("GET", "/api/vhost-limits/v1") == (200, [])  # nothing was stored
        # Any integer is taken (RabbitMQ's bignums); past 64 bits it is stored as the most.
        assert b.api("PUT", f"{vhost}/max-queues", {"value": 2**64})[0] == 204
        assert b.api("GET", vhost)[1] == [{"vhost": "v1", "value": {"max-queues": 2**63 - 1}}]


async def test_tune_ok_out_of_bounds_in_rabbitmqs_words(broker):
    """RabbitMQ logs these and closes silently after 3 s; RoarMQ sends the same words in
    connection.close (530) at once."""
    for fields, text in [
        (
            {"frame_max": 131073},
            "negotiated frame_max = 131073 is higher than the maximum allowed value (131072)",
        ),
        (
            {"frame_max": 1000},
            "negotiated frame_max = 1000 is lower than the minimum allowed value (4096)",
        ),
        (
            {"channel_max": 2048},
            "negotiated channel_max = 2048 is higher than the maximum allowed value (2047)",
        ),
    ]:
        c = await RawClient.connect(broker.port, handshake=False)
        c.write(PROTOCOL_HEADER)
        await c.expect(spec.ConnectionStart)
        c.send(
            0,
            spec.ConnectionStartOk(
                client_properties={"capabilities": {}},
                mechanism="PLAIN",
                response=b"\0guest\0guest",
                locale="en_US",
            ),
        )
        tune = await c.expect(spec.ConnectionTune)
        assert (tune.channel_max, tune.frame_max) == (2047, 131072)
        ok = {"channel_max": tune.channel_max, "frame_max": tune.frame_max, **fields}
        c.send(0, spec.ConnectionTuneOk(heartbeat=0, **ok))
        close = await c.expect(spec.ConnectionClose)
        assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
            530,
            f"NOT_ALLOWED - {text}",
            10,
            31,
        )
        c.writer.close()


async def test_client_libraries_see_the_limits(broker):
    """What an application sees: pika and aio-pika raise RabbitMQ's codes and texts."""
    setup(broker.broker)
    broker.broker.set_limit("vhost", "v1", "max-connections", 1)
    broker.broker.set_limit("vhost", "v1", "max-queues", 1)
    broker.broker.set_limit("user", "lu", "max-channels", 1)
    url = f"amqp://guest:guest@127.0.0.1:{broker.port}/v1"
    async with await aio_pika.connect(url) as conn:
        ch = await conn.channel()
        await ch.declare_queue("only-one", auto_delete=True)
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as info:
            await ch.declare_queue("one-too-many", auto_delete=True)
        assert info.value.args[0] == (
            "PRECONDITION_FAILED - cannot declare queue 'one-too-many': queue limit in "
            "vhost 'v1' (1) is reached"
        )

        def second_connection() -> tuple[int, str]:
            try:
                pika.BlockingConnection(pika.URLParameters(url)).close()
            except pika.exceptions.ProbableAccessDeniedError as exc:
                return str(exc)
            return "opened"

        assert await asyncio.to_thread(second_connection) == (
            "ConnectionClosedByBroker: (530) \"NOT_ALLOWED - access to vhost 'v1' refused "
            "for user 'guest': connection limit (1) is reached\""
        )
    async with await aio_pika.connect(f"amqp://lu:pw@127.0.0.1:{broker.port}/") as conn:
        await conn.channel()
        with pytest.raises(aiormq.exceptions.ConnectionNotAllowed) as info:
            await conn.channel()
        assert info.value.args[0] == (
            "NOT_ALLOWED - number of channels opened for user 'lu' has reached the maximum "
            "allowed user limit of (1)"
        )
