"""The Spark side: one pass over the archive that counts traffic and routes every envelope.

Plan (``analyse``):

1. The driver deals the archive's partitions (one vhost and hour each, from the footers
   ``pipeline.reader`` already read) into about one *unit* per executor core, balanced by rows,
   and makes one Spark partition per unit. A partition is never split, so each unit owns the
   hours it reads: its traffic rows are final and need no shuffle.
2. ``mapInArrow`` over the units: each Python worker reads its row groups with pyarrow (only the
   columns it needs, the repeating strings as dictionaries, never the vhost or the timestamp:
   the partition gives both) and lets Arrow group each row group by envelope ``(exchange,
   routing_key, headers, recorded queues)`` with the traffic measures summed -- headers are
   dropped first for messages whose route cannot depend on them (``Router.headers_sensitive``;
   CC/BCC always kept). One hash pass gives both the envelopes to route and, regrouped per
   partition by key, the report's traffic table, which the worker writes as its own part of
   ``traffic.parquet``. There is no per-row Python.
3. Each distinct envelope of a unit is routed with the broker's index: the definitions are
   broadcast once, and each worker builds its routers once and memoises routes across tasks
   (workers are reused), so an envelope is routed once per worker. Envelopes with the same
   routes share one outcome, and the counters ``(which, metric, vhost, name, id, n)`` are added
   up per (outcome, recorded queues) pair.
4. Spark sums the counters and, for ``report``, the per-key and per-hour totals (a small
   shuffle) and the driver collects them.

Reading with pyarrow in the workers rather than Spark's Parquet reader: on the benchmark machine
Spark's scan and hash aggregation of the string columns cost ~1-2 us a row, Arrow's read and
group-by ~0.2 us (docs/benchmarks.md "## Pipeline"). The archive, and ``report``'s output
directory, must therefore be at the same path on the driver and on every executor (a local disk
in local mode, a shared mount on a cluster). A file that cannot be read is counted and reported,
not fatal.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from roarmq.broker.archive import ENVELOPE_COLUMNS, TRAFFIC_COLUMNS

from .definitions import Definitions
from .reader import ArchiveScan
from .router import Router

ALL = -1  # "which" of counters that do not depend on the definitions
#: What a worker's time is split into: loading the definitions and building their indexes,
#: reading Parquet, grouping identical envelopes (Arrow), the report's traffic table (Arrow,
#: and writing it), routing each distinct envelope and counting (Python).
STAGES = ("setup", "read", "group", "traffic", "route")

#: Rows a worker sends to Spark: ``counter`` (which, metric, vhost, name, id, n), and for the
#: report ``key`` (vhost, exchange, routing_key: n, bytes, unroutable) and ``hour`` (vhost, hour:
#: n, bytes, unroutable), summed by Spark over the units.
OUTPUT_SCHEMA = (
    "kind STRING, vhost STRING, exchange STRING, routing_key STRING, hour STRING, which INT, "
    "metric STRING, name STRING, id BIGINT, n BIGINT, bytes BIGINT, unroutable BIGINT"
)
_OUTPUT = pa.schema(
    [
        ("kind", pa.string()),
        ("vhost", pa.string()),
        ("exchange", pa.string()),
        ("routing_key", pa.string()),
        ("hour", pa.string()),  # YYYY-MM-DDTHH, as the archive's partitions name it
        ("which", pa.int32()),
        ("metric", pa.string()),
        ("name", pa.string()),
        ("id", pa.int64()),
        ("n", pa.int64()),
        ("bytes", pa.int64()),
        ("unroutable", pa.int64()),
    ]
)
#: ``traffic.parquet``: a row per vhost, exchange, routing key and hour.
TRAFFIC_SCHEMA = pa.schema(
    [
        ("vhost", pa.string()),
        ("exchange", pa.string()),
        ("routing_key", pa.string()),
        ("hour", pa.string()),
        ("messages", pa.int64()),
        ("bytes", pa.int64()),
        ("unroutable", pa.int64()),
        ("deliveries", pa.int64()),
    ]
)
#: Archive columns read: the envelope rows are grouped by, and for the report the measures
#: summed per group; and which of them come as dictionaries (they repeat).
_ENVELOPE = list(ENVELOPE_COLUMNS)
_TRAFFIC_COLUMNS = list(TRAFFIC_COLUMNS)
_DICTIONARIES = ["exchange", "routing_key"]
_MEASURES = ["bytes", "unroutable", "deliveries"]
#: Rows read and grouped at a time (whole row groups).
_READ_ROWS = 256 * 1024
#: Partial groups are merged once this many rows have piled up.
_MERGE_ROWS = 1_000_000
#: Envelopes routed per worker are remembered up to this many, then forgotten all at once.
_MEMO_LIMIT = 2_000_000
#: A unit holds about this many rows at most (more units than cores for big archives).
_UNIT_ROWS = 50_000_000

# Where "CC" / "BCC" can appear as a key of an encoded field table: the key's length octet
# followed by its bytes. A false positive only keeps a message's headers.
_CC_MARKERS = ("\x02CC", "\x03BCC")

_ROUTERS: dict[str, Router] = {}  # per Python worker process, by definitions fingerprint


def router_for(defs: Definitions) -> Router:
    router = _ROUTERS.get(defs.fingerprint)
    if router is None:
        if len(_ROUTERS) >= 4:
            _ROUTERS.clear()
        # No routing-key cache in the indexes: every envelope reaches them once (routes are
        # memoised here), so a cache would only churn (measured: a third of the routing time).
        router = _ROUTERS[defs.fingerprint] = Router(defs, cache_keys=0)
    return router


class _Outcomes:
    """Per worker and definitions list: envelope -> outcome id, and the outcome of each id.

    An outcome is what routing an envelope under each definitions gave (``Routed`` or None,
    with the vhost and, when an exchange is unknown, its name), interned: the many envelopes
    that reach the same queues through the same bindings share one, so counting goes by
    outcome rather than by envelope.
    """

    def __init__(self, routers: list[Router]) -> None:
        self.routers = routers
        self.memos: dict[str, dict[tuple, int]] = {}  # by vhost
        self.remembered = 0
        self.ids: dict[tuple, int] = {}
        self.outcomes: list[tuple] = []

    def ids_of(self, vhost: str, exchanges: list, keys: list, headers: list) -> list[int]:
        """The outcome id of each envelope ``(exchanges[i], keys[i], headers[i])`` of a vhost."""
        if self.remembered + len(keys) > _MEMO_LIMIT:
            self.memos.clear()  # outcomes stay: they are few
            self.remembered = 0
        memo = self.memos.setdefault(vhost, {})
        before = len(memo)
        get = memo.get
        out = []
        append = out.append
        for envelope in zip(exchanges, keys, headers, strict=True):
            outcome = get(envelope)
            if outcome is None:
                outcome = memo[envelope] = self._route(vhost, *envelope)
            append(outcome)
        self.remembered += len(memo) - before
        return out

    def _route(self, vhost: str, exchange: str, key: str, headers: bytes | None) -> int:
        results = tuple(r.route(vhost, exchange, key, headers) for r in self.routers)
        interned = (vhost, exchange if None in results else None, results)
        outcome = self.ids.get(interned)
        if outcome is None:
            outcome = self.ids[interned] = len(self.outcomes)
            self.outcomes.append(interned)
        return outcome


_OUTCOMES: dict[tuple, _Outcomes] = {}  # per worker, by the definitions' fingerprints


@dataclass
class Analysis:
    """What one pass found: counters by ``(which, metric)``; for a report, the totals per key
    (vhost, exchange, routing_key, messages, bytes, unroutable) and per hour (vhost, hour,
    messages, bytes, unroutable), and how many traffic rows the workers wrote."""

    counters: dict[tuple[int, str], dict[tuple[str, str, int], int]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    keys: pa.Table | None = None
    hours: pa.Table | None = None
    traffic_rows: int = 0

    def get(self, which: int, metric: str) -> dict[tuple[str, str, int], int]:
        return self.counters.get((which, metric), {})

    def total(self, which: int, metric: str) -> int:
        return sum(self.get(which, metric).values())


def plan_units(scan: ArchiveScan, parallelism: int) -> list[dict[str, Any]]:
    """The archive's partitions in ``parallelism`` units (more for big archives), balanced by
    rows; a partition (one vhost, one hour) is never split. Each unit is ``{"index": i,
    "partitions": [{"vhost", "hour", "files": [[path, [row group, ...]], ...]}]}``."""
    count = max(1, parallelism, math.ceil(scan.rows / _UNIT_ROWS))
    parts: dict[tuple[str, str], list] = {}
    rows: dict[tuple[str, str], int] = defaultdict(int)
    for path, groups in scan.row_groups.items():
        nonempty = [i for i, n in enumerate(groups) if n]
        if nonempty:
            where = scan.partition[path]
            parts.setdefault(where, []).append([str(path), nonempty])
            rows[where] += sum(groups)
    loads = [0] * count
    units: list[list[tuple[str, str]]] = [[] for _ in range(count)]
    for where in sorted(parts, key=lambda w: (-rows[w], w)):  # largest first onto the lightest
        k = loads.index(min(loads))
        loads[k] += rows[where]
        units[k].append(where)
    return [
        {
            "index": i,
            "partitions": [
                {"vhost": v, "hour": h, "files": sorted(parts[(v, h)])} for v, h in sorted(unit)
            ],
        }
        for i, unit in enumerate(u for u in units if u)
    ]


def _separator(queues: pa.Array) -> str:
    """A character no queue name in the column contains, to join the names into one key."""
    names = pc.list_flatten(queues)
    for sep in ("\x00", "\x01", "\x1f", "\x7f"):
        if not pc.any(pc.match_substring(names, sep)).as_py():
            return sep
    raise ValueError("queue names use every separator candidate")  # not in any real archive


def _kept_headers(table: pa.Table, sensitive: pa.Array) -> pa.Array:
    """The headers column with the headers of messages whose route cannot depend on them
    (null: routed and grouped as headerless)."""
    headers = table["headers"]
    if headers.null_count == len(headers):
        return headers
    # One cheap pass for "CC" anywhere; the exact markers only when it found some.
    cc = pc.match_substring(headers, "CC")
    if pc.any(cc).as_py():
        cc = pc.or_(*(pc.match_substring(headers, m) for m in _CC_MARKERS))
        keep = pc.fill_null(cc, False)
    else:
        keep = None
    if len(sensitive):
        exchanges = table["exchange"].chunk(0)  # a dictionary: test its values, not each row
        on_sensitive = pc.take(
            pc.is_in(exchanges.dictionary, value_set=sensitive), exchanges.indices
        )
        keep = on_sensitive if keep is None else pc.or_(keep, on_sensitive)
    if keep is None:
        return pa.nulls(len(headers), pa.binary())
    return pc.if_else(keep, headers, pa.scalar(None, pa.binary()))


def _group_row_group(table: pa.Table, sensitive: pa.Array, traffic: bool) -> tuple[pa.Table, str]:
    """One row group's envelopes with their message count ``n`` (and the traffic measures
    summed when ``traffic``), keyed by plain strings; and the queue-name separator used."""
    sep = _separator(table["queues"])
    columns = {
        "exchange": table["exchange"],
        "routing_key": table["routing_key"],
        "headers": _kept_headers(table, sensitive),
        "queues": pc.binary_join(table["queues"], sep),
    }
    aggregates: list[tuple] = [([], "count_all")]
    if traffic:
        columns.update(
            bytes=table["body_size"],
            unroutable=table["unroutable"],
            deliveries=table["queue_count"],
        )
        aggregates += [(c, "sum") for c in _MEASURES]
    grouped = pa.table(columns).group_by(_ENVELOPE, use_threads=False).aggregate(aggregates)
    out = {c: grouped[c].cast(pa.string()) for c in ("exchange", "routing_key")}
    out["headers"] = grouped["headers"]
    out["queues"] = grouped["queues"]
    out["n"] = grouped["count_all"]
    if traffic:
        for c in _MEASURES:
            out[c] = grouped[f"{c}_sum"].cast(pa.int64())
    return pa.table(out), sep


class _Partials:
    """Grouped tables (keys, ``n``, summed measures), merged as they pile up."""

    def __init__(self, keys: list[str], sums: list[str]) -> None:
        self.keys, self.sums = keys, ["n", *sums]
        self.tables: list[pa.Table] = []
        self.rows = 0
        self.merged = 0  # rows of the last merge: merging again waits until as many more came

    def add(self, grouped: pa.Table) -> None:
        self.tables.append(grouped.select(self.keys + self.sums))
        self.rows += grouped.num_rows
        if self.rows >= max(_MERGE_ROWS, 2 * self.merged) and len(self.tables) > 1:
            self.tables = [self.result()]
            self.rows = self.merged = self.tables[0].num_rows

    def result(self) -> pa.Table:
        if len(self.tables) == 1:
            return self.tables[0]
        grouped = (
            pa.concat_tables(self.tables)
            .group_by(self.keys, use_threads=False)
            .aggregate([(c, "sum") for c in self.sums])
        )
        return grouped.select(self.keys + [f"{c}_sum" for c in self.sums]).rename_columns(
            self.keys + self.sums
        )


def _runs(meta: pq.FileMetaData, groups: list[int]) -> Iterator[list[int]]:
    """Row groups read and grouped together, up to ``_READ_ROWS`` rows at a time: the broker
    writes 64k-row row groups, and grouping fewer, bigger chunks leaves fewer partial rows."""
    run: list[int] = []
    rows = 0
    for g in groups:
        n = meta.row_group(g).num_rows
        if run and rows + n > _READ_ROWS:
            yield run
            run, rows = [], 0
        run.append(g)
        rows += n
    if run:
        yield run


def _repeat(value: str, n: int) -> pa.Array:
    return pa.repeat(pa.scalar(value, pa.string()), n)


class _Unit:
    """One unit's work: its envelopes to route, and for the report its part of the traffic
    table (written as it goes), its per-key totals and its hours' totals."""

    def __init__(self, index: int, traffic_dir: str | None) -> None:
        self.envelopes: dict[str, _Partials] = {}  # by the separator joining queue names
        self.keys = _Partials(["vhost", "exchange", "routing_key"], ["bytes", "unroutable"])
        self.hours: list[tuple[str, str, int, int, int]] = []
        self.traffic_rows = 0
        self._writer: pq.ParquetWriter | None = None
        self._path = (
            None if traffic_dir is None else Path(traffic_dir) / f"part-{index:05d}.parquet"
        )

    def add_envelopes(self, vhost: str, grouped: dict[str, _Partials]) -> list[pa.Table]:
        """A partition's envelopes (one ``_Partials`` per separator) into the unit's; returns
        the partition's own, merged."""
        tables = []
        for sep, partials in grouped.items():
            table = partials.result()
            tables.append(table)
            table = table.add_column(0, "vhost", _repeat(vhost, table.num_rows))
            self.envelopes.setdefault(sep, _Partials(["vhost", *_ENVELOPE], [])).add(table)
        return tables

    def add_traffic(self, vhost: str, hour: str, envelopes: list[pa.Table]) -> None:
        """A partition's traffic rows (its envelopes summed per key) into the unit's part."""
        sums = ["n", *_MEASURES]
        per_key = (
            pa.concat_tables(envelopes)
            .group_by(["exchange", "routing_key"], use_threads=False)
            .aggregate([(c, "sum") for c in sums])
            .rename_columns(["exchange", "routing_key", *sums])
        )
        n = per_key.num_rows
        traffic = pa.table(
            [
                _repeat(vhost, n),
                per_key["exchange"],
                per_key["routing_key"],
                _repeat(hour, n),
                *(per_key[c] for c in sums),
            ],
            schema=TRAFFIC_SCHEMA,
        )
        if self._writer is None:
            assert self._path is not None
            self._tmp = self._path.with_name(f".{self._path.name}.{os.getpid()}.tmp")
            # Dictionaries only where values repeat (measured: 40% faster, and smaller).
            self._writer = pq.ParquetWriter(
                self._tmp,
                TRAFFIC_SCHEMA,
                compression="zstd",
                use_dictionary=["vhost", "exchange", "hour"],
            )
        self._writer.write_table(traffic)
        self.traffic_rows += n
        self.keys.add(
            pa.table(
                {
                    "vhost": traffic["vhost"],
                    "exchange": traffic["exchange"],
                    "routing_key": traffic["routing_key"],
                    "n": traffic["messages"],
                    "bytes": traffic["bytes"],
                    "unroutable": traffic["unroutable"],
                }
            )
        )
        totals = (pc.sum(traffic[c]).as_py() or 0 for c in ("messages", "bytes", "unroutable"))
        self.hours.append((vhost, hour, *totals))

    def finish_traffic(self) -> None:
        """Close the unit's traffic part under its final name (a retried task rewrites it)."""
        if self._writer is not None:
            self._writer.close()
            assert self._path is not None
            os.replace(self._tmp, self._path)
            self._writer = None

    def count(self, outcomes: _Outcomes, counts: dict[tuple, int]) -> None:
        """Route each distinct envelope (memoised per worker) and add up the counters."""
        for sep, partials in self.envelopes.items():
            table = partials.result()
            vhosts = pc.unique(table["vhost"]).to_pylist()
            for vhost in vhosts:
                one = table if len(vhosts) == 1 else table.filter(pc.equal(table["vhost"], vhost))
                ids = outcomes.ids_of(
                    vhost, *(one[c].to_pylist() for c in ("exchange", "routing_key", "headers"))
                )
                pairs = (
                    pa.table({"outcome": ids, "queues": one["queues"], "n": one["n"]})
                    .group_by(["outcome", "queues"], use_threads=False)
                    .aggregate([("n", "sum")])
                )
                _add_counters(
                    outcomes.outcomes,
                    pairs["outcome"].to_pylist(),
                    pairs["queues"].to_pylist(),
                    pairs["n_sum"].to_pylist(),
                    sep,
                    counts,
                )


def _add_counters(
    outcomes: list[tuple],
    ids: list[int],
    joined_queues: list[str],
    ns: list[int],
    sep: str,
    counts: dict[tuple, int],
) -> None:
    for outcome, joined, n in zip(ids, joined_queues, ns, strict=True):
        vhost, exchange, results = outcomes[outcome]
        queues = joined.split(sep) if joined else []
        counts[(ALL, "rows", vhost, "", 0)] += n
        counts[(ALL, "fanout", vhost, "", len(queues))] += n
        actual = set(queues)
        for q in actual:
            counts[(ALL, "actual", vhost, q, 0)] += n
        for which, routed in enumerate(results):
            if routed is None:
                counts[(which, "unknown_exchange", vhost, exchange, 0)] += n
                would: set[str] = set()
            else:
                counts[(which, "routed", vhost, "", 0)] += n
                for b in routed.hits:
                    counts[(which, "binding", vhost, "", b)] += n
                would = set(routed.queues)
            if would == actual:
                counts[(which, "agree", vhost, "", 0)] += n
            for q in would - actual:
                counts[(which, "added", vhost, q, 0)] += n
            for q in actual - would:
                counts[(which, "lost", vhost, q, 0)] += n
            for q in would & actual:
                counts[(which, "unchanged", vhost, q, 0)] += n


def analyse_units(
    units: Iterator[dict[str, Any]],
    defs_list: list[Definitions],
    sensitive: list[str],
    traffic_dir: str | None,
    setup_seconds: float = 0.0,
) -> Iterator[pa.RecordBatch]:
    """Read, group, route and count the partitions of each unit (see ``plan_units``).

    Counters (``which`` = index into ``defs_list``; ``ALL`` for facts of the archive itself):
    ``ALL``: ``rows`` per vhost, ``fanout`` (id = queues reached), ``actual`` per queue,
    ``unreadable`` (name = file and error); per definitions: ``routed`` and
    ``unknown_exchange`` (name = exchange) rows, ``binding`` hits (id = binding id), ``agree``
    (routed to exactly the recorded queues), and per queue ``added`` (routed there, not
    recorded), ``lost`` (recorded, not routed there) and ``unchanged`` (both); and
    ``microseconds`` (name = a stage of ``STAGES``) each worker spent per stage;
    ``setup_seconds``: what getting ``defs_list`` took (a broadcast's first read unpickles it).
    With ``traffic_dir`` (the report), each unit writes ``part-<unit>.parquet`` of the traffic
    table there, and ``key`` and ``hour`` totals come out beside the counters.
    """
    clock = time.perf_counter
    t0 = clock()
    routers = [router_for(d) for d in defs_list]
    fingerprints = tuple(d.fingerprint for d in defs_list)
    outcomes = _OUTCOMES.get(fingerprints)
    if outcomes is None:
        if len(_OUTCOMES) >= 4:
            _OUTCOMES.clear()
        outcomes = _OUTCOMES[fingerprints] = _Outcomes(routers)
    sensitive_names = pa.array(sensitive, pa.string())
    with_traffic = traffic_dir is not None
    columns = _ENVELOPE + (_TRAFFIC_COLUMNS if with_traffic else [])
    counts: dict[tuple, int] = defaultdict(int)
    spent = dict.fromkeys(STAGES, 0.0)  # seconds of this worker per stage
    spent["setup"] = setup_seconds + clock() - t0
    keys: list[pa.Table] = []
    hours: list[tuple] = []
    for spec in units:
        unit = _Unit(spec["index"], traffic_dir)
        for part in spec["partitions"]:
            grouped: dict[str, _Partials] = {}  # by separator
            sums = _MEASURES if with_traffic else []
            for path, groups in part["files"]:
                from_file = []  # a file counts whole or not at all
                try:
                    source = pq.ParquetFile(path, read_dictionary=_DICTIONARIES)
                    for run in _runs(source.metadata, groups):
                        t0 = clock()
                        table = source.read_row_groups(run, columns=columns, use_threads=False)
                        t1 = clock()
                        spent["read"] += t1 - t0
                        if len(run) > 1:  # a dictionary per row group: one for the run
                            table = table.unify_dictionaries()
                        from_file.append(
                            _group_row_group(table.combine_chunks(), sensitive_names, with_traffic)
                        )
                        spent["group"] += clock() - t1
                except (OSError, pa.ArrowException) as exc:
                    why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    counts[(ALL, "unreadable", "", f"{path}: {why}", 0)] += 1
                    continue
                t0 = clock()
                for rows, sep in from_file:
                    grouped.setdefault(sep, _Partials(_ENVELOPE, sums)).add(rows)
                spent["group"] += clock() - t0
            if grouped:
                t0 = clock()
                merged = unit.add_envelopes(part["vhost"], grouped)
                t1 = clock()
                spent["group"] += t1 - t0
                if with_traffic:
                    unit.add_traffic(part["vhost"], part["hour"], merged)
                    spent["traffic"] += clock() - t1
        t0 = clock()
        unit.finish_traffic()
        if unit.traffic_rows:
            counts[(ALL, "traffic_rows", "", "", 0)] += unit.traffic_rows
        if with_traffic and unit.keys.tables:
            keys.append(unit.keys.result())
        hours += unit.hours
        t1 = clock()
        spent["traffic"] += t1 - t0
        unit.count(outcomes, counts)
        spent["route"] += clock() - t1
    for stage, seconds in spent.items():
        counts[(ALL, "microseconds", "", stage, 0)] += round(seconds * 1e6)
    rows = list(counts.items())
    yield _batch(
        "counter",
        {
            "which": [k[0] for k, _ in rows],
            "metric": [k[1] for k, _ in rows],
            "vhost": [k[2] for k, _ in rows],
            "name": [k[3] for k, _ in rows],
            "id": [k[4] for k, _ in rows],
            "n": [v for _, v in rows],
        },
    )
    if hours:
        names = ("vhost", "hour", "n", "bytes", "unroutable")
        yield _batch(
            "hour", {c: list(v) for c, v in zip(names, zip(*hours, strict=True), strict=True)}
        )
    for table in keys:
        yield _batch("key", {c: table[c] for c in table.column_names})


def _batch(kind: str, columns: dict[str, Any]) -> pa.RecordBatch:
    """A batch of ``_OUTPUT`` rows of one kind: the given columns, nulls for the others."""
    n = len(next(iter(columns.values())))
    arrays = []
    for f in _OUTPUT:
        if f.name == "kind":
            arrays.append(_repeat(kind, n))
        elif f.name in columns:
            values = columns[f.name]
            arrays.append(
                pa.array(values, f.type)
                if isinstance(values, list)
                else values.combine_chunks().cast(f.type)
            )
        else:
            arrays.append(pa.nulls(n, f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=_OUTPUT)


def analyse(
    spark: Any, scan: ArchiveScan, defs_list: list[Definitions], traffic_dir: Path | None = None
) -> Analysis:
    """One pass over the archive: counters for each of ``defs_list``; with ``traffic_dir``
    (the report's), the traffic table written there by the workers, one part per unit, and
    the totals per key and per hour collected."""
    from pyspark.sql import functions as F

    sensitive = sorted({x for d in defs_list for _, x in router_for(d).headers_sensitive()})
    units = plan_units(scan, spark.sparkContext.defaultParallelism)
    rows = [(json.dumps(u),) for u in units]
    shared = spark.sparkContext.broadcast(defs_list)
    target = None
    if traffic_dir is not None:
        traffic_dir.mkdir(parents=True, exist_ok=True)
        for old in traffic_dir.iterdir():  # an earlier report's parts
            if old.is_file():
                old.unlink()
        target = str(traffic_dir.resolve())

    def body(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        specs = (json.loads(s) for b in batches for s in b.column(0).to_pylist())
        started = time.perf_counter()
        defs = shared.value
        return analyse_units(specs, defs, sensitive, target, time.perf_counter() - started)

    source = spark.createDataFrame(spark.sparkContext.parallelize(rows, len(rows)), "unit STRING")
    dims = ["kind", "vhost", "exchange", "routing_key", "hour", "which", "metric", "name", "id"]
    summed = (
        source.mapInArrow(body, OUTPUT_SCHEMA)
        .groupBy(*dims)
        .agg(*(F.sum(c).alias(c) for c in ("n", "bytes", "unroutable")))
        .toArrow()
    )
    shared.unpersist()
    analysis = Analysis()
    kinds = summed["kind"]
    counters = summed.filter(pc.equal(kinds, "counter"))
    for which, metric, vhost, name, id_, n in zip(
        *(counters[c].to_pylist() for c in ("which", "metric", "vhost", "name", "id", "n")),
        strict=True,
    ):
        analysis.counters[(which, metric)][(vhost, name, id_)] = n
    if traffic_dir is not None:
        totals = ["n", "bytes", "unroutable"]
        named = ["messages", "bytes", "unroutable"]
        analysis.keys = _plain(
            summed.filter(pc.equal(kinds, "key"))
            .select(["vhost", "exchange", "routing_key", *totals])
            .rename_columns(["vhost", "exchange", "routing_key", *named])
        )
        analysis.hours = _plain(
            summed.filter(pc.equal(kinds, "hour"))
            .select(["vhost", "hour", *totals])
            .rename_columns(["vhost", "hour", *named])
        )
        analysis.traffic_rows = sum(analysis.get(ALL, "traffic_rows").values())
    return analysis


def _plain(table: pa.Table) -> pa.Table:
    """Spark's Arrow strings are ``large_string``; the tables use plain ``string``."""
    fields = [
        pa.field(f.name, pa.string() if pa.types.is_large_string(f.type) else f.type)
        for f in table.schema
    ]
    return table.cast(pa.schema(fields))


def stage_seconds(analysis: Analysis) -> dict[str, float]:
    """Seconds the workers spent per stage (``STAGES``), added up over all of them."""
    spent = analysis.get(ALL, "microseconds")
    return {
        stage: sum(n for (_, name, _), n in spent.items() if name == stage) / 1e6
        for stage in STAGES
    }


def unreadable(analysis: Analysis) -> list[str]:
    """``path: error`` of each archive part a worker could not read."""
    return sorted(name for (_, name, _) in analysis.get(ALL, "unreadable"))
