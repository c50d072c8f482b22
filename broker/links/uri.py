"""AMQP URIs as RabbitMQ reads them: where a shovel or a federation link connects.

The rules are RabbitMQ's URI specification and its Erlang client's `amqp_uri:parse`, which
its shovel and federation plugins use, so a URI written for RabbitMQ means the same here:

* `amqp://` or `amqps://` (either case); anything else is refused.
* `user:password@` percent-decoded; without it, guest/guest.
* The host; **no host and no port means the local broker** (RabbitMQ's "direct"
  connection: no socket, no login). A port without a host is refused.
* The port (1..65535), else 5672 (amqp) or 5671 (amqps).
* The path is the vhost, percent-decoded (`%2F` is "/"): `amqp://h` is vhost "/",
  `amqp://h/` is the empty vhost "", `amqp://h/a/b` is refused.
* Query parameters: `heartbeat`, `frame_max`, `channel_max`, `connection_timeout` (ms)
  integers; `auth_mechanism` (`plain`, `amqplain`, `external`; may repeat); over amqps
  the TLS ones, `cacertfile`, `certfile`, `keyfile`, `verify` (`verify_peer` or
  `verify_none`), `fail_if_no_peer_cert`, `server_name_indication` (a name, or
  `disable`), `depth`, and `password` (the key file's, never the login's). A query key
  that names another connection field (`host`, `port`, `username`, ...) is refused as
  RabbitMQ refuses it; other keys are ignored, as there.

A refusal is a `UriError` whose `term` prints as RabbitMQ's reason does (an Erlang term),
so the API can word it as RabbitMQ words it. `redacted` is the URI as RabbitMQ shows it in
status rows and logs: scheme, host, port and path, no credentials, no query.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote_to_bytes

from ..core.erlang import Atom, format_term

DEFAULT_PORTS = {"amqp": 5672, "amqps": 5671}
#: The Erlang client's defaults (amqp_params_network): a heartbeat of 10 s, 60 s to
#: connect; frame_max and channel_max as the server offers.
DEFAULT_HEARTBEAT = 10
DEFAULT_CONNECTION_TIMEOUT_MS = 60_000
MECHANISMS = {"plain": "PLAIN", "amqplain": "AMQPLAIN", "external": "EXTERNAL"}
_INTEGER_KEYS = ("channel_max", "frame_max", "heartbeat", "connection_timeout")
#: The connection fields a query may not set (amqp_params_network's other fields).
_UNCONFIGURABLE = (
    "username",
    "host",
    "port",
    "virtual_host",
    "ssl_options",
    "auth_mechanisms",
    "client_properties",
    "socket_options",
)
_URI = re.compile(
    r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://"
    r"(?:(?P<userinfo>[^@/?#]*)@)?"
    r"(?P<host>\[[^\]]*\]|[^:/?#]*)"
    r"(?::(?P<port>[^/?#]*))?"
    r"(?P<path>/[^?#]*)?"
    r"(?:\?(?P<query>[^#]*))?"
    r"(?:#.*)?$"
)


class UriError(ValueError):
    """A URI RabbitMQ would refuse; `term` is its reason as an Erlang term."""

    def __init__(self, term: Any, uri: str) -> None:
        super().__init__(format_term((term, uri)))
        self.term = term
        self.uri = uri


@dataclass(frozen=True)
class TlsOptions:
    cacertfile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    password: str | None = None
    verify: str = "verify_none"  # the Erlang client's default
    fail_if_no_peer_cert: bool = False
    server_name_indication: str | None = None  # None: the host; "disable": none sent
    depth: int | None = None

    def context(self, host: str) -> tuple[ssl.SSLContext, str | None]:
        """A client context for these options, and the server name to send (SNI)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cacertfile:
            ctx.load_verify_locations(cafile=self.cacertfile)
        if self.certfile:
            ctx.load_cert_chain(self.certfile, self.keyfile, password=self.password)
        sni = (
            None
            if self.server_name_indication == "disable"
            else (self.server_name_indication or host)
        )
        if self.verify == "verify_peer":
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.check_hostname = sni is not None
        else:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx, sni


@dataclass(frozen=True)
class AmqpUri:
    text: str = field(repr=False)  # (its credentials with it: `redacted` for display)
    scheme: str
    host: str | None  # None: the local broker
    port: int
    user: str
    password: str = field(repr=False)
    vhost: str
    heartbeat: int = DEFAULT_HEARTBEAT
    frame_max: int = 0  # 0: as the server offers
    channel_max: int = 0
    connection_timeout_ms: int = DEFAULT_CONNECTION_TIMEOUT_MS
    mechanisms: tuple[str, ...] = ("PLAIN", "AMQPLAIN")
    tls: TlsOptions | None = None

    @property
    def local(self) -> bool:
        return self.host is None

    @property
    def redacted(self) -> str:
        return redact(self.text)

    def __repr__(self) -> str:
        return f"AmqpUri({self.redacted!r}, vhost={self.vhost!r}, user={self.user!r})"


def parse_uri(text: str, default_vhost: str = "/") -> AmqpUri:
    """`text` as RabbitMQ's `amqp_uri:parse` reads it (module doc); UriError if refused."""
    if not isinstance(text, str):
        raise UriError(Atom("expected_string_uri"), repr(text))
    match = _URI.match(text)
    if match is None:
        raise UriError((Atom("unable_to_parse_uri"), Atom("no_scheme")), text)
    scheme = match["scheme"].lower()
    if scheme not in DEFAULT_PORTS:
        raise UriError((Atom("unexpected_uri_scheme"), scheme), text)
    host = match["host"] or None
    if host is not None and host.startswith("["):
        host = host[1:-1]
    port_text = match["port"]
    port = None
    if port_text:
        if not port_text.isdigit():
            raise UriError((Atom("unable_to_parse_uri"), (Atom("invalid_port"), port_text)), text)
        port = int(port_text)
        if not 0 < port <= 65535:
            raise UriError((Atom("port_out_of_range"), port), text)
    path = match["path"]
    if path is None:
        vhost = default_vhost
    else:
        rest = path[1:]
        if "/" in rest:
            raise UriError((Atom("invalid_vhost"), rest), text)
        vhost = _unescape(rest, text)
    if host is not None:
        host = _unescape(host, text)
    elif port is not None:
        raise UriError(Atom("port_requires_host"), text)
    user, password = "guest", "guest"
    if match["userinfo"] is not None:
        parts = match["userinfo"].split(":")
        user = _unescape(parts[0], text)
        if len(parts) > 1:
            password = _unescape(parts[1], text)
    query = _query(match["query"] or "")
    options: dict[str, Any] = {}
    for key in _INTEGER_KEYS:
        if key in query:
            options[key] = _integer(key, query[key][0], query, text)
    for key in _UNCONFIGURABLE:
        if key in query:
            raise UriError(
                (
                    Atom("invalid_amqp_params_parameter"),
                    Atom(key),
                    query[key][0],
                    _query_term(query),
                    (Atom("parameter_unconfigurable_in_query"), Atom(key), query[key][0]),
                ),
                text,
            )
    mechanisms: tuple[str, ...] = ("PLAIN", "AMQPLAIN")
    if "auth_mechanism" in query:
        names = []
        for mech in query["auth_mechanism"]:
            name = mech.split(":", 1)[1] if mech.startswith("amqp_auth_mechanisms:") else mech
            if name not in MECHANISMS:
                raise UriError((Atom("unknown_mechanism"), mech), text)
            names.append(MECHANISMS[name])
        mechanisms = tuple(names)
    tls = _tls(query, text) if scheme == "amqps" else None
    return AmqpUri(
        text=text,
        scheme=scheme,
        host=host,
        port=port or DEFAULT_PORTS[scheme],
        user=user,
        password=password,
        vhost=vhost,
        heartbeat=options.get("heartbeat", DEFAULT_HEARTBEAT),
        frame_max=options.get("frame_max", 0),
        channel_max=options.get("channel_max", 0),
        connection_timeout_ms=options.get("connection_timeout", DEFAULT_CONNECTION_TIMEOUT_MS),
        mechanisms=mechanisms,
        tls=tls,
    )


def redact(text: str) -> str:
    """A URI without its credentials or query (RabbitMQ's `amqp_uri:remove_credentials`),
    for status rows and logs; a URI that does not parse loses its `user:password@` alone."""
    match = _URI.match(text) if isinstance(text, str) else None
    if match is None:
        return re.sub(r"://[^@/]*@", "://", str(text))
    port = f":{match['port']}" if match["port"] else ""
    return f"{match['scheme']}://{match['host']}{port}{match['path'] or ''}"


def _tls(query: dict[str, list[str]], text: str) -> TlsOptions:
    options: dict[str, Any] = {}
    for key in ("cacertfile", "certfile", "keyfile", "password"):
        if key in query:
            options[key] = _unescape(query[key][0], text)
    if "verify" in query:
        value = query["verify"][0]
        if value not in ("verify_peer", "verify_none"):
            raise _bad_tls("verify", value, query, (Atom("invalid_atom_parameter"), value), text)
        options["verify"] = value
    if "fail_if_no_peer_cert" in query:
        value = query["fail_if_no_peer_cert"][0]
        if value not in ("true", "false"):
            term = (Atom("require_boolean"), value)
            raise _bad_tls("fail_if_no_peer_cert", value, query, term, text)
        options["fail_if_no_peer_cert"] = value == "true"
    if "server_name_indication" in query:
        options["server_name_indication"] = query["server_name_indication"][0]
    if "depth" in query:
        value = query["depth"][0]
        if not re.fullmatch(r"[+-]?[0-9]+", value):
            raise _bad_tls("depth", value, query, (Atom("not_an_integer"), value), text)
        options["depth"] = int(value)
    return TlsOptions(**options)


def _bad_tls(key: str, value: str, query: dict, reason: Any, text: str) -> UriError:
    term = (Atom("invalid_ssl_parameter"), Atom(key), value, _query_term(query), reason)
    return UriError(term, text)


def _integer(key: str, value: str, query: dict, text: str) -> int:
    if not re.fullmatch(r"[+-]?[0-9]+", value):
        raise UriError(
            (
                Atom("invalid_amqp_params_parameter"),
                Atom(key),
                value,
                _query_term(query),
                (Atom("not_an_integer"), value),
            ),
            text,
        )
    return int(value)


def _query(text: str) -> dict[str, list[str]]:
    """The query's keys, each with its values in order (auth_mechanism may repeat)."""
    found: dict[str, list[str]] = {}
    for part in text.split("&") if text else ():
        key, _, value = part.partition("=")
        found.setdefault(key, []).append(value)
    return found


def _query_term(query: dict[str, list[str]]) -> list[tuple[str, str]]:
    return [(k, v) for k, values in query.items() for v in values]


def _unescape(text: str, uri: str) -> str:
    """Percent-decoding as amqp_uri's: a `%` must start two hex digits."""
    for at in (m.start() for m in re.finditer("%", text)):
        digits = text[at + 1 : at + 3]
        if len(digits) < 2:  # (Erlang's terms: the atom '%', then the characters' codes)
            rest = [ord(c) for c in text[at + 1 :]]
            raise UriError((Atom("unterminated_entity"), [Atom("'%'"), *rest]), uri)
        if not re.fullmatch(r"[0-9A-Fa-f]{2}", digits):
            codes = [ord(c) for c in digits]
            raise UriError((Atom("invalid_entitiy"), [Atom("'%'"), *codes]), uri)
    return unquote_to_bytes(text).decode("utf-8", "surrogateescape")
