"""The traffic archive: every published envelope, as Parquet, written off the event loop.

The event loop pays for extending one list per publish (``Archive.record``); a writer thread
turns full batches into Arrow tables (columns that are constant within a batch, such as the
vhost, the exchange or the content header, are converted once) and writes them, partitioned by
vhost and hour, under ``[archive] dir``::

    dir/vhost=<escaped name>/hour=YYYY-MM-DDTHH/part-<session>-<seq>.parquet

An open partition is a journal, ``.part-<session>-<seq>.journal`` (hidden from readers by its
leading dot): an Arrow IPC stream to which each batch is appended as soon as it is full or has
waited ``FLUSH_SECONDS``. Appending is cheap (tens of ns a row), and a crash leaves a stream
whose complete batches all read back, so a crash loses at most the batch still being filled.

A partition rolls when its hour ends, ``roll_minutes`` after it opened, at ``FILE_ROWS`` rows,
and at close. Rolling closes the journal and queues its conversion: the writer thread, whenever
no batch is waiting, decodes properties and encodes Parquet one row group at a time into a
hidden ``.tmp`` file, fsyncs and renames it into place, then deletes the journal. So the costly
encoding never competes with the journal for the writer, and runs mostly outside the GIL. On
start-up, a journal without its data file (a crash) is converted before the broker serves, so
nothing a journal holds is lost and nothing is written twice. Readers see a partition once it
has rolled and been converted.

Memory is bounded: at most ``max_pending_batches`` full batches wait for the writer; when it falls
behind, the oldest waiting batch is dropped and counted (``dropped_batches``/``dropped_rows``)
rather than slowing the broker. The schema is ``SCHEMA``; docs/benchmarks.md "## Pipeline" has
the cost.

A full or failing disk (ENOSPC, EIO) costs the archive, never the broker: a batch whose journal
append fails is dropped and counted (``failed_batches``/``failed_rows``, in /metrics as
``roarmq_archive_batches_dropped_total{reason="write_failed"}``), the journal it tore is cut back
to its whole batches and converted, and the next batch starts a new journal, so the archive
resumes with the first write that succeeds. A conversion that fails is retried every
``RETRY_SECONDS`` from its journal, which still holds every row. The log gets one warning per
episode (``_Faults``). Only the writer thread touches the disk once the broker serves.
"""

from __future__ import annotations

import concurrent.futures
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
from typing import TYPE_CHECKING, Any

try:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("the traffic archive needs pyarrow: pip install 'roarmq[pipeline]'") from exc

from roarmq.protocol.errors import AMQPSyntaxError
from roarmq.protocol.properties import (
    BASIC_PROPERTIES,
    FLAG_CONTENT_ENCODING,
    FLAG_CONTENT_TYPE,
    FLAG_HEADERS,
    BasicProperties,
)
from roarmq.protocol.tables import timestamp_to_wire

from .ops.clock import Clock
from .ops.logs import NOTICE

if TYPE_CHECKING:
    from .config import ArchiveConfig
    from .core.message import Message
    from .core.queue import Queue

log = logging.getLogger("roarmq.archive")

#: A partially filled batch is handed to the writer after this long.
FLUSH_SECONDS = 1.0
#: A partition rolls into its Parquet file at this many rows at the latest.
FILE_ROWS = 4 * 1024 * 1024
#: Rows per row group of the data files (also one conversion step).
ROW_GROUP_ROWS = 64 * 1024
#: A conversion that failed on the disk is tried again after this long.
RETRY_SECONDS = 5.0
#: While the disk keeps failing, a reminder in the log at most this often.
WARN_EVERY = 60.0

#: Dictionary pages only for columns that repeat, statistics only for the time (what readers
#: prune on): half the encoding cost of pyarrow's defaults (measured 257 -> 126 ns a row) and
#: a smaller file.
PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "use_dictionary": [
        "vhost",
        "exchange",
        "routing_key",
        "content_type",
        "content_encoding",
        "type",
        "app_id",
        "user_id",
        "reply_to",
        "queues",
    ],
    "write_statistics": ["ts"],
    # Delta-encoded integers: the timestamps rise, sizes and counts repeat. Files 7x smaller
    # than plain + zstd on a steady stream, and 400 instructions a row fewer to write
    # (callgrind, 64k-row row groups).
    "column_encoding": {
        "ts": "DELTA_BINARY_PACKED",
        "body_size": "DELTA_BINARY_PACKED",
        "queue_count": "DELTA_BINARY_PACKED",
    },
}

#: Each property's column type, by the property's AMQP type: a timestamp is null past year
#: 9999; the headers table is kept as received (its length prefix too), not decoded.
PROPERTY_COLUMN_TYPES: dict[str, pa.DataType] = {
    "shortstr": pa.string(),
    "octet": pa.int16(),
    "timestamp": pa.timestamp("ms", tz="UTC"),
    "table": pa.binary(),
}

#: The columns the pipeline groups rows by and routes once per distinct value: what a
#: message's route depends on, and the queues it reached (pipeline/jobs.py).
ENVELOPE_COLUMNS = ("exchange", "routing_key", "headers", "queues")
#: The per-message measures the pipeline's traffic table sums (pipeline/jobs.py).
TRAFFIC_COLUMNS = ("body_size", "queue_count", "unroutable")

SCHEMA = pa.schema(
    [
        # broker wall clock when the socket read carrying the publish arrived
        pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("vhost", pa.string(), nullable=False),
        pa.field("exchange", pa.string(), nullable=False),
        pa.field("routing_key", pa.string(), nullable=False),
        # the 14 basic properties, headers first (a routing input), then in flag order
        pa.field("headers", PROPERTY_COLUMN_TYPES["table"]),
        *(
            pa.field(name, PROPERTY_COLUMN_TYPES[kind])
            for name, kind in BASIC_PROPERTIES
            if name != "headers"
        ),
        pa.field("body_size", pa.int64(), nullable=False),
        pa.field("body", pa.binary()),  # the first max_body_bytes bytes; null when 0 or paged out
        pa.field("queue_count", pa.int32(), nullable=False),
        pa.field("queues", pa.list_(pa.string()), nullable=False),  # sorted names
        pa.field("unroutable", pa.bool_(), nullable=False),
    ]
)

#: How each property's values are collected before the cast to its column type.
_COLLECTED_AS = {"shortstr": pa.string(), "octet": pa.int16(), "timestamp": pa.int64()}

_PART = re.compile(r"^part-(?P<session>[0-9A-Za-z]+-[0-9a-f]+)-(?P<seq>\d+)\.parquet$")
_JOURNAL = re.compile(r"^\.(?P<part>part-[0-9A-Za-z]+-[0-9a-f]+-\d+)\.journal$")
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


def is_part_name(name: str) -> bool:
    """Is this the name of an archive data file (not a journal or a temporary file)?"""
    return _PART.match(name) is not None


def live_files(partition: Path) -> list[Path]:
    """The data files of one ``vhost=/hour=`` directory, sorted."""
    return sorted(p for p in partition.iterdir() if is_part_name(p.name) and p.is_file())


def pending_journals(partition: Path) -> list[Path]:
    """Journals with no data file yet: a broker that stopped without closing its archive."""
    out = []
    for p in sorted(partition.iterdir()):
        m = _JOURNAL.match(p.name)
        if m is not None and not (partition / f"{m.group('part')}.parquet").exists():
            out.append(p)
    return out


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
    if not flags & FLAG_HEADERS:
        return None
    o = 2
    word = flags
    while word & 1:  # continuation flag words (never set by a well-formed basic header)
        word = _unpack_u16(raw, o)[0]
        o += 2
    # the two shortstrs before the headers in the property list
    if flags & FLAG_CONTENT_TYPE:
        o += 1 + raw[o]
    if flags & FLAG_CONTENT_ENCODING:
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
    cols: dict[str, list[Any]] = {name: [] for name, _ in BASIC_PROPERTIES}
    for raw in distinct:
        try:
            props = BasicProperties.decode(raw)
            headers = header_table_bytes(raw)
        except (AMQPSyntaxError, IndexError, ValueError):
            props, headers = BasicProperties(), None  # the broker forwards such headers as-is
        for name, kind in BASIC_PROPERTIES:
            if kind == "table":
                cols[name].append(headers)
                continue
            value = getattr(props, name)
            if kind == "timestamp" and value is not None:
                seconds = timestamp_to_wire(value)
                value = seconds * 1000 if seconds <= _MAX_TIMESTAMP_S else None
            cols[name].append(value)
    n = len(raws)
    out = {}
    for name, kind in BASIC_PROPERTIES:
        values = cols[name]
        target = SCHEMA.field(name).type
        if all(v is None for v in values):  # the usual case for most properties: no work
            out[name] = pa.nulls(n, target)
            continue
        array = (
            _strings(values)
            if kind == "shortstr"
            else pa.array(values, _COLLECTED_AS.get(kind, target))
        )
        out[name] = array.cast(target).take(indices)
    return out


def _queue_column(queue_sets: list[Any]) -> pa.Array:
    """The sorted names of each row's queues, each distinct set named once.

    The broker hands the same cached frozenset to every publish with the same routing result,
    so sets are told apart by object (``id`` is stable: the rows keep them alive).
    """
    n = len(queue_sets)
    if _same(queue_sets):  # one routing result for the whole batch (equal sets compare equal)
        return _repeat(pa.array([sorted(q.name for q in queue_sets[0])], pa.list_(pa.string())), n)
    ids = np.fromiter(map(id, queue_sets), dtype=np.uint64, count=n)
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    names = [sorted(q.name for q in queue_sets[i]) for i in first.tolist()]
    return pa.array(names, pa.list_(pa.string())).take(pa.array(inverse.astype(np.int32)))


def _same(values: list[Any]) -> bool:
    """All one value? ``list.count`` compares by identity first: ~1 ns a row in C."""
    return bool(values) and values.count(values[0]) == len(values)


def _repeat(one: pa.Array, n: int) -> pa.Array:
    """``n`` copies of a one-element array's value (5-40 us; ``take`` is 60-160 us)."""
    if one.null_count:
        return pa.nulls(n, one.type)
    if pa.types.is_list(one.type):
        values = one.values
        k = len(values)
        offsets = pa.array(np.arange(n + 1, dtype=np.int32) * k)
        if k == 1:  # one queue: the usual case, and a plain repeat is cheaper than a take
            items = pa.repeat(values[0], n)
        else:
            items = values.take(pa.array(np.tile(np.arange(k, dtype=np.int32), n))) if k else values
        return pa.ListArray.from_arrays(offsets, items, type=one.type)
    return pa.repeat(one[0], n)


_DICT = pa.dictionary(pa.int32(), pa.string())

#: What the journal holds: the batch as recorded, before the properties are decoded.
JOURNAL_SCHEMA = pa.schema(
    [
        pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("vhost", _DICT, nullable=False),
        pa.field("exchange", _DICT, nullable=False),
        pa.field("routing_key", pa.string(), nullable=False),
        pa.field("header", pa.binary(), nullable=False),  # property flags + list, as received
        pa.field("body_size", pa.int64(), nullable=False),
        pa.field("body", pa.binary()),
        pa.field("queues", pa.list_(pa.string()), nullable=False),
    ]
)


def _column(values: list[Any], type_: pa.DataType) -> pa.Array:
    if _same(values):  # one content header, one body size: no per-row conversion
        return _repeat(pa.array(values[:1], type_), len(values))
    return pa.array(values, type_)


def _dictionary_column(values: list[Any]) -> pa.Array:
    if _same(values):  # one vhost, one exchange: the usual batch
        indices = pa.array(np.zeros(len(values), np.int32))
        return pa.DictionaryArray.from_arrays(indices, _strings(values[:1]))
    return _strings(values).dictionary_encode()


def rows_to_journal(rows: list[Any], with_body: bool = False) -> pa.Table:
    """A batch, as ``Archive.record`` extends it, as a table of ``JOURNAL_SCHEMA``.

    A batch is one flat list, ``stride`` items a row; a column is a slice,
    ``rows[i::stride]``, a few ns a row. Columns that are constant within the batch (vhost,
    exchange, queues: typical of one publisher's traffic) are built from one value.
    """
    stride = 8 if with_body else 7
    n = len(rows) // stride
    ts, vhosts, exchanges, keys, raws, sizes = (rows[i::stride] for i in range(6))
    micros = (np.array(ts, dtype=np.float64) * 1e6).astype(np.int64)
    body = pa.array(rows[6::stride], pa.binary()) if with_body else pa.nulls(n, pa.binary())
    return pa.Table.from_arrays(
        [
            pa.array(micros, JOURNAL_SCHEMA.field("ts").type),
            _dictionary_column(vhosts),
            _dictionary_column(exchanges),
            _strings(keys),
            _column(raws, pa.binary()),
            _column(sizes, pa.int64()),
            body,
            _queue_column(rows[stride - 1 :: stride]),
        ],
        schema=JOURNAL_SCHEMA,
    )


def journal_to_table(journal: pa.Table) -> pa.Table:
    """The archive's table (``SCHEMA``) from journal rows: properties decoded, counts added.

    Each distinct content header is decoded once (``_property_columns``); done per row group
    of the data file, not per batch, so the fixed costs are paid rarely.
    """
    raws = journal["header"].combine_chunks()
    # One content header for the whole row group (one publisher's steady stream)? Comparing
    # with the first is a memcmp a row; counting distinct values would hash every row.
    if raws.null_count == 0 and len(raws) and pc.all(pc.equal(raws, raws[0])).as_py():
        one = _property_columns(raws.slice(0, 1))
        props = {name: _repeat(col, len(raws)) for name, col in one.items()}
    else:
        props = _property_columns(raws)
    counts = pc.list_value_length(journal["queues"]).cast(pa.int32())
    columns = {
        "ts": journal["ts"],
        "vhost": journal["vhost"].cast(pa.string()),
        "exchange": journal["exchange"].cast(pa.string()),
        "routing_key": journal["routing_key"],
        **props,
        "body_size": journal["body_size"],
        "body": journal["body"],
        "queue_count": counts,
        "queues": journal["queues"],
        "unroutable": pc.equal(counts, 0),
    }
    return pa.Table.from_arrays([columns[f.name] for f in SCHEMA], schema=SCHEMA)


def rows_to_table(rows: list[Any], with_body: bool = False) -> pa.Table:
    """A recorded batch straight to the archive's table (tests, tools)."""
    return journal_to_table(rows_to_journal(rows, with_body))


def split_partitions(table: pa.Table) -> Iterator[tuple[str, int, pa.Table]]:
    """``(vhost, epoch hour, rows)`` for each partition a batch touches, in order."""
    hours = pc.divide(table["ts"].cast(pa.int64()), _US_PER_HOUR)
    vhosts = table["vhost"].combine_chunks()
    if not pa.types.is_dictionary(vhosts.type):
        vhosts = vhosts.dictionary_encode()
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


def read_journal(path: Path) -> Iterator[pa.RecordBatch]:
    """The complete batches of a journal, in order; a torn tail ends it quietly.

    A read the disk fails (an ``OSError`` with an errno, EIO) is raised rather than taken for
    a torn tail: the conversion is then retried, instead of writing a file short of rows and
    deleting the journal that holds them.
    """
    try:
        with pa.OSFile(str(path), "rb") as f:
            reader = pa.ipc.open_stream(f)
            while True:
                try:
                    yield reader.read_next_batch()
                except StopIteration:
                    return
    except FileNotFoundError:
        return
    except (OSError, pa.ArrowException) as exc:
        if isinstance(exc, OSError) and exc.errno:
            raise
        return  # torn mid-batch (or before the schema): what was whole has been yielded


class _Conversion:
    """A rolled journal becoming its data file, one row group a step.

    The writer thread takes a step only when no batch is waiting, so converting never holds
    up the journal; the work is mostly Arrow and Parquet code that runs without the GIL.
    A step that fails on the disk (``OSError``: ENOSPC, EIO) is ``retry``-ed from the start a
    while later: the journal still holds every row, so a full disk delays the file, nothing more.
    """

    def __init__(self, journal: Path, target: Path) -> None:
        self.journal = journal
        self.target = target
        self.tmp = target.with_name(f".{target.name}.tmp")
        self.batches = read_journal(journal)
        self.writer: Any = None
        self.rows = 0
        self.failures = 0  # failed attempts so far
        self.not_before = 0.0  # time.monotonic() of the next attempt

    def step(self) -> bool:
        """Convert up to a row group; True once the data file is in place."""
        if self.writer is None and self.rows == 0 and self.target.exists():
            # a retry after the rename: only the journal's unlink failed last time
            self.journal.unlink(missing_ok=True)
            return True
        buffered: list[pa.RecordBatch] = []
        pending = 0
        for batch in self.batches:
            buffered.append(batch)
            pending += batch.num_rows
            if pending >= ROW_GROUP_ROWS:
                break
        if buffered:
            if self.writer is None:
                self.writer = pq.ParquetWriter(self.tmp, SCHEMA, **PARQUET_OPTIONS)
            self.writer.write_table(journal_to_table(pa.Table.from_batches(buffered)))
            self.rows += pending
            if pending >= ROW_GROUP_ROWS:
                return False
        if self.writer is not None:
            self.writer.close()
            self.writer = None
            with open(self.tmp, "rb+") as f:  # the journal goes next: this must be on disk
                os.fsync(f.fileno())
            os.replace(self.tmp, self.target)
        self.journal.unlink(missing_ok=True)
        return True

    def run(self) -> int:
        while not self.step():
            pass
        return self.rows

    def abandon(self) -> None:
        """After an error: the journal stays (converted at a retry or at the next start)."""
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:  # noqa: BLE001 - already failing
                pass
            self.writer = None
        try:
            self.tmp.unlink(missing_ok=True)
        except OSError:  # the next start deletes temporaries
            pass

    def retry(self, delay: float) -> None:
        """After a disk error: drop the partial file and start again in ``delay`` seconds."""
        self.abandon()
        self.batches = read_journal(self.journal)
        self.rows = 0
        self.failures += 1
        self.not_before = time.monotonic() + delay


def _use_jemalloc() -> None:
    """Make jemalloc pyarrow's allocator in this process (only the archive uses pyarrow here).

    The default, mimalloc, hands freed pages back to the OS at once, and the next batch faults
    them in again: measured 540 ns of system time a row, against 100 with jemalloc (whose
    pages are reused within its decay time). A 10 s decay rather than jemalloc's 1 s keeps
    the pages of one roll's conversion for the next: a third fewer kernel page clears in the
    writer thread (perf, bench/pipeline.py's broker runs); the pool's size is bounded by one
    row group's conversion, a few MiB.
    """
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
        pa.jemalloc_set_decay_ms(10_000)
    except (NotImplementedError, pa.ArrowException):  # a build without jemalloc
        pa.set_memory_pool(pa.system_memory_pool())


class _Partition:
    """An open partition: the journal its batches are appended to.

    ``size`` is the journal's length after its last whole batch: when an append fails half
    way (ENOSPC, EIO), the journal is cut back to it, so no torn record stays on disk.
    """

    __slots__ = (
        "directory", "vhost", "hour", "opened", "name", "journal_file", "journal", "rows", "size",
    )  # fmt: skip

    def __init__(self, directory: Path, vhost: str, hour: int, opened: float, name: str) -> None:
        self.directory = directory
        self.vhost = vhost
        self.hour = hour
        self.opened = opened  # wall time of its first batch
        self.name = name  # part-<session>-<seq>
        self.rows = 0
        self.size = 0
        self.journal_file = pa.OSFile(str(self.journal_path), "wb")
        try:
            self.journal = pa.ipc.new_stream(self.journal_file, JOURNAL_SCHEMA)
        except BaseException:
            self.journal_file.close()
            self.delete()
            raise

    @property
    def journal_path(self) -> Path:
        return self.directory / f".{self.name}.journal"

    @property
    def path(self) -> Path:
        return self.directory / f"{self.name}.parquet"

    def append(self, table: pa.Table) -> None:
        self.journal.write_table(table)  # unbuffered file: in the OS once this returns
        self.rows += table.num_rows
        self.size = self.journal_file.tell()

    def close(self) -> None:
        for closer in (self.journal.close, self.journal_file.close):
            try:
                closer()
            except Exception:  # noqa: BLE001 - a torn tail is what a crash leaves anyway
                pass

    def cut_back(self) -> None:
        """Truncate the journal to its whole batches (a failed append may have left part of one;
        readers would stop there anyway, this only keeps the file clean)."""
        try:
            os.truncate(self.journal_path, self.size)
        except OSError:
            pass

    def delete(self) -> None:
        try:
            self.journal_path.unlink(missing_ok=True)
        except OSError:  # the next start converts (or drops) an empty journal
            pass


class _Faults:
    """The archive's disk faults, for the log: one warning per episode, not one per batch.

    An episode starts at the first failed write (a warning naming the error) and ends when
    writes succeed again (a notice with what was dropped); a disk that stays full gets a
    reminder at most every ``WARN_EVERY`` seconds with the count dropped since, so a full disk
    costs a few log lines, not one per batch. Only the writer thread calls it.
    """

    def __init__(self) -> None:
        self.failing = False
        self.started = 0.0
        self.last_warning = -WARN_EVERY
        self.since_warning = [0, 0, 0]  # batches, rows dropped, errors since the last warning
        self.episode = [0, 0, 0]

    def failure(self, op: str, exc: BaseException, batches: int = 0, rows: int = 0) -> None:
        now = time.monotonic()
        for counts in (self.since_warning, self.episode):
            counts[0] += batches
            counts[1] += rows
            counts[2] += 1
        first = not self.failing
        if first:
            self.failing, self.started = True, now
        if now - self.last_warning < WARN_EVERY:
            return
        batches, rows, errors = self.since_warning
        self.last_warning, self.since_warning = now, [0, 0, 0]
        log.warning(
            "archive cannot write: dropping what cannot be written until writes succeed again"
            if first
            else "archive writes still failing",
            exc_info=None if isinstance(exc, OSError) else exc,  # not the disk: a bug to see
            extra={
                "op": op,
                "error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                "dropped_batches": batches,
                "dropped_rows": rows,
                "errors": errors,
            },
        )

    def recovered(self) -> None:
        """Writes succeed again: end the episode (a no-op when none is under way)."""
        if not self.failing:
            return
        batches, rows, errors = self.episode
        self.failing, self.episode, self.since_warning = False, [0, 0, 0], [0, 0, 0]
        log.log(
            NOTICE,
            "archive writing again",
            extra={
                "dropped_batches": batches,
                "dropped_rows": rows,
                "errors": errors,
                "seconds": round(time.monotonic() - self.started, 1),
            },
        )


class Archive:
    """Records publishes (on the loop) and writes them as Parquet (on its own thread)."""

    def __init__(self, config: ArchiveConfig, clock: Clock | None = None, loop: Any = None) -> None:
        _use_jemalloc()
        self.config = config
        self.root = Path(config.dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self.clock = clock or Clock()
        # Plain Clock: call time.time directly (one call fewer).
        self._wall = time.time if type(self.clock) is Clock else self.clock.wall
        #: The time rows are stamped with: the connection sets it as each socket read arrives
        #: (``Connection.data_received``), so every publish in one read shares one float, and
        #: the loop pays for the clock once a read, not once a message.
        self.now = self._wall()
        if loop is None:
            try:
                loop = self.clock.loop
            except RuntimeError:
                loop = None  # no running loop (unit tests): partial batches wait for close()
        self._loop = loop
        self._stride = 8 if config.max_body_bytes else 7  # items a row in a batch list
        self._batch_len = config.batch_rows * self._stride
        self._max_pending = config.max_pending_batches
        self._max_body = config.max_body_bytes
        self._rows: list[Any] = []
        self._pending: deque[list[Any]] = deque()
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
        self._conversions: deque[_Conversion] = deque()
        #: ``roll()`` callers waiting for the writer to close every open journal
        self._roll_waiters: list[concurrent.futures.Future[dict[str, int]]] = []
        # counters: the loop thread writes the dropped_* ones, the writer thread the rest
        self.recorded_rows = 0
        self.dropped_batches = 0
        self.dropped_rows = 0
        self.written_rows = 0
        self.written_files = 0
        self.recovered_rows = 0
        self.failed_batches = 0  # dropped because they could not be written (disk full, EIO)
        self.failed_rows = 0
        self.write_errors = 0  # failed writes of journals and data files, retried ones too
        self._faults = _Faults()
        self._last_drop_log = 0.0
        self.record = self._recorder()  # type: ignore[method-assign]
        replayed = 0
        try:
            replayed = self._recover()
        except Exception:
            log.exception("archive recovery failed", extra={"dir": str(self.root)})
        self._log_state(replayed)
        self._thread = threading.Thread(target=self._run, name="roarmq-archive", daemon=True)
        self._thread.start()

    # -- the event loop side --------------------------------------------------------------

    def record(self, vhost: str, msg: Message, queues: Collection[Queue]) -> None:
        """Remember one routed publish (``queues`` empty: unroutable). Called on the loop.

        The instance attribute ``record`` replaces this method with a closure from
        ``_recorder`` (same behaviour, fewer lookups); this is its documentation.
        """
        self._recorder()(vhost, msg, queues)

    def _recorder(self) -> Callable[[str, Message, Collection[Queue]], None]:
        """The loop's side of the archive, as a closure over everything it needs.

        A publish extends one flat list by seven items (eight with bodies), not a list of row
        tuples: a tuple a row would be a tracked container that the garbage collector scans
        again and again while the batch waits (measured: 600 ns a publish with tuples, 230 flat).
        ``queues`` is kept as given: the index hands out cached sets, so the writer names each
        distinct set once. Locals instead of attribute lookups: ~90 ns less a publish.
        """
        limit = self._batch_len
        handoff = self._handoff
        archive = self
        max_body = self._max_body

        if not max_body:

            def record(vhost: str, msg: Message, queues: Collection[Queue]) -> None:
                rows = archive._rows
                rows.extend(
                    (
                        archive.now,
                        vhost,
                        msg.exchange,
                        msg.routing_key,
                        msg.header.raw,
                        msg.size,
                        queues,
                    )
                )
                if len(rows) >= limit:
                    handoff()

            return record

        def record_with_body(vhost: str, msg: Message, queues: Collection[Queue]) -> None:
            body = msg.body
            rows = archive._rows
            rows.extend(
                (
                    archive.now,
                    vhost,
                    msg.exchange,
                    msg.routing_key,
                    msg.header.raw,
                    msg.size,
                    None if body is None else body[:max_body],
                    queues,
                )
            )
            if len(rows) >= limit:
                handoff()

        return record_with_body

    def stamp(self) -> None:
        """Take the time for the publishes about to be recorded (one socket read's worth)."""
        self.now = self._wall()

    def _handoff(self) -> None:
        """Pass the batch being filled to the writer, dropping the oldest one if it is behind."""
        self._flush_requested = False
        rows = self._rows
        if not rows or self._closed:
            return
        self._rows = []
        self.recorded_rows += len(rows) // self._stride
        dropped = 0
        with self._lock:
            pending = self._pending
            pending.append(rows)
            while len(pending) > self._max_pending:
                dropped += len(pending.popleft()) // self._stride
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

    def roll(self) -> concurrent.futures.Future[dict[str, int]]:
        """Close every open journal into its Parquet file now, so readers see everything
        recorded so far (``roarmq ctl archive_roll``). Called on the loop: the batch being
        filled is handed over first; the future resolves on the writer thread with what it
        did (``journals_closed``, ``files_written``, ``conversions_waiting`` for any the
        disk deferred)."""
        done: concurrent.futures.Future[dict[str, int]] = concurrent.futures.Future()
        if self._closed:
            done.set_exception(RuntimeError("the archive is closed"))
            return done
        self._handoff()  # before the waiter: the writer drains this batch before it rolls
        with self._lock:
            self._roll_waiters.append(done)
        self._wake.set()
        return done

    def _roll_now(self) -> dict[str, int]:
        """On the writer: roll every open partition and convert every journal not waiting
        on a retry (the disk failing: those stay queued, counted in ``conversions_waiting``)."""
        journals = len(self._open)
        for part in list(self._open.values()):
            self._roll(part)
        before = self.written_files
        while (conversion := self._ready_conversion()) is not None:
            self._convert_step(conversion)
        return {
            "journals_closed": journals,
            "files_written": self.written_files - before,
            "conversions_waiting": len(self._conversions),
        }

    def open_journals(self) -> int:
        """Journals being written now (rolled into Parquet at the hour, ``roll_minutes``,
        ``roll()`` or close)."""
        return len(self._open)

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
        with self._lock:
            waiters, self._roll_waiters = self._roll_waiters, []
        for waiter in waiters:  # close() rolled everything: nobody waits for nothing
            if not waiter.done():
                waiter.set_exception(RuntimeError("the archive closed"))

    def stats(self) -> dict[str, int]:
        return {
            "recorded_rows": self.recorded_rows + len(self._rows) // self._stride,
            "written_rows": self.written_rows,
            "written_files": self.written_files,
            "recovered_rows": self.recovered_rows,
            "dropped_batches": self.dropped_batches,
            "dropped_rows": self.dropped_rows,
            "failed_batches": self.failed_batches,
            "failed_rows": self.failed_rows,
            "write_errors": self.write_errors,
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
        self._warm_up()
        self._last_flush = time.monotonic()
        while not self._cycle():
            pass
        try:
            self._maintain(self._wall(), final=True)
            while self._conversions:
                self._convert_step(self._conversions[0], final=True)
        except Exception:
            log.exception("archive writer failed while closing")

    def _cycle(self) -> bool:
        """One wake-up of the writer thread; True when it is to stop.

        An unexpected error is logged and the thread carries on: a writer thread that died
        would leave the archive off, silently, until the broker restarts.
        """
        try:
            return self._cycle_once()
        except Exception:
            log.exception("archive writer error; carrying on")
            self._wake.wait(1.0)  # no hot loop if the error repeats
            return self._closing

    def _cycle_once(self) -> bool:
        self._wake.wait(0 if self._ready_conversion() else FLUSH_SECONDS)
        self._wake.clear()
        closing = self._closing
        with self._lock:  # taken before the drain: their batches are already pending
            waiters, self._roll_waiters = self._roll_waiters, []
        while True:
            with self._lock:
                batch = self._pending.popleft() if self._pending else None
            if batch is None:
                break
            self._write_batch(batch)
            self._last_flush = time.monotonic()
        if waiters:
            try:
                result = self._roll_now()
            except Exception as exc:  # answered, then _cycle logs it and carries on
                for waiter in waiters:
                    waiter.set_exception(exc)
                raise
            for waiter in waiters:
                waiter.set_result(result)
        if closing:
            return True
        if time.monotonic() - self._last_flush >= FLUSH_SECONDS:
            self._request_flush()
            self._last_flush = time.monotonic()
        self._maintain(self._wall(), final=False)
        conversion = self._ready_conversion()
        if conversion is not None:
            self._convert_step(conversion)
        return False

    def _ready_conversion(self) -> _Conversion | None:
        """The first conversion not waiting to be retried (a full disk defers them)."""
        now = time.monotonic()
        for conversion in self._conversions:
            if conversion.not_before <= now:
                return conversion
        return None

    def _convert_step(self, conversion: _Conversion, final: bool = False) -> None:
        """One step; a disk error defers the conversion (at close: leaves it to the next start)."""
        converted = False
        try:
            done = conversion.step()
        except OSError as exc:
            self.write_errors += 1
            self._faults.failure("convert", exc)
            if not final:
                conversion.retry(RETRY_SECONDS)
                return
            conversion.abandon()
            done = True
        except Exception:
            log.exception(
                "archive conversion failed; the journal is kept for the next start",
                extra={"journal": str(conversion.journal)},
            )
            conversion.abandon()
            done = True
        else:
            if done:
                self.written_files += 1
                converted = True
        if done:
            self._conversions.remove(conversion)
        if converted:
            # after its removal: a conversion that failed before and now went through must
            # not hold the episode open itself (the notice then waited for another write)
            self._succeeded()

    def _succeeded(self) -> None:
        """A write went through: the fault episode ends, unless conversions still wait on it."""
        if self._faults.failing and not any(c.failures for c in self._conversions):
            self._faults.recovered()

    def _warm_up(self) -> None:
        """Convert and encode a tiny batch once: pyarrow's first use costs ~0.3 s of CPU, paid
        here at start-up rather than under the first traffic."""

        class _Queue:
            name = ""

        row = [0.0, "", "", "", b"\x00\x00", 0] + ([b""] if self._max_body else []) + [(_Queue(),)]
        try:
            journal = rows_to_journal(row, bool(self._max_body))
            list(split_partitions(journal))
            with pa.ipc.new_stream(pa.BufferOutputStream(), JOURNAL_SCHEMA) as stream:
                stream.write_table(journal)
            pq.write_table(journal_to_table(journal), pa.BufferOutputStream(), **PARQUET_OPTIONS)
        except Exception:
            log.exception("archive warm-up failed")

    def _write_batch(self, rows: list[Any]) -> None:
        """Append a batch to its partitions' journals; what cannot be written is dropped.

        Dropped, not retried: on a full or failing disk the batches would only pile up in
        memory, and the broker's traffic must not wait on its archive.
        """
        n = len(rows) // self._stride
        try:
            parts = list(split_partitions(rows_to_journal(rows, bool(self._max_body))))
        except Exception as exc:  # not the disk: a batch the conversion cannot take
            self._drop("encode", exc, n)
            return
        lost, error = 0, None
        for vhost, hour, table in parts:
            try:
                self._write_part(vhost, hour, table)
            except Exception as exc:
                lost, error = lost + table.num_rows, exc
        self.written_rows += n - lost
        if error is not None:
            self.write_errors += 1
            self._drop("journal", error, lost)
        else:
            self._succeeded()

    def _drop(self, op: str, exc: BaseException, rows: int) -> None:
        self.failed_batches += 1
        self.failed_rows += rows
        self._faults.failure(op, exc, 1, rows)

    def _write_part(self, vhost: str, hour: int, table: pa.Table) -> None:
        key = (vhost, hour)
        part = self._open.get(key)
        if part is None:
            # a new hour closes the vhost's earlier ones
            for other in [p for p in self._open.values() if p.vhost == vhost and p.hour < hour]:
                self._roll(other)
            directory = self.root / f"vhost={escape_partition(vhost)}" / f"hour={hour_name(hour)}"
            directory.mkdir(parents=True, exist_ok=True)
            self._seq += 1
            name = f"part-{self.session}-{self._seq:08d}"
            part = self._open[key] = _Partition(directory, vhost, hour, self._wall(), name)
        try:
            part.append(table)
        except Exception:
            self._set_aside(part)
            raise
        if part.rows >= FILE_ROWS:
            self._roll(part)

    def _set_aside(self, part: _Partition) -> None:
        """A journal whose append failed takes no more batches: cut back to its whole batches,
        it is converted like a rolled one (or deleted if it holds none), and the partition's
        next batch starts a new journal. The writer's state may not match the file any more
        (a dictionary it believes written), so appending to it again could corrupt it.
        """
        self._open.pop((part.vhost, part.hour), None)
        part.close()
        if part.rows == 0:
            part.delete()
            return
        part.cut_back()
        self._conversions.append(_Conversion(part.journal_path, part.path))

    def _maintain(self, now: float, final: bool) -> None:
        """Roll the partitions that are due (all of them when closing)."""
        roll = self.config.roll_minutes * 60
        for part in list(self._open.values()):
            if final or now - part.opened >= roll:
                self._roll(part)

    def _roll(self, part: _Partition) -> None:
        """Close the partition's journal and queue its conversion into the data file."""
        self._open.pop((part.vhost, part.hour), None)
        part.close()
        self._conversions.append(_Conversion(part.journal_path, part.path))

    def _recover(self) -> int:
        """Convert journals left by a crash into their data files; drop temporaries. Returns
        how many journals it found.

        Runs in the constructor, before the broker serves anything: a journal holds at most
        ``FILE_ROWS`` rows, a few seconds of work at most.
        """
        replayed = 0
        for _, _, directory in partitions(self.root):
            for entry in sorted(directory.iterdir()):
                if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                    entry.unlink(missing_ok=True)
                    continue
                m = _JOURNAL.match(entry.name)
                if m is None:
                    continue
                target = directory / f"{m.group('part')}.parquet"
                if target.exists():  # converted; the crash came before the journal was deleted
                    entry.unlink(missing_ok=True)
                    continue
                self._replay(_Conversion(entry, target))
                replayed += 1
        return replayed

    def _log_state(self, replayed: int) -> None:
        """The archive at start-up in one line: where, what readers can see, what the last run
        left open, and when the journals this run opens become readable."""
        files = sum(len(live_files(d)) for _, _, d in partitions(self.root))
        log.log(
            NOTICE,
            "archive enabled in %s: %d Parquet files; %d journals left open by the last run "
            "replayed%s; journals roll into Parquet every %d min (roarmq ctl archive_roll: now)",
            self.root.resolve(),
            files,
            replayed,
            f", {len(self._conversions)} waiting for the disk" if self._conversions else "",
            self.config.roll_minutes,
            extra={
                "dir": str(self.root.resolve()),
                "files": files,
                "journals_replayed": replayed,
                "journals_waiting": len(self._conversions),
                "roll_minutes": self.config.roll_minutes,
            },
        )

    def _replay(self, conversion: _Conversion) -> None:
        """Convert one journal at start-up; on a full or failing disk, the writer thread
        retries it later (the broker starts all the same)."""
        try:
            rows = conversion.run()
        except OSError as exc:
            self.write_errors += 1
            self._faults.failure("recover", exc)
            conversion.retry(RETRY_SECONDS)
            self._conversions.append(conversion)
            return
        except Exception:
            conversion.abandon()
            log.exception("archive journal not replayed", extra={"file": str(conversion.journal)})
            return
        if rows:
            self.recovered_rows += rows
            log.warning(
                "archive journal replayed", extra={"file": str(conversion.target), "rows": rows}
            )
