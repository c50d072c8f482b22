"""``report``: what flowed through the broker in a window, and which bindings it used.

Tables (Parquet, in the output directory):

* ``traffic.parquet``  vhost, exchange, routing_key, hour, messages, bytes, unroutable, deliveries
  (a directory of part files, one per unit of work, written by the executors' workers;
  it can have millions of rows)
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


def derive(analysis: Analysis, top: int = TOP_KEYS) -> dict[str, pa.Table]:
    """hourly, top_keys and exchanges, from the per-hour and per-key totals Spark summed."""
    hourly = _sorted(analysis.hours, [("vhost", "ascending"), ("hour", "ascending")])
    keys = analysis.keys
    ranked = _sorted(
        keys,
        [
            ("vhost", "ascending"),
            ("messages", "descending"),
            ("exchange", "ascending"),
            ("routing_key", "ascending"),
        ],
    )
    # The first `top` rows of each vhost's run (the table is sorted by vhost first).
    vhosts = ranked["vhost"].to_pylist() if ranked.num_rows else []
    picked, ranks, rank, previous = [], [], 0, None
    for i, vhost in enumerate(vhosts):
        rank = rank + 1 if vhost == previous else 1
        previous = vhost
        if rank <= top:
            picked.append(i)
            ranks.append(rank)
    chosen = ranked.take(pa.array(picked, pa.int64()))
    top_keys = pa.table(
        {
            "vhost": chosen["vhost"],
            "rank": pa.array(ranks, pa.int32()),
            "exchange": chosen["exchange"],
            "routing_key": chosen["routing_key"],
            "messages": chosen["messages"],
            "bytes": chosen["bytes"],
        }
    )
    per_exchange = (
        keys.group_by(["vhost", "exchange"], use_threads=False)
        .aggregate([("messages", "sum"), ("unroutable", "sum")])
        .rename_columns(["vhost", "exchange", "messages", "unroutable"])
    )
    exchanges = per_exchange.append_column(
        "unroutable_rate",
        pc.divide(per_exchange["unroutable"].cast(pa.float64()), per_exchange["messages"]),
    )
    exchanges = _sorted(
        exchanges,
        [("vhost", "ascending"), ("messages", "descending"), ("exchange", "ascending")],
    )
    return {"hourly": hourly, "top_keys": top_keys, "exchanges": exchanges}


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
    # The workers write traffic.parquet themselves, a part per unit: it has a row per vhost,
    # exchange, key and hour (millions over days) and never passes through the driver.
    traffic_path = out / "traffic.parquet"
    counters = analyse(spark, scan, [defs], traffic_dir=traffic_path)
    analysed = time.perf_counter()
    tables = {
        **derive(counters, top),
        **counter_tables(counters),
        "bindings": bindings_table(defs, counters, 0),
    }
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
        "traffic_rows": counters.traffic_rows,
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
