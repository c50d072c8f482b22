"""What survives a restart: the glue between the live broker and broker/store/.

Durable exchanges, queues and bindings, and all users, vhosts and permissions
are written to SQLite before they change in memory, and restored at start; transient ones are
never written, so they are gone after a restart, as in RabbitMQ. Users, vhosts
and permissions named in config.toml (or ROARMQ_DEFAULT_USER/_PASS) seed a new
data dir only, as RabbitMQ's default_user: after that the store is the truth,
changed through the management API, so a password changed or a user deleted
there stays so across restarts, and editing the config's users does nothing
but log a notice saying so.

An AMQP client's durable declare, bind or delete does not hold the event loop for its
write's fsync: the channel's handler runs inside `deferrable`, and its first store write
goes to the store's writes thread instead (`DefinitionStore.write_later`) and raises
`WriteDeferred`, before anything of the change is in memory. The connection stops there
(nothing more of it is handled or read, as a synchronous write would have held it) and,
once the write's outcome is known, handles the same method again: that run makes the same
decisions and meets the same write, which now answers with the outcome (the queue's id, or
the `DefinitionsWriteFailed` that closes the connection with 541) instead of writing. Other
connections go on meanwhile, publishing and consuming; but a change to exchanges, queues
or bindings begins with `settle`, so none is decided on a memory about to change: a
deferrable one waits its turn, anything else (the broker's own decisions, the management
API) waits for the write and makes its change first.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

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

T = TypeVar("T")

DEFINITIONS_FILE = "definitions.sqlite3"
#: PRAGMA user_version of a definitions store once the config has seeded it.
SEEDED = 1


class _PendingWrite:
    """A write handed to the store's writes thread: what it is (`key`: the store method
    and its arguments), its outcome once `finished`, and the change to make again then."""

    __slots__ = ("key", "result", "error", "finished", "continuation", "used")

    def __init__(self, key: tuple[Any, ...]) -> None:
        self.key = key
        self.result: Any = None
        self.error: BaseException | None = None
        self.finished = threading.Event()
        self.continuation: Callable[[], None] | None = None
        self.used = False  # the change made again met the write and took its outcome


class WriteDeferred(Exception):  # noqa: N818  (a control signal, not a failure)
    """A deferrable change stopped before anything of it was in memory: its write went to
    the store's writes thread (`pending`), or it waits for one that went before it (None).
    Whoever ran it gives `then` the way to run it again, whole."""

    def __init__(self, persistence: Persistence, pending: _PendingWrite | None) -> None:
        super().__init__("a definitions write is under way")
        self.persistence = persistence
        self.pending = pending

    def then(self, continuation: Callable[[], None]) -> None:
        if self.pending is None:
            self.persistence._waiting.append(continuation)
        else:
            self.pending.continuation = continuation


class _Deferrable:
    """``with persistence.deferrable:`` around a handler whose change may wait for its write
    off the loop (not when the handler runs again with the write's outcome)."""

    __slots__ = ("_persistence",)

    def __init__(self, persistence: Persistence) -> None:
        self._persistence = persistence

    def __enter__(self) -> None:
        p = self._persistence
        p._deferring = p._replaying is None

    def __exit__(self, *exc: object) -> None:
        self._persistence._deferring = False


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
        #: The write in the store's writes thread, if any (module doc).
        self._in_flight: _PendingWrite | None = None
        #: Deferrable changes waiting for it, to be run (first) after it, in order.
        self._waiting: deque[Callable[[], None]] = deque()
        #: A deferrable handler runs and has not met a store write yet (`_first_write`).
        self._deferring = False
        #: A change made again once its write finished: the write it meets answers.
        self._replaying: _PendingWrite | None = None
        self.deferrable = _Deferrable(self)

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

    # -- writes off the loop (module doc) ---------------------------------------------

    async def change(self, make: Callable[[], T]) -> T:
        """Run `make`, a change to exchanges, queues or bindings, as a client's channel
        does: its write off the loop, then `make` run again, whole, with the outcome
        (the management API's declares, binds and deletes). `make` looks up what it
        changes each time it runs. A caller gone meanwhile (a cancelled request) does not
        stop the change its write committed from being made."""
        loop = self.broker.clock.loop
        done: asyncio.Future[T] = loop.create_future()

        def attempt() -> None:
            try:
                with self.deferrable:
                    result = make()
            except WriteDeferred as deferred:
                deferred.then(attempt)
                return
            except Exception as exc:
                if not done.done():
                    done.set_exception(exc)
                return
            if not done.done():
                done.set_result(result)

        attempt()
        return await done

    def settle(self) -> None:
        """A change to exchanges, queues or bindings begins: a write under way in the
        store's thread is finished first and its change made. A deferrable handler waits
        its turn instead (`WriteDeferred`); anything else waits here, holding the loop for
        what is left of that write (as its own write would)."""
        pending = self._in_flight
        if pending is None:
            return
        if self._deferring:
            self._deferring = False
            raise WriteDeferred(self, None)
        if self.definitions.writing_here:
            # Inside a transaction of the loop's, which the writes thread waits for: that
            # write's change comes after this one (`_reconcile` if it no longer fits).
            return
        pending.finished.wait()
        self._finish(pending)

    def _first_write(self) -> bool:
        """Whether the store write a hook is about to make may be deferred: the handler's
        first, in a deferrable handler. Every hook calls this as it begins, so a later
        write of the same handler (after some of its change is in memory) never is."""
        deferring, self._deferring = self._deferring, False
        return deferring

    def _write(self, deferring: bool, key: tuple[Any, ...], call: Callable[[], T]) -> T:
        """The store write `call` (`key`: what it is), made now, or handed to the writes
        thread (`deferring`: WriteDeferred), or, as the change is made again, the outcome
        of the one handed over."""
        replay = self._replaying
        if replay is not None and not replay.used:
            replay.used = True
            if replay.key == key:
                if replay.error is not None:
                    raise replay.error
                return replay.result
            self._replaying = None
            self._reconcile(replay)  # (settle keeps this from happening: module doc)
        elif deferring:
            pending = _PendingWrite(key)
            self._in_flight = pending
            self.definitions.write_later(
                call, partial(self._written, self.broker.clock.loop, pending)
            )
            raise WriteDeferred(self, pending)
        return call()

    def _written(self, loop: Any, pending: _PendingWrite, result: Any, error: Any) -> None:
        """The writes thread has the outcome (called there)."""
        pending.result, pending.error = result, error
        pending.finished.set()
        try:
            loop.call_soon_threadsafe(self._finish, pending)
        except RuntimeError:  # the loop is closed: the broker has stopped
            pass

    def _finish(self, pending: _PendingWrite) -> None:
        """Make the change whose write finished (once: `settle` may have done it), then let
        those that waited for it run."""
        if self._in_flight is not pending:
            return
        self._in_flight = None
        continuation = pending.continuation
        if continuation is not None:
            self._replaying = pending
            try:
                continuation()
            finally:
                self._replaying = None
        if not pending.used:
            self._reconcile(pending)
        if self._waiting:
            self.broker.clock.loop.call_soon(self._run_waiting)

    def _run_waiting(self) -> None:
        while self._waiting and self._in_flight is None:
            self._waiting.popleft()()

    def _reconcile(self, pending: _PendingWrite) -> None:
        """A write committed but its change, made again, came out otherwise (something
        it depends on, a permission or a limit, changed meanwhile): make the store and
        memory agree again. What was stored is deleted; what was deleted from the store
        goes from memory too, so that nothing lives on that a restart would not bring
        back (a message confirmed into a queue that is not stored would be lost)."""
        if pending.error is not None:
            return  # nothing was written
        kind, *args = pending.key
        log.warning(
            "a definitions write was not followed by its change; undoing it",
            extra={"write": kind, "what": repr(args)},
        )
        store = self.definitions
        try:
            if kind == "put_exchange":
                store.delete_exchange(args[0].vhost, args[0].name)
            elif kind == "put_queue":
                store.delete_queue(*args[:2])
            elif kind == "put_binding":
                store.delete_binding(args[0])
            else:
                self._forget_deleted(kind, args)
        except DefinitionsWriteFailed as exc:
            exc.log_to(log, "; the store and memory differ until the next start")

    def _forget_deleted(self, kind: str, args: list[Any]) -> None:
        """Memory follows a delete the store committed (see `_reconcile`)."""
        if kind == "delete_binding":
            b: BindingDef = args[0]
            vhost = self.broker.vhosts.get(b.vhost)
            if vhost is None:
                return
            source = vhost.exchanges.get(b.source)
            dests = vhost.queues if b.destination_type == "queue" else vhost.exchanges
            dest = dests.get(b.destination)
            if source is not None and dest is not None:
                source.unbind(b.routing_key, dest, b.arguments or None)
            return
        vhost_name, name = args[:2]
        vhost = self.broker.vhosts.get(vhost_name)
        if vhost is None:
            return
        if kind == "delete_queue" and name in vhost.queues:
            vhost.delete_queue(vhost.queues[name], reason="its stored definition is gone")
        elif kind == "delete_exchange" and name in vhost.exchanges:
            vhost.delete_exchange(name)

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
        deferring = self._first_write()
        if x.durable and not x.builtin and not self.restoring:
            d = ExchangeDef(x.vhost.name, x.name, x.type, x.auto_delete, x.internal, x.arguments)
            self._write(deferring, ("put_exchange", d), partial(self.definitions.put_exchange, d))
        if x.durable:
            self._changed(x.vhost.name)

    def exchange_deleted(self, x: Exchange) -> None:
        deferring = self._first_write()
        if x.durable and not x.builtin and not x.vhost.deleted:
            vhost, name = x.vhost.name, x.name
            delete = partial(self.definitions.delete_exchange, vhost, name)
            if self._write(deferring, ("delete_exchange", vhost, name), delete):
                self._unbind_later()
        if x.durable:
            self._changed(x.vhost.name)

    def queue_created(self, q: Queue) -> None:
        deferring = self._first_write()
        if q.durable and q.exclusive_owner is None and not self.restoring:
            vhost, name = q.vhost.name, q.name
            put = partial(self.definitions.put_queue, vhost, name, q.auto_delete, q.arguments)
            q.store_id = self._write(deferring, ("put_queue", vhost, name), put)
            q.store = self.broker.store
            self.broker.cluster.queue_created(q)  # a led vhost's queue lives in its log
        if q.store_id is not None:
            self._changed(q.vhost.name)

    def queue_deleted(self, q: Queue) -> None:
        deferring = self._first_write()
        if q.store_id is not None and not q.vhost.deleted:
            vhost, name = q.vhost.name, q.name
            delete = partial(self.definitions.delete_queue, vhost, name)
            if self._write(deferring, ("delete_queue", vhost, name), delete):
                self._unbind_later()
        if q.store_id is not None:
            self._changed(q.vhost.name)

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
        deferring = self._first_write()
        b = self._binding(source, dest, key, args)
        if b is not None:
            self._write(deferring, ("put_binding", b), partial(self.definitions.put_binding, b))
            self._changed(source.vhost.name)

    def binding_removed(self, source: Exchange, dest: Any, key: str, args: dict | None) -> None:
        """Deleting a binding that is not stored is harmless: it changes nothing on disk."""
        deferring = self._first_write()
        b = self._binding(source, dest, key, args)
        if b is not None:
            delete = partial(self.definitions.delete_binding, b)
            self._write(deferring, ("delete_binding", b), delete)
            self._changed(source.vhost.name)

    def vhost_deleted(self, name: str) -> None:
        """The vhost and all it holds, in one transaction (the vhost's memory goes after),
        once a write under way has been made (it may be one of the vhost's)."""
        self._first_write()
        self.settle()
        self.definitions.delete_vhost(name)
