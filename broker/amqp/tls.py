"""TLS: ssl contexts from [amqp.tls] / [management.tls], the accepting side of an amqps
listener, and what a session tells the management API and SASL EXTERNAL.

All of it runs at start or once per connection (its handshake); nothing on the per-message
path knows whether a connection is encrypted.

Names follow RabbitMQ, whose tools and clients read them: `verify_peer` / `verify_none`
and `fail_if_no_peer_cert` (its ssl_options), the Erlang spellings of the session facts
("tlsv1.3", "aes_256_gcm", "ecdhe_rsa", "aead"), and certificate names written as RFC 4514
strings, last RDN first ("CN=client,O=Example,C=SE"), escaped as rabbit_cert_info does.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from ..config import AmqpTlsConfig, Config, ConfigError, TlsConfig

log = logging.getLogger("roarmq.tls")

#: Seconds a client has for its TLS handshake (RabbitMQ's ssl_handshake_timeout: 5 s).
HANDSHAKE_TIMEOUT = 5.0

#: TLS handshakes in progress at once. Each costs a socket and a TLS state before the peer
#: has said who it is, and connection limits count only finished handshakes, so a peer that
#: opens sockets and never finishes is held here: past the bound, new sockets are closed at
#: once (a legitimate client retries), and the log says so once per burst.
MAX_HANDSHAKES = 512


def server_context(cfg: TlsConfig, section: str) -> ssl.SSLContext:
    """A server context: TLS 1.2 or later, the ssl module's default (secure) ciphers, and
    client certificates asked for and checked as `verify` and `fail_if_no_peer_cert` say."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cfg.certfile, cfg.keyfile)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"[{section}] certfile, keyfile: no certificate and matching private key in "
            f"{cfg.certfile} and {cfg.keyfile} ({_reason(exc)})"
        ) from None
    if cfg.cafile:
        try:
            ctx.load_verify_locations(cafile=cfg.cafile)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"[{section}] cafile: no CA certificates in {cfg.cafile} ({_reason(exc)})"
            ) from None
    if cfg.verify == "verify_peer":
        ctx.verify_mode = ssl.CERT_REQUIRED if cfg.fail_if_no_peer_cert else ssl.CERT_OPTIONAL
    return ctx


def check(config: Config) -> None:
    """Load every enabled section's files as the broker will (`roarmq check-config`)."""
    if config.amqp.tls.enabled:
        server_context(config.amqp.tls, "amqp.tls")
    if config.management.enabled and config.management.tls.enabled:
        server_context(config.management.tls, "management.tls")


def _reason(exc: BaseException) -> str:
    """An ssl error in words, without OpenSSL's source file and line."""
    if isinstance(exc, ssl.SSLError) and exc.reason:
        text = exc.reason.lower().replace("_", " ")
        detail = getattr(exc, "verify_message", None)
        return f"{text}: {detail}" if detail else text
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    if isinstance(exc, ConnectionResetError | EOFError) and not str(exc):
        return "the client closed the connection"
    return str(exc) or type(exc).__name__


# -- a session's facts ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TlsSession:
    """What a finished handshake settled, kept by the connection for its lifetime."""

    protocol: str  # "tlsv1.3"
    cipher: str | None  # "aes_256_gcm"
    key_exchange: str | None  # "any" (TLS 1.3), "ecdhe_rsa", ...
    hash: str | None  # "aead", "sha384", ...
    peer_cert: dict[str, Any] | None  # the client's certificate, verified; None if it sent none
    login: str | None  # the user SASL EXTERNAL would log in as (None: the certificate names none)

    def report(self) -> dict[str, Any]:
        """The connection fields RabbitMQ's management API shows for a TLS connection."""
        cert = self.peer_cert
        return {
            "ssl": True,
            "ssl_protocol": self.protocol,
            "ssl_cipher": self.cipher,
            "ssl_key_exchange": self.key_exchange,
            "ssl_hash": self.hash,
            "peer_cert_subject": rfc4514(cert["subject"]) if cert else None,
            "peer_cert_issuer": rfc4514(cert["issuer"]) if cert else None,
            "peer_cert_validity": _validity(cert) if cert else None,
        }


#: The same fields for a connection without TLS, as RabbitMQ reports them (null).
PLAIN_REPORT: dict[str, Any] = {
    "ssl": False,
    "ssl_protocol": None,
    "ssl_cipher": None,
    "ssl_key_exchange": None,
    "ssl_hash": None,
    "peer_cert_subject": None,
    "peer_cert_issuer": None,
    "peer_cert_validity": None,
}


def session_of(ssl_object: ssl.SSLObject, cfg: AmqpTlsConfig) -> TlsSession:
    """The facts of a connection whose handshake just finished."""
    name = (ssl_object.cipher() or ("",))[0]
    suite = next((c for c in ssl_object.context.get_ciphers() if c["name"] == name), None)
    cipher, key_exchange, mac = _erlang_suite(suite) if suite else (None, None, None)
    cert = ssl_object.getpeercert() or None  # {}: not verified, which a client cert always is
    return TlsSession(
        protocol=(ssl_object.version() or "").lower(),
        cipher=cipher,
        key_exchange=key_exchange,
        hash=mac,
        peer_cert=cert,
        login=cert_login(cert, cfg) if cert else None,
    )


def _erlang_suite(suite: Mapping[str, Any]) -> tuple[str, str, str]:
    """OpenSSL's description of a cipher suite (SSLContext.get_ciphers()) as Erlang's
    selected_cipher_suite names it: cipher, key exchange, MAC."""
    cipher = suite["symmetric"].replace("-", "_")  # "aes-256-gcm" -> "aes_256_gcm"
    kx = suite["kea"].removeprefix("kx-")  # "any" under TLS 1.3
    if kx not in ("any", "rsa"):
        kx = f"{kx}_{suite['auth'].removeprefix('auth-')}"  # "ecdhe_rsa"
    mac = "aead" if suite["aead"] else {"sha1": "sha"}.get(suite["digest"], suite["digest"])
    return cipher, kx, mac


# Python's subjectAltName type names for RabbitMQ's ssl_cert_login_san_type values.
_SAN_TYPES = {"dns": "DNS", "ip": "IP Address", "email": "email", "uri": "URI"}


def cert_login(cert: dict[str, Any], cfg: AmqpTlsConfig) -> str | None:
    """The user name a certificate gives, as RabbitMQ's ssl_cert_login_from: the subject's
    common names joined by ",", its whole RFC 4514 name, or one subject alternative name."""
    if cfg.cert_login_from == "common_name":
        names = [v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"]
        return ",".join(names) or None
    if cfg.cert_login_from == "distinguished_name":
        return rfc4514(cert.get("subject", ())) or None
    kind = _SAN_TYPES[cfg.cert_login_san_type]
    sans = [v for t, v in cert.get("subjectAltName", ()) if t == kind]
    index = cfg.cert_login_san_index
    return sans[index] if index < len(sans) else None


# OpenSSL's long attribute names (what getpeercert() gives) -> RFC 4514 / RabbitMQ short names.
_ATTRIBUTES = {
    "commonName": "CN",
    "surname": "SN",
    "givenName": "GIVENNAME",
    "initials": "INITIALS",
    "generationQualifier": "GENERATIONQUALIFIER",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "title": "TITLE",
    "countryName": "C",
    "serialNumber": "SERIALNUMBER",
    "pseudonym": "PSEUDONYM",
    "domainComponent": "DC",
    "emailAddress": "EMAILADDRESS",
    "streetAddress": "STREET",
    "userId": "UID",
}


def rfc4514(name: tuple[Any, ...]) -> str:
    """A certificate name as RabbitMQ prints it: RDNs last first, joined by ","; the
    attributes of one RDN joined by "+"."""
    return ",".join(
        "+".join(f"{_ATTRIBUTES.get(k, k)}={_escape(v)}" for k, v in rdn) for rdn in reversed(name)
    )


_SPECIAL = frozenset(b'"+,;<>\\')


def _escape(value: str) -> str:
    """RFC 4514 escaping as rabbit_cert_info does it: a leading space or "#" and a trailing
    space get a backslash, so do the special characters; bytes outside 32..125 of the UTF-8
    form become \\XX."""
    raw = value.encode()
    out = []
    last = len(raw) - 1
    for i, b in enumerate(raw):
        if (i == 0 and b in b" #") or (i == last and i > 0 and b == 32) or b in _SPECIAL:
            out.append("\\" + chr(b))
        elif b < 32 or b >= 126:
            out.append(f"\\{b:02X}")
        else:
            out.append(chr(b))
    return "".join(out)


def _validity(cert: dict[str, Any]) -> str:
    """RabbitMQ's peer_cert_validity: "2026-11-22T14:00:00Z - 2027-02-20T14:00:00Z"."""

    def iso(text: str) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ssl.cert_time_to_seconds(text)))

    return f"{iso(cert['notBefore'])} - {iso(cert['notAfter'])}"


# -- the amqps listener ---------------------------------------------------------------------


class TlsListener:
    """The amqps listener: its own sockets, accepted one by one, each handed with the ssl
    context to `loop.connect_accepted_socket`, which returns once the handshake is done and
    raises if it fails. (`create_server(ssl=...)` drops a failed handshake without a word;
    an operator whose client cannot connect needs to read why: RabbitMQ's silence on
    handshake timeouts cost one such operator a tracing session, rabbitmq-server#11171.)
    A failure closes that client's socket and nothing else.
    """

    def __init__(self, context: ssl.SSLContext, factory: Callable[[], Any]) -> None:
        self.context = context
        self.factory = factory
        self.sockets: list[socket.socket] = []
        self.bound: list[str] = []  # the addresses listened on
        self.port = 0
        self._tasks: set[asyncio.Task[None]] = set()  # accept loops and handshakes
        self.handshaking = 0  # handshakes in progress
        self.refused = 0  # sockets closed because MAX_HANDSHAKES were in progress
        self._refusing = False

    async def listen(self, hosts: tuple[str, ...], port: int, backlog: int) -> None:
        """Listen on every address; port 0 picks one free port shared by all."""
        for host in hosts:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            try:
                sock = socket.create_server((host, port), family=family, backlog=backlog)
            except OSError as exc:
                if host == "::1" and len(hosts) > 1 and exc.errno in (97, 99):
                    log.warning("IPv6 loopback unavailable; not listening on [::1] for amqps")
                    continue
                await self.close()
                raise
            sock.setblocking(False)
            port = port or sock.getsockname()[1]
            self.sockets.append(sock)
            self.bound.append(host)
            self._spawn(self._accept(sock))
        self.port = port

    async def close(self) -> None:
        """Stop accepting; clients still in their handshake are dropped. The sockets are
        closed once nothing waits on them any more."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sock in self.sockets:
            sock.close()
        self.sockets.clear()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                client, address = await loop.sock_accept(sock)
            except OSError as exc:  # out of file descriptors and the like: wait, then go on
                if sock.fileno() < 0:
                    return
                log.error("amqps accept failed", extra={"reason": _reason(exc)})
                await asyncio.sleep(0.1)
                continue
            if self.handshaking >= MAX_HANDSHAKES:
                client.close()
                self.refused += 1
                if not self._refusing:
                    self._refusing = True
                    log.warning(
                        "TLS handshakes in progress at their bound; closing new sockets",
                        extra={"conn": _peer_name(address), "limit": MAX_HANDSHAKES},
                    )
                continue
            self._refusing = False
            try:
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            self.handshaking += 1
            self._spawn(self._handshake(client, address))

    async def _handshake(self, client: socket.socket, address: Any) -> None:
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                self.factory,
                client,
                ssl=self.context,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT,
            )
        except Exception as exc:  # whatever the client did; its transport is closed already
            log.warning(
                "TLS handshake failed", extra={"conn": _peer_name(address), "reason": _reason(exc)}
            )
        finally:
            self.handshaking -= 1


def _peer_name(address: Any) -> str:
    if not isinstance(address, tuple):
        return "?"
    host = f"[{address[0]}]" if ":" in address[0] else address[0]
    return f"{host}:{address[1]}"


__all__ = [
    "HANDSHAKE_TIMEOUT",
    "MAX_HANDSHAKES",
    "PLAIN_REPORT",
    "TlsListener",
    "TlsSession",
    "cert_login",
    "check",
    "rfc4514",
    "server_context",
    "session_of",
]
