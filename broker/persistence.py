"""What survives a restart: the glue between the live broker and broker/store/.

Durable exchanges, queues and bindings, and all users, vhosts and permissions
are written to SQLite as they change and restored at start; transient ones are
never written, so they are gone after a restart, as in RabbitMQ. Users, vhosts
and permissions named in config.toml are (re)seeded at every start: the file
wins for what it names, the management API adds the rest.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .auth import Authenticator, check_password, hash_password
from .exchange import Exchange
from .store.definitions import BindingDef, DefinitionStore, ExchangeDef, PermissionDef, UserDef

if TYPE_CHECKING:
    from .queue import Queue
    from .server import Broker
    from .vhost import VirtualHost

log = logging.getLogger("roarmq.persistence")

DEFINITIONS_FILE = "definitions.sqlite3"


class Persistence:
    def __init__(self, broker: Broker, data_dir: str | Path) -> None:
        self.broker = broker
        self.dir = Path(data_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.definitions = DefinitionStore(self.dir / DEFINITIONS_FILE)
        self.restoring = False

    def close(self) -> None:
        self.definitions.close()

    # -- start-up -------------------------------------------------------------------

    def seed_from_config(self) -> None:
        cfg = self.broker.config
        store = self.definitions
        known = {u.name: u for u in store.users()}
        for v in cfg.vhosts:
            store.put_vhost(v.name)
        for u in cfg.users:
            old = known.get(u.name)
            same = (
                old is not None
                and check_password(old.password_hash, u.password)
                and old.tags == tuple(u.tags)
                and old.loopback_only == u.loopback_only
            )
            if not same:
                store.put_user(
                    UserDef(u.name, hash_password(u.password), tuple(u.tags), u.loopback_only)
                )
        for p in cfg.permissions:
            store.put_permission(PermissionDef(p.user, p.vhost, p.configure, p.write, p.read))

    def load_auth(self) -> Authenticator:
        return Authenticator(self.definitions.users(), self.definitions.permissions())

    def vhost_names(self) -> list[str]:
        return self.definitions.vhosts()

    def restore(self) -> None:
        """Recreate durable exchanges, queues and bindings in the vhosts."""
        from .queue import Queue

        self.restoring = True
        try:
            vhosts = self.broker.vhosts
            for x in self.definitions.exchanges():
                vhost = vhosts.get(x.vhost)
                if vhost is None or x.name in vhost.exchanges:
                    continue
                try:
                    vhost.declare_exchange(
                        x.name,
                        x.type,
                        durable=True,
                        auto_delete=x.auto_delete,
                        internal=x.internal,
                        arguments=x.arguments,
                    )
                except Exception as exc:  # a definition we can no longer accept
                    log.error(
                        "cannot restore exchange", extra={"exchange": x.name, "error": str(exc)}
                    )
            for q in self.definitions.queues():
                vhost = vhosts.get(q.vhost)
                if vhost is None or q.name in vhost.queues:
                    continue
                try:
                    queue = Queue(
                        vhost,
                        q.name,
                        durable=True,
                        auto_delete=q.auto_delete,
                        arguments=q.arguments,
                    )
                except Exception as exc:
                    log.error("cannot restore queue", extra={"queue": q.name, "error": str(exc)})
                    continue
                queue.store_id = q.id
                vhost.queues[q.name] = queue
            for b in self.definitions.bindings():
                vhost = vhosts.get(b.vhost)
                if vhost is None:
                    continue
                source = vhost.exchanges.get(b.source)
                dest = (vhost.queues if b.destination_type == "queue" else vhost.exchanges).get(
                    b.destination
                )
                if source is None or dest is None:
                    continue
                try:
                    source.bind(b.routing_key, dest, b.arguments or None)
                except ValueError as exc:
                    log.error(
                        "cannot restore binding", extra={"source": b.source, "error": str(exc)}
                    )
        finally:
            self.restoring = False

    # -- changes ----------------------------------------------------------------------

    def exchange_created(self, x: Exchange) -> None:
        if x.durable and not x.builtin and not self.restoring:
            self.definitions.put_exchange(
                ExchangeDef(x.vhost.name, x.name, x.type, x.auto_delete, x.internal, x.arguments)
            )

    def exchange_deleted(self, x: Exchange) -> None:
        if x.durable and not x.builtin:
            self.definitions.delete_exchange(x.vhost.name, x.name)

    def queue_created(self, q: Queue) -> None:
        if q.durable and q.exclusive_owner is None and not self.restoring:
            q.store_id = self.definitions.put_queue(
                q.vhost.name, q.name, q.auto_delete, q.arguments
            )
            q.store = self.broker.store

    def queue_deleted(self, q: Queue) -> None:
        if q.store_id is not None:
            self.definitions.delete_queue(q.vhost.name, q.name)

    def _binding(
        self, source: Exchange, dest: Any, key: str, args: dict | None
    ) -> BindingDef | None:
        if self.restoring or not source.durable or source.builtin and source.name == "":
            return None
        if not isinstance(dest, Exchange):
            if dest.store_id is None:
                return None
            return BindingDef(source.vhost.name, source.name, dest.name, "queue", key, args or {})
        if not dest.durable:
            return None
        return BindingDef(source.vhost.name, source.name, dest.name, "exchange", key, args or {})

    def binding_added(self, source: Exchange, dest: Any, key: str, args: dict | None) -> None:
        b = self._binding(source, dest, key, args)
        if b is not None:
            self.definitions.put_binding(b)

    def binding_removed(self, source: Exchange, dest: Any, key: str, args: dict | None) -> None:
        b = self._binding(source, dest, key, args)
        if b is not None:
            self.definitions.delete_binding(b)

    def vhost_created(self, vhost: VirtualHost) -> None:
        self.definitions.put_vhost(vhost.name)

    def vhost_deleted(self, name: str) -> None:
        self.definitions.delete_vhost(name)
