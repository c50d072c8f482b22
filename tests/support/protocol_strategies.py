"""Hypothesis strategies and frame-building helpers shared by the protocol tests.

Two families: ``full_*`` cover everything our codec accepts; ``oracle_*``
stay inside the domain where pamqp (the test oracle) is correct, each
exclusion named where it is made.
"""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from hypothesis import strategies as st

from roarmq.protocol.method import Method
from roarmq.protocol.properties import BasicProperties

# -- scalars ---------------------------------------------------------------------

# At most 4 UTF-8 bytes per character, so 63 characters always fit a shortstr.
shortstr = st.text(max_size=63)
longstr = st.binary(max_size=300)
octet = st.integers(0, 0xFF)
short = st.integers(0, 0xFFFF)
long_ = st.integers(0, 0xFFFFFFFF)
longlong = st.integers(0, 0xFFFFFFFFFFFFFFFF)

utc_datetimes = st.datetimes(
    min_value=datetime(1970, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)
).map(lambda d: d.replace(microsecond=0, tzinfo=UTC))
decimals = st.builds(
    lambda mantissa, scale: Decimal(mantissa).scaleb(-scale),
    st.integers(-0x80000000, 0x7FFFFFFF),
    st.integers(0, 12),
)
table_keys = st.text(max_size=30)

# -- field values ----------------------------------------------------------------

full_scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),  # NaN != NaN; NaN itself round-trips bit-exact via 'd'
    decimals,
    st.text(max_size=40),
    st.binary(max_size=40),
    utc_datetimes,
    st.none(),
)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=4), st.dictionaries(table_keys, children, max_size=4)
    )


full_values = st.recursive(full_scalars, _containers, max_leaves=12)
full_tables = st.dictionaries(table_keys, full_values, max_size=6)

# pamqp's domain: no float (pamqp sends 'f', float32, and we send 'd'), no
# bytes (pamqp cannot encode them; bytearray -> 'x' it can), timestamps up to
# 2**32 - 1 (pamqp reads larger ones as milliseconds), keys of at most 128
# UTF-8 bytes (pamqp truncates longer ones) in sorted order (pamqp sorts keys,
# we keep insertion order), and 'x' values compared as bytes == bytearray.
oracle_datetimes = st.datetimes(
    min_value=datetime(1970, 1, 1), max_value=datetime(2106, 2, 7, 6, 28, 15)
).map(lambda d: d.replace(microsecond=0, tzinfo=UTC))
oracle_scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    decimals,
    st.text(max_size=40),
    st.binary(max_size=40).map(bytearray),
    oracle_datetimes,
    st.none(),
)
oracle_keys = st.text(max_size=30)


def _sorted_dict(d: dict[str, Any]) -> dict[str, Any]:
    return dict(sorted(d.items()))


def _oracle_containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(oracle_keys, children, max_size=4).map(_sorted_dict),
    )


oracle_values = st.recursive(oracle_scalars, _oracle_containers, max_leaves=12)
oracle_tables = st.dictionaries(oracle_keys, oracle_values, max_size=6).map(_sorted_dict)

# -- methods ---------------------------------------------------------------------

FULL_TYPES: dict[str, st.SearchStrategy[Any]] = {
    "bit": st.booleans(),
    "octet": octet,
    "short": short,
    "long": long_,
    "longlong": longlong,
    "timestamp": longlong,
    "shortstr": shortstr,
    "longstr": longstr,
    "table": full_tables,
}

# pamqp validates these against ^[a-zA-Z0-9-_.:]*$ and 127 characters.
NAME_FIELDS = {"exchange", "queue", "destination", "source"}
amqp_names = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:", max_size=127
)
ORACLE_TYPES: dict[str, st.SearchStrategy[Any]] = {
    **FULL_TYPES,
    # pamqp packs longlong as signed ('>q'); AMQP's (and RabbitMQ's) is unsigned.
    "longlong": st.integers(0, 2**63 - 1),
    "longstr": st.text(max_size=100),  # pamqp encodes longstr from str only
    "table": oracle_tables,
}


def method_args(cls: type[Method], oracle: bool = False) -> st.SearchStrategy[dict[str, Any]]:
    types = ORACLE_TYPES if oracle else FULL_TYPES
    fields = {}
    for name, kind in cls.FIELDS:
        if oracle and kind == "shortstr" and name in NAME_FIELDS:
            fields[name] = amqp_names
        else:
            fields[name] = types[kind]
    return st.fixed_dictionaries(fields)


def methods(cls: type[Method]) -> st.SearchStrategy[Method]:
    return method_args(cls).map(lambda kwargs: cls(**kwargs))


# -- properties --------------------------------------------------------------------

PROPERTY_TYPES = {
    "headers": full_tables,
    "delivery_mode": octet,
    "priority": octet,
    "timestamp": utc_datetimes,
}


def _optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


full_properties = st.builds(
    BasicProperties,
    **{name: _optional(PROPERTY_TYPES.get(name, shortstr)) for name in BasicProperties.__slots__},
)

# pamqp's domain: it skips '' properties (we send them: None is "absent"),
# requires delivery_mode in {1, 2} and cluster_id to be empty (so we leave it
# unset), and reads timestamps above 2**32 - 1 as milliseconds.
oracle_properties = st.fixed_dictionaries(
    {},
    optional={
        "content_type": st.text(min_size=1, max_size=63),
        "content_encoding": st.text(min_size=1, max_size=63),
        "headers": oracle_tables,
        "delivery_mode": st.sampled_from([1, 2]),
        "priority": octet,
        "correlation_id": st.text(min_size=1, max_size=63),
        "reply_to": st.text(min_size=1, max_size=63),
        "expiration": st.text(min_size=1, max_size=63),
        "message_id": st.text(min_size=1, max_size=63),
        "timestamp": oracle_datetimes,
        "type": st.text(min_size=1, max_size=63),
        "user_id": st.text(min_size=1, max_size=63),
        "app_id": st.text(min_size=1, max_size=63),
    },
)


# -- raw frames --------------------------------------------------------------------


def raw_frame(kind: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    """A frame built by hand, so tests can break any part of it."""
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + bytes([end])


def method_payload(method: Method) -> bytes:
    return struct.pack(">HH", method.CLASS_ID, method.METHOD_ID) + method.encode()


def header_payload(
    body_size: int, raw: bytes = b"\x00\x00", class_id: int = 60, weight: int = 0
) -> bytes:
    return struct.pack(">HHQ", class_id, weight, body_size) + raw
