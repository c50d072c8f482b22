"""The traffic archive: every published envelope, as Parquet, written off the event loop.

The event loop pays for one tuple append per publish (``Archive.record``); a writer thread turns
full batches into Arrow tables (decoding each distinct content header once per batch, so per-row
work stays in C) and writes them, partitioned by vhost and hour, under ``[archive] dir``::

    dir/vhost=<escaped name>/hour=YYYY-MM-DDTHH/part-<session>-<seq>.parquet          one batch
    dir/vhost=<escaped name>/hour=YYYY-MM-DDTHH/part-<session>-<first>-<last>.parquet merged

Durability: each batch becomes its own file as soon as it is full or has waited ``FLUSH_SECONDS``
(written under a hidden temporary name, fsynced, then renamed), so a crash loses at most the
batch still being filled. Files roll: a partition's batch files are merged into one file (same
temporary-then-rename dance) when its hour ends, when ``roll_minutes`` have passed since its
first batch, when ``MERGE_BATCHES`` have piled up, and at close. A merged file names the batch
sequence numbers it covers; readers skip batch files a merged file covers (see
``live_files``), so a crash between the rename and the deletions never duplicates rows, and the
deletions wait ``DELETE_GRACE_SECONDS`` so a reader that listed the batch files can still read
them. Hidden names (``.``) are never data.

Memory is bounded: at most ``max_pending_batches`` full batches wait for the writer; when it falls
behind, the oldest waiting batch is dropped and counted (``dropped_batches``/``dropped_rows``)
rather than slowing the broker. The schema is ``SCHEMA``; docs/benchmarks.md "## Pipeline" has
the cost.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator
from datetime import UTC, datetime
from pathlib import Path
from struct import Struct
from typing import TYPE_CHECKING, Any, NamedTuple

try:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("the traffic archive needs pyarrow: pip install 'roarmq[pipeline]'") from exc

from protocol.errors import AMQPSyntaxError
from protocol.properties import BasicProperties
from protocol.tables import timestamp_to_wire

from .clock import Clock

if TYPE_CHECKING:
    from .config import ArchiveConfig
    from .message import Message
    from .queue import Queue

log = logging.getLogger("roarmq.archive")

#: A partially filled batch is handed to the writer after this long.
FLUSH_SECONDS = 1.0
#: A partition is merged into one file once this many batch files are waiting.
MERGE_BATCHES = 128
#: Rows per row group in merged files (batches are small row groups; merging evens them out).
MERGE_ROW_GROUP = 256 * 1024
#: Batch files a merged file covers stay this long, for readers that already listed them.
DELETE_GRACE_SECONDS = 600.0

SCHEMA = pa.schema(
    [
        pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),  # broker wall clock
        pa.field("vhost", pa.string(), nullable=False),
        pa.field("exchange", pa.string(), nullable=False),
        pa.field("routing_key", pa.string(), nullable=False),
        pa.field("headers", pa.binary()),  # AMQP field table as received (length prefix too)
        pa.field("content_type", pa.string()),
        pa.field("content_encoding", pa.string()),
        pa.field("delivery_mode", pa.int16()),
        pa.field("priority", pa.int16()),
        pa.field("correlation_id", pa.string()),
        pa.field("reply_to", pa.string()),
        pa.field("expiration", pa.string()),
        pa.field("message_id", pa.string()),
        pa.field("timestamp", pa.timestamp("ms", tz="UTC")),  # null past year 9999
        pa.field("type", pa.string()),
        pa.field("user_id", pa.string()),
        pa.field("app_id", pa.string()),
        pa.field("cluster_id", pa.string()),
        pa.field("body_size", pa.int64(), nullable=False),
        pa.field("body", pa.binary()),  # the first max_body_bytes bytes; null when 0 or paged out
        pa.field("queue_count", pa.int32(), nullable=False),
        pa.field("queues", pa.list_(pa.string()), nullable=False),  # sorted names
        pa.field("unroutable", pa.bool_(), nullable=False),
    ]
)

_STRING_PROPERTIES = (
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)

_PART = re.compile(
    r"^part-(?P<session>[0-9A-Za-z]+-[0-9a-f]+)-(?P<first>\d+)(?:-(?P<last>\d+))?\.parquet$"
)
_unpack_u16 = Struct(">H").unpack_from
_unpack_u32 = Struct(">I").unpack_from
_US_PER_HOUR = 3_600_000_000
_MAX_TIMESTAMP_S = 253402300799  # 9999-12-31T23:59:59Z

# Characters Spark and Hive escape in partition directory names (ExternalCatalogUtils), so
# both Spark's partition discovery and pyarrow's "hive" partitioning read the name back.
_ESCAPE = frozenset("\"#%'*/:=?\\\x7f{[]^") | frozenset(chr(c) for c in range(1, 32))


def escape_partition(value: str) -> str:
    """A vhost name as a partition directory value (``/`` -> ``%2F``)."""
    return "".join(f"%{ord(c):02X}" if c in _ESCAPE else c for c in value)


def unescape_partition(value: str) -> str:
    return re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), value)


def hour_name(epoch_hour: int) -> str:
    return datetime.fromtimestamp(epoch_hour * 3600, UTC).strftime("%Y-%m-%dT%H")


class PartName(NamedTuple):
    """What an archive file name says: its writer session and the batch numbers it holds."""

    session: str
    first: int
    last: int
    merged: bool


def parse_part_name(name: str) -> PartName | None:
    """The parts of an archive file name, or ``None`` if it is not one."""
    m = _PART.match(name)
    if m is None:
        return None
    first = int(m.group("first"))
    last = m.group("last")
    if last is None:
        return PartName(m.group("session"), first, first, False)
    return PartName(m.group("session"), first, int(last), True)


def live_files(partition: Path) -> tuple[list[Path], list[Path]]:
    """``(files to read, batch files a merged file covers)`` of one partition directory."""
    parts = []
    for entry in sorted(partition.iterdir()):
        parsed = parse_part_name(entry.name)
        if parsed is not None and entry.is_file():
            parts.append((entry, parsed))
    merged: dict[str, list[tuple[int, int]]] = {}
    for _, name in parts:
        if name.merged:
            merged.setdefault(name.session, []).append((name.first, name.last))
    live, covered = [], []
    for path, name in parts:
        ranges = merged.get(name.session, ())
        if not name.merged and any(a <= name.first <= b for a, b in ranges):
            covered.append(path)
        else:
            live.append(path)
    return live, covered


def partitions(root: Path) -> Iterator[tuple[str, str, Path]]:
    """``(vhost, hour, directory)`` of every partition under an archive root, sorted."""
    for vdir in sorted(root.glob("vhost=*")):
        if not vdir.is_dir():
            continue
        vhost = unescape_partition(vdir.name[len("vhost=") :])
        for hdir in sorted(vdir.glob("hour=*")):
            if hdir.is_dir():
                yield vhost, hdir.name[len("hour=") :], hdir


def header_table_bytes(raw: bytes) -> bytes | None:
    """The headers field table inside a raw property list, exactly as sent (None if absent)."""
    flags = _unpack_u16(raw, 0)[0]
    if not flags & 0x2000:
        return None
    o = 2
    word = flags
    while word & 1:  # continuation flag words (never set by a well-formed basic header)
        word = _unpack_u16(raw, o)[0]
        o += 2
    if flags & 0x8000:
        o += 1 + raw[o]
    if flags & 0x4000:
        o += 1 + raw[o]
    size = _unpack_u32(raw, o)[0]
    if o + 4 + size > len(raw):
        raise AMQPSyntaxError("headers table truncated")
    return raw[o : o + 4 + size]


def _strings(values: Collection[Any]) -> pa.Array:
    """A string array; names with undecodable bytes (kept as surrogates) become U+FFFD."""
    try:
        return pa.array(values, pa.string())
    except (UnicodeEncodeError, pa.ArrowException):
        return pa.array(
            [
                None
                if v is None
                else v.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
                for v in values
            ],
            pa.string(),
        )


def _property_columns(raws: pa.Array) -> dict[str, pa.Array]:
    """Typed property columns for a column of raw headers, decoding each distinct one once."""
    encoded = raws.dictionary_encode()
    indices = encoded.indices
    distinct = encoded.dictionary.to_pylist()
    cols: dict[str, list[Any]] = {
        name: []
        for name in (*_STRING_PROPERTIES, "delivery_mode", "priority", "timestamp", "headers")
    }
    for raw in distinct:
        try:
            props = BasicProperties.decode(raw)
            headers = header_table_bytes(raw)
        except (AMQPSyntaxError, IndexError, ValueError):
            props, headers = BasicProperties(), None  # the broker forwards such headers as-is
        for name in _STRING_PROPERTIES:
            cols[name].append(getattr(props, name))
        cols["delivery_mode"].append(props.delivery_mode)
        cols["priority"].append(props.priority)
        stamp = props.timestamp
        if stamp is not None:
            seconds = timestamp_to_wire(stamp)
            stamp = seconds * 1000 if seconds <= _MAX_TIMESTAMP_S else None
        cols["timestamp"].append(stamp)
        cols["headers"].append(headers)
    out = {name: _strings(cols[name]).take(indices) for name in _STRING_PROPERTIES}
    out["delivery_mode"] = pa.array(cols["delivery_mode"], pa.int16()).take(indices)
    out["priority"] = pa.array(cols["priority"], pa.int16()).take(indices)
    out["timestamp"] = (
        pa.array(cols["timestamp"], pa.int64()).cast(SCHEMA.field("timestamp").type).take(indices)
    )
    out["headers"] = pa.array(cols["headers"], pa.binary()).take(indices)
    return out


def _queue_columns(queue_sets: list[Any]) -> tuple[pa.Array, pa.Array]:
    """``(queues, queue_count)``: the names of each row's queues, deduplicated by object.

    The broker hands the same cached frozenset to every publish with the same routing result,
    so sets are named once per distinct object (``id`` is stable: the rows keep them alive).
    """
    ids = np.fromiter(map(id, queue_sets), dtype=np.uint64, count=len(queue_sets))
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    names = [sorted(q.name for q in queue_sets[i]) for i in first.tolist()]
    lists = pa.array(names, pa.list_(pa.string()))
    taken = lists.take(pa.array(inverse.astype(np.int32)))
    return taken, pc.list_value_length(taken).cast(pa.int32())


def rows_to_table(rows: list[tuple], with_body: bool = False) -> pa.Table:
    """Arrow table (``SCHEMA``) from rows as ``Archive.record`` appends them."""
    # One comprehension per column: ~130 ns a row for all eight, where zip(*rows) over
    # thousands of rows costs several times that (measured with 8,192-row batches).
    ts, vhosts, exchanges, keys, raws, sizes, bodies, queue_sets = (
        [r[i] for r in rows] for i in range(8)
    )
    n = len(rows)
    micros = (np.array(ts, dtype=np.float64) * 1e6).astype(np.int64)
    props = _property_columns(pa.array(raws, pa.binary()))
    queues, counts = _queue_columns(queue_sets)
    if with_body:
        body = pa.array(bodies, pa.binary())
    else:
        body = pa.nulls(n, pa.binary())
    columns = {
        "ts": pa.array(micros, SCHEMA.field("ts").type),
        "vhost": _strings(vhosts),
        "exchange": _strings(exchanges),
        "routing_key": _strings(keys),
        **props,
        "body_size": pa.array(sizes, pa.int64()),
        "body": body,
        "queue_count": counts,
        "queues": queues,
        "unroutable": pc.equal(counts, 0),
    }
    return pa.Table.from_arrays([columns[f.name] for f in SCHEMA], schema=SCHEMA)


def split_partitions(table: pa.Table) -> Iterator[tuple[str, int, pa.Table]]:
    """``(vhost, epoch hour, rows)`` for each partition a batch touches, in order."""
    hours = pc.divide(table["ts"].cast(pa.int64()), _US_PER_HOUR)
    vhosts = table["vhost"].combine_chunks().dictionary_encode()
    hours_np = hours.to_numpy()
    codes = vhosts.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    first_hour = int(hours_np.min())
    if len(vhosts.dictionary) == 1 and first_hour == int(hours_np.max()):
        yield vhosts.dictionary[0].as_py(), first_hour, table
        return
    combo = codes * (1 << 32) + (hours_np - first_hour)
    for value in np.unique(combo).tolist():
        mask = pa.array(combo == value)
        yield (
            vhosts.dictionary[value >> 32].as_py(),
            first_hour + (value & 0xFFFFFFFF),
            table.filter(mask),
        )


def _write_atomically(path: Path, write: Callable[[Any], None]) -> None:
    """Write through ``write(file)`` to a hidden temporary name, fsync, then rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class _Partition:
    """Batch files of one partition waiting to be merged."""

    __slots__ = ("directory", "vhost", "hour", "files", "opened")

    def __init__(self, directory: Path, vhost: str, hour: int, opened: float) -> None:
        self.directory = directory
        self.vhost = vhost
        self.hour = hour
        self.files: list[tuple[int, Path]] = []
        self.opened = opened  # wall time of its first batch file


class Archive:
    """Records publishes (on the loop) and writes them as Parquet (on its own thread)."""

    def __init__(self, config: ArchiveConfig, clock: Clock | None = None, loop: Any = None) -> None:
        self.config = config
        self.root = Path(config.dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self.clock = clock or Clock()
        # Plain Clock: call time.time directly (one call fewer on the hot path).
        self._wall = time.time if type(self.clock) is Clock else self.clock.wall
        if loop is None:
            try:
                loop = self.clock.loop
            except RuntimeError:
                loop = None  # no running loop (unit tests): partial batches wait for close()
        self._loop = loop
        self._batch_rows = config.batch_rows
        self._max_pending = config.max_pending_batches
        self._max_body = config.max_body_bytes
        self._rows: list[tuple] = []
        self._pending: deque[list[tuple]] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._closed = False
        self._flush_requested = False
        started = self._wall()
        self.session = (
            time.strftime("%Y%m%dT%H%M%S", time.gmtime(started)) + "-" + secrets.token_hex(3)
        )
        self._seq = 0
        self._open: dict[tuple[str, int], _Partition] = {}
        self._doomed: deque[tuple[float, list[Path]]] = deque()
        # counters: the loop thread writes the dropped_* ones, the writer thread the rest
        self.recorded_rows = 0
        self.dropped_batches = 0
        self.dropped_rows = 0
        self.written_rows = 0
        self.written_files = 0
        self.merged_files = 0
        self.failed_rows = 0
        self._last_drop_log = 0.0
        if self._max_body:
            self.record = self._record_with_body  # type: ignore[method-assign]
        self._thread = threading.Thread(target=self._run, name="roarmq-archive", daemon=True)
        self._thread.start()

    # -- the event loop side --------------------------------------------------------------

    def record(self, vhost: str, msg: Message, queues: Collection[Queue]) -> None:
        """Remember one routed publish (``queues`` empty: unroutable). Called on the loop."""
        rows = self._rows
        rows.append(
            (
                self._wall(),
                vhost,
                msg.exchange,
                msg.routing_key,
                msg.header.raw,
                msg.size,
                None,
                queues,
            )
        )
        if len(rows) >= self._batch_rows:
            self._handoff()

    def _record_with_body(self, vhost: str, msg: Message, queues: Collection[Queue]) -> None:
        body = msg.body
        rows = self._rows
        rows.append(
            (
                self._wall(),
                vhost,
                msg.exchange,
                msg.routing_key,
                msg.header.raw,
                msg.size,
                None if body is None else body[: self._max_body],
                queues,
            )
        )
        if len(rows) >= self._batch_rows:
            self._handoff()

    def _handoff(self) -> None:
        """Pass the batch being filled to the writer, dropping the oldest one if it is behind."""
        self._flush_requested = False
        rows = self._rows
        if not rows or self._closed:
            return
        self._rows = []
        self.recorded_rows += len(rows)
        dropped = 0
        with self._lock:
            pending = self._pending
            pending.append(rows)
            while len(pending) > self._max_pending:
                dropped += len(pending.popleft())
                self.dropped_batches += 1
        self._wake.set()
        if dropped:
            self.dropped_rows += dropped
            now = time.monotonic()
            if now - self._last_drop_log > 10:
                self._last_drop_log = now
                log.warning(
                    "archive writer behind: dropped the oldest batch",
                    extra={
                        "dropped_batches": self.dropped_batches,
                        "dropped_rows": self.dropped_rows,
                    },
                )

    def close(self, timeout: float = 120.0) -> None:
        """Write everything recorded, merge open partitions, stop the writer thread."""
        if self._closed:
            return
        self._handoff()
        self._closed = True
        self._closing = True
        self._wake.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("archive writer did not finish in time", extra={"timeout_s": timeout})

    def stats(self) -> dict[str, int]:
        return {
            "recorded_rows": self.recorded_rows + len(self._rows),
            "written_rows": self.written_rows,
            "written_files": self.written_files,
            "merged_files": self.merged_files,
            "dropped_batches": self.dropped_batches,
            "dropped_rows": self.dropped_rows,
            "failed_rows": self.failed_rows,
            "pending_batches": len(self._pending),
        }

    # -- the writer thread ----------------------------------------------------------------

    def _request_flush(self) -> None:
        """Ask the loop to hand over a partial batch (the loop owns ``_rows``)."""
        if not self._rows or self._flush_requested or self._loop is None:
            return
        self._flush_requested = True
        try:
            self._loop.call_soon_threadsafe(self._handoff)
        except RuntimeError:  # the loop is closed: close() hands the rest over
            self._flush_requested = False

    def _run(self) -> None:
        try:
            self._recover()
        except Exception:
            log.exception("archive recovery failed", extra={"dir": str(self.root)})
        while True:
            woke = self._wake.wait(FLUSH_SECONDS)
            self._wake.clear()
            closing = self._closing
            while True:
                with self._lock:
                    batch = self._pending.popleft() if self._pending else None
                if batch is None:
                    break
                self._write_batch(batch)
            if closing:
                break
            if not woke:
                self._request_flush()
            self._maintain(self._wall(), final=False)
        self._maintain(self._wall(), final=True)

    def _write_batch(self, rows: list[tuple]) -> None:
        try:
            table = rows_to_table(rows, bool(self._max_body))
            for vhost, hour, part in split_partitions(table):
                self._write_part(vhost, hour, part)
            self.written_rows += len(rows)
        except Exception:
            self.failed_rows += len(rows)
            log.exception("archive batch not written", extra={"rows": len(rows)})

    def _write_part(self, vhost: str, hour: int, table: pa.Table) -> None:
        key = (vhost, hour)
        part = self._open.get(key)
        if part is None:
            directory = self.root / f"vhost={escape_partition(vhost)}" / f"hour={hour_name(hour)}"
            directory.mkdir(parents=True, exist_ok=True)
            part = self._open[key] = _Partition(directory, vhost, hour, self._wall())
            # a new hour closes the vhost's earlier ones
            for other in [p for p in self._open.values() if p.vhost == vhost and p.hour < hour]:
                self._merge(other)
        self._seq += 1
        path = part.directory / f"part-{self.session}-{self._seq:08d}.parquet"
        _write_atomically(path, lambda f: pq.write_table(table, f, compression="snappy"))
        part.files.append((self._seq, path))
        self.written_files += 1
        if len(part.files) >= MERGE_BATCHES:
            self._merge(part)

    def _maintain(self, now: float, final: bool) -> None:
        """Roll partitions that are due (all of them when closing); delete what merges cover."""
        roll = self.config.roll_minutes * 60
        for part in list(self._open.values()):
            if final or now - part.opened >= roll:
                self._merge(part)
        doomed = self._doomed
        while doomed and (final or doomed[0][0] <= now):
            for path in doomed.popleft()[1]:
                path.unlink(missing_ok=True)

    def _merge(self, part: _Partition) -> None:
        """One file for the partition's batch files (a single batch file is just kept)."""
        self._open.pop((part.vhost, part.hour), None)
        files = part.files
        if len(files) < 2:
            return
        first, last = files[0][0], files[-1][0]
        path = part.directory / f"part-{self.session}-{first:08d}-{last:08d}.parquet"

        def write(f: Any) -> None:
            with pq.ParquetWriter(f, SCHEMA, compression="zstd") as writer:
                buffered: list[pa.Table] = []
                rows = 0
                for _, src in files:
                    table = pq.read_table(src, schema=SCHEMA)
                    buffered.append(table)
                    rows += table.num_rows
                    if rows >= MERGE_ROW_GROUP:
                        writer.write_table(pa.concat_tables(buffered), row_group_size=rows)
                        buffered, rows = [], 0
                if buffered:
                    writer.write_table(pa.concat_tables(buffered), row_group_size=max(rows, 1))

        try:
            _write_atomically(path, write)
        except Exception:
            log.exception(
                "archive merge failed; batch files kept", extra={"dir": str(part.directory)}
            )
            return
        self.merged_files += 1
        self._doomed.append((self._wall() + DELETE_GRACE_SECONDS, [p for _, p in files]))

    def _recover(self) -> None:
        """Remove temporary files and batch files a merged file covers (a crash mid-merge)."""
        for _, _, directory in partitions(self.root):
            for entry in directory.iterdir():
                if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                    entry.unlink(missing_ok=True)
            for path in live_files(directory)[1]:
                path.unlink(missing_ok=True)
