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

When the leader runs on the same machine (its membership record's ``machine``, the kernel's
boot id and the hostname, equals ours) the socket itself is passed instead, and this node
steps out of the path entirely (`_pass`): every node listens on a Unix socket
(``handoff.sock`` in its data dir, mode 0600; an abstract name when that path is longer
than sun_path allows) and advertises it as ``handoff_socket``. The passing node connects,
checks the listener runs as its own uid (SO_PEERCRED) and says it is the leader (a hello
line with its node name), sends ``u32 length`` with the client's fd (SCM_RIGHTS) and then
the same preamble as the relay's plus ``data``, the bytes already read past
connection.open; the leader checks the sender's uid, answers one ack byte *before* it
touches the socket, and adopts it through the same `_adopt` as a relayed one. On the ack
the passing node closes its copy of the fd and forgets the connection; without one (no
socket, a refused or timed-out pass, the leader gone) nothing was written to the client,
and the connection is relayed as above. TLS connections are always relayed: their session
state lives in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import socket
import struct
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roarmq.protocol.errors import NOT_ALLOWED

from ..amqp.connection import Connection
from ..errors import connection_error
from ..replog import wire

if TYPE_CHECKING:
    from .node import ClusterNode

log = logging.getLogger("roarmq.cluster")

#: The replication port's frame kind of a hand-off preamble (replog/wire.py has 1..6).
HANDOFF = 16
#: Seconds to reach the leader before the client gets the 530 naming it.
CONNECT_TIMEOUT = 5.0
#: A side's write buffer above this: the other side is not read until it is below LOW_WATER.
HIGH_WATER = 1024 * 1024
LOW_WATER = 256 * 1024
#: The flow-control reason that holds the client's socket while the leader is reached.
HOLD = "handoff"
#: Seconds for each step of passing a socket (connect, hello, preamble); the passing node
#: waits twice that for the ack, and the leader takes nothing it acks later than this.
PASS_TIMEOUT = 2.0
#: The Unix socket other nodes on this machine pass client sockets to, in the data dir.
SOCKET_FILE = "handoff.sock"
#: sockaddr_un.sun_path is 108 bytes, its NUL included.
SUN_PATH_MAX = 107
#: The largest preamble taken over the Unix socket (facts plus the bytes read past open).
MAX_PASS_BODY = 4 * 1024 * 1024
_LEN = struct.Struct(">I")
_ACK = b"\x01"
_CMSG_FLAGS = getattr(socket, "MSG_CMSG_CLOEXEC", 0)


def machine_id() -> str | None:
    """What says two nodes can pass sockets: the running kernel's boot id (SCM_RIGHTS works
    within one kernel; it changes at every boot) and the hostname (containers on one kernel
    have their own). None where there is no boot id (not Linux): never passed."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    if not boot or not hasattr(socket, "send_fds") or not hasattr(socket, "SO_PEERCRED"):
        return None
    return f"{boot}/{socket.gethostname()}"


def socket_address(data_dir: str) -> tuple[str, str]:
    """(what to bind, what to advertise) for the hand-off socket of `data_dir`: the file
    ``handoff.sock`` there, or, when its path is too long for sun_path, an abstract name
    derived from it (advertised with a leading '@', as ss(8) shows them)."""
    path = os.path.abspath(os.path.join(data_dir, SOCKET_FILE))
    if len(os.fsencode(path)) <= SUN_PATH_MAX:
        return path, path
    name = "roarmq-handoff-" + hashlib.sha256(os.fsencode(path)).hexdigest()[:32]
    return "\0" + name, "@" + name


def _bindable(advertised: str) -> str:
    return "\0" + advertised[1:] if advertised.startswith("@") else advertised


def _peer_uid(sock: socket.socket) -> int:
    _pid, uid, _gid = struct.unpack(
        "iII", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    )
    return int(uid)


def _remove_stale(path: str) -> None:
    """A socket file left by a process that is gone (kill -9) is removed; one something
    still listens on is not (bind then fails, and this node is only relayed to)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except FileNotFoundError:
        return
    except ConnectionRefusedError:
        os.unlink(path)
        return
    finally:
        probe.close()
    raise OSError(f"another process listens on {path}")


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    ready = loop.create_future()
    fd = sock.fileno()
    loop.add_reader(fd, _wake, ready)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


async def _read_line(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        chunk = await loop.sock_recv(sock, 4096)
        if not chunk or len(line) > 4096:
            raise ConnectionError("the hand-off socket closed before its hello")
        line += chunk
    return line


async def _receive_pass(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, fds: list[int]
) -> dict[str, Any]:
    """The passing node's ``u32 length`` (with the fd, appended to `fds`), then the
    preamble of that length."""
    head = b""
    while len(head) < _LEN.size:
        try:
            data, got, flags, _ = socket.recv_fds(sock, _LEN.size - len(head), 4, _CMSG_FLAGS)
        except BlockingIOError:
            await _readable(loop, sock)
            continue
        fds.extend(got)
        if flags & socket.MSG_CTRUNC:
            raise ConnectionError("more descriptors than one hand-off carries")
        if not data:
            raise ConnectionError("the passing node closed before its preamble")
        head += data
    (size,) = _LEN.unpack(head)
    if size > MAX_PASS_BODY:
        raise ValueError(f"hand-off preamble of {size} bytes")
    body = bytearray()
    while len(body) < size:
        chunk = await loop.sock_recv(sock, min(size - len(body), 65536))
        if not chunk:
            raise ConnectionError("the passing node closed in the middle of its preamble")
        body += chunk
    return wire.decode_control(bytes(body))


class PassRefused(Exception):
    """The socket was not passed (the connection is relayed instead), in words."""


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
        #: This machine (machine_id) and the hand-off socket as advertised: set by `listen`.
        self.machine: str | None = None
        self.socket_path: str | None = None
        self._unix: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        # Counted per hand-off (GET /api/nodes, this node's row), never per message.
        self.passed = 0  # client sockets this node passed to a leader on this machine
        self.relayed = 0  # client connections this node relays to a leader
        self.pass_failed = 0  # passes that fell back to the relay
        self.adopted_passed = 0  # sockets passed to this node and adopted
        self.adopted_relayed = 0  # relayed connections this node adopted

    def stats(self) -> dict[str, Any]:
        return {
            "handoffs_passed": self.passed,
            "handoffs_relayed": self.relayed,
            "handoffs_pass_failed": self.pass_failed,
            "handoffs_adopted_passed": self.adopted_passed,
            "handoffs_adopted_relayed": self.adopted_relayed,
            "relays": len(self.relays),
            "handoff_socket": self.socket_path,
        }

    def advertised(self) -> dict[str, Any]:
        """What the membership record carries so that nodes on this machine pass sockets."""
        if self.socket_path is None:
            return {}
        return {"machine": self.machine, "handoff_socket": self.socket_path}

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
        path = self._local_socket(node, conn)
        if path is not None:
            if await self._pass(conn, vhost, node, path):
                return
            if conn.transport is None or conn.transport.is_closing():
                return
            # The pass may have waited on a leader that no longer answers: relay to the
            # one etcd names now.
            node, host, port = self.target(vhost) or target
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
        upstream.write(
            wire.control(HANDOFF, {**self.facts(conn, vhost), "cookie": self.node.cookie})
        )
        client, rest = conn.detach()
        relay.attach(client, rest)
        self.relayed += 1
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

    # -- passing the socket (a leader on this machine) ----------------------------------

    def _local_socket(self, node: str, conn: Connection) -> str | None:
        """The hand-off socket of `node` when it runs on this machine and `conn` can be
        passed (not TLS: its session state is this process's)."""
        c = self.node.coordinator
        if self.machine is None or c is None or conn.tls is not None:
            return None
        transport = conn.transport
        if transport is None or transport.get_extra_info("ssl_object") is not None:
            return None
        info = c.members().get(node) or {}
        path = info.get("handoff_socket")
        if info.get("machine") != self.machine or not isinstance(path, str) or not path:
            return None
        return path

    async def _pass(self, conn: Connection, vhost: str, node: str, path: str) -> bool:
        """Pass the client's socket to `node` (on this machine) over its hand-off socket.
        True when there is nothing more to do (passed: this node has forgotten the
        connection; or the client went away); False when it was not passed and nothing
        was written to the client (the caller relays)."""
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, _bindable(path)), PASS_TIMEOUT)
            if _peer_uid(sock) != os.getuid():
                raise PassRefused(f"{path} belongs to another user")
            hello = json.loads(await asyncio.wait_for(_read_line(loop, sock), PASS_TIMEOUT))
            if not isinstance(hello, dict) or hello.get("node") != node:
                raise PassRefused(f"{path} is not node {node!r}'s")
            transport = conn.transport
            if transport is None or transport.is_closing():
                return True  # the client went away meanwhile
            conn.flush()
            facts = self.facts(conn, vhost)
            facts["data"] = conn.unread().decode("latin-1")
            body = json.dumps(facts).encode()
            fd = transport.get_extra_info("socket").fileno()
            if socket.send_fds(sock, [_LEN.pack(len(body))], [fd]) != _LEN.size:
                raise PassRefused("short write of the hand-off header")
            await asyncio.wait_for(loop.sock_sendall(sock, body), PASS_TIMEOUT)
            try:
                ack = await asyncio.wait_for(loop.sock_recv(sock, 1), 2 * PASS_TIMEOUT)
            except TimeoutError:
                try:  # a last look: an ack that arrived as the time ran out still counts
                    ack = sock.recv(1)
                except BlockingIOError:
                    ack = b""
            if ack != _ACK:
                raise PassRefused(f"node {node!r} did not take it")
        except (OSError, TimeoutError, ValueError, PassRefused) as exc:
            self.pass_failed += 1
            log.warning(
                "cannot pass the connection to node %r over %s (%s); relaying it",
                node,
                path,
                exc or type(exc).__name__,
                extra={"conn": conn.name},
            )
            return False
        finally:
            sock.close()
        # The leader owns the socket now: close this process's copy of the fd (the
        # socket stays open: the leader holds it) and forget the connection.
        self.passed += 1
        if conn.transport is not None:
            client, _rest = conn.detach()
            client.set_protocol(asyncio.Protocol())
            client.close()
        log.info(
            "connection passed to node %r on this machine (vhost %r)",
            node,
            vhost,
            extra={"conn": conn.name},
        )
        return True

    async def listen(self) -> None:
        """The Unix socket nodes on this machine pass client sockets to (idempotent; when
        it cannot be made this node is relayed to, as from other machines)."""
        if self._unix is not None:
            return
        self.machine = machine_id()
        if self.machine is None:
            return
        bind, shown = socket_address(self.node.broker.config.storage.data_dir)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if not shown.startswith("@"):
                Path(bind).parent.mkdir(parents=True, exist_ok=True)
                _remove_stale(bind)
            sock.bind(bind)
            if not shown.startswith("@"):
                os.chmod(bind, 0o600)
            sock.listen(128)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            log.warning(
                "no hand-off socket at %s (%s): clients handed to this node are relayed",
                shown,
                exc,
            )
            return
        self._unix, self.socket_path = sock, shown
        self._accepting = asyncio.get_running_loop().create_task(
            self._accept(sock), name="handoff-accept"
        )
        log.info("hand-off socket at %s", shown)

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    sock, _ = await loop.sock_accept(listener)
                except OSError as exc:
                    log.warning("hand-off socket: accept failed: %s", exc)
                    await asyncio.sleep(0.1)
                    continue
                task = loop.create_task(self._receive(sock))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        finally:
            listener.close()

    async def _receive(self, sock: socket.socket) -> None:
        """The leader's side of a pass: hello, the fd and its preamble, the ack, adopt."""
        loop = asyncio.get_running_loop()
        started = time.monotonic()  # not the loop's: a frozen process must see the freeze
        fds: list[int] = []
        client: socket.socket | None = None
        try:
            sock.setblocking(False)
            if _peer_uid(sock) != os.getuid():
                log.warning("hand-off socket: refused a process of another user")
                return
            await loop.sock_sendall(sock, json.dumps({"node": self.node.name}).encode() + b"\n")
            facts = await asyncio.wait_for(_receive_pass(loop, sock, fds), PASS_TIMEOUT)
            if len(fds) != 1:
                raise ValueError(f"{len(fds)} descriptors passed")
            if time.monotonic() - started > PASS_TIMEOUT:  # the sender has given up (relays)
                raise TimeoutError("the pass took too long")
            client = socket.socket(fileno=fds.pop())
            if client.type != socket.SOCK_STREAM or client.family not in (
                socket.AF_INET,
                socket.AF_INET6,
            ):
                raise ValueError("the passed descriptor is not a TCP socket")
            client.setblocking(False)
            sock.send(_ACK)  # from here on the socket is this node's alone
        except (OSError, TimeoutError, ValueError, wire.ProtocolError) as exc:
            log.warning("hand-off socket: a passed connection not taken: %s", exc)
            if client is not None:
                client.close()  # this process's copy only: the sender still holds the socket
            return
        finally:
            for fd in fds:
                os.close(fd)
            sock.close()
        try:
            transport, held = await loop.connect_accepted_socket(_Held, client)
        except OSError as exc:
            log.warning("hand-off socket: cannot serve the passed connection: %s", exc)
            client.close()
            return
        data = str(facts.pop("data", "")).encode("latin-1") + bytes(held.data)
        if not held.lost:
            self._adopt(transport, facts, data, passed=True)

    # -- the leader ----------------------------------------------------------------------

    def adopt(
        self, facts: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """A HANDOFF frame on the replication listener: the socket becomes a Connection."""
        transport = writer.transport
        # The bytes the relay sent after the preamble, which the reader has read ahead:
        # asyncio has no public way to take them back.
        buffered = bytes(reader._buffer)  # type: ignore[attr-defined]  # asyncio has no public way to take read-ahead bytes back
        reader._buffer.clear()  # type: ignore[attr-defined]  # (as above)
        self._writers = {w for w in self._writers if not w.transport.is_closing()}
        self._writers.add(writer)
        self._adopt(transport, facts, buffered, passed=False)  # type: ignore[arg-type]  # a stream socket's transport

    def _adopt(
        self, transport: asyncio.Transport, facts: dict[str, Any], data: bytes, passed: bool
    ) -> None:
        """The one adoption path, relayed or passed: the socket becomes a Connection at
        AWAIT_OPEN, continued from the preamble's facts (`Connection.adopt`)."""
        conn = Connection(self.node.broker)
        transport.set_protocol(conn)  # type: ignore[arg-type]  # an asyncio protocol by its methods (a compiled class)
        conn.adopt(transport, facts, data)
        if not transport.is_closing():
            transport.resume_reading()  # the stream reader may have paused it
        if passed:
            self.adopted_passed += 1
        else:
            self.adopted_relayed += 1
        log.info(
            "adopted a connection %s by node %r (vhost %r, user %r)",
            "passed" if passed else "handed over",
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
        if self._accepting is not None:
            self._accepting.cancel()  # its finally closes the listening socket
            self._accepting = None
        if self._unix is not None:
            self._unix = None
            path = self.socket_path
            if path is not None and not path.startswith("@"):
                with contextlib.suppress(OSError):
                    os.unlink(path)


class _Held(asyncio.Protocol):
    """A passed socket between its arrival and its Connection: not read (what is read
    anyway is kept for the Connection)."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.pause_reading()  # type: ignore[attr-defined]  # a stream socket's transport reads

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


class _Side(asyncio.Protocol):
    """One socket of a relay; what it reads is written to the other side."""

    __slots__ = ("relay", "transport", "other")

    def __init__(self, relay: _Relay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self.other: _Side | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream socket's transport
        transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)  # type: ignore[attr-defined]  # (as above)

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
