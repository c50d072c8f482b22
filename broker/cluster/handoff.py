"""Any node, any client: a connection whose vhost another node leads is handed to that leader.

The handshake (authentication, tune) runs on the node the client reached. At
`connection.open` for a vhost led elsewhere (`ClusterNode.refusal` says so and the leader's
replication address is known), `Handoffs.start`:

1. holds the client's socket (not read) and connects to the leader's replication port;
2. sends one HANDOFF frame (``u32 length | u8 kind | JSON``, the replication port's own
   framing, so the same listener routes it): who the client is -- user, vhost, the
   negotiated frame_max / channel_max / heartbeat, client properties, capabilities, peer
   address, TLS facts, auth mechanism;
3. takes the client's socket away from its `Connection` (`Connection.detach`) and from then
   on copies bytes both ways (`_Relay`), with backpressure: when one side's write buffer
   goes over HIGH_WATER the other side is not read until it drains to LOW_WATER
   (`pause_writing` -> the other transport's `pause_reading`). Either side closing closes
   the other (after what it already had to write).

The leader (`adopt`, called by the replication listener on a HANDOFF frame) makes a
`Connection` of the socket at AWAIT_OPEN with the preamble's facts (no handshake again),
checks the user and the vhost from its own store exactly as for a direct connection's
`connection.open` (same 530/403 texts, sent through the relay), and answers
`connection.open-ok` itself. Why the leader and not the relay: the checks that decide
between open-ok and a 530 (permission, vhost and user connection limits, "is being
recovered", "no longer leads") are the leader's, made at the moment its session starts,
so one answer comes from one place and the relay never has to parse AMQP. Heartbeats are
the leader's (the relay forwards them like any other bytes).

If the leader cannot be reached (refused, CONNECT_TIMEOUT), the client gets the 530 naming
it, as before hand-offs existed. While no node leads the vhost there is nobody to hand to:
the 530 "has no leader at the moment" stays.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from typing import TYPE_CHECKING, Any

from roarmq.protocol.errors import NOT_ALLOWED

from ..connection import Connection
from ..errors import connection_error
from . import replication_wire as wire

if TYPE_CHECKING:
    from .node import ClusterNode

log = logging.getLogger("roarmq.cluster")

#: The replication port's frame kind of a hand-off preamble (replication_wire.py has 1..6).
HANDOFF = 16
#: Seconds to reach the leader before the client gets the 530 naming it.
CONNECT_TIMEOUT = 5.0
#: A side's write buffer above this: the other side is not read until it is below LOW_WATER.
HIGH_WATER = 1024 * 1024
LOW_WATER = 256 * 1024
#: The flow-control reason that holds the client's socket while the leader is reached.
HOLD = "handoff"


def _jsonable(value: Any) -> Any:
    """AMQP field-table values JSON has no type for (bytes, decimals, timestamps)."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("latin-1")
    return str(value)


class Handoffs:
    """One per ClusterNode: the relays this node runs and the adoptions it made."""

    def __init__(self, node: ClusterNode) -> None:
        self.node = node
        self.relays: set[_Relay] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        # The listener's StreamWriters of adopted sockets: StreamWriter.__del__ would close
        # the socket its Connection now owns.
        self._writers: set[asyncio.StreamWriter] = set()

    # -- the relaying node -------------------------------------------------------------

    def target(self, vhost: str) -> tuple[str, str, int] | None:
        """(node, host, replication port) of the vhost's leader, if another node leads it
        and etcd says where it is."""
        c = self.node.coordinator
        if c is None or vhost in c.leading:
            return None
        leader = c.leader(vhost)
        if leader is None or leader[0] == self.node.name:
            return None
        info = c.members().get(leader[0])
        if not info or not info.get("address") or not info.get("replication_port"):
            return None
        return leader[0], str(info["address"]), int(info["replication_port"])

    def start(self, conn: Connection, vhost: str, refusal: str) -> bool:
        """Hand `conn` (at connection.open for `vhost`) to the leader; False when there is
        nobody to hand it to (the caller answers the 530 `refusal`)."""
        target = self.target(vhost)
        if target is None:
            return False
        conn.flow.hold(HOLD)
        task = asyncio.get_running_loop().create_task(self._hand(conn, vhost, target, refusal))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _hand(
        self, conn: Connection, vhost: str, target: tuple[str, str, int], refusal: str
    ) -> None:
        node, host, port = target
        relay = _Relay(self)
        loop = asyncio.get_running_loop()
        try:
            upstream, _ = await asyncio.wait_for(
                loop.create_connection(lambda: relay.leader, host, port), CONNECT_TIMEOUT
            )
        except (TimeoutError, OSError) as exc:
            log.warning(
                "cannot hand the connection to node %r at %s:%d: %s",
                node,
                host,
                port,
                exc,
                extra={"conn": conn.name},
            )
            if conn.transport is not None and not conn.transport.is_closing():
                conn.close_with_error(connection_error(NOT_ALLOWED, refusal))
            return
        if conn.transport is None or conn.transport.is_closing():
            upstream.close()  # the client went away meanwhile
            return
        upstream.write(wire.control(HANDOFF, self.facts(conn, vhost)))
        client, rest = conn.detach()
        relay.attach(client, rest)
        log.info(
            "connection handed to node %r (vhost %r)",
            node,
            vhost,
            extra={"conn": conn.name},
        )

    def facts(self, conn: Connection, vhost: str) -> dict[str, Any]:
        """The preamble: everything the leader needs to continue the session at open."""
        facts = {
            "vhost": vhost,
            "user": conn.user.name,
            "auth_mechanism": conn.auth_mechanism,
            "frame_max": conn.frame_max,
            "channel_max": conn.channel_max,
            "heartbeat": conn.heartbeat,
            "client_properties": conn.client_properties,
            "capabilities": conn.capabilities,
            "peer": list(conn.peer) if conn.peer else None,
            "tls": dataclasses.asdict(conn.tls) if conn.tls is not None else None,
            "via": self.node.name,
        }
        return json.loads(json.dumps(facts, default=_jsonable))

    # -- the leader ----------------------------------------------------------------------

    def adopt(
        self, facts: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """A HANDOFF frame on the replication listener: the socket becomes a Connection."""
        transport = writer.transport
        buffered = bytes(reader._buffer)  # bytes the relay sent after the preamble
        reader._buffer.clear()
        self._writers = {w for w in self._writers if not w.transport.is_closing()}
        self._writers.add(writer)
        conn = Connection(self.node.broker)
        transport.set_protocol(conn)
        conn.adopt(transport, facts, buffered)  # type: ignore[arg-type]
        if not transport.is_closing():
            transport.resume_reading()  # the stream reader may have paused it
        log.info(
            "adopted a connection handed over by node %r (vhost %r, user %r)",
            facts.get("via"),
            facts.get("vhost"),
            facts.get("user"),
            extra={"conn": conn.name},
        )

    def close(self) -> None:
        """The node stops: every relayed client is disconnected (it reconnects elsewhere)."""
        for task in self._tasks:
            task.cancel()
        for relay in list(self.relays):
            relay.close()


class _Side(asyncio.Protocol):
    """One socket of a relay; what it reads is written to the other side."""

    __slots__ = ("relay", "transport", "other")

    def __init__(self, relay: _Relay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self.other: _Side | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        other = self.other
        if other is not None and other.transport is not None:
            other.transport.write(data)

    def eof_received(self) -> bool:
        return False  # close this side; connection_lost closes the other

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.relay.close()

    def pause_writing(self) -> None:
        """Our buffer towards this side is full: stop reading the other side."""
        other = self.other
        if other is not None and other.transport is not None and not other.transport.is_closing():
            other.transport.pause_reading()

    def resume_writing(self) -> None:
        other = self.other
        if other is not None and other.transport is not None and not other.transport.is_closing():
            other.transport.resume_reading()


class _Relay:
    """A client's socket and the leader's, copied both ways."""

    def __init__(self, owner: Handoffs) -> None:
        self.owner = owner
        self.client = _Side(self)
        self.leader = _Side(self)
        self.client.other = self.leader
        self.leader.other = self.client
        self.closed = False

    def attach(self, client: asyncio.Transport, rest: bytes) -> None:
        """The client's socket (from `Connection.detach`, not being read) joins the relay."""
        self.owner.relays.add(self)
        client.set_protocol(self.client)
        self.client.connection_made(client)
        if self.closed or self.leader.transport is None:  # the leader went away already
            self.close()
            return
        if rest:
            self.leader.transport.write(rest)
        client.resume_reading()

    def close(self) -> None:
        """Either side closed: close the other (what it had to write is still written)."""
        self.closed = True
        self.owner.relays.discard(self)
        for side in (self.client, self.leader):
            if side.transport is not None and not side.transport.is_closing():
                side.transport.close()
