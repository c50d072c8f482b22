"""RabbitMQ's `properties_key` hash of binding arguments, reproduced: `erlang:phash2/2` (the
VM's make_hash2, a portable term hash) over the arguments as RabbitMQ keeps them, a list of
{Name, Type, Value} tuples sorted by name.

rabbit_mgmt_format:args_hash(Args) is base64url(<<(erlang:phash2(Args, 1 bsl 32)):32>>);
pack_binding_props puts it after the quoted routing key and "~". The types are AMQP field
types (atoms): a binding made over AMQP keeps the ones its client sent (pika, the Java and
.NET clients send an integer as `signedint` when it fits 32 bits, else `long`); one made
through the HTTP API has JSON's (`long`, `double`, nested tables sorted). RoarMQ keeps the
values, not the wire types, so it assumes the first for AMQP and knows the second for the
API (`ApiArguments`); a client that sends other integer types (pamqp: the smallest that
fits) gets a different hash than RabbitMQ would give it. Checked against RabbitMQ 3.10.8 and
`erl` by tests/management/test_api_parity.py.
"""

from __future__ import annotations

import base64
import struct
from datetime import datetime
from decimal import Decimal
from typing import Any

_M = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9
_H = {n: (_GOLDEN * n) & _M for n in range(1, 23)}  # HCONST_n
_NIL = 2  # NIL_DEF


class Atom(str):
    """An Erlang atom (hashed by its name's hashpjw, unlike a binary)."""


class ApiArguments(dict):
    """Binding arguments that came as JSON (the HTTP API): RabbitMQ types them as JSON's."""


def _hash2(x: int, y: int, const: int, h: int) -> int:
    """UINT32_HASH_2."""
    return _mix3((const + x) & _M, (const + y) & _M, h)[2]


def _block_hash(k: bytes, initval: int) -> int:
    """Bob Jenkins' lookup2, as the VM hashes a binary's bytes."""
    a = b = _GOLDEN
    c = initval
    i, n = 0, len(k)
    while n >= 12:
        a = (a + int.from_bytes(k[i : i + 4], "little")) & _M
        b = (b + int.from_bytes(k[i + 4 : i + 8], "little")) & _M
        c = (c + int.from_bytes(k[i + 8 : i + 12], "little")) & _M
        a, b, c = _mix3(a, b, c)
        i, n = i + 12, n - 12
    c = (c + len(k)) & _M
    rest = k[i:]
    if n > 8:
        c = (c + (int.from_bytes(rest[8:], "little") << 8)) & _M
    if n > 4:
        b = (b + int.from_bytes(rest[4:8], "little")) & _M
    if n > 0:
        a = (a + int.from_bytes(rest[:4], "little")) & _M
    return _mix3(a, b, c)[2]


def _mix3(a: int, b: int, c: int) -> tuple[int, int, int]:
    a = (a - b - c) & _M
    a ^= c >> 13
    b = (b - c - a) & _M
    b ^= (a << 8) & _M
    c = (c - a - b) & _M
    c ^= b >> 13
    a = (a - b - c) & _M
    a ^= c >> 12
    b = (b - c - a) & _M
    b ^= (a << 16) & _M
    c = (c - a - b) & _M
    c ^= b >> 5
    a = (a - b - c) & _M
    a ^= c >> 3
    b = (b - c - a) & _M
    b ^= (a << 10) & _M
    c = (c - a - b) & _M
    c ^= b >> 15
    return a, b, c


def _atom_hash(name: str) -> int:
    """The atom table's hashpjw of the name."""
    h = 0
    for v in name.encode("latin-1"):
        h = ((h << 4) + v) & _M
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
            h ^= g
    return h


def phash2(term: Any) -> int:
    """erlang:phash2(Term, 1 bsl 32) for atoms (`Atom`), binaries (`bytes`), integers,
    floats, lists and tuples."""
    if isinstance(term, Atom):
        return _atom_hash(term)
    stack: list[Any] = []
    h = 0
    while True:
        if isinstance(term, Atom):
            v = _atom_hash(term)
            h = v if h == 0 else _hash2(v, 0, _H[3], h)
        elif isinstance(term, list):
            if not term:
                h = 3468870702 if h == 0 else _hash2(_NIL, 0, _H[2], h)
            else:
                c = sh = i = 0
                n = len(term)
                while i < n and type(term[i]) is int and 0 <= term[i] <= 255:
                    sh = ((sh << 8) + term[i]) & _M  # a string's bytes, four at a time
                    if c == 3:
                        h = _hash2(sh, 0, _H[4], h)
                        c = sh = 0
                    else:
                        c += 1
                    i += 1
                if c > 0:
                    h = _hash2(sh, 0, _H[4], h)
                if i < n:
                    stack.append(term[i + 1 :])
                    term = term[i]
                else:
                    term = []
                continue
        elif isinstance(term, tuple):
            h = _hash2(len(term), 0, _H[9], h)
            if term:
                stack.extend(reversed(term[1:]))
                term = term[0]
                continue
        elif isinstance(term, bool):
            raise TypeError("a boolean is an atom: Atom('true')")
        elif isinstance(term, int):
            if -(1 << 27) <= term < (1 << 27):
                if term < 0:
                    h = _hash2(-term, 0, _GOLDEN, h)
                h = _hash2(term & _M, 0, _GOLDEN, h)
            else:  # a bignum: 64-bit digits of the magnitude, low word first
                const = _H[10] if term < 0 else _H[11]
                mag = abs(term)
                while True:
                    digit = mag & 0xFFFFFFFFFFFFFFFF
                    h = _hash2(digit & _M, digit >> 32, const, h)
                    mag >>= 64
                    if not mag:
                        break
        elif isinstance(term, float):
            bits = struct.unpack("<Q", struct.pack("<d", term if term != 0.0 else 0.0))[0]
            h = _hash2(bits >> 32, bits & _M, _H[12], h)
        elif isinstance(term, (bytes, bytearray)):
            const = (_H[13] + h) & _M
            h = _block_hash(bytes(term), const) if term else const
        else:
            raise TypeError(f"no Erlang term for {type(term).__name__}")
        if not stack:
            return h
        term = stack.pop()


def _typed(value: Any, json: bool) -> tuple[Atom, Any]:
    """{Type, Value} of one field value as RabbitMQ holds it."""
    if isinstance(value, bool):
        return Atom("bool"), Atom("true" if value else "false")
    if isinstance(value, str):
        return Atom("longstr"), value.encode("utf-8", "surrogateescape")
    if isinstance(value, int):
        if not json and -0x80000000 <= value <= 0x7FFFFFFF:
            return Atom("signedint"), int(value)
        return Atom("long"), int(value)
    if isinstance(value, float):
        return Atom("double"), value
    if isinstance(value, dict):
        return Atom("table"), _table(value, json, sort=json)
    if isinstance(value, (list, tuple)):
        return Atom("array"), [_typed(v, json) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return Atom("binary"), bytes(value)
    if value is None:
        return Atom("void"), Atom("undefined")
    if isinstance(value, Decimal):
        sign, digits, exponent = value.as_tuple()
        scale = -exponent if isinstance(exponent, int) and exponent < 0 else 0
        unscaled = int(value.scaleb(scale))
        return Atom("decimal"), (scale, unscaled)
    if isinstance(value, datetime):
        return Atom("timestamp"), int(value.timestamp())
    return Atom("longstr"), str(value).encode()


def _table(table: dict[str, Any], json: bool, sort: bool) -> list[tuple[Any, ...]]:
    rows = [(k.encode("utf-8", "surrogateescape"), *_typed(v, json)) for k, v in table.items()]
    return sorted(rows, key=lambda r: r[0]) if sort else rows


def args_hash(arguments: dict[str, Any]) -> str:
    """rabbit_mgmt_format:args_hash: the arguments sorted by name (rabbit_misc:
    sort_field_table), phash2 over 32 bits, base64url without padding."""
    json = isinstance(arguments, ApiArguments)
    term = _table(arguments, json, sort=True)
    return base64.urlsafe_b64encode(phash2(term).to_bytes(4, "big")).decode().rstrip("=")


def format_term(term: Any) -> str:
    """A term as Erlang's `~p` prints it, where RabbitMQ's error texts show one: `Atom`s
    bare, `str` as a charlist ("..."), `bytes` as a binary (<<"...">>: a JSON string as
    RabbitMQ decodes it), tuples {..}, lists [..], dicts as maps (#{K => V}, keys
    sorted), None as `null` (rabbit_json's), booleans as atoms."""
    if isinstance(term, Atom):
        return str(term)
    if term is None:
        return "null"
    if isinstance(term, bool):
        return "true" if term else "false"
    if isinstance(term, str):
        return '"' + term.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(term, bytes):
        text = term.decode("utf-8", "replace").replace("\\", "\\\\").replace('"', '\\"')
        return f'<<"{text}">>'
    if isinstance(term, tuple):
        return "{" + ",".join(format_term(t) for t in term) + "}"
    if isinstance(term, list):
        return "[" + ",".join(format_term(t) for t in term) + "]"
    if isinstance(term, dict):
        items = sorted(term.items(), key=lambda kv: str(kv[0]))
        return "#{" + ",".join(f"{format_term(k)} => {format_term(v)}" for k, v in items) + "}"
    return repr(term) if isinstance(term, float) else str(term)


def binaries(value: Any) -> Any:
    """A decoded JSON value as RabbitMQ holds it: its strings as binaries (bytes), so
    `format_term` prints them as `~p` does."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, list):
        return [binaries(v) for v in value]
    if isinstance(value, tuple):
        return tuple(binaries(v) for v in value)
    if isinstance(value, dict):
        return {k.encode() if isinstance(k, str) else k: binaries(v) for k, v in value.items()}
    return value
