"""The session rules: what each AMQP method does in each connection and channel state.

As h11's `_state.py` does for HTTP, every rule of the session lives here, as tables a
reader can check against the spec and RabbitMQ (`rabbit_reader.erl` for channel 0 and
for frames on channels that do not exist, `rabbit_channel.erl` for the rest) in one
screen, instead of `if`s spread over the connection and the channel. The handlers stay
where they are, methods of `Connection` and `Channel`; a row names them.

A *row* is one state's rules: for each method type either the name of a handler, `DROP`
(read and ignored, as RabbitMQ ignores it), or a `Refuse` (a connection error, with the
reply code and text RabbitMQ sends), and a default for every method the row does not
name. There are three tables of rows:

* `CONNECTION_RULES`, by `ConnectionState`: methods on channel 0.
* `UNOPENED_RULES`, by `ConnectionState`: methods on a channel number nothing is open
  on (never opened, or everything was let go because the connection is closing).
* `CHANNEL_RULES`, by `ChannelState`: methods on a channel that exists. A channel whose
  close / close-ok exchange is over leaves a tombstone under its number, in state CLOSED,
  so that frames the client sent before it saw the close are dropped, not refused, until
  channel.open reuses the number.

`bind_rows` turns a table into what dispatch uses: per state a dict holding *every*
method type the frame parser can yield (`spec.METHODS`), mapped to a plain function, so
dispatching any method, acks and publishes included, is one dict lookup and one call:
``row[type(method)](target, method)``. The owner of a state (a `Connection`, a `Channel`)
binds its row on each transition (``self._row = ROWS[state]``); nobody else writes it.

Content methods (basic.publish; deliver, return and get-ok, which a client must not
send) always arrive assembled with their header and body, never as a bare method frame,
so their entries are called as ``handler(target, method, header, body)``.

Rows map to unbound functions looked up once on the class and shared by every instance.
Bound methods per instance cost the same per call (callgrind, a loop of
``row[type(m)](...)``: 913 instructions an iteration either way) but would build a dict
of 60-odd bound methods at every channel.open and every transition.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from roarmq.protocol import spec
from roarmq.protocol.errors import (
    CHANNEL_ERROR,
    COMMAND_INVALID,
    NOT_IMPLEMENTED,
    HardError,
)


class ConnectionState(enum.Enum):
    """Where a connection is; the values are the names `/api/connections` shows."""

    AWAIT_HEADER = "await-header"  # nothing read yet: the protocol header comes first
    AWAIT_START_OK = "await-start-ok"  # we sent connection.start
    AWAIT_TUNE_OK = "await-tune-ok"  # logged in; we sent connection.tune
    AWAIT_OPEN = "await-open"  # tuned; the client must pick a vhost
    OPEN = "open"
    CLOSING = "closing"  # we sent connection.close: only close / close-ok matter
    DRAINING = "draining"  # we sent close-ok: input is read and dropped until the EOF
    CLOSED = "closed"


class ChannelState(enum.Enum):
    """Where a channel is."""

    OPEN = "open"
    CLOSING = "closing"  # we sent channel.close: only close / close-ok matter (spec 2.3.5)
    CLOSED = "closed"  # close-ok sent or received: nothing more is sent on it


class _Drop:
    """Read and ignored: what RabbitMQ does with frames that crossed a close in flight."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DROP"


DROP = _Drop()


@dataclass(frozen=True)
class Refuse:
    """A connection error (every refusal in these tables is one, as in RabbitMQ).

    `text` may name ``{method}`` (the method's name), ``{channel}`` (its channel number)
    and ``{state}`` (the connection state). The close names the refused method's class
    and method ids, taken from the method itself.
    """

    reply_code: int
    text: str

    def error(self, method: Any, channel: int, state: ConnectionState | None) -> HardError:
        text = self.text.format(
            method=method.NAME, channel=channel, state=state.value if state else ""
        )
        return HardError(
            self.reply_code, text, class_id=method.CLASS_ID, method_id=method.METHOD_ID
        )


Entry = str | _Drop | Refuse


@dataclass(frozen=True)
class Rules:
    """One state's row: the entries it names, and the default for every other method."""

    entries: Mapping[type, Entry]
    default: Entry


def _each(methods: Any, entry: Entry) -> dict[type, Entry]:
    return dict.fromkeys(methods, entry)


#: Every method type the frame parser can yield; a bound row holds each of them.
ALL_METHODS: tuple[type[spec.Method], ...] = tuple(spec.METHODS.values())
CONTENT_METHODS: tuple[type, ...] = tuple(m for m in ALL_METHODS if m.HAS_CONTENT)
CONNECTION_CLASS: tuple[type, ...] = tuple(m for m in ALL_METHODS if m.CLASS_ID == 10)

_UNEXPECTED_ON_0 = Refuse(
    COMMAND_INVALID, "unexpected method {method} on channel 0 in state {state}"
)
_EXPECTED_OPEN = Refuse(CHANNEL_ERROR, "expected 'channel.open' for channel {channel}")


def _handshake_step(method: type | None, handler: str = "") -> Rules:
    """A handshake state: its one expected method; connection.close is always allowed, and
    content on channel 0 is dropped before the connection is open."""
    entries: dict[type, Entry] = {
        **_each(CONTENT_METHODS, DROP),
        spec.ConnectionClose: "_client_close",
    }
    if method is not None:
        entries[method] = handler
    return Rules(entries, _UNEXPECTED_ON_0)


C = ConnectionState
CONNECTION_RULES: dict[ConnectionState, Rules] = {
    # No frame is parsed before the protocol header, but every state has a row.
    C.AWAIT_HEADER: _handshake_step(None),
    C.AWAIT_START_OK: _handshake_step(spec.ConnectionStartOk, "_start_ok"),
    C.AWAIT_TUNE_OK: _handshake_step(spec.ConnectionTuneOk, "_tune_ok"),
    C.AWAIT_OPEN: _handshake_step(spec.ConnectionOpen, "_open"),
    C.OPEN: Rules(
        {
            spec.ConnectionClose: "_client_close",
            spec.ConnectionUpdateSecret: "_update_secret",
            # Content on channel 0 is refused as on any channel nothing is open on.
            **_each(CONTENT_METHODS, _EXPECTED_OPEN),
        },
        _UNEXPECTED_ON_0,
    ),
    # After our connection.close only close and close-ok matter (spec 2.2.4,
    # rabbit_reader's handle_method0 when stopping).
    C.CLOSING: Rules(
        {spec.ConnectionClose: "_client_close", spec.ConnectionCloseOk: "_close_ok_received"},
        DROP,
    ),
    C.DRAINING: Rules({}, DROP),  # after our close-ok nothing does
    C.CLOSED: Rules({}, DROP),
}

_BEFORE_OPEN = Rules(
    {
        spec.ChannelOpen: Refuse(COMMAND_INVALID, "channel.open before connection.open"),
        spec.ChannelCloseOk: DROP,
        **_each(CONTENT_METHODS, DROP),
    },
    _EXPECTED_OPEN,
)
_STOPPING = Rules({}, DROP)  # rabbit_reader drops frames on other channels while stopping
UNOPENED_RULES: dict[ConnectionState, Rules] = {
    C.AWAIT_HEADER: _BEFORE_OPEN,
    C.AWAIT_START_OK: _BEFORE_OPEN,
    C.AWAIT_TUNE_OK: _BEFORE_OPEN,
    C.AWAIT_OPEN: _BEFORE_OPEN,
    # A close-ok for a channel we no longer hold crossed our close in flight.
    C.OPEN: Rules({spec.ChannelOpen: "_open_channel", spec.ChannelCloseOk: DROP}, _EXPECTED_OPEN),
    C.CLOSING: _STOPPING,
    C.DRAINING: _STOPPING,
    C.CLOSED: _STOPPING,
}

#: Refused on a channel that exists, open or closing (rabbit_channel checks these first).
_ON_A_CHANNEL: dict[type, Entry] = {
    spec.ChannelOpen: Refuse(CHANNEL_ERROR, "second 'channel.open' seen on channel {channel}"),
    **_each(CONNECTION_CLASS, Refuse(COMMAND_INVALID, "{method} is only valid on channel 0")),
}

H = ChannelState
CHANNEL_RULES: dict[ChannelState, Rules] = {
    H.OPEN: Rules(
        {
            **_ON_A_CHANNEL,
            spec.ChannelFlow: "_channel_flow",
            spec.ChannelFlowOk: DROP,
            spec.ChannelClose: "_channel_close",
            spec.ChannelCloseOk: DROP,
            spec.ExchangeDeclare: "_exchange_declare",
            spec.ExchangeDelete: "_exchange_delete",
            spec.ExchangeBind: "_exchange_bind",
            spec.ExchangeUnbind: "_exchange_unbind",
            spec.QueueDeclare: "_queue_declare",
            spec.QueueBind: "_queue_bind",
            spec.QueueUnbind: "_queue_unbind",
            spec.QueuePurge: "_queue_purge",
            spec.QueueDelete: "_queue_delete",
            spec.BasicQos: "_basic_qos",
            spec.BasicConsume: "_basic_consume",
            spec.BasicCancel: "_basic_cancel",
            spec.BasicGet: "_basic_get",
            spec.BasicAck: "_basic_ack",  # a consumer's ack: as frequent as publishes
            spec.BasicReject: "_basic_reject",
            spec.BasicNack: "_basic_nack",
            spec.BasicRecover: "_basic_recover",
            spec.BasicRecoverAsync: "_basic_recover",
            spec.ConfirmSelect: "_confirm_select",
            spec.TxSelect: "_tx_select",
            spec.TxCommit: "_tx_commit",
            spec.TxRollback: "_tx_rollback",
            **_each(
                CONTENT_METHODS,
                Refuse(COMMAND_INVALID, "{method} carries content the broker does not accept"),
            ),
            spec.BasicPublish: "_basic_publish",  # content: (channel, method, header, body)
        },
        Refuse(NOT_IMPLEMENTED, "method {method} is not allowed from a client on a channel"),
    ),
    # After our channel.close everything but close / close-ok is dropped (spec 2.3.5).
    H.CLOSING: Rules(
        {
            **_ON_A_CHANNEL,
            spec.ChannelClose: "_answer_close",
            spec.ChannelCloseOk: "_close_ok_received",
        },
        DROP,
    ),
    # The tombstone: whatever was in flight when the channel closed is dropped.
    H.CLOSED: Rules({spec.ChannelOpen: "_reopen"}, DROP),
}
del C, H

Row = dict[type, Callable[..., None]]


def _drop(target: Any, *rest: Any) -> None:
    """DROP bound: the frame is read and ignored."""


def _bind_entry(entry: Entry, owner: type, kind: str, state: Any) -> Callable[..., None]:
    if entry is DROP:
        return _drop
    if isinstance(entry, Refuse):
        return _refuser(entry, kind, state)
    handler = getattr(owner, entry)  # type: ignore[arg-type]  # not _drop nor Refuse: a handler's name
    if not callable(handler):
        raise TypeError(f"{owner.__name__}.{entry} is not a handler")
    return handler


def _refuser(refuse: Refuse, kind: str, state: Any) -> Callable[..., None]:
    """A Refuse bound to how its row is called (the channel number comes from there)."""
    conn_state = state if isinstance(state, ConnectionState) else None
    if kind == "connection":

        def refuse_on_channel_0(conn: Any, method: Any, *content: Any) -> None:
            raise refuse.error(method, 0, conn_state)

        return refuse_on_channel_0
    if kind == "unopened":

        def refuse_unopened(conn: Any, channel: int, method: Any) -> None:
            raise refuse.error(method, channel, conn_state)

        return refuse_unopened

    def refuse_on_channel(channel: Any, method: Any, *content: Any) -> None:
        raise refuse.error(method, channel.id, None)

    return refuse_on_channel


def bind_rows(
    rules: Mapping[Any, Rules], owners: Mapping[Any, type] | type, kind: str
) -> dict[Any, Row]:
    """Each state's row as dispatch uses it: every method type -> a plain function.

    `owners` is the class whose methods the row's names are (or one per state); `kind`
    is how its entries are called: "connection" (conn, method), "unopened" (conn,
    channel number, method) or "channel" (channel, method).
    """
    rows: dict[Any, Row] = {}
    for state, rule in rules.items():
        owner = owners if isinstance(owners, type) else owners[state]
        default = _bind_entry(rule.default, owner, kind, state)
        row: Row = dict.fromkeys(ALL_METHODS, default)
        for method, entry in rule.entries.items():
            row[method] = _bind_entry(entry, owner, kind, state)
        rows[state] = row
    return rows


def entry_for(rules: Mapping[Any, Rules], state: Any, method: type) -> Entry:
    """The rule for `method` in `state`, as the table states it (for tests and readers)."""
    rule = rules[state]
    return rule.entries.get(method, rule.default)
