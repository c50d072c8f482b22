"""Users, SASL mechanisms (PLAIN, AMQPLAIN) and RabbitMQ-style permissions.

Permissions are three regular expressions per user and vhost (configure,
write, read) searched for in resource names, as RabbitMQ's `re:run` does (an
unanchored search: `lim` allows `xlimx`; the empty expression is RabbitMQ's
`^$`, which no resource name matches but the empty routing key does); the
answers are cached because a publish checks `write` on every message. Topic permissions add, per exchange, write and read expressions over
routing keys (publish) and binding keys (bind), with `{username}` and
`{vhost}` replaced by the user's and vhost's names first.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from roarmq.protocol.tables import decode_table

MECHANISMS = ("PLAIN", "AMQPLAIN")
#: Offered besides them on TLS connections with a verified client certificate (broker/amqp/tls.py).
EXTERNAL = "EXTERNAL"


class AuthError(Exception):
    """Login refused; the text is for the log, the client gets RabbitMQ's generic refusal.

    Never holds a password: a malformed response is described, not quoted.
    """


class MalformedResponse(AuthError):
    """A SASL response that does not parse: RabbitMQ's 502 SYNTAX_ERROR, not a refusal."""


def _regex(text: str) -> re.Pattern[str]:
    """A permission expression; the empty one stands for `^$`, as in RabbitMQ."""
    return re.compile(text or "^$")


@dataclass
class TopicPermission:
    """Write and read expressions over the routing keys of one topic exchange."""

    write: re.Pattern[str] | None
    read: re.Pattern[str] | None


@dataclass
class Permission:
    configure: re.Pattern[str] | None
    write: re.Pattern[str] | None
    read: re.Pattern[str] | None
    #: Topic permissions by exchange name; empty (and falsy) for most users.
    topics: dict[str, TopicPermission] = field(default_factory=dict)
    _cache: dict[tuple[str, str], bool] = field(default_factory=dict)

    def allows(self, action: str, name: str) -> bool:
        key = (action, name)
        hit = self._cache.get(key)
        if hit is None:
            pattern = getattr(self, action)
            hit = pattern is not None and pattern.search(name) is not None
            if len(self._cache) > 10000:
                self._cache.clear()
            self._cache[key] = hit
        return hit

    def allows_topic(self, action: str, exchange: str, key: str) -> bool:
        """RabbitMQ's topic check: no topic permission on the exchange means allowed."""
        topic = self.topics.get(exchange)
        if topic is None:
            return True
        pattern = topic.write if action == "write" else topic.read
        return pattern is not None and pattern.search(key) is not None


#: Allows nothing: a connection whose user lost its permissions on the vhost.
NO_PERMISSION = Permission(None, None, None)


@dataclass
class User:
    name: str
    password_hash: str
    tags: tuple[str, ...]
    loopback_only: bool
    permissions: dict[str, Permission]


class _EveryVhost(dict):
    """Full permissions on whatever vhost is asked for."""

    def get(self, vhost: str, default: Any = None) -> Permission:
        return Permission(_regex(".*"), _regex(".*"), _regex(".*"))


#: Who the broker's own connections to itself log in as (a shovel's or federation link's
#: `amqp://` with no host): trusted, every vhost, every permission, with no password. As
#: RabbitMQ's direct connections, which its dummy auth backend's user "none" makes.
INTERNAL_USER = User("none", "", (), False, _EveryVhost())


def hash_password(password: str) -> str:
    """Salted SHA-256, RabbitMQ's default scheme: base64(salt(4 bytes) + sha256(salt + password))."""
    salt = os.urandom(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def check_password(password_hash: str, password: str) -> bool:
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except ValueError:
        return False
    if len(raw) != 36:
        return False
    salt, digest = raw[:4], raw[4:]
    return hmac.compare_digest(digest, hashlib.sha256(salt + password.encode()).digest())


class Authenticator:
    """Users and their permissions; rebuilt whenever the definitions change."""

    def __init__(
        self, users: Iterable[Any], permissions: Iterable[Any], topics: Iterable[Any] = ()
    ) -> None:
        """`users` have name, password_hash, tags, loopback_only; `permissions` have
        user, vhost, configure, write, read (the config and store records both fit);
        `topics` have user, vhost, exchange, write, read."""
        self.users: dict[str, User] = {
            u.name: User(u.name, u.password_hash, tuple(u.tags), u.loopback_only, {}) for u in users
        }
        for p in permissions:
            user = self.users.get(p.user)
            if user is not None:
                user.permissions[p.vhost] = Permission(
                    _regex(p.configure), _regex(p.write), _regex(p.read)
                )
        for t in topics:
            user = self.users.get(t.user)
            perm = user.permissions.get(t.vhost) if user is not None else None
            if perm is not None:  # without permissions on the vhost nothing gets that far
                perm.topics[t.exchange] = TopicPermission(
                    _regex(_expand(t.write, t.user, t.vhost)),
                    _regex(_expand(t.read, t.user, t.vhost)),
                )

    def check(self, username: str, password: str) -> User | None:
        user = self.users.get(username)
        if user is None or not check_password(user.password_hash, password):
            return None
        return user

    def authenticate(self, mechanism: str, response: bytes, peer_host: str | None) -> User:
        if mechanism == "PLAIN":
            username, password = parse_plain(response)
        elif mechanism == "AMQPLAIN":
            username, password = parse_amqplain(response)
        else:
            raise AuthError(f"unsupported authentication mechanism '{mechanism}'")
        user = self.check(username, password)
        if user is None:
            raise AuthError(f"user '{username}' - invalid credentials")
        if user.loopback_only and not is_loopback(peer_host):
            raise AuthError(f"user '{username}' can only connect via localhost")
        return user

    def external(self, name: str | None, peer_host: str | None) -> User:
        """SASL EXTERNAL, as RabbitMQ's rabbitmq_auth_mechanism_ssl: the verified client
        certificate names the user (`name`, None if it names none); no password, but the
        user must exist."""
        if name is None:
            raise AuthError("EXTERNAL: the client certificate names no user")
        user = self.users.get(name)
        if user is None:
            raise AuthError(f"EXTERNAL: user '{name}' - not found")
        if user.loopback_only and not is_loopback(peer_host):
            raise AuthError(f"user '{name}' can only connect via localhost")
        return user


def _expand(expression: str, user: str, vhost: str) -> str:
    """RabbitMQ's topic-permission variables, replaced by the names as they are."""
    return expression.replace("{username}", user).replace("{vhost}", vhost)


def parse_plain(response: bytes) -> tuple[str, str]:
    """SASL PLAIN: authzid NUL authcid NUL password."""
    parts = response.split(b"\x00")
    if len(parts) != 3:
        raise MalformedResponse("malformed PLAIN response")
    return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")


def parse_amqplain(response: bytes) -> tuple[str, str]:
    """AMQPLAIN: a field table without its length prefix, holding LOGIN and PASSWORD."""
    try:
        table, _ = decode_table(len(response).to_bytes(4, "big") + response, 0)
    except Exception:
        raise MalformedResponse("malformed AMQPLAIN response") from None
    login, password = table.get("LOGIN"), table.get("PASSWORD")
    if isinstance(login, bytes):
        login = login.decode("utf-8", "replace")
    if isinstance(password, bytes):
        password = password.decode("utf-8", "replace")
    if not isinstance(login, str) or not isinstance(password, str):
        raise MalformedResponse("AMQPLAIN response lacks LOGIN or PASSWORD")
    return login, password


def is_loopback(host: str | None) -> bool:
    if host is None:
        return True  # a Unix socket or in-process transport
    try:
        addr = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback
