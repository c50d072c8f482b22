"""``report``: what flowed through the broker in a window, and which bindings it used.

Tables (Parquet, in the output directory):

* ``traffic.parquet``  vhost, exchange, routing_key, hour, messages, bytes, unroutable, deliveries
  (a directory of part files: Spark's executors write it, it can have millions of rows)
* ``hourly.parquet``   vhost, hour, messages, bytes, unroutable
* ``top_keys.parquet`` vhost, rank, exchange, routing_key, messages, bytes (top N per vhost)
* ``exchanges.parquet`` vhost, exchange, messages, unroutable, unroutable_rate
* ``fanout.parquet``   vhost, queues (how many a message reached), messages
* ``queues.parquet``   vhost, queue, messages (as recorded)
* ``bindings.parquet`` every binding of the definitions with its hits, including zero

Fan-out, unroutable and per-queue counts are what the broker recorded; binding hits come from
routing every envelope through the definitions with the broker's index. ``agree_rate`` in
``summary.json`` says how often that routing reproduces the recorded queues: well below 1 means
the definitions do not describe the window.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .definitions import Definitions
from .jobs import ALL, Analysis, analyse, stage_seconds, unreadable
from .reader import ArchiveScan

TOP_KEYS = 25


def bindings_table(defs: Definitions, counters: Analysis, which: int) -> pa.Table:
    hits = {id_: n for (_, _, id_), n in counters.get(which, "binding").items()}
    rows = [
        {
            "vhost": b.vhost,
            "source": b.source,
            "destination_type": b.destination_type,
            "destination": b.destination,
            "routing_key": b.routing_key,
            "arguments": b.arguments_json(),
            "hits": hits.get(b.id, 0),
        }
        for b in defs.bindings
    ]
    schema = pa.schema(
        [
            ("vhost", pa.string()),
            ("source", pa.string()),
            ("destination_type", pa.string()),
            ("destination", pa.string()),
            ("routing_key", pa.string()),
            ("arguments", pa.string()),
            ("hits", pa.int64()),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def _sorted(table: pa.Table, keys: list[tuple[str, str]]) -> pa.Table:
    return table.sort_by(keys) if table.num_rows else table


def derive(traffic: Any, top: int = TOP_KEYS) -> dict[str, pa.Table]:
    """hourly, top_keys and exchanges, aggregated by Spark from the traffic DataFrame."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    def total(c: str) -> Any:
        return F.sum(c).cast("long").alias(c)

    hourly = (
        traffic.groupBy("vhost", "hour")
        .agg(total("messages"), total("bytes"), total("unroutable"))
        .orderBy("vhost", "hour")
    )
    keys = traffic.groupBy("vhost", "exchange", "routing_key").agg(
        total("messages"), total("bytes")
    )
    rank = Window.partitionBy("vhost").orderBy(F.desc("messages"), "exchange", "routing_key")
    top_keys = (
        keys.withColumn("rank", F.row_number().over(rank))
        .filter(F.col("rank") <= top)
        .select("vhost", "rank", "exchange", "routing_key", "messages", "bytes")
        .orderBy("vhost", "rank")
    )
    exchanges = (
        traffic.groupBy("vhost", "exchange")
        .agg(total("messages"), total("unroutable"))
        .withColumn("unroutable_rate", F.col("unroutable") / F.col("messages"))
        .orderBy("vhost", F.desc("messages"), "exchange")
    )
    return {
        name: _plain(df.toArrow())
        for name, df in (("hourly", hourly), ("top_keys", top_keys), ("exchanges", exchanges))
    }


def _plain(table: pa.Table) -> pa.Table:
    """Spark's Arrow strings are ``large_string``; the tables use plain ``string``."""
    fields = [
        pa.field(f.name, pa.string() if pa.types.is_large_string(f.type) else f.type)
        for f in table.schema
    ]
    return table.cast(pa.schema(fields))


def counter_tables(counters: Analysis) -> dict[str, pa.Table]:
    fanout = [
        {"vhost": v, "queues": i, "messages": n}
        for (v, _, i), n in counters.get(ALL, "fanout").items()
    ]
    queues = [
        {"vhost": v, "queue": q, "messages": n}
        for (v, q, _), n in counters.get(ALL, "actual").items()
    ]
    fan = pa.Table.from_pylist(
        fanout,
        schema=pa.schema(
            [("vhost", pa.string()), ("queues", pa.int32()), ("messages", pa.int64())]
        ),
    )
    que = pa.Table.from_pylist(
        queues,
        schema=pa.schema(
            [("vhost", pa.string()), ("queue", pa.string()), ("messages", pa.int64())]
        ),
    )
    return {
        "fanout": _sorted(fan, [("vhost", "ascending"), ("queues", "ascending")]),
        "queues": _sorted(
            que, [("vhost", "ascending"), ("messages", "descending"), ("queue", "ascending")]
        ),
    }


def run_report(
    spark: Any, scan: ArchiveScan, defs: Definitions, out: Path, top: int = TOP_KEYS
) -> dict[str, Any]:
    """Compute, write and render the report; returns the summary (also ``summary.json``)."""
    from .render import render_report

    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    counters = analyse(spark, scan, [defs], with_traffic=True)
    analysed = time.perf_counter()
    try:
        # Written by the executors: a row per vhost, exchange, key and hour can be millions.
        traffic_path = out / "traffic.parquet"
        counters.traffic.write.mode("overwrite").parquet(f"file://{traffic_path.resolve()}")
        tables = {
            **derive(counters.traffic, top),
            **counter_tables(counters),
            "bindings": bindings_table(defs, counters, 0),
        }
    finally:
        counters.release()
    paths = [traffic_path]
    for name, table in tables.items():
        path = out / f"{name}.parquet"
        pq.write_table(table, path)
        paths.append(path)

    rows = counters.total(ALL, "rows")
    unroutable = int(pc.sum(tables["exchanges"]["unroutable"]).as_py() or 0)
    bindings = tables["bindings"]
    summary = {
        "command": "report",
        "archive": str(scan.root),
        "definitions": defs.path,
        "window": scan.window,
        "files_read": len(scan.files),
        "files_skipped": [{"path": str(p), "reason": why} for p, why in scan.skipped],
        "unreadable": unreadable(counters),
        "rows_in_files": scan.rows,
        "rows_read": rows,
        "rows_routed": counters.total(0, "routed"),
        "rows_unknown_exchange": counters.total(0, "unknown_exchange"),
        "unroutable": unroutable,
        "unroutable_rate": unroutable / rows if rows else 0.0,
        "agree_rate": counters.total(0, "agree") / rows if rows else 0.0,
        "bindings": bindings.num_rows,
        "bindings_never_matched": int(pc.sum(pc.equal(bindings["hits"], 0)).as_py() or 0),
        "unknown_exchanges": sorted(
            {f"{v}/{x}" for (v, x, _) in counters.get(0, "unknown_exchange")}
        ),
    }
    html = render_report(out, tables, summary)
    summary["seconds"] = {
        "analyse": analysed - started,  # the Spark job: read, group, route, sum
        "output": time.perf_counter() - analysed,  # tables, charts, page
        "workers": stage_seconds(counters),  # inside the analysis, all workers added up
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    summary["outputs"] = [str(p) for p in (*paths, out / "summary.json", html)]
    return summary
