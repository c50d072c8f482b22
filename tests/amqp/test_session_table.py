"""broker/amqp/session.py's rules, driven without sockets (h11 tests its state machine with bytes).

Two halves. The table itself: every (state, method type) pair binds to the handler, drop
or refusal the table states, and the rules a client depends on are pinned one by one.
Then a Connection on a fake transport, fed raw frames and read back frame by frame,
through the transitions: the handshake, channel open / close and the races of close with
close-ok, frames after a close. What clients see of the same rules over a real socket is
in test_errors_raw.py, test_semantics_raw.py and test_hostile_input.py.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from typing import Any

import pytest

from roarmq.broker.amqp import channel as channel_module
from roarmq.broker.amqp import connection as connection_module
from roarmq.broker.amqp.channel import DEFERRABLE, Channel, ClosedChannel
from roarmq.broker.amqp.connection import CLOSE_OK_AFTER_CHANNELS, Connection
from roarmq.broker.amqp.session import (
    ALL_METHODS,
    CHANNEL_RULES,
    CONNECTION_RULES,
    CONTENT_METHODS,
    DROP,
    UNOPENED_RULES,
    ChannelState,
    ConnectionState,
    Refuse,
    entry_for,
)
from roarmq.broker.ops.clock import VirtualClock
from roarmq.broker.server import Broker
from roarmq.broker.testing import ephemeral_config
from roarmq.protocol import spec
from roarmq.protocol.errors import HardError
from roarmq.protocol.frames import (
    PROTOCOL_HEADER,
    FrameParser,
    encode_content,
    encode_method,
)
from roarmq.protocol.properties import BasicProperties

CONN_ROWS = connection_module._ROWS
UNOPENED_ROWS = connection_module._UNOPENED_ROWS
CHANNEL_ROWS = channel_module._ROWS
Cs, Hs = ConnectionState, ChannelState

# -- the table ------------------------------------------------------------------------


def _owner(table: Any, state: Any) -> type:
    if table is CHANNEL_RULES:
        return ClosedChannel if state is Hs.CLOSED else Channel
    return Connection


TABLES = [
    ("connection", CONNECTION_RULES, CONN_ROWS),
    ("unopened", UNOPENED_RULES, UNOPENED_ROWS),
    ("channel", CHANNEL_RULES, CHANNEL_ROWS),
]


@pytest.mark.parametrize(("kind", "rules", "rows"), TABLES, ids=[t[0] for t in TABLES])
def test_every_state_binds_every_method_as_its_table_says(kind: str, rules: Any, rows: Any) -> None:
    """Every (state, method type) pair: a handler of the owner, the drop, or a refusal."""
    assert set(rows) == set(rules) == set(type(next(iter(rules))))
    for state, row in rows.items():
        assert set(row) == set(ALL_METHODS), state
        for method in ALL_METHODS:
            entry = entry_for(rules, state, method)
            bound = row[method]
            if isinstance(entry, str):
                handler = getattr(bound, "__wrapped__", bound)  # (DEFERRABLE's, below)
                assert handler is getattr(_owner(rules, state), entry), (state, method)
                # and it takes what dispatch passes it
                inspect.signature(bound).bind(_Target(), *_args(kind, method))
            elif entry is DROP:
                assert bound(object(), *_args(kind, method)) is None
            else:
                assert isinstance(entry, Refuse)
                with pytest.raises(HardError) as raised:
                    bound(_Target(), *_args(kind, method))
                error = raised.value
                assert error.reply_code == entry.reply_code, (state, method)
                # The close names the refused method: its ids, never typed by hand.
                assert (error.class_id, error.method_id) == (method.CLASS_ID, method.METHOD_ID)


def test_only_the_durable_changes_of_an_open_channel_may_wait_for_the_store() -> None:
    """The channel's handlers that run `deferrable` (a durable declare, bind or delete may
    stop at its definitions write and be handled again: broker/core/persistence.py) are
    DEFERRABLE's, in the OPEN row only."""
    wrapped = {
        (state, method)
        for state, row in CHANNEL_ROWS.items()
        for method, bound in row.items()
        if hasattr(bound, "__wrapped__")
    }
    assert wrapped == {(Hs.OPEN, method) for method in DEFERRABLE}
    assert all(isinstance(entry_for(CHANNEL_RULES, Hs.OPEN, m), str) for m in DEFERRABLE)


class _Target:
    id = 7


def _args(kind: str, method: type) -> tuple:
    m = method.__new__(method)
    if kind == "unopened":
        return (7, m)
    return (m, None, b"") if method in CONTENT_METHODS else (m,)


RULES = [
    # channel 0
    (CONNECTION_RULES, Cs.AWAIT_START_OK, spec.ConnectionStartOk, "_start_ok"),
    (CONNECTION_RULES, Cs.AWAIT_START_OK, spec.ConnectionOpen, Refuse(503, "")),
    (CONNECTION_RULES, Cs.AWAIT_TUNE_OK, spec.ConnectionTuneOk, "_tune_ok"),
    (CONNECTION_RULES, Cs.AWAIT_OPEN, spec.ConnectionOpen, "_open"),
    (CONNECTION_RULES, Cs.AWAIT_OPEN, spec.ConnectionClose, "_client_close"),
    (CONNECTION_RULES, Cs.AWAIT_OPEN, spec.BasicPublish, DROP),
    (CONNECTION_RULES, Cs.OPEN, spec.ConnectionClose, "_client_close"),
    (CONNECTION_RULES, Cs.OPEN, spec.ConnectionUpdateSecret, "_update_secret"),
    (CONNECTION_RULES, Cs.OPEN, spec.ConnectionCloseOk, Refuse(503, "")),
    (CONNECTION_RULES, Cs.OPEN, spec.ChannelOpen, Refuse(503, "")),
    (CONNECTION_RULES, Cs.OPEN, spec.BasicPublish, Refuse(504, "")),
    (CONNECTION_RULES, Cs.CLOSING, spec.ConnectionClose, "_client_close"),
    (CONNECTION_RULES, Cs.CLOSING, spec.ConnectionCloseOk, "_close_ok_received"),
    (CONNECTION_RULES, Cs.CLOSING, spec.BasicAck, DROP),
    (CONNECTION_RULES, Cs.DRAINING, spec.ConnectionClose, DROP),
    # channel numbers nothing is open on
    (UNOPENED_RULES, Cs.AWAIT_OPEN, spec.ChannelOpen, Refuse(503, "")),
    (UNOPENED_RULES, Cs.AWAIT_OPEN, spec.BasicQos, Refuse(504, "")),
    (UNOPENED_RULES, Cs.AWAIT_OPEN, spec.ChannelCloseOk, DROP),
    (UNOPENED_RULES, Cs.OPEN, spec.ChannelOpen, "_open_channel"),
    (UNOPENED_RULES, Cs.OPEN, spec.ChannelCloseOk, DROP),
    (UNOPENED_RULES, Cs.OPEN, spec.BasicPublish, Refuse(504, "")),
    (UNOPENED_RULES, Cs.OPEN, spec.BasicAck, Refuse(504, "")),
    (UNOPENED_RULES, Cs.CLOSING, spec.ConnectionClose, DROP),  # rabbit_reader: channel 0 only
    (UNOPENED_RULES, Cs.CLOSING, spec.ChannelOpen, DROP),
    # channels
    (CHANNEL_RULES, Hs.OPEN, spec.BasicAck, "_basic_ack"),
    (CHANNEL_RULES, Hs.OPEN, spec.BasicPublish, "_basic_publish"),
    (CHANNEL_RULES, Hs.OPEN, spec.BasicDeliver, Refuse(503, "")),
    (CHANNEL_RULES, Hs.OPEN, spec.BasicGetOk, Refuse(503, "")),
    (CHANNEL_RULES, Hs.OPEN, spec.ChannelOpen, Refuse(504, "")),
    (CHANNEL_RULES, Hs.OPEN, spec.ConnectionClose, Refuse(503, "")),
    (CHANNEL_RULES, Hs.OPEN, spec.ChannelCloseOk, DROP),
    (CHANNEL_RULES, Hs.OPEN, spec.ChannelFlowOk, DROP),
    (CHANNEL_RULES, Hs.OPEN, spec.BasicConsumeOk, Refuse(540, "")),
    (CHANNEL_RULES, Hs.CLOSING, spec.ChannelClose, "_answer_close"),
    (CHANNEL_RULES, Hs.CLOSING, spec.ChannelCloseOk, "_close_ok_received"),
    (CHANNEL_RULES, Hs.CLOSING, spec.ChannelOpen, Refuse(504, "")),
    (CHANNEL_RULES, Hs.CLOSING, spec.ConnectionTuneOk, Refuse(503, "")),
    (CHANNEL_RULES, Hs.CLOSING, spec.BasicPublish, DROP),
    (CHANNEL_RULES, Hs.CLOSING, spec.BasicAck, DROP),
    (CHANNEL_RULES, Hs.CLOSED, spec.ChannelOpen, "_reopen"),
    (CHANNEL_RULES, Hs.CLOSED, spec.BasicPublish, DROP),
    (CHANNEL_RULES, Hs.CLOSED, spec.ChannelClose, DROP),
    (CHANNEL_RULES, Hs.CLOSED, spec.ConnectionClose, DROP),
]


@pytest.mark.parametrize(("rules", "state", "method", "expected"), RULES)
def test_the_rules_clients_depend_on(rules: Any, state: Any, method: type, expected: Any) -> None:
    entry = entry_for(rules, state, method)
    if isinstance(expected, Refuse):
        assert isinstance(entry, Refuse) and entry.reply_code == expected.reply_code
    else:
        assert entry == expected


def test_an_ack_costs_one_lookup_straight_to_its_handler() -> None:
    """No fast path beside the table: the open row's entry is the ack handler itself."""
    assert CHANNEL_ROWS[Hs.OPEN][spec.BasicAck] is Channel._basic_ack
    assert CHANNEL_ROWS[Hs.OPEN][spec.BasicPublish] is Channel._basic_publish


def test_refusal_texts_are_rabbitmqs() -> None:
    refuse = entry_for(CONNECTION_RULES, Cs.AWAIT_TUNE_OK, spec.ConnectionOpen)
    error = refuse.error(spec.ConnectionOpen(virtual_host="/"), 0, Cs.AWAIT_TUNE_OK)
    assert error.text == "unexpected method connection.open on channel 0 in state await-tune-ok"
    refuse = entry_for(UNOPENED_RULES, Cs.OPEN, spec.BasicQos)
    assert refuse.error(spec.BasicQos(), 9, Cs.OPEN).text == "expected 'channel.open' for channel 9"


# -- a Connection on a fake transport ---------------------------------------------------


class FakeTransport:
    """What a Connection asks of its transport; keeps what it writes."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False
        self.reading = True

    def get_extra_info(self, key: str, default: object = None) -> object:
        return ("127.0.0.1", 40000) if key == "peername" else default

    def set_write_buffer_limits(self, **_: int) -> None:
        pass

    def write(self, data: bytes) -> None:
        self.out += data

    def writelines(self, chunks: list[bytes]) -> None:
        for data in chunks:
            self.out += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


class Session:
    """A Connection fed raw frames; `replies()` parses what it wrote since the last call."""

    def __init__(self, broker: Broker) -> None:
        self.conn = Connection(broker)
        self.transport = FakeTransport()
        self.conn.connection_made(self.transport)  # type: ignore[arg-type]
        self.parser = FrameParser(expect_protocol_header=False)

    def feed(self, *frames: bytes) -> None:
        self.conn.data_received(b"".join(frames))

    def send(self, channel: int, method: Any) -> None:
        self.feed(encode_method(channel, method))

    def publish(self, channel: int, body: bytes = b"x", key: str = "q") -> bytes:
        return encode_content(
            channel, spec.BasicPublish(routing_key=key), BasicProperties(), body, 131072
        )

    def replies(self) -> list[tuple[int, Any]]:
        self.conn.flush()
        data, self.transport.out = bytes(self.transport.out), bytearray()
        return [(ev.channel, ev.method) for ev in self.parser.feed(data) if hasattr(ev, "method")]

    def only(self, kind: type, channel: int | None = None) -> Any:
        replies = self.replies()
        assert len(replies) == 1 and isinstance(replies[0][1], kind), replies
        if channel is not None:
            assert replies[0][0] == channel
        return replies[0][1]

    def handshake(self) -> None:
        self.feed(PROTOCOL_HEADER)
        self.only(spec.ConnectionStart)
        self.send(
            0,
            spec.ConnectionStartOk(
                client_properties={"capabilities": {"authentication_failure_close": True}},
                mechanism="PLAIN",
                response=b"\0guest\0guest",
                locale="en_US",
            ),
        )
        self.only(spec.ConnectionTune)
        self.send(0, spec.ConnectionTuneOk(channel_max=0, frame_max=131072, heartbeat=0))
        assert self.replies() == []
        self.send(0, spec.ConnectionOpen(virtual_host="/"))
        self.only(spec.ConnectionOpenOk)


@pytest.fixture
async def broker(tmp_path: Any) -> AsyncIterator[Broker]:
    broker = Broker(ephemeral_config(data_dir=str(tmp_path / "data")), clock=VirtualClock())
    yield broker
    broker.persistence.close()


@pytest.fixture
async def session(broker: Broker) -> Session:
    s = Session(broker)
    s.handshake()
    return s


def _row_is(conn: Connection, state: ConnectionState) -> None:
    assert conn.state is state
    assert conn._row is CONN_ROWS[state] and conn._unopened is UNOPENED_ROWS[state]


async def test_handshake_walks_the_states_binding_each_row(broker: Broker) -> None:
    s = Session(broker)
    _row_is(s.conn, Cs.AWAIT_HEADER)
    s.feed(PROTOCOL_HEADER)
    s.only(spec.ConnectionStart)
    _row_is(s.conn, Cs.AWAIT_START_OK)
    s.send(
        0,
        spec.ConnectionStartOk(
            client_properties={}, mechanism="PLAIN", response=b"\0guest\0guest", locale="en_US"
        ),
    )
    s.only(spec.ConnectionTune)
    _row_is(s.conn, Cs.AWAIT_TUNE_OK)
    s.send(0, spec.ConnectionTuneOk(channel_max=0, frame_max=131072, heartbeat=0))
    _row_is(s.conn, Cs.AWAIT_OPEN)
    s.send(0, spec.ConnectionOpen(virtual_host="/"))
    s.only(spec.ConnectionOpenOk)
    _row_is(s.conn, Cs.OPEN)


async def test_a_method_out_of_turn_closes_naming_it(broker: Broker) -> None:
    s = Session(broker)
    s.feed(PROTOCOL_HEADER)
    s.replies()
    s.send(0, spec.ConnectionOpen(virtual_host="/"))
    close = s.only(spec.ConnectionClose, 0)
    assert (close.reply_code, close.class_id, close.method_id) == (503, 10, 40)
    assert close.reply_text.endswith(
        "unexpected method connection.open on channel 0 in state await-start-ok"
    )
    _row_is(s.conn, Cs.CLOSING)


async def test_channel_open_before_connection_open(broker: Broker) -> None:
    s = Session(broker)
    s.feed(PROTOCOL_HEADER)
    s.replies()
    s.send(1, spec.ChannelCloseOk())  # dropped
    assert s.replies() == []
    s.send(1, spec.ChannelOpen())
    close = s.only(spec.ConnectionClose)
    assert (close.reply_code, close.class_id, close.method_id) == (503, 20, 10)


async def test_handshake_errors_name_the_method_in_hand(broker: Broker) -> None:
    """Errors raised by handlers carry no hand-typed ids: the method being handled gives them."""
    s = Session(broker)
    s.feed(PROTOCOL_HEADER)
    s.replies()
    s.send(
        0,
        spec.ConnectionStartOk(
            client_properties={"capabilities": {"authentication_failure_close": True}},
            mechanism="PLAIN",
            response=b"\0guest\0guest",
            locale="en_US",
        ),
    )
    s.replies()
    s.send(0, spec.ConnectionTuneOk(channel_max=0, frame_max=1024, heartbeat=0))
    close = s.only(spec.ConnectionClose)
    assert (close.reply_code, close.class_id, close.method_id) == (530, 10, 31)


async def test_client_close_of_a_channel_leaves_a_tombstone(session: Session) -> None:
    s = session
    s.send(1, spec.ChannelOpen())
    s.only(spec.ChannelOpenOk, 1)
    ch = s.conn.channels[1]
    assert ch._row is CHANNEL_ROWS[Hs.OPEN]
    s.send(1, spec.ChannelClose(reply_code=200, reply_text="bye"))
    s.only(spec.ChannelCloseOk, 1)
    assert ch.state is Hs.CLOSED and 1 not in s.conn.channels
    tomb = s.conn._receivers[1]
    assert type(tomb) is ClosedChannel and tomb._row is CHANNEL_ROWS[Hs.CLOSED]
    # In flight when the close crossed: dropped, not refused.
    s.feed(s.publish(1), encode_method(1, spec.BasicAck(delivery_tag=1)))
    s.send(1, spec.BasicQos(prefetch_count=1))
    assert s.replies() == [] and s.conn.state is Cs.OPEN
    # channel.open reuses the number.
    s.send(1, spec.ChannelOpen())
    s.only(spec.ChannelOpenOk, 1)
    assert type(s.conn._receivers[1]) is Channel and s.conn.channels[1] is s.conn._receivers[1]


async def test_server_close_of_a_channel_and_the_close_ok_race(session: Session) -> None:
    s = session
    s.send(1, spec.ChannelOpen())
    s.replies()
    s.send(1, spec.BasicReject(delivery_tag=42, requeue=False))
    close = s.only(spec.ChannelClose, 1)
    # The reject's own ids (60, 90), not the ack's.
    assert (close.reply_code, close.class_id, close.method_id) == (406, 60, 90)
    ch = s.conn.channels[1]
    assert ch.state is Hs.CLOSING and ch._row is CHANNEL_ROWS[Hs.CLOSING]
    # Until close-ok: everything but close / close-ok is dropped...
    s.feed(s.publish(1), encode_method(1, spec.BasicQos(prefetch_count=1)))
    assert s.replies() == []
    # ...the client's own channel.close crossing ours is answered, and we still wait...
    s.send(1, spec.ChannelClose(reply_code=200, reply_text=""))
    s.only(spec.ChannelCloseOk, 1)
    assert ch.state is Hs.CLOSING
    # ...for the close-ok, which leaves the tombstone.
    s.send(1, spec.ChannelCloseOk())
    assert s.replies() == [] and ch.state is Hs.CLOSED
    assert type(s.conn._receivers[1]) is ClosedChannel
    s.send(1, spec.ChannelCloseOk())  # a duplicate: dropped
    assert s.replies() == [] and s.conn.state is Cs.OPEN


async def test_second_channel_open_and_connection_methods_on_a_channel(session: Session) -> None:
    s = session
    s.send(1, spec.ChannelOpen())
    s.replies()
    s.send(1, spec.ChannelOpen())
    close = s.only(spec.ConnectionClose, 0)
    assert (close.reply_code, close.class_id, close.method_id) == (504, 20, 10)
    assert "second 'channel.open' seen on channel 1" in close.reply_text


async def test_content_on_channel_0_and_unopened_channels(session: Session) -> None:
    s = session
    s.feed(s.publish(0))
    close = s.only(spec.ConnectionClose, 0)
    assert (close.reply_code, close.class_id, close.method_id) == (504, 60, 40)
    assert close.reply_text == "CHANNEL_ERROR - expected 'channel.open' for channel 0"


async def test_deliver_with_content_from_a_client_is_refused(session: Session) -> None:
    s = session
    s.send(1, spec.ChannelOpen())
    s.replies()
    deliver = spec.BasicDeliver(consumer_tag="c", delivery_tag=1, exchange="", routing_key="q")
    s.feed(encode_content(1, deliver, BasicProperties(), b"x", 131072))
    close = s.only(spec.ConnectionClose, 0)
    assert (close.reply_code, close.class_id, close.method_id) == (503, 60, 60)


async def test_client_connection_close_then_frames_after_it(session: Session) -> None:
    s = session
    s.send(1, spec.ChannelOpen())
    s.replies()
    s.feed(
        encode_method(
            0, spec.ConnectionClose(reply_code=200, reply_text="", class_id=0, method_id=0)
        ),
        encode_method(1, spec.BasicQos(prefetch_count=1)),  # same read, after the close
        encode_method(
            0, spec.ConnectionClose(reply_code=200, reply_text="", class_id=0, method_id=0)
        ),
    )
    _row_is(s.conn, Cs.DRAINING)
    assert s.replies() == []  # a channel was open: close-ok waits CLOSE_OK_AFTER_CHANNELS
    await asyncio.sleep(CLOSE_OK_AFTER_CHANNELS * 2)
    s.only(spec.ConnectionCloseOk, 0)
    assert s.conn.channels == {} and s.conn._receivers == {0: s.conn}
    assert not s.transport.closed  # the socket is left to the client
    s.send(0, spec.ConnectionClose(reply_code=200, reply_text="", class_id=0, method_id=0))
    assert s.replies() == []


async def test_server_connection_close_drops_all_but_close_and_close_ok(session: Session) -> None:
    s = session
    s.send(1, spec.ChannelOpen())
    s.replies()
    s.send(5, spec.BasicQos(prefetch_count=1))  # nothing open on 5
    close = s.only(spec.ConnectionClose, 0)
    assert (close.reply_code, close.class_id, close.method_id) == (504, 60, 10)
    _row_is(s.conn, Cs.CLOSING)
    assert s.conn._receivers == {0: s.conn}
    s.feed(
        s.publish(1),
        encode_method(1, spec.ChannelOpen()),
        encode_method(
            1, spec.ConnectionClose(reply_code=200, reply_text="", class_id=0, method_id=0)
        ),
        encode_method(0, spec.BasicQos(prefetch_count=1)),
    )
    assert s.replies() == [] and not s.transport.closed
    # Both sides closing at once: the client's close is answered...
    s.send(0, spec.ConnectionClose(reply_code=200, reply_text="", class_id=0, method_id=0))
    s.only(spec.ConnectionCloseOk, 0)
    # ...and its close-ok to ours ends it (close-ok answered from DRAINING is not read).
    s2 = Session(s.conn.broker)
    s2.handshake()
    s2.send(5, spec.BasicQos(prefetch_count=1))
    s2.replies()
    s2.send(0, spec.ConnectionCloseOk())
    assert s2.transport.closed


async def test_ack_dispatch_through_the_row(session: Session) -> None:
    """A consumer's acks go straight to the ack handler by the open row, as publishes go
    to the publish handler."""
    s = session
    s.send(1, spec.ChannelOpen())
    s.send(1, spec.QueueDeclare(queue="q"))
    s.send(1, spec.BasicConsume(queue="q", consumer_tag="c"))
    s.replies()
    s.feed(s.publish(1), s.publish(1))
    delivered = [m for _, m in s.replies() if isinstance(m, spec.BasicDeliver)]
    assert [d.delivery_tag for d in delivered] == [1, 2]
    ch = s.conn.channels[1]
    s.feed(
        encode_method(1, spec.BasicAck(delivery_tag=1)),
        encode_method(1, spec.BasicAck(delivery_tag=2)),
    )
    assert ch.unacked == {} and s.replies() == []
