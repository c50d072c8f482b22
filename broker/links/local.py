"""The local broker as a link's end: what `amqp://` with no host means (RabbitMQ's
"direct" connection), with no socket and no login.

`connect_local` makes a pair of in-process transports (`Pipe`): one end is an
`AmqpClient`, the other a real `Connection` of this broker, so a shovel or federation
link talks to its own broker through exactly the code any client meets (the same
handshake, routing, confirms and flow), minus the kernel. What one end writes, the other
reads on a later loop turn, in order; a side whose reading is paused keeps what comes,
and the writer sees that backlog as its write buffer (`pause_writing` past its high mark,
as a socket's transport would). The server side carries `internal_user`: the connection
is logged in as that user (every vhost, every permission) without SASL, as RabbitMQ's
direct connections are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

HIGH_WATER = 64 * 1024
LOW_WATER = 16 * 1024


class Pipe(asyncio.Transport):
    """One side of an in-process connection (module doc)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, extra: dict[str, Any]) -> None:
        super().__init__(extra)
        self._loop = loop
        self._protocol: Any = None
        self.peer: Pipe | None = None
        self._closing = False
        self._reading = True
        self._backlog: list[bytes] = []
        self._backlog_bytes = 0
        self._scheduled = False
        self._high, self._low = HIGH_WATER, LOW_WATER
        self._writing_paused = False

    def set_protocol(self, protocol: Any) -> None:
        self._protocol = protocol

    def get_protocol(self) -> Any:
        return self._protocol

    # -- writing (to the peer) -------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        peer = self.peer
        if self._closing or peer is None or peer._closing:
            return
        peer._receive(bytes(data))
        if not self._writing_paused and peer._backlog_bytes > self._high:
            self._writing_paused = True
            self._protocol.pause_writing()

    def writelines(self, parts: Any) -> None:
        self.write(b"".join(parts))

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return self.peer._backlog_bytes if self.peer is not None else 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = HIGH_WATER if low is None else 4 * low
        if low is None:
            low = high // 4
        self._high, self._low = high, low

    def _drained(self) -> None:
        """The peer read its backlog down: go on writing if this side was paused."""
        if self._writing_paused and self.peer is not None and self.peer._backlog_bytes <= self._low:
            self._writing_paused = False
            self._protocol.resume_writing()

    # -- reading (what the peer wrote) -----------------------------------------------------

    def _receive(self, data: bytes) -> None:
        self._backlog.append(data)
        self._backlog_bytes += len(data)
        self._schedule()

    def _schedule(self) -> None:
        if self._reading and not self._scheduled and self._backlog:
            self._scheduled = True
            self._loop.call_soon(self._deliver)

    def _deliver(self) -> None:
        self._scheduled = False
        if self._closing or not self._reading or not self._backlog:
            return
        data = b"".join(self._backlog) if len(self._backlog) > 1 else self._backlog[0]
        self._backlog.clear()
        self._backlog_bytes = 0
        self._protocol.data_received(data)
        if self.peer is not None:
            self.peer._drained()

    def pause_reading(self) -> None:
        self._reading = False

    def resume_reading(self) -> None:
        if not self._reading:
            self._reading = True
            self._schedule()

    def is_reading(self) -> bool:
        return self._reading

    # -- closing ---------------------------------------------------------------------------

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Both sides go: each protocol hears `connection_lost` on a later turn, after
        what was written before reached it."""
        if self._closing:
            return
        self._closing = True
        self._loop.call_soon(self._lost)
        if self.peer is not None:
            self.peer.close()

    def abort(self) -> None:
        self.close()

    def _lost(self) -> None:
        self._backlog.clear()
        self._protocol.connection_lost(None)


def pipe_pair(
    loop: asyncio.AbstractEventLoop, client_extra: dict[str, Any], server_extra: dict[str, Any]
) -> tuple[Pipe, Pipe]:
    client, server = Pipe(loop, client_extra), Pipe(loop, server_extra)
    client.peer, server.peer = server, client
    return client, server


async def connect_local(
    make_connection: Callable[[], Any],
    internal_user: Any,
    uri: Any,
    name: str,
    *,
    call_timeout: float = 30.0,
) -> Any:
    """An `AmqpClient` opened on the local broker's vhost `uri.vhost`, its server side a
    `make_connection()` logged in as `internal_user`."""
    from .client import AmqpClient

    loop = asyncio.get_running_loop()
    client = AmqpClient(uri, loop, name=name, call_timeout=call_timeout)
    server = make_connection()
    local = ("local", 0)
    client_side, server_side = pipe_pair(
        loop,
        {"peername": local, "sockname": local},
        {"peername": local, "sockname": local, "internal_user": internal_user},
    )
    client_side.set_protocol(client)
    server_side.set_protocol(server)
    server.connection_made(server_side)
    client.connection_made(client_side)
    await client.wait_opened(uri.connection_timeout_ms / 1000)
    return client
