"""Streams (x-queue-type: stream): an append-only, replayable log that consumers read
without removing anything, as RabbitMQ serves them over AMQP 0-9-1.

A `Stream` is a `Queue` (bindings, policies, management rows and deletion treat it as
one) whose messages live in their own `SegmentLog` under ``<data>/streams/<id>/``, one
record per message: offset, timestamp, the flag "first of its chunk", exchange, routing
key, raw content header, body. Memory does not grow with the stream's length: it holds
one `_Segment` summary per segment file, a sparse index (offset, segment, position,
timestamp) every `INDEX_EVERY` records, and the last `TAIL_RECORDS` records, so readers
at the tail never touch the disk; the segment log counts a segment's records instead of
keeping a bit per record (`whole_segments`), and retention releases a segment without
reading it. While a stream has two consumers or more, the messages built for deliveries
are kept in a bounded ring (`RING`, `RING_BYTES`) that readers of the same region share:
fan-out parses and builds each message once. A delivery's header is the publisher's raw
property list with `x-stream-offset` spliced into its headers table (nothing decoded).
A complete segment (and, at a clean stop, the active one) has a summary file
``NNNNNNNN.idx`` (its totals, index entries, filter values): start-up takes the segments
that have a matching one without reading them. A chunk is what one loop turn appended
(RabbitMQ's osiris batches the same way); ``x-stream-offset: last`` starts at the last
chunk.

Offsets are handed to consumers only once fsynced (``committed``), so a crash can lose
an unconfirmed message but never deliver an offset twice; publisher confirms wait for
the same fsync. In a clustered vhost the stream's files are a working copy and each
record has a copy in the vhost's replicated log: an offset is delivered and confirmed
once that copy is held by every in-sync member (`_advance` waits for both). Retention (``x-max-length-bytes``, ``x-max-age``, their policy keys)
removes whole segments, oldest first, never the last one holding records. Consumer
offsets are the client's business (AMQP 0-9-1 has no place to store them).
"""

from __future__ import annotations

import asyncio
import bisect
import datetime
import itertools
import json
import logging
import os
import shutil
import struct
import time
import zlib
from array import array
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyroaring import BitMap

from roarmq.protocol.errors import NOT_IMPLEMENTED, PRECONDITION_FAILED
from roarmq.protocol.frames import ContentHeader
from roarmq.protocol.properties import with_long_header
from roarmq.protocol.stream.codec import combined_crc32, crc32_combinable, crc32_of_parts

from ..errors import channel_error, connection_error
from ..store.segments import HEADER_SIZE, MAGIC, Location, SegmentLog, SegmentLogError
from . import amqp10_map, queue_arguments, trace
from .message import Message
from .queue import Entry, Queue
from .queue_arguments import age_seconds

if TYPE_CHECKING:
    from ..amqp.channel import Channel, Consumer

#: offset, timestamp (ms since the epoch), flags, len(exchange), len(routing key), len(header)
_RECORD = struct.Struct("<QqBBBI")
_CHUNK_START = 1
_FILTERED = 2  # a filter value follows the fixed fields: its length (<H) and utf-8 bytes
_FLEN = struct.Struct("<H")
#: After the filter value (if any): the publisher that wrote it, for deduplication -- its
#: reference (<B length, utf-8) and the publishing id (<Q) -- so the newest id of each named
#: publisher is rebuilt from the log at start-up (RabbitMQ keeps the same in osiris chunks).
_WRITER = 4
_WLEN = struct.Struct("<B")
_PID = struct.Struct("<Q")
#: A batch record: the messages of one stream-protocol publish frame, offsets
#: [offset, offset + count) with count in the header-length field, stored as the entries of
#: an osiris chunk (each a >I size and the AMQP 1.0 message) so subscriptions get them as
#: stored. No exchange, key or header; never a filter value (a message with one is a
#: record of its own); with _WRITER, the newest publishing id of the batch. The entries'
#: CRC-32 (<I, what a chunk's header carries) precedes them, so a delivery computes none.
_BATCH = 8
_ENTRY = struct.Struct(">I")
_CRC = struct.Struct("<I")
FILTER_HEADER = "x-stream-filter-value"
_HDR = struct.Struct("<4sII")
INDEX_EVERY = 1024  # one sparse index entry per this many records
TAIL_RECORDS = 4096  # the newest records kept in memory for readers at the tail
TAIL_BYTES = 16 << 20  # ... and at most this many bytes of them (large bodies)
TAIL_TRIM_AT = TAIL_RECORDS + 512  # trimmed back to TAIL_RECORDS in one go past this
# The deliveries built lately, shared by readers of the same region, while a stream has two
# consumers or more: slots (a power of 2; independent consumers reading from `first` drift
# apart by thousands of offsets), and the bytes the ring may hold, bodies and about
# RING_SLOT_BYTES a message (a message that would pass it is built but not kept)
RING = 1 << 16
RING_BYTES = 16 << 20
RING_SLOT_BYTES = 400
READ_AHEAD = 256 << 10  # bytes one disk read fetches for a reader
DISPATCH_BATCH = 2000  # deliveries per consumer per dispatch pass before yielding
#: Consumer offsets the stream protocol stores: the file, and how soon a change is written.
TRACKING_FILE = "offsets.json"
TRACKING_WRITE_SECONDS = 0.1
CHUNK_RECORDS = 10_000  # messages in one chunk sent to a stream-protocol subscription
#: Bytes of consecutive batch records sent as one chunk: with a credit of a few chunks,
#: chunks of a single publish frame's batch would leave the consumer waiting on credit.
MERGE_BYTES = 256 << 10
SUB_DISPATCH_BATCH = 50_000  # messages to a subscription per dispatch pass before yielding
#: A stored batch record with at least this many bytes of entries goes to a subscription
#: from its segment file to the socket (sendfile: no copy in this process), as RabbitMQ
#: sends its chunks; smaller ones are read and merged into chunks of up to MERGE_BYTES.
SENDFILE_BYTES = 64 << 10
#: Bytes of consecutive stored batches of one segment sent from the file as one chunk: a
#: consumer's credit is counted in chunks, so chunks of one batch each (a publisher's read,
#: ~170 KiB at full speed) would leave it waiting on credit round trips wherever its core
#: or the broker's is shared; RabbitMQ's chunks at that rate are ~650 KB.
FILE_CHUNK_BYTES = 1 << 20
SPAN_HEAD = 512  # bytes read to learn a record's head (its fields and the writer's name)
DEFAULT_SEGMENT_SIZE = 500_000_000  # RabbitMQ's x-stream-max-segment-size-bytes default
#: x-max-age's timer (`Stream._plan_retention`): at the oldest segment's expiry, but never
#: further ahead than osiris's retention_eval_interval (an hour), and a second after an
#: expiry that found the segment not yet synced.
RETENTION_RECHECK_MS = 3_600_000
RETENTION_RETRY_MS = 1_000
#: The active segment's summary is written again each time it has grown by this much (once
#: the records it covers are synced), so a start-up after a kill -9 reads at most this
#: much of it instead of the whole segment.
PARTIAL_SUMMARY_BYTES = 32 << 20

log = logging.getLogger("roarmq.stream")

#: Streams the message being routed was appended to; `Channel._route` empties it each time.
TOUCHED: set[Stream] = set()


def _remove(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _load_summary(directory: Path, seg_id: int) -> dict | None:
    """A segment's summary if it matches the segment file: the file's size (at least it,
    for the partial summary of what was the active segment), and an intact record where the
    summary says its last one is; None otherwise (the segment is read)."""
    try:
        summary = json.loads((directory / f"{seg_id:08d}.idx").read_text())
        if summary.get("version") != 1 or summary["segment"] != seg_id:
            return None
        path = directory / f"{seg_id:08d}.seg"
        size = os.path.getsize(path)
        if size != summary["size"] and not (summary.get("partial") and size > summary["size"]):
            return None  # (a partial one covers the segment's first bytes: more may follow)
        pos, n = summary["last_pos"], summary["last_len"]
        with open(path, "rb") as f:
            f.seek(pos)
            raw = f.read(HEADER_SIZE + n)
        magic, length, crc = _HDR.unpack_from(raw)
        if magic != MAGIC or length != n or zlib.crc32(raw[HEADER_SIZE:]) != crc:
            return None
        first, count = record_span(memoryview(raw)[HEADER_SIZE:])
        if first + count - 1 != summary["last"]:
            return None
        return summary
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None


def _stream_dir(queue: Queue, store_id: int) -> Path:
    return queue.vhost.broker.cluster.stream_home(queue.vhost.name) / "streams" / str(store_id)


def record_offset(payload: bytes | memoryview) -> int:
    """The stream offset a stored record carries (the replicated log's copies name it)."""
    return _RECORD.unpack_from(payload)[0]


def record_span(payload: bytes | memoryview) -> tuple[int, int]:
    """A stored record's first offset and how many offsets it holds (a batch: several)."""
    off, _ts, flags, _nx, _nk, nh = _RECORD.unpack_from(payload)
    return off, (nh if flags & _BATCH else 1)


def batch_messages(entries: bytes | memoryview) -> list[bytes]:
    """A batch record's messages, from its entries."""
    out = []
    p = 0
    n = len(entries)
    while p + 4 <= n:
        (size,) = _ENTRY.unpack_from(entries, p)
        out.append(bytes(entries[p + 4 : p + 4 + size]))
        p += 4 + size
    return out


class _Segment:
    """What memory keeps of one segment file (and its summary file holds, with the index
    entries and filter summaries of its blocks)."""

    __slots__ = (
        "id", "first", "last", "first_ts", "last_ts", "bytes", "records", "last_pos",
        "last_len", "last_chunk",
    )  # fmt: skip

    def __init__(self, seg_id: int, offset: int, ts: int) -> None:
        self.id = seg_id
        self.first = self.last = offset
        self.first_ts = self.last_ts = ts
        self.bytes = 0
        self.records = 0
        self.last_pos = self.last_len = 0  # where its newest record is (file position)
        self.last_chunk = -1  # the first offset of its newest chunk (-1: none starts here)


def _position(reader: _Reader) -> int:
    return reader.next


class _Reader:
    """One consumer's position: the next offset and, once known, where it is on disk."""

    __slots__ = (
        "consumer",
        "next",
        "seg",
        "pos",
        "buf",
        "buf_seg",
        "buf_at",
        "fd",
        "fd_seg",
        "filt",
        "filt_bits",
        "unfiltered",
        "checked",
        "batch",
        "batch_msgs",
        "pos_offset",
    )

    def __init__(self, consumer: Consumer, start: int) -> None:
        self.consumer = consumer
        self.next = start
        self.filt: set[int] | None = None  # x-stream-filter as interned ids (None: all)
        self.filt_bits: BitMap | None = None  # the same, to test a chunk's bitmap
        self.unfiltered = False  # x-stream-match-unfiltered
        self.checked = 0  # offsets below this passed the chunk filter
        self.seg = -1  # segment and byte position of the record at `next` (-1: seek)
        self.pos = 0
        self.buf = b""
        self.buf_seg = -1
        self.buf_at = 0
        self.fd = -1
        self.fd_seg = -1
        self.batch: tuple | None = None  # the batch record read last (it holds more offsets)
        self.batch_msgs: list[bytes] | None = None  # ... and its messages, once split
        self.pos_offset = -1  # the offset of the record at (seg, pos), where known

    def message_of(self, record: tuple, off: int) -> bytes:
        """Offset `off`'s AMQP 1.0 message in a batch record (split once per batch)."""
        if self.batch_msgs is None or self.batch is not record:
            self.batch, self.batch_msgs = record, batch_messages(record[5])
        return self.batch_msgs[off - record[0]]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# -- x-stream-offset ---------------------------------------------------------------------


def _bad_offset(queue: Queue, value: Any) -> Exception:
    # RabbitMQ 3.10 crashes the channel (541) on an unparsable offset; later versions refuse
    # the consumer with 406 PRECONDITION_FAILED, as this does.
    return channel_error(
        PRECONDITION_FAILED,
        f"invalid arg 'x-stream-offset' for {queue.description}: {value!r} is not first, "
        "last, next, an offset, a timestamp or an interval",
    )


def parse_offset(queue: Queue, args: dict) -> tuple[str, Any]:
    """x-stream-offset as (kind, value): first, last, next, offset n, timestamp s."""
    value = args.get("x-stream-offset", "next")
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, bool):
        raise _bad_offset(queue, value)
    if isinstance(value, int):
        return "offset", value
    if isinstance(value, datetime.datetime):
        stamp = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
        return "timestamp", stamp.timestamp()
    if isinstance(value, str):
        if value in ("first", "last", "next"):
            return value, None
        seconds = age_seconds(value)
        if seconds is not None:
            return "timestamp", time.time() - seconds
    raise _bad_offset(queue, value)


def _bad_filter(queue: Queue, name: str, expected: str) -> Exception:
    # RabbitMQ 3.13 ignores an x-stream-filter / x-stream-match-unfiltered of the wrong type
    # (the consumer then reads everything); LavinMQ refuses it with 406, as this does.
    return channel_error(
        PRECONDITION_FAILED, f"invalid arg '{name}' for {queue.description}: expected {expected}"
    )


def parse_filter(queue: Queue, args: dict) -> tuple[list[str] | None, bool]:
    """x-stream-filter (a string or an array of strings, any of which matches; None: no
    filter) and x-stream-match-unfiltered (a bool, default false)."""
    unfiltered = args.get("x-stream-match-unfiltered", False)
    if not isinstance(unfiltered, bool):
        raise _bad_filter(queue, "x-stream-match-unfiltered", "a boolean")
    value = args.get("x-stream-filter")
    if value is None:
        return None, unfiltered
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, str | bytes) for v in values):
        raise _bad_filter(queue, "x-stream-filter", "a string or a non-empty array of strings")
    return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in values], (
        unfiltered
    )


def check_consume(channel: Channel, queue: Queue, no_ack: bool, args: dict) -> None:
    """basic.consume on a stream: RabbitMQ's refusals, in its order."""
    if no_ack:
        raise connection_error(
            NOT_IMPLEMENTED,
            f"automatic acknowledgement not supported by stream queues {queue.description}",
        )
    if not channel.prefetch_count:
        raise channel_error(
            PRECONDITION_FAILED, f"consumer prefetch count is not set for '{queue.description}'"
        )
    # another type's argument (x-priority, x-cancel-on-ha-failover): 406
    queue_arguments.check_consumer_arguments(queue.queue_type, args, queue.description)
    parse_offset(queue, args)
    parse_filter(queue, args)


def refuse(what: str, queue: Queue) -> Exception:
    """What a stream answers to basic.get, queue.purge, nack, reject, recover: 540."""
    return connection_error(
        NOT_IMPLEMENTED, f"{what} not supported by stream queues {queue.description}"
    )


# -- confirms ------------------------------------------------------------------------------


def confirm_after(channel: Channel, seq: int, token: int | None, ok: bool) -> None:
    """A confirming publish reached streams (TOUCHED): ack it once each one's appends are
    fsynced (and the message store's `token`, if a durable queue took it too)."""
    streams = [s for s in TOUCHED if s.log is not None and s.unsettled()]
    TOUCHED.clear()
    if not ok:
        channel._confirmed(seq, False)
        return
    if not streams:
        _after_streams(channel, seq, token)
        return
    channel.confirm_later(seq)
    if token is None and len(streams) == 1:
        # One stream, nothing else to wait for: consecutive publishes of a channel in one
        # chunk (one loop turn's appends, synced as one batch) share one waiter, a run of
        # sequence numbers confirmed when the newest of them is. (Not across chunks: a run
        # that kept growing would hold its oldest confirms until the log caught up.)
        streams[0].confirm_run(channel, seq, seq)
        return
    waiter = [len(streams), channel, seq, token]
    for stream in streams:
        stream.waiters.append((stream.last_token, waiter, stream.last_replicated))


def _confirm_run(waiter: list) -> None:
    """A waiter's publishes are durable: [count, channel, newest seq, store token] for one
    publish, plus the oldest seq and the chunk for a run of a channel's consecutive ones
    (one stream)."""
    channel, seq = waiter[1], waiter[2]
    if len(waiter) == 6:
        confirmed = channel.disk_confirmed
        for one in range(waiter[4], seq + 1):
            confirmed(one)
    else:
        _after_streams(channel, seq, waiter[3])


def _after_streams(channel: Channel, seq: int, token: int | None) -> None:
    store = channel.vhost.message_store
    if token is not None and store is not None and not store.durable(token):
        store.confirm_after(token, channel, seq)
    elif seq in channel._acks_waiting:
        channel.disk_confirmed(seq)
    else:
        channel._confirmed(seq, True)


def close_all(broker: Any) -> None:
    """Broker shutdown: every stream's log written, synced and closed."""
    for vhost in broker.vhosts.values():
        for queue in vhost.queues.values():
            if isinstance(queue, Stream):
                queue.close()


def streams_of(broker: Any) -> list[Stream]:
    return [q for v in broker.vhosts.values() for q in v.queues.values() if type(q) is Stream]


def metric_families(broker: Any, per_object: bool, rabbit: bool) -> Iterator[Any]:
    """Prometheus families of streams, read at scrape time. `rabbit`: RabbitMQ's family
    (`rabbitmq_stream_consumer_max_offset_lag`, per stream in per-object mode, else the
    highest over all streams); otherwise RoarMQ's own: retained messages and bytes,
    segments, chunks skipped by filters (totals, or per stream with the first and
    committed offsets in per-object mode)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    streams = streams_of(broker)
    labels = ["vhost", "queue"] if per_object else []

    def family(kind: type, name: str, doc: str, value: Any) -> Any:
        fam = kind(name, doc, labels=labels)
        if per_object:
            for s in streams:
                fam.add_metric([s.vhost.name, s.name], value(s))
        return fam

    if rabbit:
        fam = family(
            GaugeMetricFamily,
            "rabbitmq_stream_consumer_max_offset_lag",
            "Highest consumer offset lag of a stream",
            Stream.max_offset_lag,
        )
        if not per_object:
            fam.add_metric([], max((s.max_offset_lag() for s in streams), default=0))
        yield fam
        return
    specs = [
        (GaugeMetricFamily, "roarmq_stream_messages", "Messages retained in streams",
         Stream.message_count),
        (GaugeMetricFamily, "roarmq_stream_bytes", "Bytes of stream segments on disk",
         lambda s: s.retained_bytes),
        (GaugeMetricFamily, "roarmq_stream_segments", "Stream segment files",
         lambda s: len(s.segs)),
        (CounterMetricFamily, "roarmq_stream_filter_chunks_skipped",
         "Chunks filtered stream consumers skipped without reading them",
         lambda s: s.filter_chunks_skipped),
    ]  # fmt: skip
    if per_object:
        specs += [
            (GaugeMetricFamily, "roarmq_stream_first_offset", "The oldest retained offset",
             lambda s: s.first_offset),
            (GaugeMetricFamily, "roarmq_stream_committed_offset",
             "The newest offset consumers may read (-1: none)", lambda s: s.committed - 1),
        ]  # fmt: skip
    for kind, name, doc, value in specs:
        fam = family(kind, name, doc, value)
        if not per_object:
            fam.add_metric([], sum(value(s) for s in streams))
        yield fam
    totals = broker.totals
    fam = CounterMetricFamily(
        "roarmq_stream_chunk_file_bytes",
        "Bytes of stored chunks sent to stream-protocol consumers from their segment files: "
        "by sendfile, or read into memory first (the socket was full, or TLS)",
        labels=["how"],
    )
    fam.add_metric(["sendfile"], totals.stream_file_bytes_sent)
    fam.add_metric(["read"], totals.stream_file_bytes_copied)
    yield fam


def queue_class(arguments: dict | None) -> type[Queue]:
    """The class a queue with these x-arguments is made of."""
    if arguments and arguments.get("x-queue-type") in ("stream", b"stream"):
        return Stream
    return Queue


class Stream(Queue):
    """A durable stream; see the module docstring. Has a __dict__ (no __slots__): its
    attributes are read per delivery batch, not per classic-queue message."""

    def __init__(self, vhost: Any, name: str, **kwargs: Any) -> None:
        self.log: SegmentLog | None = None
        self.directory: Path | None = None
        self.next_offset = 0  # the offset the next append gets
        self.committed = 0  # offsets below this are fsynced and may be delivered
        self.first_offset = 0
        self.last_chunk = 0  # first offset of the newest chunk
        self.last_token = 0
        self.retained_bytes = 0
        self.segs: list[_Segment] = []
        self._ix_off = array("q")
        self._ix_seg = array("q")
        self._ix_pos = array("q")
        self._ix_ts = array("q")
        # the filter summary of each index block (a "chunk" for filtering: the records from
        # one index entry to the next, at most INDEX_EVERY): a bitmap of the interned
        # filter values it holds (None: none) and whether it holds a record without one
        self._ix_bits: list[BitMap | None] = []
        self._ix_unf = bytearray()
        self._fvals: dict[str, int] = {}  # filter value -> small int (rebuilt at recovery)
        self._fnames: list[str] = []  # and back
        self._fstored: list[bytes] = []  # and as a record stores it (length + utf-8)
        self._chunk_ts = 0  # the open chunk's timestamp: its records share it (osiris's)
        self.filter_chunks_skipped = 0
        # the newest records (off, ts, exchange, key, header, body, fid, segment, end):
        # at most TAIL_RECORDS and TAIL_BYTES of bodies
        self._tail: deque[tuple] = deque()
        self._tail_first = 0  # the offset of the tail's first element
        self._tail_bytes = 0
        # the messages built for the latest deliveries, by offset modulo RING: (offset,
        # message, filter id, segment, end of its record), so readers of the same region
        # (fan-out) build each message once and parse each record once
        self._ring: list[tuple | None] | None = None  # while 2+ consumers
        self._ring_bytes = 0
        self._ring_lo = 0  # the oldest offset the ring may hold
        # (token, offsets below are in it, replicated-log offset) and (token, confirm
        # waiter, replicated-log offset): each waits for the local log to have written the
        # records (`_synced`) and, in a clustered vhost, for the in-sync set to hold their
        # copies in the vhost's log (`replication_confirmed`); elsewhere the third is 0.
        self._pending: deque[tuple[int, int, int]] = deque()
        self.waiters: deque[tuple[int, list, int]] = deque()
        self._written = 0  # the local log's newest written (synced) token
        self.last_replicated = 0  # the vhost log's offset of the newest copy (cluster)
        self._replicated_ok = 0  # ... and the newest offset the in-sync set holds
        self._readers: dict[Consumer, _Reader] = {}
        self._chunk_open = False
        self.chunks = 0  # chunks opened (a confirm run stays within one)
        self._rolled = False
        # the active segment's partial summary waiting for its records' sync (token,
        # summary), and (segment, bytes) when the last one was taken
        self._partial: tuple[int, dict] | None = None
        self._partial_at = (-1, 0)
        self._opening = False  # replaying the segments at start-up
        # a named stream-protocol publisher -> the newest publishing id it appended
        # (deduplication; rebuilt from the records and the segment summaries at start-up)
        self.writers: dict[str, int] = {}
        # stream-protocol subscriptions (broker/stream_protocol/), read by chunk
        self._subs: dict[Any, _Reader] = {}
        # what wants to know when the stream goes (stream-protocol connections with a
        # publisher or subscription on it): each has `stream_deleted(stream)`
        self.watchers: set[Any] = set()
        # consumer reference -> its stored offset (stream protocol's store/query offset)
        self.tracked: dict[str, int] = {}
        self._tracking_dirty = False
        self._sid: int | None = None
        self.max_age = None
        self.segment_size = DEFAULT_SEGMENT_SIZE
        # x-max-age on a timer: when the oldest segment passes it (None: no timer), and
        # the time it is armed for (wall-clock ms)
        self._retention_timer: Any = None
        self._retention_due = 0
        super().__init__(vhost, name, **kwargs)

    # A stream's messages never go to the message store: `store` stays None, whatever the
    # broker sets; `store_id` (its definitions row) names its directory and opens its log.
    @property
    def store(self) -> None:
        return None

    @store.setter
    def store(self, value: Any) -> None:
        pass

    @property
    def store_id(self) -> int | None:
        return self._sid

    @store_id.setter
    def store_id(self, value: int | None) -> None:
        self._sid = value
        if value is not None and self.log is None:
            self._open(_stream_dir(self, value))

    # -- settings ------------------------------------------------------------------------

    def _settle(self) -> None:
        super()._settle()
        self.consumer_timeout = None  # a stream delivery may stay unacked
        values = queue_arguments.settings(self._args, self.effective_policy, "stream")
        self.max_age = values["max-age"]
        self.segment_size = values["stream-max-segment-size-bytes"]
        self.max_age_seconds = age_seconds(self.max_age) if self.max_age else None
        if self.log is not None:
            self._retain()

    # -- the log -------------------------------------------------------------------------

    def _open(self, directory: Path) -> None:
        storage = self.vhost.broker.config.storage
        try:
            loop = self.vhost.clock.loop
        except RuntimeError:  # restored before the loop runs (a broker built on a thread)
            loop = asyncio.get_event_loop_policy().get_event_loop()
        self.directory = directory
        self._read_tracking(directory)
        self.log = SegmentLog(
            directory,
            segment_size=max(self.segment_size or DEFAULT_SEGMENT_SIZE, 4096),
            sync_interval_ms=storage.sync_interval_ms,
            on_synced=lambda token: loop.call_soon_threadsafe(self._synced, token),
            whole_segments=True,  # retention drops whole segments: no memory per record
            fsync=self.vhost.broker.cluster.streams_fsync,
        )
        # Segments with a summary (written when each was complete) are taken from it
        # without reading them: start-up costs a file per segment, not a pass over the data.
        summaries = {}
        for seg_id in self.log.segments_to_replay:
            summary = _load_summary(directory, seg_id)
            if summary is not None:
                summaries[seg_id] = summary
        for name in os.listdir(directory):  # summaries of segments gone: crash leftovers
            if name.endswith(".idx") and name[:-4].isdigit() and int(name[:-4]) not in summaries:
                _remove(directory / name)
        # A partial summary (the active segment's, then a kill -9) covers the segment's first
        # bytes: they are taken from it, the records after them are read.
        sums = {i: (s["size"], s["records"], s["bytes"] - HEADER_SIZE * s["records"])
                for i, s in summaries.items()}  # fmt: skip
        partial = {i for i, s in summaries.items() if s.get("partial")}
        known = {i: v for i, v in sums.items() if i not in partial}
        prefixes = {i: v for i, v in sums.items() if i in partial}
        pending = sorted(summaries)
        last = -1
        self._opening = True
        for loc, payload in self.log.replay(copy=False, known=known, prefixes=prefixes):
            while pending and (
                pending[0] < loc.segment or (pending[0] == loc.segment and loc.segment in partial)
            ):
                last = self._apply_summary(summaries[pending.pop(0)])
            off, ts, flags, *_ = _RECORD.unpack_from(payload)
            fid = -1
            p = _RECORD.size
            if flags & _FILTERED:
                (n,) = _FLEN.unpack_from(payload, p)
                p += _FLEN.size
                fid = self._intern(bytes(payload[p : p + n]).decode("utf-8", "replace"))
                p += n
            if flags & _WRITER:
                (n,) = _WLEN.unpack_from(payload, p)
                ref = bytes(payload[p + 1 : p + 1 + n]).decode("utf-8", "replace")
                self.writers[ref] = _PID.unpack_from(payload, p + 1 + n)[0]
            count = _RECORD.unpack_from(payload)[5] if flags & _BATCH else 1
            self._note(off, ts, loc, fid, count)
            if flags & _CHUNK_START:
                self.last_chunk = self.segs[-1].last_chunk = off
            last = off + count - 1
        while pending:
            last = self._apply_summary(summaries[pending.pop(0)])
        self._opening = False
        for seg in self.segs:  # every old segment is complete now: a fresh one takes appends
            if seg.id not in summaries or seg.id in partial:
                self._write_summary(seg)
        self._rolled = False
        if self.segs:
            self.first_offset = self.segs[0].first
        self.next_offset = self.committed = last + 1
        self.first_offset = min(self.first_offset, self.next_offset)
        self._retain()

    def close(self) -> None:
        self._plan_retention(0)  # (cancels the timer: a closed stream drops nothing)
        for reader in [*self._readers.values(), *self._subs.values()]:
            reader.close()
        if self.log is not None:
            try:
                self.log.close()
            except Exception:  # noqa: BLE001 - a failed log has nothing left to write
                return
            if self._tracking_dirty:
                self._write_tracking()
            if self.segs and not self.deleted:
                # written and synced: the active segment is complete too (the next start
                # appends to a fresh one), so a clean restart reads no segment at all
                self._write_summary(self.segs[-1])

    def _intern(self, value: str) -> int:
        fid = self._fvals.get(value)
        if fid is None:
            fid = self._fvals[value] = len(self._fvals)
            self._fnames.append(value)
            stored = value.encode()[:65535]
            self._fstored.append(_FLEN.pack(len(stored)) + stored)
        return fid

    def _note(self, off: int, ts: int, loc: Location, fid: int = -1, count: int = 1) -> None:
        """A record of `count` offsets from `off` was written at `loc` (an index entry at a
        record that starts or spans a multiple of INDEX_EVERY: entries are record starts)."""
        segs = self.segs
        if not segs or segs[-1].id != loc.segment:
            if segs and not self._opening:
                self._write_summary(segs[-1])  # complete: the log rolled to a new segment
            segs.append(_Segment(loc.segment, off, ts))
            self._rolled = len(segs) > 1
            self._index(off, loc, ts)
        elif off % INDEX_EVERY == 0 or off // INDEX_EVERY != (off + count - 1) // INDEX_EVERY:
            self._index(off, loc, ts)
        if fid >= 0:
            bits = self._ix_bits[-1]
            if bits is None:
                bits = self._ix_bits[-1] = BitMap()
            bits.add(fid)
        else:
            self._ix_unf[-1] = 1
        seg = segs[-1]
        seg.last, seg.last_ts = off + count - 1, ts
        seg.last_pos, seg.last_len = loc.offset, loc.length
        seg.records += 1
        size = HEADER_SIZE + loc.length
        seg.bytes += size
        self.retained_bytes += size

    # -- segment summaries ---------------------------------------------------------------

    def _write_summary(self, seg: _Segment) -> None:
        """Write a complete segment's summary (``NNNNNNNN.idx``, JSON): its totals, where its
        last record is (checked at start-up), its index entries and their filter values.
        Not fsynced: a summary lost or torn by a crash only means that segment is read."""
        self._store_summary(self._summary(seg))

    def _summary(self, seg: _Segment, partial: bool = False) -> dict:
        """What `_write_summary` writes, as the segment is now."""
        lo = bisect.bisect_left(self._ix_off, seg.first)
        hi = bisect.bisect_right(self._ix_off, seg.last)
        names = self._fnames
        values: dict[str, int] = {}
        index = []
        for k in range(lo, hi):
            bits = self._ix_bits[k]
            ids = [values.setdefault(names[f], len(values)) for f in bits] if bits else []
            index.append([self._ix_off[k], self._ix_pos[k], self._ix_ts[k], self._ix_unf[k], ids])
        summary = {
            "version": 1,
            "segment": seg.id,
            "size": seg.bytes,
            "records": seg.records,
            "bytes": seg.bytes,
            "first": seg.first,
            "last": seg.last,
            "first_ts": seg.first_ts,
            "last_ts": seg.last_ts,
            "last_pos": seg.last_pos,
            "last_len": seg.last_len,
            "last_chunk": seg.last_chunk,
            "values": list(values),
            "index": index,
            # every named publisher's newest id so far: deduplication outlives retention
            "writers": dict(self.writers),
        }
        if partial:
            summary["partial"] = True
        return summary

    def _store_summary(self, summary: dict) -> None:
        if self.directory is None:
            return
        path = self.directory / f"{summary['segment']:08d}.idx"
        tmp = path.with_suffix(".idx.tmp")
        try:
            tmp.write_text(json.dumps(summary, separators=(",", ":")))
            os.replace(tmp, path)
        except OSError:
            _remove(tmp)  # no summary: the segment is read at the next start

    def _apply_summary(self, summary: dict) -> int:
        """Take a segment from its summary, as replaying its records would have; returns its
        last offset."""
        seg = _Segment(summary["segment"], summary["first"], summary["first_ts"])
        seg.last, seg.last_ts = summary["last"], summary["last_ts"]
        seg.bytes, seg.records = summary["bytes"], summary["records"]
        seg.last_pos, seg.last_len = summary["last_pos"], summary["last_len"]
        seg.last_chunk = summary["last_chunk"]
        self.segs.append(seg)
        self.retained_bytes += seg.bytes
        self.writers.update(summary.get("writers", {}))
        ids = [self._intern(v) for v in summary["values"]]
        for off, pos, ts, unf, vals in summary["index"]:
            self._ix_off.append(off)
            self._ix_seg.append(seg.id)
            self._ix_pos.append(pos)
            self._ix_ts.append(ts)
            self._ix_bits.append(BitMap([ids[v] for v in vals]) if vals else None)
            self._ix_unf.append(unf)
        if seg.last_chunk >= 0:
            self.last_chunk = seg.last_chunk
        return seg.last

    def _index(self, off: int, loc: Location, ts: int) -> None:
        self._ix_off.append(off)
        self._ix_seg.append(loc.segment)
        self._ix_pos.append(loc.offset)
        self._ix_ts.append(ts)
        self._ix_bits.append(None)
        self._ix_unf.append(0)

    # -- publishing ----------------------------------------------------------------------

    def publish(self, msg: Message) -> bool:
        if self.deleted or self.log is None:
            return True
        fid = -1
        headers = msg.headers
        if headers:
            value = headers.get(FILTER_HEADER)
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            if isinstance(value, str):
                known = self._fvals.get(value)  # a value seen before (no call)
                fid = known if known is not None else self._filter_id(value)
        return self._append(msg.exchange, msg.routing_key, msg.header.raw, msg.body or b"", fid)

    def publish_amqp10(
        self, message: bytes, filter_value: str | None, writer: str | None, publishing_id: int
    ) -> bool:
        """Append a message as a stream-protocol client sent it (AMQP 1.0, kept as it came:
        its record has no AMQP 0-9-1 header); `writer`, a named publisher whose newest
        publishing id the stream keeps (deduplication)."""
        if self.deleted or self.log is None:
            return False
        fid = -1 if filter_value is None else self._filter_id(filter_value)
        extra = b""
        if writer is not None:
            ref = writer.encode()[:255]
            extra = _WLEN.pack(len(ref)) + ref + _PID.pack(publishing_id)
        if not self._append("", "", b"", message, fid, extra):
            return False
        if writer is not None:
            self.writers[writer] = publishing_id
        return True

    def publish_batch(self, messages: list[bytes], writer: str | None, newest_id: int) -> bool:
        """Append a stream-protocol publish frame's messages (AMQP 1.0, none with a filter
        value) as one batch record: one write, one index note, delivered as stored."""
        if not messages:
            return False
        entries = b"".join([part for m in messages for part in (_ENTRY.pack(len(m)), m)])
        return self.publish_entries(entries, len(messages), writer, newest_id)

    def publish_entries(
        self, entries: bytes | list[bytes], count: int, writer: str | None, newest_id: int
    ) -> bool:
        """`publish_batch` of messages already as chunk entries (publish frames' bytes
        without their publishing ids, one or several runs of them: no message is copied one
        by one)."""
        if self.deleted or self.log is None or not count:
            return False
        extra = b""
        if writer is not None:
            ref = writer.encode()[:255]
            extra = _WLEN.pack(len(ref)) + ref + _PID.pack(newest_id)
        if not self._append("", "", b"", entries, -1, extra, count):
            return False
        if writer is not None:
            self.writers[writer] = newest_id
        return True

    def _filter_id(self, value: str) -> int:
        known = self._fvals.get(value)  # a value seen before: nothing to encode
        if known is None:
            known = self._intern(value.encode()[:65535].decode("utf-8", "replace"))
        return known

    def _append(
        self, exchange_name: str, routing_key: str, header: bytes, body: bytes | list[bytes],
        fid: int, writer: bytes = b"", batch: int = 0,
    ) -> bool:  # fmt: skip
        """One record at the next offset (a batch: `batch` offsets, `body` their entries,
        or runs of them joined only into the record):
        written to the log (and, clustered, its copy to the vhost's log), noted in the index
        and the tail; False when the log refused it."""
        log = self.log
        assert log is not None
        off = self.next_offset
        flags = 0
        if not self._chunk_open:
            flags = _CHUNK_START
            self._chunk_open = True
            self.chunks += 1
            self._chunk_ts = int(self.vhost.clock.wall() * 1000)
            self.vhost.clock.loop.call_soon(self._end_chunk, off)
        ts = self._chunk_ts
        exchange = exchange_name.encode()
        key = routing_key.encode()
        filt = b""
        if fid >= 0:
            flags |= _FILTERED
            filt = self._fstored[fid]
        if writer:
            flags |= _WRITER
        crc = b""
        checksum = 0
        runs = body if isinstance(body, list) else (body,)
        if batch:
            flags |= _BATCH
            for run in runs:
                checksum = zlib.crc32(run, checksum)
            crc = _CRC.pack(checksum)
        payload = b"".join(
            (
                _RECORD.pack(off, ts, flags, len(exchange), len(key), batch or len(header)),
                filt,
                writer,
                crc,
                exchange,
                key,
                header,
                *runs,
            )
        )
        stored: bytes | memoryview
        if isinstance(body, list):  # the entries as they are in the record: no other copy
            stored = memoryview(payload)[len(payload) - sum(map(len, runs)) :]
        else:
            stored = body
        try:
            # A led clustered vhost: a copy in its log first (0 elsewhere).
            self.last_replicated = self.vhost.replicated.replicate_stream(self, payload)
            loc, token = log.append(payload)
        except (SegmentLogError, ValueError):  # failed, or closed (a deposed cluster leader)
            return False
        count = batch or 1
        self.next_offset = off + count
        self.last_token = token
        self._note(off, ts, loc, fid, count)
        if flags & _CHUNK_START:
            self.segs[-1].last_chunk = off
        tail = self._tail
        end = loc.offset + HEADER_SIZE + loc.length
        if not tail:
            self._tail_first = off
        if batch:  # one reference per offset: the tail is indexed by offset
            record = (off, ts, "", batch, None, stored, checksum, loc.segment, end)
            tail.extend(itertools.repeat(record, batch))
        else:
            tail.append(
                (off, ts, exchange_name, routing_key, header, stored, fid, loc.segment, end)
            )
        self._tail_bytes += len(stored)
        if len(tail) > TAIL_TRIM_AT or self._tail_bytes > TAIL_BYTES:
            popleft = tail.popleft
            while len(tail) > 1 and (len(tail) > TAIL_RECORDS or self._tail_bytes > TAIL_BYTES):
                gone = popleft()
                dropped = 1
                if gone[4] is None:  # a batch: the rest of its references go with it
                    more = gone[0] + gone[3] - self._tail_first - 1
                    for _ in range(more):
                        popleft()
                    dropped += more
                self._tail_first += dropped
                self._tail_bytes -= len(gone[5])
        self.stats_published += 1
        TOUCHED.add(self)
        return True

    def confirm_run(self, owner: Any, first: int, last: int) -> None:
        """Confirm `owner`'s sequence numbers first..last (a channel's, or a stream-protocol
        publisher's) once what was appended for them is durable: `owner.disk_confirmed(n)`
        for each, then `owner.flush_confirms()`. Consecutive runs of one owner within a
        chunk share one waiter."""
        waiters = self.waiters
        chunk = self.chunks
        if waiters:
            _token, waiter, replicated = waiters[-1]
            if (
                waiter[1] is owner
                and len(waiter) == 6
                and waiter[5] == chunk
                and waiter[2] == first - 1
                and replicated == self.last_replicated
            ):
                waiter[2] = last
                waiters[-1] = (self.last_token, waiter, replicated)
                return
        waiters.append(
            (self.last_token, [1, owner, last, None, first, chunk], self.last_replicated)
        )

    def confirm_publisher(self, publisher: Any, first: int, last: int) -> None:
        """A stream-protocol publish frame's appends (not an AMQP route's: TOUCHED forgets
        this stream), confirmed as `confirm_run` says."""
        TOUCHED.discard(self)
        self.confirm_run(publisher, first, last)

    # -- consumer offsets (stream protocol) ------------------------------------------------

    def store_offset(self, reference: str, offset: int) -> None:
        """A consumer's stored offset, written to ``offsets.json`` in the stream's
        directory within TRACKING_WRITE_SECONDS (store-offset has no answer: RabbitMQ's
        writes a tracking chunk in the same spirit, with the next append)."""
        self.tracked[reference] = offset
        if not self._tracking_dirty and self.directory is not None:
            self._tracking_dirty = True
            self.vhost.clock.call_later(TRACKING_WRITE_SECONDS, self._write_tracking)

    def tracked_offset(self, reference: str) -> int | None:
        return self.tracked.get(reference)

    def _write_tracking(self) -> None:
        self._tracking_dirty = False
        if self.directory is None or self.deleted:
            return
        # a led clustered vhost: into its log too, so a new leader has them
        self.vhost.replicated.replicate_offsets(self, self.tracked)
        path = self.directory / TRACKING_FILE
        tmp = path.with_suffix(".tmp")
        try:
            with open(tmp, "w") as out:
                json.dump(self.tracked, out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            _remove(tmp)
            log.error("stream %r: stored offsets not written: %s", self.name, exc)

    def _read_tracking(self, directory: Path) -> None:
        try:
            loaded = json.loads((directory / TRACKING_FILE).read_text())
        except (OSError, ValueError):
            return
        if isinstance(loaded, dict):
            self.tracked.update(
                {k: v for k, v in loaded.items() if isinstance(k, str) and isinstance(v, int)}
            )

    def _end_chunk(self, first: int) -> None:
        """The loop turn's appends are one chunk: sync them as one batch."""
        self._chunk_open = False
        self.last_chunk_pending = first
        if self.next_offset > first:  # the chunk's offsets commit together, once it is synced
            self._pending.append((self.last_token, self.next_offset, self.last_replicated))
            if self._written >= self.last_token and self._replicated_ok >= self.last_replicated:
                self._advance()  # (a sync of the log's own ran first)
        if self.log is not None and not self.deleted:
            try:
                self.log.schedule_sync()
            except Exception:  # noqa: BLE001 - a closed log: nothing to sync
                pass
            seg = self.segs[-1] if self.segs else None
            if seg is None:
                return
            since = seg.bytes - (self._partial_at[1] if self._partial_at[0] == seg.id else 0)
            if since >= min(
                PARTIAL_SUMMARY_BYTES, (self.segment_size or DEFAULT_SEGMENT_SIZE) // 4
            ):
                # The active segment as it is now, written once these records are synced.
                self._partial = (self.last_token, self._summary(seg, partial=True))
                self._partial_at = (seg.id, seg.bytes)

    def _write_partial(self) -> None:
        """The active segment's partial summary, its records synced (unless the segment
        was completed meanwhile: it has its whole summary then)."""
        _token, summary = self._partial  # type: ignore[misc]  # called only while a partial summary is kept
        self._partial = None
        if self.segs and self.segs[-1].id == summary["segment"] and not self.deleted:
            self._store_summary(summary)

    def _synced(self, token: int) -> None:
        """The local log wrote (and, outside a cluster, fsynced) everything up to `token`."""
        if token > self._written:
            self._written = token
        if self._partial is not None and token >= self._partial[0]:
            self._write_partial()
        self._advance()

    def replication_confirmed(self, offset: int) -> bool:
        """Cluster: the in-sync set holds the vhost's log up to `offset` (and the leader may
        confirm). True when no copy of this stream's waits for more."""
        if offset > self._replicated_ok:
            self._replicated_ok = offset
            self._advance()
        return self.last_replicated <= offset

    def fail_replicated(self) -> None:
        """Cluster: this leadership (or its log) ended before the in-sync set held what
        these confirms wait for: they are nacked, each once (a publish that reached several
        streams shares one waiter)."""
        waiters, self.waiters = self.waiters, deque()
        channels: dict[Any, None] = {}
        for _token, waiter, _replicated in waiters:
            if waiter[0] > 0:
                waiter[0] = 0
                for seq in range(waiter[4] if len(waiter) == 6 else waiter[2], waiter[2] + 1):
                    waiter[1].disk_failed(seq)
                channels[waiter[1]] = None
        for channel in channels:
            channel.conn.flush()

    def unsettled(self) -> bool:
        """Appends made that are not yet both written here and (cluster) held in sync."""
        log = self.log
        return (
            log is not None and log.synced_token < self.last_token
        ) or self._replicated_ok < self.last_replicated

    def _advance(self) -> None:
        """Commit (deliverable offsets) and confirm what both gates have passed."""
        if self.deleted:
            return
        written, replicated = self._written, self._replicated_ok
        pending = self._pending
        committed = self.committed
        while pending and pending[0][0] <= written and pending[0][2] <= replicated:
            committed = pending.popleft()[1]
        if committed > self.committed:
            self.committed = committed
            chunk = getattr(self, "last_chunk_pending", None)
            if chunk is not None and chunk < committed:
                self.last_chunk = chunk
        waiters = self.waiters
        flush: dict[Any, None] = {}
        while waiters and waiters[0][0] <= written and waiters[0][2] <= replicated:
            waiter = waiters.popleft()[1]
            waiter[0] -= 1
            if waiter[0] == 0:
                _confirm_run(waiter)
                flush[waiter[1]] = None
        for channel in flush:
            channel.flush_confirms()
            channel.conn.flush()
        if self._rolled:
            self._retain()
            segs = self.segs
            if len(segs) < 2 or segs[-2].last < self.committed:
                self._rolled = False  # every complete segment was committed when it ran
        self.dispatch()

    def stored_records(self, start: int, end: int) -> Iterator[bytes]:
        """Each stored record with `start` <= offset < `end`, in offset order, read from the
        segment files (a cluster leader's checkpoint copies them into the vhost's log; the
        caller has had the log write them). A segment retention drops meanwhile is skipped."""
        assert self.log is not None
        for seg in list(self.segs):
            if seg.last < start:
                continue
            if seg.first >= end:
                return
            k = bisect.bisect_right(self._ix_off, start) - 1  # start reading near `start`
            pos = self._ix_pos[k] if k >= 0 and self._ix_seg[k] == seg.id else 0
            try:
                fd = os.open(os.path.join(self.log.directory, f"{seg.id:08d}.seg"), os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                buf, at = b"", pos
                while True:
                    need = pos - at
                    if need + HEADER_SIZE > len(buf):
                        buf, at, need = os.pread(fd, READ_AHEAD, pos), pos, 0
                        if len(buf) < HEADER_SIZE:
                            break
                    _magic, n, _crc = _HDR.unpack_from(buf, need)
                    if need + HEADER_SIZE + n > len(buf):
                        buf, at, need = os.pread(fd, max(READ_AHEAD, HEADER_SIZE + n), pos), pos, 0
                        if HEADER_SIZE + n > len(buf):
                            break
                    payload = buf[need + HEADER_SIZE : need + HEADER_SIZE + n]
                    pos += HEADER_SIZE + n
                    off, count = record_span(payload)
                    if off >= end:
                        return
                    if off + count > start:
                        yield payload
            finally:
                os.close(fd)

    # -- retention -----------------------------------------------------------------------

    def _retain(self) -> None:
        """Drop whole segments, oldest first, past x-max-length-bytes or x-max-age; never
        the newest segment holding records, nor one not wholly fsynced. Runs when a
        segment is complete, when a policy changes, at start-up and, with x-max-age, on
        the timer `_plan_retention` arms."""
        segs = self.segs
        limit = self.max_length_bytes
        age = self.max_age_seconds
        if limit is None and age is None:
            self._plan_retention(0)
            return
        now_ms = int(self.vhost.clock.wall() * 1000)
        dropped = False
        while len(segs) > 1 and segs[0].last < self.committed:
            seg = segs[0]
            too_big = limit is not None and self.retained_bytes > limit
            too_old = age is not None and seg.last_ts < now_ms - age * 1000
            if not (too_big or too_old):
                break
            self._drop_segment(seg)
            segs.pop(0)
            self.retained_bytes -= seg.bytes
            dropped = True
        if dropped:
            self.first_offset = segs[0].first
            cut = bisect.bisect_left(self._ix_off, self.first_offset)
            for ix in (self._ix_off, self._ix_seg, self._ix_pos, self._ix_ts):
                del ix[:cut]
            del self._ix_bits[:cut]
            del self._ix_unf[:cut]
            for reader in self._readers.values():
                if reader.next < self.first_offset:
                    reader.next = self.first_offset
                    reader.seg = -1
            self.log.schedule_sync()  # type: ignore[union-attr]  # an open stream has its log
        self._plan_retention(now_ms)

    def _plan_retention(self, now_ms: int) -> None:
        """With x-max-age and more than one segment, arm the stream's one retention timer
        for when its oldest segment passes the age (its newest record's timestamp plus
        x-max-age), at most RETENTION_RECHECK ahead; otherwise (or `now_ms` 0) cancel it.
        A stream nobody writes to still sheds its expired segments: RabbitMQ (osiris 1.4+,
        3.11.4+) re-evaluates x-max-age every `retention_eval_interval`, an hour by
        default, and 3.10.8 only when a segment is complete. Timed to the segment's
        expiry, a segment goes when it expires, not up to an hour later; nothing is
        looked at per message, and a timer already armed for that time is kept."""
        age = self.max_age_seconds
        due = 0
        if now_ms and age is not None and len(self.segs) > 1 and not self.deleted:
            due = self.segs[0].last_ts + age * 1000 + 1  # (too old: strictly older)
            if due <= now_ms:  # expired but kept (not wholly synced yet): look again soon
                due = now_ms + RETENTION_RETRY_MS
            due = min(due, now_ms + RETENTION_RECHECK_MS)  # (a wall clock set back)
        timer = self._retention_timer
        if timer is not None:
            if due == self._retention_due:
                return
            timer.cancel()
            self._retention_timer = None
        if not due:
            return
        try:
            self._retention_timer = self.vhost.clock.call_later(
                (due - now_ms) / 1000, self._retention_tick
            )
        except RuntimeError:  # no running loop (restored before it runs): the next roll
            return
        self._retention_due = due

    def _retention_tick(self) -> None:
        self._retention_timer = None
        if not self.deleted and self.log is not None:
            self._retain()

    def _drop_segment(self, seg: _Segment) -> None:
        """Release a whole segment, reading nothing: the log deletes the file after its next
        sync; its summary goes now (a summary without its segment is ignored at start-up)."""
        assert self.log is not None
        self.log.release_segment(seg.id)
        if self.directory is not None:
            _remove(self.directory / f"{seg.id:08d}.idx")

    # -- consumers -----------------------------------------------------------------------

    def start_offset(self, kind: str, value: Any) -> int:
        """Where a reader starts: first, last (the newest chunk), next, an offset (clamped
        to what the stream holds), or a timestamp (seconds since the epoch)."""
        if kind == "first":
            return self.first_offset
        if kind == "last":
            return self.last_chunk if self.committed > self.first_offset else self.next_offset
        if kind == "next":
            return self.next_offset
        if kind == "offset":
            return min(max(value, self.first_offset), self.next_offset)
        return self._offset_at(int(value * 1000))

    def add_consumer(self, consumer: Consumer) -> None:
        kind, value = parse_offset(self, consumer.arguments)
        if kind == "offset":
            # Past the end, the consumer waits for the offset it asked for (RabbitMQ
            # delivers nothing below it), and below the first retained starts there.
            start = max(value, self.first_offset)
        else:
            start = self.start_offset(kind, value)
        reader = self._readers[consumer] = _Reader(consumer, start)
        values, unfiltered = parse_filter(self, consumer.arguments)
        if values is not None:
            ids = [self._intern(v) for v in values]
            reader.filt, reader.filt_bits = set(ids), BitMap(ids)
            reader.unfiltered = unfiltered
        self.consumer_count += 1
        self._had_consumers = True
        if len(self._readers) >= 2 and self._ring is None:
            self._ring = [None] * RING
        self.dispatch()

    def _offset_at(self, ts_ms: int) -> int:
        """The first offset published at or after `ts_ms` (the next offset if none): from
        the last index entry before it, step over the older records."""
        if not self.segs or self.segs[-1].last_ts < ts_ms:
            return self.next_offset
        k = bisect.bisect_left(self._ix_ts, ts_ms) - 1
        start = self._ix_off[k] if k >= 0 else self.first_offset
        probe = _Reader(None, max(start, self.first_offset))  # type: ignore[arg-type]  # a probe reads no records: it needs no consumer
        try:
            while probe.next < self.committed:
                record = self._record(probe)
                if record is None or record[1] >= ts_ms:
                    break
                probe.next = record[0] + (record[3] if record[4] is None else 1)
        finally:
            probe.close()
        return probe.next

    def remove_consumer(self, consumer: Consumer) -> None:
        reader = self._readers.pop(consumer, None)
        if reader is not None:
            reader.close()
            self.consumer_count -= 1
            if len(self._readers) < 2:
                self._ring, self._ring_bytes, self._ring_lo = None, 0, 0

    def consumers(self) -> list[Consumer]:
        return list(self._readers)

    def active_consumer(self) -> Consumer | None:
        return None

    def has_exclusive_consumer(self) -> bool:
        """Never: each consumer of a stream reads on its own, and RabbitMQ takes an
        exclusive one beside others (the flag is kept, and shown, but excludes no one)."""
        return False

    # -- stream-protocol subscriptions ----------------------------------------------------

    def subscribe(
        self, sub: Any, start: int, filter_values: list[str] | None, match_unfiltered: bool
    ) -> None:
        """A stream-protocol subscription reads from `start`, a chunk per unit of its credit:
        `sub.credit` and `sub.deliver_chunk(first offset, timestamp, entries, ...)`."""
        reader = self._subs[sub] = _Reader(sub, start)
        if filter_values is not None:
            ids = [self._intern(v) for v in filter_values]
            reader.filt, reader.filt_bits = set(ids), BitMap(ids)
            reader.unfiltered = match_unfiltered
        self.dispatch()

    def unsubscribe(self, sub: Any) -> None:
        reader = self._subs.pop(sub, None)
        if reader is not None:
            reader.close()

    def subscription_position(self, sub: Any) -> dict[str, int]:
        reader = self._subs.get(sub)
        if reader is None:
            return {}
        return {"offset": reader.next, "offset_lag": max(self.committed - reader.next, 0)}

    def _deliver_chunks(self, reader: _Reader, committed: int) -> bool:
        """Hand a subscription chunks of consecutive committed offsets (its filter's
        misses end a chunk: a chunk's offsets are its first one plus the entry's index)
        while it has credit; True when it stopped with more to send (the pass's batch).
        A batch record read from its start goes into the chunk as stored."""
        sub: Any = reader.consumer  # a stream-protocol Subscription
        sent = 0
        conn = sub.conn
        direct = reader.filt is None and conn.sends_files
        while reader.next < committed and sub.credit > 0 and conn.writable:
            spans = self._stored_spans(reader, committed) if direct else None
            if spans is not None:  # stored batches: their entries from file to socket
                off, ts, count, checksum, fd, runs, length = spans
                sub.deliver_file(off, ts, fd, runs, length, checksum, count)
            else:
                chunk = self._gather_chunk(reader, committed, sub.chunk_bytes)
                if chunk is None:
                    break
                first, ts, parts, size, crc, count = chunk
                sub.deliver_chunk(first, ts, parts, size, crc, count)
            sent += count
            if sent >= SUB_DISPATCH_BATCH:
                self.stats_delivered += sent
                return True
        self.stats_delivered += sent
        return False

    def _gather_chunk(self, reader: _Reader, committed: int, limit: int) -> tuple | None:
        """The next chunk for a subscription from `reader.next` (moved past it): first
        offset, timestamp, parts, size, CRC-32 and message count; None if nothing is
        ready. Up to CHUNK_RECORDS messages or `limit` bytes of single messages, or stored
        batches as they are (up to MERGE_BYTES)."""
        filt = reader.filt
        pack = _ENTRY.pack
        parts: list[bytes] = []
        n = 0
        first = ts = 0
        size = 0
        crcs: list[int] | None = None  # a chunk of batches only: each one's stored CRC
        while reader.next < committed and n < CHUNK_RECORDS and size < limit:
            if filt is not None and reader.next >= reader.checked:
                at = reader.next
                self._skip_chunks(reader, committed)
                if reader.next >= committed or (n and reader.next != at):
                    break
            record = self._record(reader)
            if record is None or (n and record[1] != ts):
                break  # (a chunk has one timestamp: its messages' own, as RabbitMQ's)
            off = record[0]
            if record[4] is None:  # a batch record
                count = record[3]
                if n and reader.next != first + n:
                    break
                if filt is not None and not reader.unfiltered:  # (its messages have none)
                    if n:
                        break
                    reader.next = off + count
                    continue
                if reader.next == off:  # as stored, with the batches after it that fit
                    stored = record[5]
                    if n and (crcs is None or size + len(stored) > MERGE_BYTES):
                        break
                    if not n:
                        first, ts, crcs = off, record[1], []
                    crcs.append(record[6])  # type: ignore[union-attr]  # set just above
                    parts.append(stored)
                    n += count
                    size += len(stored)
                    reader.next = off + count
                    continue
                if crcs is not None:
                    break
                off = reader.next  # from inside it (a start offset there): one by one
                body = reader.message_of(record, off)
                fid = -1
            else:
                if crcs is not None:  # batches go in a chunk of their own
                    break
                if n and off != first + n:  # retention moved the reader
                    reader.next, reader.seg = off, -1
                    break
                fid = record[6]
                body = record[5]
                header = record[4]
                if filt is not None and not (fid in filt if fid >= 0 else reader.unfiltered):
                    reader.next = off + 1
                    if n:
                        break
                    continue
                if header:  # published over AMQP 0-9-1: its AMQP 1.0 form
                    props = ContentHeader(60, len(body), header).properties
                    body = amqp10_map.to_amqp10(record[2], record[3], header, props, body)
            reader.next = off + 1
            if not n:
                first, ts = off, record[1]
            parts.append(pack(len(body)))
            parts.append(body)
            n += 1
            size += len(body) + 4
        if not n:
            return None
        if crcs is None:  # single messages: one piece
            parts = [b"".join(parts)]
            crc = zlib.crc32(parts[0])
        else:  # a chunk of stored batches: its CRC from theirs, its bytes not read again
            crc = crc32_of_parts(parts, crcs)
        return first, ts, parts, size, crc, n

    def dispatch(self) -> None:
        """Deliver committed records to every consumer with credit."""
        if self.deleted:
            return
        if self._subs:
            again = False
            for reader in list(self._subs.values()):
                again = self._deliver_chunks(reader, self.committed) or again
            if again:
                self._schedule_dispatch()
        if not self._readers:
            return
        committed = self.committed
        again = False
        ring = self._ring
        tracing = self.vhost.tracing
        readers = list(self._readers.values())
        if ring is not None:
            # The readers furthest behind go first: they get the earliest delivery tags, so
            # the acks that return credit reach them first and they catch up. Served in a
            # fixed order, the first ones drifted ahead for good (100k offsets apart after
            # 2M messages, past what the ring holds: every reader built its own messages).
            readers.sort(key=_position)
        for reader in readers:
            consumer = reader.consumer
            deliver = consumer.channel.deliver
            filt = reader.filt
            sent = passed = 0
            while reader.next < committed and consumer.has_credit():
                if filt is not None and reader.next >= reader.checked:
                    self._skip_chunks(reader, committed)
                    if reader.next >= committed:
                        break
                off = reader.next
                slot = ring[off & (RING - 1)] if ring is not None else None
                if slot is not None and slot[0] == off:  # another reader built it lately
                    _, msg, fid, reader.seg, reader.pos = slot
                else:
                    record = self._record(reader)
                    if record is None:
                        break
                    if record[4] is None:  # a batch record: this offset's message of it
                        off = reader.next
                        body = reader.message_of(record, off)
                        record = (off, record[1], "", "", b"", body, -1, -1, 0)
                    off, msg, fid = record[0], None, record[6]
                reader.next = off + 1
                if filt is not None and not (fid in filt if fid >= 0 else reader.unfiltered):
                    passed += 1  # exact filtering: the client needs no second pass
                    if passed >= 4 * DISPATCH_BATCH:
                        again = True
                        break
                    continue
                if msg is None:
                    msg = self._build(record)  # type: ignore[arg-type]  # msg is None: read just now
                entry = Entry(msg, off, self)
                if tracing:
                    trace.delivered(consumer.channel, entry)
                deliver(consumer, entry)
                sent += 1
                if sent >= DISPATCH_BATCH:
                    again = True
                    break
            self.stats_delivered += sent
        if again:
            self._schedule_dispatch()

    def _skip_chunks(self, reader: _Reader, committed: int) -> None:
        """Step a filtered reader over the chunks (index blocks) whose bitmap holds none of
        its values (and no unfiltered record, if it wants those) without reading them."""
        ix = self._ix_off
        if not ix:
            reader.checked = committed
            return
        bits_of, unf_of = self._ix_bits, self._ix_unf
        want, unfiltered = reader.filt_bits, reader.unfiltered
        k = max(bisect.bisect_right(ix, reader.next) - 1, 0)
        start = reader.next
        while True:
            closed = k + 1 < len(ix)
            end = ix[k + 1] if closed else self.next_offset
            bits = bits_of[k]
            if (bits is not None and bits.intersect(want)) or (unfiltered and unf_of[k]):  # type: ignore[arg-type]  # a filtered reader
                reader.checked = end
                break
            if closed and end <= committed:
                self.filter_chunks_skipped += 1
                reader.next = end
                k += 1
                continue
            # the newest chunk, or one not wholly committed: skip what is there so far
            reader.next = max(reader.next, min(end, committed))
            reader.checked = reader.next
            break
        if reader.next != start:
            reader.seg = -1  # seek: the index has an entry at every chunk start

    def _build(self, record: tuple) -> Message:
        """The message a record is delivered as: its content header with `x-stream-offset`
        added to the headers (spliced into the raw property list, so the publisher's
        encoding is kept and nothing is decoded); kept in the ring for other readers."""
        off, _ts, exchange, key, raw, body, fid, seg, end = record
        if not raw:  # a stream-protocol message (AMQP 1.0): its 0-9-1 form
            props, body = amqp10_map.to_amqp091(body)
            raw = props.encode()
        size = len(body)
        spliced = with_long_header(raw, "x-stream-offset", off)
        msg = Message._rebuilt(exchange, key, ContentHeader(60, size, spliced), body, size, True, 0)
        if self._ring is not None:
            self._ring_put(off, (off, msg, fid, seg, end), size + RING_SLOT_BYTES)
        return msg

    def _ring_put(self, off: int, slot: tuple, cost: int) -> None:
        """Keep a built message for the readers behind: the ring holds the newest offsets
        built, [_ring_lo, newest], within RING slots and RING_BYTES; the oldest go first.
        (Admitting by bytes alone left the slots past the budget empty for good: about half
        of the offsets were never shared and each of ten readers built them again.)"""
        ring = self._ring
        assert ring is not None
        lo = self._ring_lo
        if off < lo:
            return  # a reader far behind the others: not worth evicting newer messages
        if off - lo >= 2 * RING:  # the readers jumped far ahead: nothing held is near
            ring[:] = [None] * RING
            self._ring_bytes = 0
            lo = off - RING + 1
        held = self._ring_bytes
        while lo < off and (held + cost > RING_BYTES or off - lo >= RING):
            j = lo & (RING - 1)
            old = ring[j]
            if old is not None:
                held -= old[1].size + RING_SLOT_BYTES
                ring[j] = None
            lo += 1
        self._ring_lo = lo
        i = off & (RING - 1)
        old = ring[i]
        if old is not None:  # this offset built again (a reader re-read it)
            held -= old[1].size + RING_SLOT_BYTES
        if held + cost <= RING_BYTES:
            ring[i] = slot
            held += cost
        else:
            ring[i] = None
        self._ring_bytes = held

    def _record(self, reader: _Reader) -> tuple | None:
        """The record at reader.next: from the tail in memory, else read from its segment."""
        tail = self._tail
        if tail and reader.next >= self._tail_first:
            return tail[reader.next - self._tail_first]
        if reader.next < self.first_offset:
            reader.next = self.first_offset
            reader.seg = -1
        batch = reader.batch  # read from disk last, and holding more offsets than one
        if batch is not None and batch[0] <= reader.next < batch[0] + batch[3]:
            return batch
        while True:
            if reader.seg < 0:
                self._seek(reader)
            record = self._read_at(reader)
            if record is None:
                return None
            if record[4] is None:  # a batch record: offsets [record[0], record[0] + count)
                if record[0] + record[3] > reader.next:
                    reader.batch, reader.batch_msgs = record, None
                    return record
            elif record[0] >= reader.next:
                return record

    def _seek(self, reader: _Reader) -> None:
        k = bisect.bisect_right(self._ix_off, reader.next) - 1
        k = max(k, 0)
        reader.seg, reader.pos = self._ix_seg[k], self._ix_pos[k]
        reader.pos_offset = -1

    def _stored_spans(self, reader: _Reader, committed: int) -> tuple | None:
        """Consecutive stored batches from `reader.next` in one segment file (each as
        `_stored_span` takes it), up to CHUNK_RECORDS messages and FILE_CHUNK_BYTES, the
        reader moved past them: (first offset, the first batch's timestamp, count, CRC-32
        of them all, fd, [(file position, length)], total length). The first batch's
        timestamp, so a message is never shown a later one than a timestamp offset
        specification finds it by. None: the record-by-record path reads on."""
        span = self._stored_span(reader, committed)
        if span is None:
            return None
        first, ts, count, checksum, fd, at, length = span
        runs = [(at, length)]
        crcs = [checksum]
        total = length
        merge = crc32_combinable()  # (else one batch a chunk: its CRC is stored)
        while True:
            reader.next = reader.pos_offset = first + count
            reader.pos = runs[-1][0] + runs[-1][1]
            if not merge or count >= CHUNK_RECORDS or total >= FILE_CHUNK_BYTES:
                break
            more = self._stored_span(reader, committed)
            if (
                more is None
                or more[4] != fd
                or count + more[2] > CHUNK_RECORDS
                or total + more[6] > FILE_CHUNK_BYTES
            ):
                break
            runs.append((more[5], more[6]))
            crcs.append(more[3])
            count += more[2]
            total += more[6]
        if len(runs) > 1:
            checksum = combined_crc32(crcs, [n for _at, n in runs])
        return first, ts, count, checksum, fd, runs, total

    def _stored_span(self, reader: _Reader, committed: int) -> tuple | None:
        """The batch record at the reader's file position when it starts at `reader.next`,
        is committed, has no filter value and holds at least SENDFILE_BYTES of entries:
        (offset, timestamp, count, CRC, fd, file position of its entries, their length),
        read from its head alone. None: the record-by-record path reads on."""
        if reader.seg < 0 or reader.next < self.first_offset:
            return None
        batch = reader.batch
        if (
            batch is not None
            and batch[0] == reader.next
            and reader.pos_offset == batch[0] + batch[3]
        ):
            # read already (the other path reads one record past a chunk it ends): in memory,
            # but the copy into the socket is still saved
            length = len(batch[5])
            if length < SENDFILE_BYTES or batch[0] + batch[3] > committed:
                return None
            self._open_fd(reader)
            if reader.fd < 0:
                return None
            return batch[0], batch[1], batch[3], batch[6], reader.fd, batch[8] - length, length
        if reader.pos_offset != reader.next:
            return None
        pos = reader.pos
        need = pos - reader.buf_at
        buf = reader.buf
        if reader.buf_seg != reader.seg or need < 0 or need + SPAN_HEAD > len(buf):
            self._open_fd(reader)
            if reader.fd < 0:
                return None
            buf, need = os.pread(reader.fd, SPAN_HEAD, pos), 0
        if need + HEADER_SIZE + _RECORD.size + _CRC.size > len(buf):
            return None  # the segment's end (or a record too short): the other path
        _magic, n, _crc = _HDR.unpack_from(buf, need)
        at = need + HEADER_SIZE
        off, ts, flags, _nx, _nk, count = _RECORD.unpack_from(buf, at)
        if not flags & _BATCH or flags & _FILTERED or off != reader.next or off + count > committed:
            return None
        p = at + _RECORD.size
        if flags & _WRITER:
            p += _WLEN.size + buf[p] + _PID.size
        if p + _CRC.size > len(buf):
            return None
        (checksum,) = _CRC.unpack_from(buf, p)
        start = p + _CRC.size - need  # the entries, from the record's head
        length = HEADER_SIZE + n - start
        if length < SENDFILE_BYTES:
            return None
        self._open_fd(reader)
        if reader.fd < 0:
            return None
        return off, ts, count, checksum, reader.fd, pos + start, length

    def _open_fd(self, reader: _Reader) -> None:
        """The reader's segment file open (fd -1 when retention removed it)."""
        if reader.fd_seg != reader.seg:
            reader.close()
            path = os.path.join(self.log.directory, f"{reader.seg:08d}.seg")  # type: ignore[union-attr]  # an open stream has its log
            try:
                reader.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return
            reader.fd_seg = reader.seg

    def _read_at(self, reader: _Reader) -> tuple | None:
        """Parse the record at (reader.seg, reader.pos) and step past it; None at the end."""
        for _ in range(len(self.segs) + 1):
            need = reader.pos - reader.buf_at
            buf = reader.buf
            if reader.buf_seg != reader.seg or need < 0 or need + HEADER_SIZE > len(buf):
                self._fill(reader, HEADER_SIZE)
                buf, need = reader.buf, 0
            if need + HEADER_SIZE <= len(buf):
                _magic, n, _crc = _HDR.unpack_from(buf, need)
                if need + HEADER_SIZE + n > len(buf):
                    self._fill(reader, HEADER_SIZE + n)
                    buf, need = reader.buf, 0
                start = need + HEADER_SIZE
                reader.pos += HEADER_SIZE + n
                record = _parse(
                    memoryview(buf)[start : start + n], self._intern, reader.seg, reader.pos
                )
                reader.pos_offset = record[0] + (record[3] if record[4] is None else 1)
                return record
            # the end of this segment: on to the next one
            later = [s.id for s in self.segs if s.id > reader.seg]
            if not later:
                return None
            reader.seg, reader.pos = later[0], 0
        return None

    def _fill(self, reader: _Reader, need: int) -> None:
        self._open_fd(reader)
        if reader.fd_seg != reader.seg:
            reader.buf, reader.buf_seg, reader.buf_at = b"", reader.seg, reader.pos
            return
        reader.buf = os.pread(reader.fd, max(READ_AHEAD, need), reader.pos)
        reader.buf_seg, reader.buf_at = reader.seg, reader.pos

    # -- what a stream does instead of a queue's ----------------------------------------

    def ack(self, entry: Entry) -> None:
        """An ack returns credit (the channel's counts); nothing is removed."""

    def lend(self, size: int) -> None:
        """A stream's deliveries are not its unacked messages: RabbitMQ reports a stream's
        `messages_unacknowledged` as 0 and its `messages` as the retained ones (the credit
        lives on the consumer and the channel)."""

    def take_back(self, count: int, size: int) -> None:
        pass

    def settle(self, entry: Entry) -> None:
        pass

    def requeue(self, entries: list[Entry], failed: bool = True) -> None:
        """A closing channel's unacked deliveries: the stream keeps everything anyway."""

    def reject(self, entry: Entry, requeue: bool) -> None:
        pass

    def restored(self) -> None:
        pass

    def touch(self) -> None:
        pass

    def purge(self) -> int:
        raise refuse("queue.purge", self)

    def get(self) -> Entry | None:
        raise refuse("basic.get", self)

    def on_deleted(self) -> list[Entry]:
        self.deleted = True
        for reader in [*self._readers.values(), *self._subs.values()]:
            reader.close()
        self._readers.clear()
        self._subs.clear()
        for watcher in list(self.watchers):
            watcher.stream_deleted(self)
        self.watchers.clear()
        self.consumer_count = 0
        TOUCHED.discard(self)
        self.close()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
        return []

    def message_count(self) -> int:
        return max(self.committed - self.first_offset, 0)

    def position(self, consumer: Consumer) -> dict[str, int]:
        """A consumer's place, as RabbitMQ's stream consumers report it: `offset`, the next
        offset it will be sent, and `offset_lag`, the committed messages it has not been
        sent yet (a filtered consumer's lag counts the messages its filter will skip)."""
        reader = self._readers.get(consumer)
        if reader is None:
            return {}
        return {"offset": reader.next, "offset_lag": max(self.committed - reader.next, 0)}

    def max_offset_lag(self) -> int:
        """The highest `offset_lag` of its consumers and stream-protocol subscriptions (0
        without any)."""
        committed = self.committed
        readers = [*self._readers.values(), *self._subs.values()]
        return max(0, max((committed - r.next for r in readers), default=0))

    def iter_ready(self) -> Iterable[Entry]:
        return iter(())


def _parse(view: memoryview, intern: Any, seg: int = -1, end: int = 0) -> tuple:
    off, ts, flags, nx, nk, nh = _RECORD.unpack_from(view)
    p = _RECORD.size
    fid = -1
    if flags & _FILTERED:
        (n,) = _FLEN.unpack_from(view, p)
        p += _FLEN.size
        fid = intern(bytes(view[p : p + n]).decode("utf-8", "replace"))
        p += n
    if flags & _WRITER:
        p += _WLEN.size + view[p] + _PID.size
    if flags & _BATCH:  # (off, ts, "", count, None, entries, their CRC, segment, end)
        # the entries as a view of what was read: a chunk sends them on without a copy
        return off, ts, "", nh, None, view[p + 4 :], _CRC.unpack_from(view, p)[0], seg, end
    exchange = str(view[p : p + nx], "utf-8")  # (decoded from the view: no copy first)
    p += nx
    key = str(view[p : p + nk], "utf-8")
    p += nk
    header = bytes(view[p : p + nh])
    return off, ts, exchange, key, header, bytes(view[p + nh :]), fid, seg, end
