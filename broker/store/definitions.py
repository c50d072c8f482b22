"""Durable definitions (vhosts, users, permissions, exchanges, queues, bindings) in SQLite.

Definitions change rarely and must survive kill -9 exactly, which is what a
SQLite transaction in WAL mode gives us; arguments are stored as AMQP field
tables (our own encoder) so every RabbitMQ field type round-trips unchanged.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roarmq.protocol.tables import decode_table, encode_table

SCHEMA = """
CREATE TABLE IF NOT EXISTS vhosts (name TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS vhost_metadata (name TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS users (
    name TEXT PRIMARY KEY, password_hash TEXT NOT NULL, tags TEXT NOT NULL, loopback_only INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS permissions (
    user TEXT NOT NULL, vhost TEXT NOT NULL, configure TEXT NOT NULL, write TEXT NOT NULL,
    read TEXT NOT NULL, PRIMARY KEY (user, vhost)
);
CREATE TABLE IF NOT EXISTS topic_permissions (
    user TEXT NOT NULL, vhost TEXT NOT NULL, exchange TEXT NOT NULL, write TEXT NOT NULL,
    read TEXT NOT NULL, PRIMARY KEY (user, vhost, exchange)
);
CREATE TABLE IF NOT EXISTS policies (
    vhost TEXT NOT NULL, name TEXT NOT NULL, operator INTEGER NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (vhost, name, operator)
);
CREATE TABLE IF NOT EXISTS limits (
    kind TEXT NOT NULL, owner TEXT NOT NULL, name TEXT NOT NULL, value INTEGER NOT NULL,
    PRIMARY KEY (kind, owner, name)
);
CREATE TABLE IF NOT EXISTS exchanges (
    vhost TEXT NOT NULL, name TEXT NOT NULL, type TEXT NOT NULL, auto_delete INTEGER NOT NULL,
    internal INTEGER NOT NULL, arguments BLOB NOT NULL, PRIMARY KEY (vhost, name)
);
CREATE TABLE IF NOT EXISTS queues (
    id INTEGER PRIMARY KEY, vhost TEXT NOT NULL, name TEXT NOT NULL, auto_delete INTEGER NOT NULL,
    arguments BLOB NOT NULL, UNIQUE (vhost, name)
);
CREATE TABLE IF NOT EXISTS bindings (
    vhost TEXT NOT NULL, source TEXT NOT NULL, destination TEXT NOT NULL,
    destination_type TEXT NOT NULL, routing_key TEXT NOT NULL, arguments BLOB NOT NULL,
    PRIMARY KEY (vhost, source, destination, destination_type, routing_key, arguments)
);
"""


@dataclass(frozen=True)
class ExchangeDef:
    vhost: str
    name: str
    type: str
    auto_delete: bool
    internal: bool
    arguments: dict[str, Any]


@dataclass(frozen=True)
class QueueDef:
    id: int
    vhost: str
    name: str
    auto_delete: bool
    arguments: dict[str, Any]


@dataclass(frozen=True)
class BindingDef:
    vhost: str
    source: str
    destination: str
    destination_type: str  # "queue" or "exchange"
    routing_key: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class UserDef:
    name: str
    password_hash: str
    tags: tuple[str, ...]
    loopback_only: bool


@dataclass(frozen=True)
class PermissionDef:
    user: str
    vhost: str
    configure: str
    write: str
    read: str


@dataclass(frozen=True)
class TopicPermissionDef:
    user: str
    vhost: str
    exchange: str
    write: str
    read: str


@dataclass(frozen=True)
class LimitDef:
    kind: str  # "vhost" or "user"
    owner: str  # the vhost's or the user's name
    name: str  # "max-connections", "max-queues", "max-channels"
    value: int


def _table(args: dict[str, Any] | None) -> bytes:
    return encode_table(args or {})


def _untable(blob: bytes) -> dict[str, Any]:
    return decode_table(blob, 0)[0]


class DefinitionStore:
    """One SQLite file; every change is its own committed transaction."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    def _run(self, sql: str, *params: Any) -> sqlite3.Cursor:
        return self.db.execute(sql, params)

    # -- vhosts, users, permissions ------------------------------------------------

    def put_vhost(self, name: str, metadata: dict[str, Any] | None = None) -> None:
        """A vhost, and its description, tags and default queue type when given."""
        with self.db:
            self._run("INSERT OR IGNORE INTO vhosts (name) VALUES (?)", name)
            if metadata is not None:
                self._run(
                    "INSERT OR REPLACE INTO vhost_metadata (name, body) VALUES (?, ?)",
                    name,
                    json.dumps(metadata),
                )

    def vhost_metadata(self) -> dict[str, dict[str, Any]]:
        rows = self._run("SELECT name, body FROM vhost_metadata")
        return {name: json.loads(body) for name, body in rows}

    def put_setting(self, name: str, value: Any) -> None:
        """A broker-wide setting changed at run time (e.g. the cluster name)."""
        self._run(
            "INSERT OR REPLACE INTO settings (name, value) VALUES (?, ?)", name, json.dumps(value)
        )

    def settings(self) -> dict[str, Any]:
        return {name: json.loads(value) for name, value in self._run("SELECT * FROM settings")}

    def delete_vhost(self, name: str) -> None:
        with self.db:
            tables = ("exchanges", "queues", "bindings", "permissions", "topic_permissions")
            for table in (*tables, "policies"):
                self._run(f"DELETE FROM {table} WHERE vhost = ?", name)
            self._run("DELETE FROM limits WHERE kind = 'vhost' AND owner = ?", name)
            self._run("DELETE FROM vhosts WHERE name = ?", name)
            self._run("DELETE FROM vhost_metadata WHERE name = ?", name)

    def vhosts(self) -> list[str]:
        return [r[0] for r in self._run("SELECT name FROM vhosts ORDER BY name")]

    def put_user(self, user: UserDef) -> None:
        self._run(
            "INSERT OR REPLACE INTO users (name, password_hash, tags, loopback_only) "
            "VALUES (?, ?, ?, ?)",
            user.name,
            user.password_hash,
            ",".join(user.tags),
            int(user.loopback_only),
        )

    def delete_user(self, name: str) -> None:
        with self.db:
            self._run("DELETE FROM permissions WHERE user = ?", name)
            self._run("DELETE FROM topic_permissions WHERE user = ?", name)
            self._run("DELETE FROM limits WHERE kind = 'user' AND owner = ?", name)
            self._run("DELETE FROM users WHERE name = ?", name)

    def users(self) -> list[UserDef]:
        return [
            UserDef(name, password, tuple(t for t in tags.split(",") if t), bool(loop))
            for name, password, tags, loop in self._run(
                "SELECT name, password_hash, tags, loopback_only FROM users ORDER BY name"
            )
        ]

    def put_permission(self, perm: PermissionDef) -> None:
        self._run(
            "INSERT OR REPLACE INTO permissions (user, vhost, configure, write, read) "
            "VALUES (?, ?, ?, ?, ?)",
            perm.user,
            perm.vhost,
            perm.configure,
            perm.write,
            perm.read,
        )

    def delete_permission(self, user: str, vhost: str) -> None:
        self._run("DELETE FROM permissions WHERE user = ? AND vhost = ?", user, vhost)

    def permissions(self) -> list[PermissionDef]:
        return [
            PermissionDef(*row)
            for row in self._run(
                "SELECT user, vhost, configure, write, read FROM permissions ORDER BY user, vhost"
            )
        ]

    def put_topic_permission(self, perm: TopicPermissionDef) -> None:
        self._run(
            "INSERT OR REPLACE INTO topic_permissions (user, vhost, exchange, write, read) "
            "VALUES (?, ?, ?, ?, ?)",
            perm.user,
            perm.vhost,
            perm.exchange,
            perm.write,
            perm.read,
        )

    def delete_topic_permissions(self, user: str, vhost: str, exchange: str | None = None) -> int:
        """Remove a user's topic permissions in a vhost (on one exchange, or all); how many."""
        if exchange is None:
            sql, params = "DELETE FROM topic_permissions WHERE user = ? AND vhost = ?", ()
        else:
            sql = "DELETE FROM topic_permissions WHERE user = ? AND vhost = ? AND exchange = ?"
            params = (exchange,)
        return self._run(sql, user, vhost, *params).rowcount

    def topic_permissions(self) -> list[TopicPermissionDef]:
        return [
            TopicPermissionDef(*row)
            for row in self._run(
                "SELECT user, vhost, exchange, write, read FROM topic_permissions "
                "ORDER BY user, vhost, exchange"
            )
        ]

    def put_policy(self, vhost: str, name: str, operator: bool, body: dict[str, Any]) -> None:
        """A policy as its API body (pattern, apply-to, priority, definition), in JSON."""
        self._run(
            "INSERT OR REPLACE INTO policies (vhost, name, operator, body) VALUES (?, ?, ?, ?)",
            vhost,
            name,
            int(operator),
            json.dumps(body, sort_keys=True),
        )

    def delete_policy(self, vhost: str, name: str, operator: bool) -> None:
        self._run(
            "DELETE FROM policies WHERE vhost = ? AND name = ? AND operator = ?",
            vhost,
            name,
            int(operator),
        )

    def policies(self) -> list[tuple[str, str, bool, dict[str, Any]]]:
        """(vhost, name, operator, body) of every stored policy."""
        return [
            (vhost, name, bool(op), json.loads(body))
            for vhost, name, op, body in self._run(
                "SELECT vhost, name, operator, body FROM policies ORDER BY 1, 2, 3"
            )
        ]

    def put_limit(self, limit: LimitDef) -> None:
        self._run(
            "INSERT OR REPLACE INTO limits (kind, owner, name, value) VALUES (?, ?, ?, ?)",
            limit.kind,
            limit.owner,
            limit.name,
            limit.value,
        )

    def delete_limit(self, kind: str, owner: str, name: str) -> int:
        return self._run(
            "DELETE FROM limits WHERE kind = ? AND owner = ? AND name = ?", kind, owner, name
        ).rowcount

    def limits(self) -> list[LimitDef]:
        return [
            LimitDef(*row)
            for row in self._run("SELECT kind, owner, name, value FROM limits ORDER BY 1, 2, 3")
        ]

    # -- exchanges, queues, bindings -------------------------------------------------

    def put_exchange(self, x: ExchangeDef) -> None:
        self._run(
            "INSERT OR REPLACE INTO exchanges (vhost, name, type, auto_delete, internal, arguments) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            x.vhost,
            x.name,
            x.type,
            int(x.auto_delete),
            int(x.internal),
            _table(x.arguments),
        )

    def delete_exchange(self, vhost: str, name: str) -> None:
        with self.db:
            self._run("DELETE FROM exchanges WHERE vhost = ? AND name = ?", vhost, name)
            self._run(
                "DELETE FROM bindings WHERE vhost = ? AND (source = ? OR "
                "(destination = ? AND destination_type = 'exchange'))",
                vhost,
                name,
                name,
            )

    def exchanges(self) -> list[ExchangeDef]:
        return [
            ExchangeDef(vhost, name, type_, bool(ad), bool(internal), _untable(args))
            for vhost, name, type_, ad, internal, args in self._run(
                "SELECT vhost, name, type, auto_delete, internal, arguments FROM exchanges "
                "ORDER BY rowid"
            )
        ]

    def put_queue(self, vhost: str, name: str, auto_delete: bool, arguments: dict[str, Any]) -> int:
        """Store a durable queue; returns its small integer id (used in the message log)."""
        row = self._run(
            "SELECT id FROM queues WHERE vhost = ? AND name = ?", vhost, name
        ).fetchone()
        if row is not None:
            return row[0]
        cur = self._run(
            "INSERT INTO queues (vhost, name, auto_delete, arguments) VALUES (?, ?, ?, ?)",
            vhost,
            name,
            int(auto_delete),
            _table(arguments),
        )
        return int(cur.lastrowid)

    def delete_queue(self, vhost: str, name: str) -> None:
        with self.db:
            self._run("DELETE FROM queues WHERE vhost = ? AND name = ?", vhost, name)
            self._run(
                "DELETE FROM bindings WHERE vhost = ? AND destination = ? AND "
                "destination_type = 'queue'",
                vhost,
                name,
            )

    def queues(self) -> list[QueueDef]:
        return [
            QueueDef(qid, vhost, name, bool(ad), _untable(args))
            for qid, vhost, name, ad, args in self._run(
                "SELECT id, vhost, name, auto_delete, arguments FROM queues ORDER BY id"
            )
        ]

    def put_binding(self, b: BindingDef) -> None:
        self._run(
            "INSERT OR IGNORE INTO bindings (vhost, source, destination, destination_type, "
            "routing_key, arguments) VALUES (?, ?, ?, ?, ?, ?)",
            b.vhost,
            b.source,
            b.destination,
            b.destination_type,
            b.routing_key,
            _table(b.arguments),
        )

    def delete_binding(self, b: BindingDef) -> None:
        self._run(
            "DELETE FROM bindings WHERE vhost = ? AND source = ? AND destination = ? AND "
            "destination_type = ? AND routing_key = ? AND arguments = ?",
            b.vhost,
            b.source,
            b.destination,
            b.destination_type,
            b.routing_key,
            _table(b.arguments),
        )

    def bindings(self) -> list[BindingDef]:
        return [
            BindingDef(vhost, src, dst, dtype, key, _untable(args))
            for vhost, src, dst, dtype, key, args in self._run(
                "SELECT vhost, source, destination, destination_type, routing_key, arguments "
                "FROM bindings ORDER BY rowid"
            )
        ]
