"""A broker's connections fed bytes in process, without sockets (bench/hotpath.py's way of
timing the broker's own work per message; bench/streams_inprocess.py's too).
"""

from __future__ import annotations

from roarmq.broker.amqp.connection import Connection
from roarmq.broker.server import Broker
from roarmq.protocol import spec
from roarmq.protocol.frames import PROTOCOL_HEADER, encode_method


class NullTransport:
    """A transport that counts what is written to it and sends nothing."""

    def __init__(self) -> None:
        self.bytes = 0

    def get_extra_info(self, key: str, default: object = None) -> object:
        return ("127.0.0.1", 1) if key == "peername" else default

    def set_write_buffer_limits(self, **_: int) -> None:
        pass

    def write(self, data: bytes) -> None:
        self.bytes += len(data)

    def writelines(self, chunks: list[bytes]) -> None:
        for data in chunks:
            self.bytes += len(data)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def open_connection(broker: Broker) -> Connection:
    """A Connection of ``broker`` on a ``NullTransport``, past the handshake as guest, with
    channel 1 open: feed it frames with ``data_received``."""
    conn = Connection(broker)
    conn.connection_made(NullTransport())  # type: ignore[arg-type]
    for data in (
        PROTOCOL_HEADER,
        encode_method(
            0,
            spec.ConnectionStartOk(
                client_properties={}, mechanism="PLAIN", response=b"\0guest\0guest", locale="en_US"
            ),
        ),
        encode_method(0, spec.ConnectionTuneOk(channel_max=0, frame_max=131072, heartbeat=0)),
        encode_method(0, spec.ConnectionOpen(virtual_host="/")),
        encode_method(1, spec.ChannelOpen()),
    ):
        conn.data_received(data)
    return conn
