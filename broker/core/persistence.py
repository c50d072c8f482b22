"""What survives a restart: the glue between the live broker and broker/store/.

Durable exchanges, queues and bindings, and all users, vhosts and permissions
are written to SQLite before they change in memory, and restored at start; transient ones are
never written, so they are gone after a restart, as in RabbitMQ. Users, vhosts
and permissions named in config.toml (or ROARMQ_DEFAULT_USER/_PASS) seed a new
data dir only, as RabbitMQ's default_user: after that the store is the truth,
changed through the management API, so a password changed or a user deleted
there stays so across restarts, and editing the config's users does nothing
but log a notice saying so.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..ops.logs import NOTICE
from ..store.definitions import (
    BindingDef,
    DefinitionStore,
    DefinitionsWriteFailed,
    ExchangeDef,
    PermissionDef,
    UserDef,
)
from ..store.segments import make_dirs_durably
from .auth import Authenticator, check_password, hash_password
from .exchange import Exchange

if TYPE_CHECKING:
    from ..server import Broker
    from .queue import Queue

log = logging.getLogger("roarmq.persistence")

DEFINITIONS_FILE = "definitions.sqlite3"
#: PRAGMA user_version of a definitions store once the config has seeded it.
SEEDED = 1


class Persistence:
    def __init__(self, broker: Broker, data_dir: str | Path) -> None:
        self.broker = broker
        self.dir = Path(data_dir)
        make_dirs_durably(self.dir)
        existed = (self.dir / DEFINITIONS_FILE).exists()
        self.definitions = DefinitionStore(self.dir / DEFINITIONS_FILE)
        #: Not seeded yet: the config's users, vhosts and permissions seed it. The seed and
        #: its mark (SQLite's user_version) commit together, so a first start that died
        #: half-way seeds again rather than leaving a store without its users.
        self.new = not existed or self._unseeded()
        self.restoring = False

    def _unseeded(self) -> bool:
        db = self.definitions.db
        if db.execute("PRAGMA user_version").fetchone()[0] >= SEEDED:
            return False
        # Stores older than the mark: seeded if they hold anything at all.
        held = self.definitions.users() or self.definitions.vhosts()
        if held:
            self.definitions.set_user_version(SEEDED)
        return not held

    def close(self) -> None:
        self.definitions.close()

    # -- start-up -------------------------------------------------------------------

    def seed_from_config(self) -> None:
        cfg = self.broker.config
        store = self.definitions
        if not self.new:
            self._note_config_users_not_applied()
            return
        with store.writing("seed the definitions from the config"):
            for v in cfg.vhosts:
                store.put_vhost(v.name)
            for u in cfg.users:
                store.put_user(
                    UserDef(u.name, hash_password(u.password), tuple(u.tags), u.loopback_only)
                )
            for p in cfg.permissions:
                store.put_permission(PermissionDef(p.user, p.vhost, p.configure, p.write, p.read))
            store.set_user_version(SEEDED)
        self.new = False

    def _note_config_users_not_applied(self) -> None:
        """Say so when the config names users the store does not hold as written."""
        stored = {u.name: u for u in self.definitions.users()}
        differ = [
            u.name
            for u in self.broker.config.users
            if u.name not in stored
            or not check_password(stored[u.name].password_hash, u.password)
            or stored[u.name].tags != tuple(u.tags)
        ]
        if differ:
            log.log(
                NOTICE,
                "the config's users seed only a new data dir; these differ from the stored "
                "users and were not applied (change users through the management API)",
                extra={"users": ", ".join(sorted(differ)), "stored": ", ".join(sorted(stored))},
            )

    def load_auth(self) -> Authenticator:
        store = self.definitions
        return Authenticator(store.users(), store.permissions(), store.topic_permissions())

    def vhost_names(self) -> list[str]:
        return self.definitions.vhosts()

    def restore(self) -> None:
        """Recreate durable exchanges, queues and bindings in the vhosts."""
        from .stream import queue_class

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
                    queue = queue_class(q.arguments)(
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
        self._finish_unbinding()

    def _finish_unbinding(self) -> None:
        """At start: delete what a stop left of deleted queues' and exchanges' stored bindings
        (restore skipped them: their queue or exchange is not stored)."""
        try:
            while self.definitions.sweep_unbound():
                pass
        except DefinitionsWriteFailed as exc:
            exc.log_to(log, "; tried again at the next start")

    # -- changes ----------------------------------------------------------------------
    #
    # The vhost calls these *before* it changes its memory: a write that raises
    # DefinitionsWriteFailed leaves the broker as it was, on disk and in memory.

    def _changed(self, vhost: str) -> None:
        """A cluster node replicates a vhost's durable definitions in its log."""
        if not self.restoring:
            self.broker.cluster.definitions_changed(vhost)

    def exchange_created(self, x: Exchange) -> None:
        if x.durable:
            self._changed(x.vhost.name)
        if x.durable and not x.builtin and not self.restoring:
            self.definitions.put_exchange(
                ExchangeDef(x.vhost.name, x.name, x.type, x.auto_delete, x.internal, x.arguments)
            )

    def exchange_deleted(self, x: Exchange) -> None:
        if x.durable:
            self._changed(x.vhost.name)
        if x.durable and not x.builtin and not x.vhost.deleted:
            if self.definitions.delete_exchange(x.vhost.name, x.name):
                self._unbind_later()

    def queue_created(self, q: Queue) -> None:
        if q.durable and q.exclusive_owner is None and not self.restoring:
            q.store_id = self.definitions.put_queue(
                q.vhost.name, q.name, q.auto_delete, q.arguments
            )
            q.store = self.broker.store
            self.broker.cluster.queue_created(q)  # a led vhost's queue lives in its log
        if q.store_id is not None:
            self._changed(q.vhost.name)

    def queue_deleted(self, q: Queue) -> None:
        if q.store_id is not None:
            self._changed(q.vhost.name)
        if q.store_id is not None and not q.vhost.deleted:
            if self.definitions.delete_queue(q.vhost.name, q.name):
                self._unbind_later()

    def _unbind_later(self) -> None:
        """Delete the stored bindings a deleted queue or exchange left (more than one write
        deletes at once: UNBIND_BATCH), in the definitions store's sweep thread."""
        self.definitions.sweep_later()

    def _binding(
        self, source: Exchange, dest: Any, key: str, args: dict | None
    ) -> BindingDef | None:
        if self.restoring or source.vhost.deleted:
            return None
        if not source.durable or source.builtin and source.name == "":
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
            self._changed(source.vhost.name)

    def binding_removed(self, source: Exchange, dest: Any, key: str, args: dict | None) -> None:
        """Deleting a binding that is not stored is harmless: it changes nothing on disk."""
        b = self._binding(source, dest, key, args)
        if b is not None:
            self.definitions.delete_binding(b)
            self._changed(source.vhost.name)

    def vhost_deleted(self, name: str) -> None:
        """The vhost and all it holds, in one transaction (the vhost's memory goes after)."""
        self.definitions.delete_vhost(name)
