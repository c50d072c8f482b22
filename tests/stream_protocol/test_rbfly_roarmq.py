"""rbfly against RoarMQ alone, where the RabbitMQ 3.10.8 node of the parity tests cannot
answer: stream filtering (RabbitMQ 3.13+; this follows RabbitMQ 3.13's documentation,
"Stream Filtering"), and what that node is not set up for: users without permissions
(the answer codes of 3.10's PROTOCOL.adoc), TLS (`rabbitmq-stream+tls`), a short
heartbeat, and the client properties a broker keeps of an rbfly connection."""

from __future__ import annotations

import asyncio
import ssl

import pytest
import rbfly.streams as rbs
import trustme
from rbfly.streams.error import ProtocolError
from support.rbfly_clients import client_of, take
from support.waiting import until_async

from roarmq.broker.config import StreamTlsConfig
from roarmq.broker.core.auth import hash_password
from roarmq.broker.stream_protocol import connection as stream_connection
from roarmq.broker.testing import ephemeral_config, running_broker

REGIONS = ("emea", "apac", "amer")


def _region(message: rbs.MessageCtx) -> str:
    return message.app_properties["region"]


async def test_filter_values_published_by_rbfly_filter_on_the_broker(broker):
    """A publisher with `filter_extract` sends publish version 2, a filter value per
    message; a subscription with a MessageFilter sends `filter.N` properties and no
    `match-unfiltered`. RabbitMQ 3.13 delivers whole chunks whose Bloom filter may match
    and rbfly drops the false positives with `extract`; RoarMQ's filter is exact, so
    `extract` only ever sees wanted messages, and messages without a filter value (from
    a version 1 publisher) are not delivered to a filtered subscription."""
    client = client_of(broker)
    seen: list[int] = []

    def extract(message: rbs.MessageCtx) -> str:
        seen.append(message.stream_offset)  # what the broker delivered
        return message.app_properties.get("region", "")

    try:
        await client.create_stream("regions")
        async with client.publisher("regions", filter_extract=_region) as publisher:
            for i in range(30):
                region = REGIONS[i % 3]
                await publisher.send(rbs.stream_message_ctx(i, app_properties={"region": region}))
        async with client.publisher("regions") as unfiltered:
            for i in range(30, 33):
                await unfiltered.send(i)
        async with client.publisher("regions", filter_extract=_region) as publisher:
            await publisher.send(rbs.stream_message_ctx(33, app_properties={"region": "apac"}))
        apac = [*range(1, 30, 3), 33]
        only_apac = rbs.MessageFilter(extract, {"apac"})
        got = await take(client, "regions", rbs.Offset.FIRST, len(apac), filter=only_apac)
        assert got == [(i, i) for i in apac]
        assert seen == apac
        seen.clear()
        two = rbs.MessageFilter(extract, {"apac", "emea"})
        wanted = [i for i in range(34) if i < 30 and i % 3 < 2 or i == 33]
        got = await take(client, "regions", rbs.Offset.FIRST, len(wanted), filter=two)
        assert got == [(i, i) for i in wanted]
        assert seen == wanted
        everything = await take(client, "regions", rbs.Offset.FIRST, 34)  # no filter
        assert everything == [(i, i) for i in range(34)]
    finally:
        await client.disconnect()
    assert broker.broker.vhosts["/"].queues["regions"].message_count() == 34


async def test_a_user_without_permissions_is_refused(broker):
    """Creating or deleting a stream needs configure, declaring a publisher write,
    subscribing read: else `Access refused` (0x10), which rbfly raises (it retries only
    0x02 and 0x06). A user may not log in to a vhost it has no permissions on: `Virtual
    host access failure` (0x0c)."""
    broker.broker.put_user("nobody", hash_password("pw"), ())
    broker.broker.set_permission("nobody", "/", "^$", "^$", "^$")
    broker.broker.put_user("stranger", hash_password("pw"), ())
    owner = client_of(broker)
    nobody = client_of(broker, user="nobody", password="pw")
    try:
        await owner.create_stream("taken")
        for attempt in (
            nobody.create_stream("mine"),
            nobody.delete_stream("taken"),
            take(nobody, "taken", rbs.Offset.FIRST, 1),
        ):
            with pytest.raises(ProtocolError) as refused:
                await asyncio.wait_for(attempt, 10)
            assert refused.value.code == 0x10
        with pytest.raises(ProtocolError) as refused:
            async with nobody.publisher("taken", name="p"):
                pass
        assert refused.value.code == 0x10
        with pytest.raises(ProtocolError) as refused:
            await client_of(broker, user="stranger", password="pw").create_stream("x")
        assert refused.value.code == 0x0C
        assert "mine" not in broker.broker.vhosts["/"].queues
        assert "taken" in broker.broker.vhosts["/"].queues
    finally:
        await owner.disconnect()
        await nobody.disconnect()


async def test_rbfly_over_tls(tmp_path):
    """`rabbitmq-stream+tls://` with an SSLContext: PLAIN inside TLS on [stream.tls]'s
    port."""
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    server.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    tls = StreamTlsConfig(
        enabled=True,
        port=0,
        certfile=str(tmp_path / "server.pem"),
        keyfile=str(tmp_path / "server.pem"),
    )
    context = ssl.create_default_context()
    ca.configure_trust(context)
    config = ephemeral_config(data_dir=str(tmp_path / "data"), stream={"tls": tls})
    async with running_broker(config) as broker:
        port = broker.broker.stream_tls.port
        client = rbs.streams_client(
            f"rabbitmq-stream+tls://guest:guest@127.0.0.1:{port}/", ssl=context
        )
        try:
            await client.create_stream("secure")
            async with client.publisher("secure", name="tls") as publisher:
                await publisher.send("over tls")
            assert await take(client, "secure", rbs.Offset.FIRST, 1) == [(0, "over tls")]
            [conn] = broker.broker.stream_connections
            assert conn.tls
        finally:
            await client.disconnect()


async def test_heartbeats_and_client_properties(broker, monkeypatch):
    """rbfly takes the heartbeat the broker proposes in tune (1 s here) and answers each of
    the broker's heartbeats, so an idle connection stays open; the broker keeps the
    client properties rbfly sends (its product and platform); rbfly's close is answered
    and the broker forgets the connection."""
    monkeypatch.setattr(stream_connection, "HEARTBEAT", 1)
    client = client_of(broker)
    try:
        await client.create_stream("idle")
        [conn] = broker.broker.stream_connections
        assert conn.heartbeat == 1
        assert (await client.get_protocol()).heartbeat == 1
        assert conn.client_properties["product"] == "RbFly"
        assert conn.client_properties["platform"] == "Python"
        received = conn.recv_oct
        sent = conn.send_oct
        # idle: the broker's heartbeat (8 bytes with its size) goes out and comes back
        assert await until_async(lambda: conn.recv_oct >= received + 8, 5)
        assert conn.send_oct >= sent + 8
        assert client.connected and broker.broker.stream_connections == {conn}
        async with client.publisher("idle") as publisher:  # and it still serves
            await publisher.send("after")
    finally:
        await client.disconnect()
    assert await until_async(lambda: not broker.broker.stream_connections, 5)
