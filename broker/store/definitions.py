"""Durable definitions (vhosts, users, permissions, exchanges, queues, bindings) in SQLite.

Definitions change rarely and must survive kill -9 exactly, which is what a
SQLite transaction in WAL mode gives us; arguments are stored as AMQP field
tables (our own encoder) so every RabbitMQ field type round-trips unchanged.

Every write goes through `DefinitionStore.writing()`: one transaction that either
commits or raises `DefinitionsWriteFailed` with nothing of it left behind, in the
database or on disk, and the connection reopened so the store recovers by itself
once the disk does. The broker changes its memory only after the commit, which fsyncs
the WAL. Three kinds of write run off the event loop, each in a thread of the store's own:
WAL checkpoints (`_Checkpoints`); the sweep of the stored bindings deleted queues and
exchanges left, which nothing relies on (`_Sweeper`: not fsynced either); and the writes
an AMQP client's durable declare, bind or delete asks for (`write_later`, `_Writer`), whose
fsync would otherwise hold every connection's loop (the client waits for its reply, and
the broker changes its memory once the write has committed: broker/core/persistence.py).
"""

from __future__ import annotations

import abc
import contextlib
import errno
import json
import logging
import os
import sqlite3
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roarmq.protocol.tables import decode_table, encode_table

log = logging.getLogger("roarmq.definitions")

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
CREATE TABLE IF NOT EXISTS parameters (
    vhost TEXT NOT NULL, component TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL,
    PRIMARY KEY (vhost, component, name)
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
CREATE INDEX IF NOT EXISTS bindings_by_destination
    ON bindings (vhost, destination, destination_type);
CREATE TABLE IF NOT EXISTS unbound (
    vhost TEXT NOT NULL, name TEXT NOT NULL, kind TEXT NOT NULL, PRIMARY KEY (vhost, name, kind)
);
"""

#: Most stored bindings the write that deletes a queue or an exchange deletes with it (~1 ms);
#: past it, the name goes into ``unbound`` in that same write and the rest are deleted by
#: later writes of as many (``sweep_unbound``), so that no one write holds the event loop for
#: long (100,000 rows at once: ~50 ms). Until then they are bindings of a queue or exchange
#: that is not stored, which ``restore`` skips, and a queue or exchange stored again under
#: that name first deletes them (``_finish_unbound``).
UNBIND_BATCH = 500


@dataclass(frozen=True, slots=True)
class ExchangeDef:
    """An exchange's definition: a durable one as the store keeps it, and any one of a
    definitions file as the pipeline reads it (``pipeline/definitions.py``), which also sets
    ``builtin`` (predeclared: the default exchange and ``amq.*``) and ``where`` (its key path
    in the file, for messages) and leaves ``auto_delete`` and ``internal``, which routing
    does not read, False."""

    vhost: str
    name: str
    type: str
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    builtin: bool = False
    where: str = ""

    @property
    def alternate(self) -> str | None:
        value = self.arguments.get("alternate-exchange")
        return value if isinstance(value, str) else None  # as broker/core/exchange.py reads it


@dataclass(frozen=True)
class QueueDef:
    id: int
    vhost: str
    name: str
    auto_delete: bool
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class BindingDef:
    """A binding's definition: a durable one as the store keeps it, and any one of a
    definitions file as the pipeline reads it, which also sets ``id`` (its position among the
    file's distinct bindings) and ``where`` (its key path in the file)."""

    vhost: str
    source: str
    destination: str
    destination_type: str  # "queue" or "exchange"
    routing_key: str
    arguments: dict[str, Any]
    id: int = 0
    where: str = ""

    def arguments_json(self) -> str:
        return json.dumps(self.arguments, sort_keys=True, default=str)


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


#: The errno an SQLite error comes from, by its primary code (extended codes such as
#: SQLITE_IOERR_FSYNC or SQLITE_READONLY_DBMOVED share their primary's). SQLite keeps the
#: OS's errno to itself, so this is the nearest we can say.
SQLITE_ERRNO = {
    "SQLITE_FULL": "ENOSPC",
    "SQLITE_IOERR": "EIO",
    "SQLITE_READONLY": "EROFS",
    "SQLITE_PERM": "EACCES",
}


def errno_of(sqlite_name: str) -> str:
    """The errno name an SQLite error name comes from ("EIO" for SQLITE_IOERR_FSYNC); EIO
    for the rest (SQLITE_CANTOPEN, SQLITE_CORRUPT...), whose sqlite name is logged too."""
    for prefix, name in SQLITE_ERRNO.items():
        if sqlite_name == prefix or sqlite_name.startswith(prefix + "_"):
            return name
    return "EIO"


class DefinitionsWriteFailed(OSError):
    """A change to the definitions SQLite could not commit; none of it took effect.

    An OSError (errno EIO, ENOSPC, EROFS... as `errno_of` maps SQLite's error) naming the
    file and what was being done, so the AMQP side can answer 541 with RabbitMQ's kind of
    text and the management API a 500, each logging one line instead of a traceback.
    """

    def __init__(self, path: Path, operation: str, error: BaseException) -> None:
        self.sqlite_name = getattr(error, "sqlite_errorname", None) or type(error).__name__
        self.errno_name = errno_of(self.sqlite_name)
        self.operation = operation
        self.reason = str(error)
        super().__init__(getattr(errno, self.errno_name), self.reason, str(path))
        self.path = Path(path)

    def __str__(self) -> str:
        return self.reply_text

    @property
    def reply_text(self) -> str:
        """e.g. cannot store queue 'q' in vhost '/': definitions.sqlite3: disk I/O error
        (SQLITE_IOERR_FSYNC); ProtocolError.close_text adds the INTERNAL_ERROR prefix."""
        return f"cannot {self.operation}: {self.path.name}: {self.reason} ({self.sqlite_name})"

    def log_to(self, logger: logging.Logger, note: str = "", **extra: Any) -> None:
        """The one error line a failure gets (no traceback: the cause is the disk, and
        the fields say which file and which error)."""
        fields = {"file": str(self.path), "errno": self.errno_name, "sqlite": self.sqlite_name}
        logger.error(f"cannot {self.operation}: {self.reason}{note}", extra={**extra, **fields})


def _table(args: dict[str, Any] | None) -> bytes:
    return encode_table(args or {})


def _untable(blob: bytes) -> dict[str, Any]:
    return decode_table(blob, 0)[0]


#: Bytes of a WAL file's header, and of each frame's header before its page.
WAL_HEADER = 32
WAL_FRAME_HEADER = 24
#: Where the wal-index's (the -shm file's) checkpoint info starts, its first field the
#: frames already copied into the database (nBackfill): after two 48-byte index headers.
WAL_INDEX_CHECKPOINT_INFO = 96
#: WAL frames (pages) past which they are copied into the database file: SQLite's own
#: ``wal_autocheckpoint`` default, but in the store's checkpoint thread (`_Checkpoints`),
#: not in the commit that crosses it, on the event loop (a checkpoint writes ~4 MB and
#: fsyncs the WAL and the database: 50-150 ms on a busy disk, five of them in a sweep of
#: 100,000 stored bindings).
CHECKPOINT_FRAMES = 1000
#: ... and past which a commit checkpoints itself all the same (``wal_autocheckpoint`` of
#: the writing connection): only if the thread cannot keep up, so the WAL stays bounded.
CHECKPOINT_FRAMES_ON_COMMIT = 16 * CHECKPOINT_FRAMES
#: Seconds without a write after which the last frames of a WAL past CHECKPOINT_FRAMES
#: are copied too, so that the next write starts the WAL over.
CHECKPOINT_QUIET = 0.1


def wal_frames(path: Path) -> tuple[int, int]:
    """(frames in the WAL, frames of it already copied into the database) as the
    wal-index (the -shm file) has them; (0, 0) if there is none. A read without SQLite's
    locks: a hint, never the truth of what is committed."""
    try:
        with open(f"{path}-shm", "rb") as f:
            header = f.read(WAL_INDEX_CHECKPOINT_INFO + 4)
    except OSError:
        return 0, 0
    if len(header) < WAL_INDEX_CHECKPOINT_INFO + 4 or header[12] != 1:  # isInit
        return 0, 0
    (max_frame,) = struct.unpack_from("=I", header, 16)
    (backfilled,) = struct.unpack_from("=I", header, WAL_INDEX_CHECKPOINT_INFO)
    return max_frame, backfilled


def _close_quietly(db: sqlite3.Connection | None) -> None:
    """Close a connection a failure or a stop is done with (its own error, if any, is the
    failure's echo: what failed is already raised or logged)."""
    if db is not None:
        with contextlib.suppress(sqlite3.Error):
            db.close()


class _StoreThread(abc.ABC):
    """A worker thread of the store's own, on an SQLite connection of its own: started by
    the first `poke`, woken by each, and stopped (`stop`: the work under way is waited for)
    when the store closes or reopens. What it does is the subclass's `_serve`."""

    #: The thread's name, and its connection's `PRAGMA synchronous`.
    name = ""
    synchronous = "FULL"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._db: sqlite3.Connection | None = None

    def poke(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        self._wake.set()

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stopping = True
            self._wake.set()
            thread.join()
            self._stopping = False
            self._wake.clear()

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            self._drop_connection()

    @abc.abstractmethod
    def _serve(self) -> None:
        """The thread's work: wait for pokes (`_wake`) and return once `_stopping`."""

    def _connection(self) -> sqlite3.Connection:
        """The thread's connection, opened again after a failure dropped it."""
        if self._db is None:
            self._db = sqlite3.connect(
                str(self.path), isolation_level=None, check_same_thread=False
            )
            self._db.execute(f"PRAGMA synchronous={self.synchronous}")
        return self._db

    def _drop_connection(self) -> None:
        db, self._db = self._db, None
        _close_quietly(db)


class _Checkpoints(_StoreThread):
    """WAL checkpoints of a definitions store in a thread of their own, on a connection of
    their own (PASSIVE: never waiting for, nor holding up, the store's writes and reads).

    Each commit pokes it; it checkpoints once CHECKPOINT_FRAMES of the WAL are not in the
    database yet, and the rest of a WAL that long once the writes pause (a WAL is started
    over only when a write finds it all copied). A failed checkpoint waits for the next
    poke: the commits do not depend on it (they are durable in the WAL, and SQLite's
    recovery reads whatever it still holds)."""

    name = "definitions checkpoints"

    def _serve(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            frames, copied = wal_frames(self.path)
            if frames - copied < CHECKPOINT_FRAMES:
                if frames < CHECKPOINT_FRAMES or copied >= frames:
                    continue
                # A long WAL with a short tail not copied yet: copy it once the writes
                # pause (the next write then starts the WAL over), not after each.
                if self._wake.wait(CHECKPOINT_QUIET):
                    continue  # written again meanwhile (or stopping): look again
            try:
                self._connection().execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            except sqlite3.Error:  # (the next poke tries again, on a new connection)
                self._drop_connection()


class _Sweeper(_StoreThread):
    """The sweep of the stored bindings deleted queues and exchanges left
    (`DefinitionStore.sweep_unbound`), in a thread of its own on a connection of its own,
    one batch (UNBIND_BATCH) a transaction until none is left.

    On the event loop a sweep of 100,000 bindings was 200 writes, each a few ms of SQLite
    and now and then tens of ms blocked in a system call on a busy disk: the loop stalled
    (tests/core/test_large_deletes.py). Its writes and the loop's take turns through the
    store's write lock, so one of the loop's may wait out one batch at most, and never
    meets a half-done recovery of a failed write. A failed batch is logged and tried
    again a second later; a stop leaves the rest to the next start (`restore`)."""

    name = "definitions sweep"
    synchronous = "NORMAL"

    def __init__(self, store: DefinitionStore) -> None:
        super().__init__(store.path)
        self.store = store
        #: Batches swept, and whether the thread is sweeping (for tests and the curious).
        self.batches = 0
        self.busy = False

    def poke(self) -> None:
        super().poke()
        self.busy = True  # after the wake: the thread clears it only when none is set

    def stop(self) -> None:
        super().stop()
        self.busy = False

    def _serve(self) -> None:
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                while not self._stopping:
                    try:
                        db = self._connection()
                        with self.store.write_lock:
                            more = self.store.sweep_batch(db)
                        self.batches += 1
                    except sqlite3.Error as exc:
                        DefinitionsWriteFailed(
                            self.store.path, "delete stored bindings of deleted objects", exc
                        ).log_to(log, "; tried again in 1 s")
                        self._drop_connection()
                        self._wake.wait(1.0)
                        continue
                    self.store.poke_checkpoints()
                    if not more:
                        break
                if self._stopping:
                    return
                if not self._wake.is_set():
                    self.busy = False
        finally:
            self.busy = False


class _WriteState(threading.local):
    """What a thread's `writing` blocks share: how deep they nest (the outermost commits),
    whether its commit fsyncs, and the connection they write on (None: the store's own;
    the `_Writer` thread's is its own)."""

    depth = 0
    durable = True
    db: sqlite3.Connection | None = None
    #: A thread of the store's (`_Writer`): its writes are not jobs of the event loop.
    off_loop = False


class _Writer(_StoreThread):
    """Writes the event loop hands over (`DefinitionStore.write_later`), one at a time in
    the order given, each a `writing` block on this thread's connection: the commit's
    fsync (milliseconds, and tens of them on a busy disk) holds this thread, not the loop.
    Each outcome, a result or the `DefinitionsWriteFailed`, goes to its `done` callback,
    called on this thread."""

    name = "definitions writes"

    def __init__(self, store: DefinitionStore) -> None:
        super().__init__(store.path)
        self.store = store
        self._jobs: deque[tuple[Callable[[], Any], Callable[[Any, BaseException | None], None]]]
        self._jobs = deque()

    def submit(
        self, call: Callable[[], Any], done: Callable[[Any, BaseException | None], None]
    ) -> None:
        self._jobs.append((call, done))
        self.poke()

    def _serve(self) -> None:
        state = self.store._state
        state.off_loop = True
        while True:
            self._wake.wait()
            self._wake.clear()
            while self._jobs:
                call, done = self._jobs.popleft()
                result: Any = None
                error: BaseException | None = None
                try:
                    if state.db is None:
                        state.db = self.store._connect()
                    result = call()
                except sqlite3.Error as exc:  # (opening the connection)
                    error = DefinitionsWriteFailed(self.path, "open the definitions store", exc)
                except BaseException as exc:  # DefinitionsWriteFailed, and what else befell
                    error = exc
                done(result, error)
            if self._stopping:
                return

    def _drop_connection(self) -> None:
        db, self.store._state.db = self.store._state.db, None  # where `writing` finds it
        _close_quietly(db)


class DefinitionStore:
    """One SQLite file; every change is its own committed transaction (see `writing`)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db: sqlite3.Connection | None = None
        self._state = _WriteState()
        #: The broker's JobTimes while its loop-lag probe is on: each write is a job of the
        #: stall attribution (broker/ops/stalls.py), its commit included (WAL checkpoints
        #: are the `_Checkpoints` thread's).
        self.jobs: Any = None
        #: Held by each write, the loop's (`writing`) and the sweep thread's alike.
        self.write_lock = threading.Lock()
        self._checkpoints = _Checkpoints(self.path)
        self._sweeper = _Sweeper(self)
        self._writer = _Writer(self)
        self._db = self._connect()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute(f"PRAGMA wal_autocheckpoint={CHECKPOINT_FRAMES_ON_COMMIT}")
            db.executescript(SCHEMA)
        except BaseException:
            db.close()
            raise
        return db

    @property
    def db(self) -> sqlite3.Connection:
        return self._open("open the definitions store")

    def _open(self, operation: str) -> sqlite3.Connection:
        """The connection, reopened first if a failed write could not reopen it (the disk
        was still failing), so reads and writes alike recover once the disk does."""
        if self._db is None:
            try:
                self._db = self._connect()
            except sqlite3.Error as exc:
                raise DefinitionsWriteFailed(self.path, operation, exc) from None
        return self._db

    def poke_checkpoints(self) -> None:
        self._checkpoints.poke()

    @property
    def writing_here(self) -> bool:
        """Whether this thread is inside a `writing` block (holding the write lock)."""
        return self._state.depth > 0

    def write_later(
        self, call: Callable[[], Any], done: Callable[[Any, BaseException | None], None]
    ) -> None:
        """Run `call` (a method of this store, or a function of them) in the writes thread
        (`_Writer`), after those handed over before it; `done(result, error)` is called
        there with its outcome (`error` a `DefinitionsWriteFailed`, or None). A `close`
        waits for what was handed over."""
        self._writer.submit(call, done)

    def close(self) -> None:
        self._writer.stop()
        self._sweeper.stop()
        self._checkpoints.stop()  # first: the last connection to close ends the WAL
        if self._db is not None:
            self._db.close()
            self._db = None

    def _run(self, sql: str, *params: Any) -> sqlite3.Cursor:
        return (self._state.db or self.db).execute(sql, params)

    # -- the one way to write ---------------------------------------------------------

    @contextlib.contextmanager
    def writing(self, operation: str, *, durable: bool = True) -> Iterator[None]:
        """BEGIN IMMEDIATE, the block's statements, COMMIT: all of it or nothing.

        On any SQLite error the transaction is rolled back, frames it left in the WAL are
        cut off, the connection reopened, and `DefinitionsWriteFailed` raised naming
        `operation` ("store queue 'q' in vhost '/'"). Blocks nest: an inner one joins the
        outer's transaction (the config's seed is one transaction of many puts).

        The commit fsyncs the WAL (synchronous=FULL): the change is durable when this
        returns. Not `durable`: a write nothing relies on surviving a power loss (its
        effect is redone from what durable writes left, as ``sweep_unbound``'s) commits
        without the fsync (synchronous=NORMAL for its commit), so it never holds the
        event loop for the disk; the WAL keeps commits in order, so a power loss takes
        only such writes after the last fsync, and the next durable commit's fsync covers
        them. One may join a durable block (it is then durable), not the reverse.
        """
        state = self._state
        if state.depth:
            if durable and not state.durable:  # the outer commit would not fsync it
                raise RuntimeError(f"{operation}: a durable write inside one that is not")
            state.depth += 1
            try:
                yield
            finally:
                state.depth -= 1
            return
        self.write_lock.acquire()
        try:
            db = state.db or self._open(operation)
        except BaseException:
            self.write_lock.release()
            raise
        state.depth, state.durable = 1, durable
        started = time.perf_counter()
        try:
            if not durable:
                db.execute("PRAGMA synchronous=NORMAL")  # (not inside a transaction)
            db.execute("BEGIN IMMEDIATE")
            yield
            db.execute("COMMIT")
            self._checkpoints.poke()
        except sqlite3.Error as exc:
            self._recover()
            raise DefinitionsWriteFailed(self.path, operation, exc) from None
        except BaseException:
            self._rollback()
            raise
        finally:
            state.depth, state.durable = 0, True
            if not durable:
                self._sync_again(db)
            self.write_lock.release()
            if self.jobs is not None and not state.off_loop:
                self.jobs.note("definitions store write", started, time.perf_counter())

    def _sync_again(self, db: sqlite3.Connection) -> None:
        """Every commit after a write that was not durable fsyncs again; a connection that
        cannot be set so is not used again (`db` reopens it, with FULL)."""
        if (self._state.db or self._db) is not db:  # a failed write reopened it
            return
        try:
            db.execute("PRAGMA synchronous=FULL")
        except sqlite3.Error:
            self._recover()

    def _rollback(self) -> None:
        db = self._state.db or self._db
        if db is not None and db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")

    def _recover(self) -> None:
        """After a failed write: roll back, drop its WAL frames, reopen the connection.

        If reopening fails too (the disk is still gone), `db` tries again on next use (the
        writes thread's connection: its next write).
        """
        self._rollback()
        self._drop_uncommitted_frames()
        state = self._state
        _close_quietly(state.db if state.off_loop else self._db)
        reopened = None
        with contextlib.suppress(sqlite3.Error):
            reopened = self._connect()
        if state.off_loop:
            state.db = reopened
        else:
            self._db = reopened

    def _drop_uncommitted_frames(self) -> None:
        """Cut the WAL back to its last frame SQLite counts as committed.

        When only the commit's fdatasync fails, the transaction's frames, commit frame
        included, are in the WAL already (in the page cache, which outlives a kill -9):
        the next opener's recovery, ours on reopen or a restarted broker's, would find
        them valid and apply the change we reported as failed. SQLite moves the
        wal-index's mxFrame (the -shm file's header) only after a commit has synced, so
        the WAL ends, as far as anything committed goes, at that frame.
        """
        wal, shm = Path(f"{self.path}-wal"), Path(f"{self.path}-shm")
        try:
            with open(shm, "rb") as f:
                header = f.read(48)
            if len(header) < 48 or header[12] != 1:  # isInit: a header SQLite wrote
                return
            page_size, max_frame = struct.unpack_from("=HI", header, 14)
            page_size = 65536 if page_size == 1 else page_size
            end = WAL_HEADER + max_frame * (page_size + WAL_FRAME_HEADER)
            if wal.stat().st_size > end:
                os.truncate(wal, end)
        except OSError:
            pass  # nothing to cut (no WAL, no -shm) or the disk refuses even that

    # -- vhosts, users, permissions ------------------------------------------------

    def put_vhost(self, name: str, metadata: dict[str, Any] | None = None) -> None:
        """A vhost, and its description, tags and default queue type when given."""
        with self.writing(f"store vhost '{name}'"):
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
        with self.writing(f"store setting '{name}'"):
            self._run(
                "INSERT OR REPLACE INTO settings (name, value) VALUES (?, ?)",
                name,
                json.dumps(value),
            )

    def settings(self) -> dict[str, Any]:
        return {name: json.loads(value) for name, value in self._run("SELECT * FROM settings")}

    def delete_vhost(self, name: str) -> None:
        with self.writing(f"delete vhost '{name}'"):
            tables = (
                "exchanges",
                "queues",
                "bindings",
                "unbound",
                "permissions",
                "topic_permissions",
            )
            for table in (*tables, "policies", "parameters"):
                self._run(f"DELETE FROM {table} WHERE vhost = ?", name)
            self._run("DELETE FROM limits WHERE kind = 'vhost' AND owner = ?", name)
            self._run("DELETE FROM vhosts WHERE name = ?", name)
            self._run("DELETE FROM vhost_metadata WHERE name = ?", name)

    def vhosts(self) -> list[str]:
        return [r[0] for r in self._run("SELECT name FROM vhosts ORDER BY name")]

    def put_user(self, user: UserDef) -> None:
        with self.writing(f"store user '{user.name}'"):
            self._run(
                "INSERT OR REPLACE INTO users (name, password_hash, tags, loopback_only) "
                "VALUES (?, ?, ?, ?)",
                user.name,
                user.password_hash,
                ",".join(user.tags),
                int(user.loopback_only),
            )

    def delete_user(self, name: str) -> None:
        with self.writing(f"delete user '{name}'"):
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
        with self.writing(f"store permissions of user '{perm.user}' in vhost '{perm.vhost}'"):
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
        with self.writing(f"delete permissions of user '{user}' in vhost '{vhost}'"):
            self._run("DELETE FROM permissions WHERE user = ? AND vhost = ?", user, vhost)

    def permissions(self) -> list[PermissionDef]:
        return [
            PermissionDef(*row)
            for row in self._run(
                "SELECT user, vhost, configure, write, read FROM permissions ORDER BY user, vhost"
            )
        ]

    def put_topic_permission(self, perm: TopicPermissionDef) -> None:
        what = f"topic permissions of user '{perm.user}' in vhost '{perm.vhost}'"
        with self.writing(f"store {what}"):
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
            sql = "DELETE FROM topic_permissions WHERE user = ? AND vhost = ?"
            params: tuple[str, ...] = ()
        else:
            sql = "DELETE FROM topic_permissions WHERE user = ? AND vhost = ? AND exchange = ?"
            params = (exchange,)
        with self.writing(f"delete topic permissions of user '{user}' in vhost '{vhost}'"):
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
        with self.writing(f"store policy '{name}' in vhost '{vhost}'"):
            self._run(
                "INSERT OR REPLACE INTO policies (vhost, name, operator, body) VALUES (?, ?, ?, ?)",
                vhost,
                name,
                int(operator),
                json.dumps(body, sort_keys=True),
            )

    def delete_policy(self, vhost: str, name: str, operator: bool) -> None:
        with self.writing(f"delete policy '{name}' in vhost '{vhost}'"):
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

    def put_parameter(self, vhost: str, component: str, name: str, value: Any) -> None:
        """A runtime parameter's value (shovel, federation-upstream, ...), in JSON."""
        with self.writing(f"store {component} parameter '{name}' in vhost '{vhost}'"):
            self._run(
                "INSERT OR REPLACE INTO parameters (vhost, component, name, value) "
                "VALUES (?, ?, ?, ?)",
                vhost,
                component,
                name,
                json.dumps(value, sort_keys=True),
            )

    def delete_parameter(self, vhost: str, component: str, name: str) -> None:
        with self.writing(f"delete {component} parameter '{name}' in vhost '{vhost}'"):
            self._run(
                "DELETE FROM parameters WHERE vhost = ? AND component = ? AND name = ?",
                vhost,
                component,
                name,
            )

    def parameters(self) -> list[tuple[str, str, str, Any]]:
        """(vhost, component, name, value) of every stored runtime parameter."""
        return [
            (vhost, component, name, json.loads(value))
            for vhost, component, name, value in self._run(
                "SELECT vhost, component, name, value FROM parameters ORDER BY 1, 2, 3"
            )
        ]

    def put_limit(self, limit: LimitDef) -> None:
        with self.writing(f"store {limit.kind} limit '{limit.name}' of '{limit.owner}'"):
            self._run(
                "INSERT OR REPLACE INTO limits (kind, owner, name, value) VALUES (?, ?, ?, ?)",
                limit.kind,
                limit.owner,
                limit.name,
                limit.value,
            )

    def delete_limit(self, kind: str, owner: str, name: str) -> int:
        with self.writing(f"delete {kind} limit '{name}' of '{owner}'"):
            return self._run(
                "DELETE FROM limits WHERE kind = ? AND owner = ? AND name = ?", kind, owner, name
            ).rowcount

    def limits(self) -> list[LimitDef]:
        return [
            LimitDef(*row)
            for row in self._run("SELECT kind, owner, name, value FROM limits ORDER BY 1, 2, 3")
        ]

    def set_user_version(self, version: int) -> None:
        """SQLite's user_version, which marks a store the config has seeded."""
        with self.writing("mark the definitions store as seeded"):
            self._run(f"PRAGMA user_version = {int(version)}")

    # -- exchanges, queues, bindings -------------------------------------------------

    def put_exchange(self, x: ExchangeDef) -> None:
        with self.writing(f"store exchange '{x.name}' in vhost '{x.vhost}'"):
            self._finish_unbound(x.vhost, x.name, "exchange")
            self._run(
                "INSERT OR REPLACE INTO exchanges "
                "(vhost, name, type, auto_delete, internal, arguments) VALUES (?, ?, ?, ?, ?, ?)",
                x.vhost,
                x.name,
                x.type,
                int(x.auto_delete),
                int(x.internal),
                _table(x.arguments),
            )

    def delete_exchange(self, vhost: str, name: str) -> bool:
        """Delete a durable exchange and its bindings (either way); True if some of them are
        left to ``sweep_unbound`` (``UNBIND_BATCH``)."""
        with self.writing(f"delete exchange '{name}' in vhost '{vhost}'"):
            self._run("DELETE FROM exchanges WHERE vhost = ? AND name = ?", vhost, name)
            return self._unbind_first(vhost, name, "exchange")

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
        with self.writing(f"store queue '{name}' in vhost '{vhost}'"):
            row = self._run(
                "SELECT id FROM queues WHERE vhost = ? AND name = ?", vhost, name
            ).fetchone()
            if row is not None:
                return int(row[0])
            self._finish_unbound(vhost, name, "queue")
            cur = self._run(
                "INSERT INTO queues (vhost, name, auto_delete, arguments) VALUES (?, ?, ?, ?)",
                vhost,
                name,
                int(auto_delete),
                _table(arguments),
            )
            return int(cur.lastrowid)  # type: ignore[arg-type]  # an INSERT sets lastrowid

    def delete_queue(self, vhost: str, name: str) -> bool:
        """Delete a durable queue and the bindings to it; True if some of them are left to
        ``sweep_unbound`` (``UNBIND_BATCH``)."""
        with self.writing(f"delete queue '{name}' in vhost '{vhost}'"):
            self._run("DELETE FROM queues WHERE vhost = ? AND name = ?", vhost, name)
            return self._unbind_first(vhost, name, "queue")

    def _unbind(
        self, vhost: str, name: str, kind: str, limit: int, db: sqlite3.Connection | None = None
    ) -> int:
        """Delete at most ``limit`` (-1: all) stored bindings of the queue or exchange ``name``
        (``kind``), each statement on an index, on ``db`` (by default the connection this
        thread writes on); returns how many."""
        execute = (db or self._state.db or self.db).execute
        wheres: list[tuple[str, tuple[str, ...]]] = [
            ("destination = ? AND destination_type = ?", (name, kind))
        ]
        if kind == "exchange":
            wheres.insert(0, ("source = ?", (name,)))
        deleted = 0
        for where, params in wheres:
            deleted += execute(
                "DELETE FROM bindings WHERE rowid IN "
                f"(SELECT rowid FROM bindings WHERE vhost = ? AND {where} LIMIT ?)",
                (vhost, *params, limit if limit < 0 else limit - deleted),
            ).rowcount
            if deleted == limit:
                break
        return deleted

    def _unbind_first(self, vhost: str, name: str, kind: str) -> bool:
        if self._unbind(vhost, name, kind, UNBIND_BATCH) < UNBIND_BATCH:
            return False
        self._run("INSERT OR IGNORE INTO unbound VALUES (?, ?, ?)", vhost, name, kind)
        return True

    def sweep_later(self) -> None:
        """Sweep what deleted queues and exchanges left, in the sweep thread (`_Sweeper`)."""
        self._sweeper.poke()

    @property
    def sweeping(self) -> bool:
        """Whether the sweep thread has work it has not finished."""
        return self._sweeper.busy

    def sweep_batch(self, db: sqlite3.Connection) -> bool:
        """One batch of `sweep_unbound` on ``db`` (the sweep thread's connection, under the
        write lock): True if some remain."""
        row = db.execute("SELECT vhost, name, kind FROM unbound LIMIT 1").fetchone()
        if row is None:
            return False
        vhost, name, kind = row
        db.execute("BEGIN IMMEDIATE")
        try:
            if self._unbind(vhost, name, kind, UNBIND_BATCH, db) < UNBIND_BATCH:
                db.execute(
                    "DELETE FROM unbound WHERE vhost = ? AND name = ? AND kind = ?",
                    (vhost, name, kind),
                )
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise
        return True

    def sweep_unbound(self) -> bool:
        """Delete up to ``UNBIND_BATCH`` of the bindings deleted queues and exchanges left,
        in one write; True if some remain.

        Not a durable write (no fsync: a sweep of 100,000 bindings is 200 of them, each
        once held the loop for an fsync, 110 ms on a busy disk): it changes nothing a
        client or a restart sees. The delete's own durable write made the rows dead
        (``restore`` skips them, a queue or exchange stored again under the name deletes
        them first), and the ``unbound`` row goes only with the last of them, so what a
        power loss takes of the sweep the next start's sweep does again."""
        row = self._run("SELECT vhost, name, kind FROM unbound LIMIT 1").fetchone()
        if row is None:
            return False
        vhost, name, kind = row
        with self.writing(
            f"delete the bindings of {kind} '{name}' in vhost '{vhost}'", durable=False
        ):
            if self._unbind(vhost, name, kind, UNBIND_BATCH) < UNBIND_BATCH:
                self._run(
                    "DELETE FROM unbound WHERE vhost = ? AND name = ? AND kind = ?",
                    vhost,
                    name,
                    kind,
                )
        return True

    def _finish_unbound(self, vhost: str, name: str, kind: str) -> None:
        """A queue or exchange is stored under ``name``: first delete whatever bindings of
        an earlier one of that name ``sweep_unbound`` has not yet (in the caller's write)."""
        if self._run(
            "SELECT 1 FROM unbound WHERE vhost = ? AND name = ? AND kind = ?", vhost, name, kind
        ).fetchone():
            self._unbind(vhost, name, kind, -1)
            self._run(
                "DELETE FROM unbound WHERE vhost = ? AND name = ? AND kind = ?", vhost, name, kind
            )

    def queues(self) -> list[QueueDef]:
        return [
            QueueDef(qid, vhost, name, bool(ad), _untable(args))
            for qid, vhost, name, ad, args in self._run(
                "SELECT id, vhost, name, auto_delete, arguments FROM queues ORDER BY id"
            )
        ]

    def put_binding(self, b: BindingDef) -> None:
        with self.writing(f"store {_binding_text(b)}"):
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
        with self.writing(f"delete {_binding_text(b)}"):
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


def _binding_text(b: BindingDef) -> str:
    """As RabbitMQ names a binding: from exchange 'x' to queue 'q' in vhost '/'."""
    return (
        f"binding from exchange '{b.source}' to {b.destination_type} '{b.destination}' "
        f"with routing key '{b.routing_key}' in vhost '{b.vhost}'"
    )
