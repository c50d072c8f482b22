"""Any node, any client: a client of a node that does not lead its vhost is handed to the
leader (broker/cluster/handoff.py) and notices nothing.

Three real nodes on a real etcd, all on this machine, so the client's socket itself is
passed to the leader (SCM_RIGHTS over the leader's hand-off socket): pika on a non-leader
publishes 100 persistent messages with confirms into a durable queue and consumes them
with manual acks; the connection is the leader's own (API: the leader lists it with the
client's port, the first node lists none, its counters say passed, no relay); heartbeats
keep it alive; an amqps client on the same node is relayed instead (TLS state cannot move);
a kill -9 of the first node leaves the passed client working. With the leader's hand-off
socket gone, a client is relayed over the replication port (the fallback): the same
traffic and heartbeats, closing it closes the leader's side, and a kill -9 of the leader
closes the relayed client, which reconnects to any node and reaches the new leader."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import time
import urllib.request
from typing import Any

import aio_pika
import pika
import pytest
import trustme
from support.cluster_nodes import TTL, Node, placement, three_nodes
from support.waiting import free_port, until

from roarmq.protocol import spec
from roarmq.protocol.frames import (
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    FrameParser,
    MethodFrame,
    encode_content,
    encode_method,
)
from roarmq.protocol.properties import BasicProperties

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


@pytest.fixture
def cluster(etcd, tmp_path):
    with three_nodes(etcd, tmp_path) as nodes:
        yield nodes


@pytest.fixture
def tls_cluster(etcd, tmp_path):
    """Three nodes, each with an amqps listener too; yields (nodes, CA file)."""
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    cert, key, ca_file = tmp_path / "server.pem", tmp_path / "server.key", tmp_path / "ca.pem"
    for blob in server.cert_chain_pems:
        blob.write_to_path(str(cert), append=True)
    server.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    nodes = []
    for i in (1, 2, 3):
        tls_port = free_port()
        tls = (
            f"[amqp.tls]\nenabled = true\nport = {tls_port}\n"
            f"certfile = {json.dumps(str(cert))}\nkeyfile = {json.dumps(str(key))}\n"
        )
        nodes.append(Node(tmp_path, f"n{i}", etcd.url, extra=tls))
        nodes[-1].tls_port = tls_port
    try:
        for node in nodes:
            node.start()
        yield nodes, ca_file
    finally:
        for node in nodes:
            node.stop()


def agreed_leader(nodes: list[Node]) -> str | None:
    seen = {placement(node) for node in nodes}
    if len(seen) != 1:
        return None
    (leader, members, in_sync), *_ = seen
    return leader if leader is not None and len(in_sync) == len(nodes) else None


def connections_on(node: Node) -> list[dict]:
    return [c for c in node.api("/api/connections") if c.get("vhost") == "/"]


def own_connections(node: Node) -> list[dict]:
    """The connections this node holds itself (not the cluster-wide merge)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{node.mgmt_port}/api/connections",
        headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q=", "X-RoarMQ-Node-Local": "1"},
    )
    with urllib.request.urlopen(request, timeout=2) as resp:
        return json.loads(resp.read())


def own_row(node: Node) -> dict:
    """The node's own row of GET /api/nodes: its hand-off counters."""
    return next(row for row in node.api("/api/nodes") if row["name"] == node.name)


def local_port(conn: pika.BlockingConnection) -> int:
    return conn._impl._transport._sock.getsockname()[1]


def publish_and_consume(ch, queue: str, count: int, tag: bytes) -> None:
    """`count` persistent messages with confirms, then consumed with manual acks, in order."""
    bodies = [tag + b"%03d" % i for i in range(count)]
    for body in bodies:
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2), mandatory=True)
    got = []
    for _ in range(count):
        method, _props, body = ch.basic_get(queue, auto_ack=False)
        assert method is not None
        got.append(body)
        ch.basic_ack(method.delivery_tag)
    assert got == bodies
    assert ch.queue_declare(queue, passive=True).method.message_count == 0


async def aiopika_roundtrip(port: int) -> None:
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        queue = await ch.declare_queue("passed", durable=True)
        for i in range(10):
            await ch.default_exchange.publish(
                aio_pika.Message(b"aio%d" % i, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key="passed",
            )
        got = []
        for _ in range(10):
            message = await queue.get(no_ack=False, timeout=5)
            got.append(message.body)
            await message.ack()
        assert got == [b"aio%d" % i for i in range(10)]


async def pipelined_session(port: int, queue: str, count: int) -> list[Any]:
    """A client that does not wait for connection.open-ok: connection.open, channel.open,
    confirm.select, a durable queue.declare, `count` persistent publishes and a heartbeat
    go in one write after tune-ok (RabbitMQ answers them all). The methods it gets back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    parser = FrameParser(expect_protocol_header=False)
    got: list[Any] = []

    async def method() -> Any:
        while not got:
            data = await asyncio.wait_for(reader.read(65536), 10)
            if not data:
                raise ConnectionError("the broker closed the socket")
            got.extend(e.method for e in parser.feed(data) if isinstance(e, MethodFrame))
        return got.pop(0)

    writer.write(PROTOCOL_HEADER)
    assert isinstance(await method(), spec.ConnectionStart)
    writer.write(
        encode_method(
            0,
            spec.ConnectionStartOk(
                client_properties={"product": "pipelining"},
                mechanism="PLAIN",
                response=b"\x00guest\x00guest",
                locale="en_US",
            ),
        )
    )
    tune = await method()
    assert isinstance(tune, spec.ConnectionTune)
    persistent = BasicProperties(delivery_mode=2)
    frames = [
        encode_method(
            0,
            spec.ConnectionTuneOk(
                channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0
            ),
        ),
        encode_method(0, spec.ConnectionOpen(virtual_host="/")),
        encode_method(1, spec.ChannelOpen()),
        encode_method(1, spec.ConfirmSelect()),
        encode_method(1, spec.QueueDeclare(queue=queue, durable=True)),
        *(
            encode_content(
                1, spec.BasicPublish(routing_key=queue), persistent, b"p%d" % i, tune.frame_max
            )
            for i in range(count)
        ),
        HEARTBEAT_FRAME,
    ]
    writer.write(b"".join(frames))
    answers = [await method() for _ in range(4)]
    acked = 0
    while acked < count:
        ack = await method()
        answers.append(ack)
        assert isinstance(ack, spec.BasicAck), ack
        acked = ack.delivery_tag
    writer.write(
        encode_method(
            0, spec.ConnectionClose(reply_code=200, reply_text="bye", class_id=0, method_id=0)
        )
    )
    answers.append(await method())
    writer.close()
    return answers


def assert_pipelined_answered(answers: list[Any], count: int) -> None:
    kinds = [type(a) for a in answers]
    assert kinds[:4] == [
        spec.ConnectionOpenOk,
        spec.ChannelOpenOk,
        spec.ConfirmSelectOk,
        spec.QueueDeclareOk,
    ], answers
    assert answers[3].message_count == 0
    assert answers[-2].delivery_tag == count and isinstance(answers[-1], spec.ConnectionCloseOk)


def test_client_on_a_follower_has_its_socket_passed_to_the_leader(tls_cluster):
    nodes, ca_file = tls_cluster
    leader_name = until(lambda: agreed_leader(nodes), 40)
    assert leader_name, [n.log.read_text()[-2000:] for n in nodes]
    leader = next(n for n in nodes if n.name == leader_name)
    first, _third = [n for n in nodes if n is not leader]
    assert own_row(leader)["handoff_socket"] == str(leader.data_dir / "handoff.sock")

    params = first.params()
    params.heartbeat = 1
    conn = pika.BlockingConnection(params)
    # Passed, not relayed: the first node keeps nothing of it, the leader has it as its own.
    # (The leader acks the pass before it answers open-ok; the first node may count it a
    # moment after the client is open.)
    assert until(lambda: own_row(first)["handoffs_passed"] == 1, 5), own_row(first)
    row = own_row(first)
    assert (row["handoffs_passed"], row["handoffs_relayed"], row["relays"]) == (1, 0, 0), row
    assert row["handoffs_pass_failed"] == 0
    assert own_row(leader)["handoffs_adopted_passed"] == 1
    assert own_connections(first) == []
    (mine,) = own_connections(leader)
    assert mine["peer_port"] == local_port(conn) and mine["vhost"] == "/"
    assert mine["node"] == leader_name

    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("passed", durable=True)
    publish_and_consume(ch, "passed", 100, b"m")
    assert leader.api("/api/queues/%2F/passed")["node"] == leader_name
    conn.sleep(3)  # three heartbeat intervals (1 s) with the leader itself
    assert conn.is_open

    # amqps is relayed: its TLS session cannot leave the first node's process.
    tls_params = pika.ConnectionParameters(
        "127.0.0.1",
        first.tls_port,
        connection_attempts=1,
        socket_timeout=3,
        ssl_options=pika.SSLOptions(ssl.create_default_context(cafile=str(ca_file)), "127.0.0.1"),
    )
    tls = pika.BlockingConnection(tls_params)
    row = own_row(first)
    assert (row["handoffs_passed"], row["handoffs_relayed"], row["relays"]) == (1, 1, 1), row
    assert row["handoffs_pass_failed"] == 0
    tls_ch = tls.channel()
    tls_ch.confirm_delivery()
    publish_and_consume(tls_ch, "passed", 10, b"t")
    tls.close()
    assert until(lambda: own_row(first)["relays"] == 0, 5)

    # aio-pika (its own handshake and pipelining) is passed too, and publishes with confirms.
    asyncio.run(aiopika_roundtrip(first.port))
    assert until(lambda: own_row(first)["handoffs_passed"] == 2, 5), own_row(first)
    assert own_row(first)["handoffs_relayed"] == 1

    # A client that pipelines past connection.open: the leader answers every frame.
    assert_pipelined_answered(asyncio.run(pipelined_session(first.port, "piped", 5)), 5)
    assert until(lambda: own_row(first)["handoffs_passed"] == 3, 5), own_row(first)
    assert until(lambda: leader.api("/api/queues/%2F/piped").get("messages") == 5, 5)

    # kill -9 of the first node: the passed client does not notice.
    first.kill9()
    conn.process_data_events(0.5)
    assert conn.is_open
    publish_and_consume(ch, "passed", 20, b"a")
    conn.sleep(2)
    assert conn.is_open
    assert len(own_connections(leader)) == 1
    # Closing it closes the leader's connection (an ordinary one of the leader's).
    conn.close()
    assert until(lambda: own_connections(leader) == [], 5), own_connections(leader)


def test_relay_when_the_leader_socket_is_unavailable(cluster):
    leader_name = until(lambda: agreed_leader(cluster), 40)
    assert leader_name, [n.log.read_text()[-2000:] for n in cluster]
    leader = next(n for n in cluster if n.name == leader_name)
    relay, third = [n for n in cluster if n is not leader]
    # The leader's hand-off socket goes away: clients of other nodes are relayed to it.
    os.unlink(own_row(leader)["handoff_socket"])

    # Publish 100 persistent messages with confirms through a node that does not lead.
    conn = pika.BlockingConnection(relay.params())
    row = own_row(relay)
    assert (row["handoffs_passed"], row["handoffs_relayed"], row["relays"]) == (0, 1, 1), row
    assert row["handoffs_pass_failed"] == 1
    assert own_row(leader)["handoffs_adopted_relayed"] == 1
    assert own_connections(relay) == []
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("handed", durable=True)
    bodies = [b"m%03d" % i for i in range(100)]
    for body in bodies:
        ch.basic_publish("", "handed", body, pika.BasicProperties(delivery_mode=2), mandatory=True)
    # The queue and the connection are the leader's.
    row = leader.api("/api/queues/%2F/handed")
    assert row["node"] == leader_name and row["durable"] is True
    assert until(lambda: row_count(leader) == 100, 5)
    assert len(connections_on(leader)) == 1
    # (the relay keeps none of its own; a merged cluster-wide list names the leader)
    assert all(c.get("node", leader_name) == leader_name for c in connections_on(relay))
    # Consume them with manual acks, in order.
    got = []
    for _ in range(100):
        method, _props, body = ch.basic_get("handed", auto_ack=False)
        assert method is not None
        got.append(body)
        ch.basic_ack(method.delivery_tag)
    assert got == bodies
    assert ch.queue_declare("handed", passive=True).method.message_count == 0
    # Closing the client closes the leader's side.
    conn.close()
    assert until(lambda: connections_on(leader) == [], 5), connections_on(leader)
    assert until(lambda: own_row(relay)["relays"] == 0, 5)

    # A client that pipelines past connection.open: relayed, the leader answers every frame.
    assert_pipelined_answered(asyncio.run(pipelined_session(relay.port, "piped", 5)), 5)
    assert own_row(relay)["handoffs_relayed"] == 2
    assert until(lambda: leader.api("/api/queues/%2F/piped").get("messages") == 5, 5)
    assert until(lambda: own_row(relay)["relays"] == 0, 5)

    # Heartbeats pass through (the leader sends them, the relay copies them).
    params = relay.params()
    params.heartbeat = 1
    hb = pika.BlockingConnection(params)
    assert own_row(relay)["relays"] == 1
    hb.sleep(3)
    assert hb.is_open
    assert hb.channel().queue_declare("handed", passive=True).method.message_count == 0

    # kill -9 of the leader: the relayed client is closed; it reconnects to any node and
    # reaches the new leader (a 530 while the election runs).
    leader.kill9()
    deadline = time.monotonic() + 5
    while hb.is_open and time.monotonic() < deadline:
        try:
            hb.process_data_events(0.2)
        except pika.exceptions.AMQPError:
            break
    assert not hb.is_open

    def reconnect():
        try:
            c = pika.BlockingConnection(third.params())
        except pika.exceptions.AMQPError:
            return None
        return c

    again = until(reconnect, 4 * TTL + 10, step=0.2)
    assert again, [n.log.read_text()[-3000:] for n in (relay, third)]
    ch = again.channel()
    ch.confirm_delivery()
    ch.basic_publish("", "handed", b"after", pika.BasicProperties(delivery_mode=2))
    assert ch.queue_declare("handed", passive=True).method.message_count == 1
    new_leader = placement(third)[0]
    assert new_leader in (relay.name, third.name)
    again.close()


def row_count(node: Node) -> int:
    return node.api("/api/queues/%2F/handed").get("messages", -1)


def test_socket_address_falls_back_to_an_abstract_name(tmp_path):
    from roarmq.broker.cluster import handoff

    short = tmp_path / "d"
    assert handoff.socket_address(str(short)) == (str(short / "handoff.sock"),) * 2
    deep = tmp_path / ("x" * 120)
    bind, shown = handoff.socket_address(str(deep))
    assert bind.startswith("\0roarmq-handoff-") and shown == "@" + bind[1:]
    assert handoff.socket_address(str(deep)) == (bind, shown)  # the same name every start
    assert handoff.machine_id()  # Linux: the boot id and the hostname


class _FakeConnection:
    """What `Handoffs._pass` uses of a Connection at connection.open."""

    def __init__(self, transport) -> None:
        from types import SimpleNamespace

        self.transport, self.tls, self.name = transport, None, "fake"
        self.user, self.auth_mechanism = SimpleNamespace(name="guest"), "PLAIN"
        self.frame_max, self.channel_max, self.heartbeat = 131072, 2047, 60
        self.client_properties, self.capabilities = {"product": "test"}, {}
        self.peer = ("127.0.0.1", 1)
        self.detached = False

    def flush(self) -> None:
        pass

    def unread(self) -> bytes:
        return b"\x01\x00\x01"  # bytes read past connection.open, carried on

    def detach(self):
        self.detached = True
        transport, self.transport = self.transport, None
        return transport, b""


async def test_pass_over_an_abstract_socket_and_refusals(tmp_path):
    """In one process, no broker: a long data dir gets an abstract hand-off socket; a
    client's TCP socket passed over it arrives with the preamble and the unread bytes, the
    passing side forgets its copy and the client talks to the receiver; a socket that
    answers with another node's name is not passed to (False: the caller relays), nor is a
    missing one."""
    import asyncio
    from types import SimpleNamespace

    from roarmq.broker.cluster import handoff

    def node(name: str, data_dir):
        storage = SimpleNamespace(data_dir=str(data_dir))
        broker = SimpleNamespace(config=SimpleNamespace(storage=storage))
        return SimpleNamespace(name=name, broker=broker, coordinator=None)

    loop = asyncio.get_running_loop()
    leader = handoff.Handoffs(node("L", tmp_path / ("d" * 120)))
    first = handoff.Handoffs(node("F", tmp_path / "f"))
    adopted: list = []
    leader._adopt = lambda transport, facts, data, passed: adopted.append(
        (transport, facts, data, passed)
    )
    await leader.listen()
    assert leader.socket_path.startswith("@roarmq-handoff-")
    assert leader.advertised() == {
        "machine": handoff.machine_id(),
        "handoff_socket": leader.socket_path,
    }

    class Holder(asyncio.Protocol):
        def connection_made(self, transport):
            transport.pause_reading()  # as the flow hold leaves it
            accepted.set_result(transport)

    accepted = loop.create_future()
    front = await loop.create_server(Holder, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", front.sockets[0].getsockname()[1])
    conn = _FakeConnection(await accepted)

    # Refused: no such socket; a socket of another name. The connection is untouched.
    assert not await first._pass(conn, "/", "L", "@roarmq-handoff-nobody")
    assert not await first._pass(conn, "/", "X", leader.socket_path)
    assert first.pass_failed == 2 and not conn.detached and not adopted

    assert await first._pass(conn, "/", "L", leader.socket_path)
    assert first.passed == 1 and conn.detached
    for _ in range(100):
        if adopted:
            break
        await asyncio.sleep(0.01)
    transport, facts, data, passed = adopted[0]
    assert passed and data == b"\x01\x00\x01"
    assert facts["vhost"] == "/" and facts["user"] == "guest" and facts["via"] == "F"
    assert facts["frame_max"] == 131072 and facts["client_properties"] == {"product": "test"}
    # The first side's copy is closed, the client's socket is not: it talks to the receiver.
    transport.write(b"from the leader")
    assert await asyncio.wait_for(reader.readexactly(15), 5) == b"from the leader"
    transport.close()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    front.close()
    leader.close()
    first.close()


async def test_relay_backpressure_both_ways():
    """A leader that does not read: the relay stops reading the client once its buffer
    towards the leader is over HIGH_WATER (bounded memory), and everything arrives once the
    leader reads again. Closing one side closes the other."""
    import asyncio

    from roarmq.broker.cluster import handoff

    loop = asyncio.get_running_loop()
    received = bytearray()
    leader_side: list[asyncio.Transport] = []

    class Leader(asyncio.Protocol):
        def connection_made(self, transport):
            transport.pause_reading()  # a slow leader
            leader_side.append(transport)

        def data_received(self, data):
            received.extend(data)

    class Holder(asyncio.Protocol):
        def connection_made(self, transport):
            accepted.set_result(transport)

    accepted = loop.create_future()
    leader_server = await loop.create_server(Leader, "127.0.0.1", 0)
    front = await loop.create_server(Holder, "127.0.0.1", 0)
    owner = type("Owner", (), {"relays": set()})()
    relay = handoff._Relay(owner)
    await loop.create_connection(
        lambda: relay.leader, "127.0.0.1", leader_server.sockets[0].getsockname()[1]
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", front.sockets[0].getsockname()[1])
    client_transport = await accepted
    client_transport.pause_reading()  # as Connection.detach leaves it
    relay.attach(client_transport, b"")
    chunk = b"x" * (1 << 20)
    total = 64 * len(chunk)  # 64 MiB: past the kernel buffers and HIGH_WATER
    for _ in range(64):
        writer.write(chunk)
    drained = asyncio.ensure_future(writer.drain())
    await asyncio.sleep(0.5)
    # Bounded: the relay holds at most HIGH_WATER plus one read towards the leader.
    assert relay.leader.transport.get_write_buffer_size() <= handoff.HIGH_WATER + 262144
    assert not client_transport.is_reading()
    leader_side[0].resume_reading()
    deadline = loop.time() + 10
    while len(received) < total and loop.time() < deadline:
        await asyncio.sleep(0.05)
    assert len(received) == total and set(received) == {ord("x")}
    await drained
    assert client_transport.is_reading()
    # The leader closes: the client's socket is closed too.
    leader_side[0].close()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    assert relay.closed and not owner.relays
    writer.close()
    leader_server.close()
    front.close()


def test_the_replication_port_refuses_a_stranger_without_the_cluster_cookie(cluster, etcd):
    """A HANDOFF claiming to be guest on "/" (what a relay sends), or a follower's HELLO,
    from someone without the cluster's cookie (etcd's {name}/cookie): refused, nothing
    adopted, nothing streamed."""
    import socket as sockets

    from roarmq.broker.cluster.handoff import HANDOFF
    from roarmq.broker.replog import wire

    assert until(lambda: placement(cluster[0])[0], 30)
    leader = next(n for n in cluster if n.name == placement(cluster[0])[0])
    facts = {
        "vhost": "/",
        "user": "guest",
        "auth_mechanism": "PLAIN",
        "frame_max": 131072,
        "channel_max": 2047,
        "heartbeat": 0,
        "client_properties": {},
        "capabilities": {},
        "peer": ["127.0.0.1", 1],
        "tls": None,
        "via": "n9",
    }
    hello = {"vhost": "/", "node": "n9", "epoch": 0, "offset": 0, "last_epoch": 0}
    for kind, fields in (
        (HANDOFF, facts),
        (wire.HELLO, hello),
        (HANDOFF, {**facts, "cookie": "x"}),
    ):
        with sockets.create_connection(("127.0.0.1", leader.repl_port), timeout=5) as s:
            s.sendall(wire.control(kind, fields))
            answer = b""
            while chunk := s.recv(4096):
                answer += chunk
        assert answer[4] == wire.REFUSE and b"bad cookie" in answer, answer
    conns = leader.api("/api/connections")
    assert conns == [], conns
    assert "not this cluster's cookie" in leader.log.read_text()


def test_a_client_reaching_a_follower_of_a_frozen_leader_is_served_by_its_successor(etcd, tmp_path):
    """The leader is frozen (SIGSTOP) and stays frozen. A client that reaches a follower
    once the leader has been silent for two of its heartbeats (replica_lag_ms 1000: 0.5 s)
    but before its lease has expired (TTL 2 s) is neither handed to the frozen process (a
    socket nobody reads: the client would wait until the leader wakes) nor refused: the
    follower holds its connection.open until a successor serves, and the client publishes
    with confirms on the successor while the old leader still sleeps."""
    with three_nodes(etcd, tmp_path, "replica_lag_ms = 1000\n") as nodes:
        leader_name = until(lambda: agreed_leader(nodes), 40)
        assert leader_name, [n.log.read_text()[-2000:] for n in nodes]
        leader = next(n for n in nodes if n.name == leader_name)
        follower = next(n for n in nodes if n is not leader)
        leader.freeze()
        time.sleep(1.0)
        params = follower.params()
        params.connection_attempts = 1
        params.socket_timeout = 20
        params.stack_timeout = 20
        started = time.monotonic()
        conn = pika.BlockingConnection(params)
        took = time.monotonic() - started
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("successor", durable=True)
        publish_and_consume(ch, "successor", 20, b"s")
        successor = next(n for n in nodes if n is not leader and placement(n)[0] == n.name)
        assert local_port(conn) in {c["peer_port"] for c in own_connections(successor)}
        # Everything above happened while the old leader slept.
        assert leader.proc.poll() is None
        with open(f"/proc/{leader.proc.pid}/stat") as stat:
            assert stat.read().split(") ")[1][0] == "T", "the old leader woke up"
        # Held for the election (lease expiry, campaign, recovery), not for a timeout.
        assert took < 2 * TTL + 3, took
        conn.close()
