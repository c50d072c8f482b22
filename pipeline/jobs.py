"""The Spark side: one pass over the archive that counts traffic and routes every envelope.

Plan (``analyse``):

1. The driver splits the archive's row groups (from the footers ``pipeline.reader`` already
   read) into about one *unit* per executor core, balanced by rows, and makes one Spark
   partition per unit.
2. ``mapInArrow`` over the units: each Python worker reads its row groups with pyarrow (only the
   columns it needs) and, per row group, lets Arrow group identical envelopes ``(vhost,
   exchange, routing_key, headers, recorded queues)`` -- headers are dropped first for messages
   whose route cannot depend on them (``Router.headers_sensitive``; CC/BCC always kept) -- and,
   for ``report``, traffic by ``(vhost, exchange, routing_key, hour)``. Partial groups are
   merged as they accumulate, so a unit ends with one row per distinct envelope however many
   rows it read; there is no per-row Python.
3. Each distinct envelope is routed with the broker's index: the definitions are broadcast
   once, and each worker builds its routers once and memoises routes across tasks (workers are
   reused), so an envelope is routed once per worker. Counters ``(which, metric, vhost, name,
   id, n)`` come out, beside the traffic rows.
4. Spark sums both (a small shuffle) and the driver collects them.

Reading with pyarrow in the workers rather than Spark's Parquet reader: on the benchmark machine
Spark's scan and hash aggregation of the string columns cost ~1-2 us a row, Arrow's read and
group-by ~0.3 us (docs/benchmarks.md "## Pipeline"). The archive must therefore be at the same
path on the driver and on every executor (a local disk in local mode, a shared mount on a
cluster). A row group that cannot be read is counted and reported, not fatal.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .definitions import Definitions
from .reader import ArchiveScan
from .router import Router

ALL = -1  # "which" of counters that do not depend on the definitions
#: What a worker's time is split into: reading Parquet, grouping identical envelopes (Arrow),
#: the report's traffic table (Arrow), routing each distinct envelope (Python, the index).
STAGES = ("read", "group", "traffic", "route")

OUTPUT_SCHEMA = (
    "kind STRING, vhost STRING, exchange STRING, routing_key STRING, hour BIGINT, which INT, "
    "metric STRING, name STRING, id BIGINT, n BIGINT, bytes BIGINT, unroutable BIGINT, "
    "deliveries BIGINT"
)
_OUTPUT = pa.schema(
    [
        ("kind", pa.string()),  # "traffic" or "counter"
        ("vhost", pa.string()),
        ("exchange", pa.string()),
        ("routing_key", pa.string()),
        ("hour", pa.int64()),  # hours since the epoch
        ("which", pa.int32()),
        ("metric", pa.string()),
        ("name", pa.string()),
        ("id", pa.int64()),
        ("n", pa.int64()),
        ("bytes", pa.int64()),
        ("unroutable", pa.int64()),
        ("deliveries", pa.int64()),
    ]
)
_KEYS = ["vhost", "exchange", "routing_key", "headers", "queues"]
_TRAFFIC = ["vhost", "exchange", "routing_key", "hour"]
_COLUMNS = [
    "ts",
    "vhost",
    "exchange",
    "routing_key",
    "headers",
    "body_size",
    "queue_count",
    "queues",
    "unroutable",
]
_US_PER_HOUR = 3_600_000_000
#: Partial groups are merged once this many rows have piled up.
_MERGE_ROWS = 1_000_000
#: Envelopes routed per worker are remembered up to this many, then forgotten all at once.
_MEMO_LIMIT = 2_000_000

# Where "CC" / "BCC" can appear as a key of an encoded field table: the key's length octet
# followed by its bytes. A false positive only keeps a message's headers.
_CC_MARKERS = (b"\x02CC", b"\x03BCC")

_ROUTERS: dict[str, Router] = {}  # per Python worker process, by definitions fingerprint
_MEMO: dict[tuple, int] = {}  # per worker: (fingerprints, envelope) -> outcome id
_OUTCOMES: list[tuple] = []  # outcome id -> routes under each definitions


def router_for(defs: Definitions) -> Router:
    router = _ROUTERS.get(defs.fingerprint)
    if router is None:
        if len(_ROUTERS) >= 4:
            _ROUTERS.clear()
        # No routing-key cache in the indexes: every envelope reaches them once (routes are
        # memoised here), so a cache would only churn (measured: a third of the routing time).
        router = _ROUTERS[defs.fingerprint] = Router(defs, cache_keys=0)
    return router


@dataclass
class Analysis:
    """What one pass found: counters by ``(which, metric)``, and the traffic table."""

    counters: dict[tuple[int, str], dict[tuple[str, str, int], int]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    traffic: Any = None  # a Spark DataFrame (see ``analyse``)
    persisted: Any = None

    def release(self) -> None:
        if self.persisted is not None:
            self.persisted.unpersist()
            self.persisted = None

    def get(self, which: int, metric: str) -> dict[tuple[str, str, int], int]:
        return self.counters.get((which, metric), {})

    def total(self, which: int, metric: str) -> int:
        return sum(self.get(which, metric).values())


def plan_units(scan: ArchiveScan, parallelism: int) -> list[list[tuple[str, list[int]]]]:
    """Row groups in ``parallelism`` units (more for big archives), balanced by rows."""
    count = max(1, parallelism, math.ceil(scan.rows / 20_000_000))
    pieces = [
        (rows, str(path), i)
        for path, groups in scan.row_groups.items()
        for i, rows in enumerate(groups)
        if rows
    ]
    pieces.sort(reverse=True)
    loads = [0] * count
    units: list[dict[str, list[int]]] = [{} for _ in range(count)]
    for rows, path, i in pieces:  # largest first onto the lightest unit
        k = loads.index(min(loads))
        loads[k] += rows
        units[k].setdefault(path, []).append(i)
    return [sorted((p, sorted(g)) for p, g in u.items()) for u in units if u]


def _separator(queues: pa.ChunkedArray) -> str:
    """A character no queue name in the column contains, to join the names into one key."""
    names = pc.list_flatten(queues)
    for sep in ("\x00", "\x01", "\x1f", "\x7f"):
        if not pc.any(pc.match_substring(names, sep)).as_py():
            return sep
    raise ValueError("queue names use every separator candidate")  # not in any real archive


def _keyed(table: pa.Table, sensitive: pa.Array) -> tuple[pa.Table, str]:
    """The grouping columns of an archive chunk: headers only where they matter, queues joined."""
    headers = table["headers"]
    keep = pc.is_in(table["exchange"], value_set=sensitive)
    for marker in _CC_MARKERS:
        keep = pc.or_(keep, pc.fill_null(pc.match_substring(headers, marker.decode()), False))
    sep = _separator(table["queues"])
    return pa.table(
        {
            "vhost": table["vhost"],
            "exchange": table["exchange"],
            "routing_key": table["routing_key"],
            "headers": pc.if_else(keep, headers, pa.scalar(None, pa.binary())),
            "queues": pc.binary_join(table["queues"], sep),
        }
    ), sep


class _Partials:
    """Group-bys of chunks (row count ``n`` plus summed measures), merged as they pile up."""

    def __init__(self, keys: list[str], sums: list[str]) -> None:
        self.keys, self.sums = keys, sums
        self.tables: list[pa.Table] = []
        self.rows = 0
        self.merged = 0  # rows of the last merge: merging again waits until as many more came

    def _group(self, table: pa.Table, count: tuple) -> pa.Table:
        grouped = table.group_by(self.keys, use_threads=False).aggregate(
            [count] + [(c, "sum") for c in self.sums]
        )
        names = [grouped.column_names[len(self.keys)]] + [f"{c}_sum" for c in self.sums]
        return grouped.select(self.keys + names).rename_columns(self.keys + ["n"] + self.sums)

    def add_rows(self, table: pa.Table) -> None:
        self.tables.append(self._group(table, ([], "count_all")))
        self.rows += self.tables[-1].num_rows
        if self.rows >= max(_MERGE_ROWS, 2 * self.merged) and len(self.tables) > 1:
            self.tables = [self.result()]
            self.rows = self.merged = self.tables[0].num_rows

    def result(self) -> pa.Table:
        if len(self.tables) == 1:
            return self.tables[0]
        return self._group(pa.concat_tables(self.tables), ("n", "sum"))


def _outcome(
    routers: list[Router],
    key: tuple,
    vhost: str,
    exchange: str,
    routing_key: str,
    headers: bytes | None,
) -> int:
    outcome = _MEMO.get(key)
    if outcome is None:
        if len(_MEMO) >= _MEMO_LIMIT:
            _MEMO.clear()
            _OUTCOMES.clear()
        outcome = _MEMO[key] = len(_OUTCOMES)
        _OUTCOMES.append(
            (vhost, exchange, [r.route(vhost, exchange, routing_key, headers) for r in routers])
        )
    return outcome


def _counters(
    envelopes: pa.Table,
    sep: str,
    routers: list[Router],
    fingerprints: tuple,
    counts: dict[tuple, int],
) -> None:
    """Route each distinct envelope (memoised per worker) and add up its counters."""
    pairs: dict[tuple[int, tuple], int] = {}
    columns = [envelopes[c].to_pylist() for c in (*_KEYS, "n")]
    for vhost, exchange, key, hdr, joined, n in zip(*columns, strict=True):
        outcome = _outcome(
            routers, (fingerprints, vhost, exchange, key, hdr), vhost, exchange, key, hdr
        )
        queues = tuple(joined.split(sep)) if joined else ()
        pair = (outcome, queues)
        pairs[pair] = pairs.get(pair, 0) + n
    for (outcome, queues), n in pairs.items():
        vhost, exchange, results = _OUTCOMES[outcome]
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
    units: Iterator[list[tuple[str, list[int]]]],
    defs_list: list[Definitions],
    sensitive: list[str],
    with_traffic: bool,
) -> Iterator[pa.RecordBatch]:
    """Read, group, route and count the row groups of each unit (``[(path, [row group])]``).

    Counters (``which`` = index into ``defs_list``; ``ALL`` for facts of the archive itself):
    ``ALL``: ``rows`` per vhost, ``fanout`` (id = queues reached), ``actual`` per queue,
    ``unreadable`` (name = file and error); per definitions: ``routed`` and
    ``unknown_exchange`` (name = exchange) rows, ``binding`` hits (id = binding id), ``agree``
    (routed to exactly the recorded queues), and per queue ``added`` (routed there, not
    recorded), ``lost`` (recorded, not routed there) and ``unchanged`` (both); and
    ``microseconds`` (name = stage: read, group, traffic, route) each worker spent per stage.
    """
    routers = [router_for(d) for d in defs_list]
    fingerprints = tuple(d.fingerprint for d in defs_list)
    sensitive_names = pa.array(sensitive, pa.string())
    counts: dict[tuple, int] = defaultdict(int)
    traffic = _Partials(_TRAFFIC, ["bytes", "unroutable", "deliveries"])
    columns = _COLUMNS if with_traffic else _COLUMNS[1:5] + ["queues"]
    spent = dict.fromkeys(STAGES, 0.0)  # seconds of this worker per stage
    clock = time.perf_counter
    for spec in units:
        envelopes: dict[str, _Partials] = {}  # by the separator joining queue names
        for path, groups in spec:
            t0 = clock()
            try:
                table = pq.ParquetFile(path).read_row_groups(
                    groups, columns=list(dict.fromkeys(columns)), use_threads=False
                )
            except (OSError, pa.ArrowException) as exc:
                why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                counts[(ALL, "unreadable", "", f"{path}: {why}", 0)] += 1
                continue
            t1 = clock()
            spent["read"] += t1 - t0
            keyed, sep = _keyed(table, sensitive_names)
            if sep not in envelopes:
                envelopes[sep] = _Partials(_KEYS, [])
            envelopes[sep].add_rows(keyed)
            t2 = clock()
            spent["group"] += t2 - t1
            if with_traffic:
                traffic.add_rows(
                    pa.table(
                        {
                            "vhost": table["vhost"],
                            "exchange": table["exchange"],
                            "routing_key": table["routing_key"],
                            "hour": pc.divide(table["ts"].cast(pa.int64()), _US_PER_HOUR),
                            "bytes": table["body_size"],
                            "unroutable": table["unroutable"].cast(pa.int64()),
                            "deliveries": table["queue_count"].cast(pa.int64()),
                        }
                    )
                )
                spent["traffic"] += clock() - t2
        t0 = clock()
        distinct = [(sep, partials.result()) for sep, partials in envelopes.items()]
        t1 = clock()
        spent["group"] += t1 - t0
        for sep, table in distinct:
            _counters(table, sep, routers, fingerprints, counts)
        spent["route"] += clock() - t1
    t0 = clock()
    traffic_rows = traffic.result() if with_traffic and traffic.tables else None
    spent["traffic"] += clock() - t0
    for stage, seconds in spent.items():
        counts[(ALL, "microseconds", "", stage, 0)] += round(seconds * 1e6)
    if counts:
        rows = list(counts.items())
        n = len(rows)
        yield pa.RecordBatch.from_pydict(
            {
                "kind": ["counter"] * n,
                "vhost": [k[2] for k, _ in rows],
                "exchange": [None] * n,
                "routing_key": [None] * n,
                "hour": [None] * n,
                "which": [k[0] for k, _ in rows],
                "metric": [k[1] for k, _ in rows],
                "name": [k[3] for k, _ in rows],
                "id": [k[4] for k, _ in rows],
                "n": [v for _, v in rows],
                "bytes": [None] * n,
                "unroutable": [None] * n,
                "deliveries": [None] * n,
            },
            schema=_OUTPUT,
        )
    if traffic_rows is not None:
        t = traffic_rows
        n = t.num_rows
        nulls = {
            name: pa.nulls(n, _OUTPUT.field(name).type)
            for name in ("which", "metric", "name", "id")
        }
        yield from pa.table(
            {
                "kind": pa.array(["traffic"] * n, pa.string()),
                "vhost": t["vhost"],
                "exchange": t["exchange"],
                "routing_key": t["routing_key"],
                "hour": t["hour"],
                **nulls,
                "n": t["n"],
                "bytes": t["bytes"],
                "unroutable": t["unroutable"],
                "deliveries": t["deliveries"],
            },
            schema=_OUTPUT,
        ).to_batches()


def analyse(
    spark: Any, scan: ArchiveScan, defs_list: list[Definitions], with_traffic: bool = False
) -> Analysis:
    """One pass over the archive: counters for each of ``defs_list``, and traffic if asked.

    The counters are collected (they are small); the traffic stays a Spark DataFrame (it has a
    row per vhost, exchange, routing key and hour: millions over days), persisted so the
    report's queries on it do not read the archive again. Call ``Analysis.release`` after.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    sensitive = sorted({x for d in defs_list for _, x in router_for(d).headers_sensitive()})
    units = plan_units(scan, spark.sparkContext.defaultParallelism)
    rows = [(json.dumps(u),) for u in units]
    shared = spark.sparkContext.broadcast(defs_list)

    def body(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        specs = (json.loads(s) for b in batches for s in b.column(0).to_pylist())
        return analyse_units(specs, shared.value, sensitive, with_traffic)

    source = spark.createDataFrame(spark.sparkContext.parallelize(rows, len(rows)), "unit STRING")
    dims = ["kind", "vhost", "exchange", "routing_key", "hour", "which", "metric", "name", "id"]
    summed = (
        source.mapInArrow(body, OUTPUT_SCHEMA)
        .groupBy(*dims)
        .agg(*(F.sum(c).alias(c) for c in ("n", "bytes", "unroutable", "deliveries")))
    )
    if with_traffic:
        summed = summed.persist(StorageLevel.MEMORY_AND_DISK)
    counters = (
        summed.filter(F.col("kind") == "counter")
        .select("which", "metric", "vhost", "name", "id", "n")
        .toArrow()
    )
    shared.unpersist()
    analysis = Analysis()
    for which, metric, vhost, name, id_, n in zip(
        *(counters[c].to_pylist() for c in ("which", "metric", "vhost", "name", "id", "n")),
        strict=True,
    ):
        analysis.counters[(which, metric)][(vhost, name, id_)] = n
    if with_traffic:
        analysis.traffic = summed.filter(F.col("kind") == "traffic").select(
            "vhost",
            "exchange",
            "routing_key",
            F.date_format(F.timestamp_seconds(F.col("hour") * 3600), "yyyy-MM-dd'T'HH").alias(
                "hour"
            ),
            F.col("n").alias("messages"),
            "bytes",
            "unroutable",
            "deliveries",
        )
        analysis.persisted = summed
    return analysis


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
