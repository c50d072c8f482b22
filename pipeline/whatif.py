"""``whatif``: what each queue would have received under candidate definitions.

Every archived envelope is routed twice with the broker's index, once with the current
definitions and once with the candidate, and compared with the queues the broker recorded for it
("actually received"). Tables:

* ``queues.parquet``   vhost, queue, actual, current, candidate, added, lost, unchanged, change
  (``added``: the candidate routes it there, the broker did not; ``lost``: the reverse;
  ``unchanged``: both; ``candidate`` = added + unchanged, ``actual`` = lost + unchanged)
* ``bindings.parquet`` the union of both files' bindings: in_current, in_candidate,
  hits_current, hits_candidate
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

CURRENT, CANDIDATE = 0, 1


def queues_table(counters: Analysis, current: Definitions, candidate: Definitions) -> pa.Table:
    names: set[tuple[str, str]] = set(current.queues) | set(candidate.queues)
    cols: dict[str, dict[tuple[str, str], int]] = {}
    cols["actual"] = {(v, q): n for (v, q, _), n in counters.get(ALL, "actual").items()}
    for which, label in ((CURRENT, "current"), (CANDIDATE, "candidate")):
        for metric in ("added", "unchanged", "lost"):
            cols[f"{label}.{metric}"] = {
                (v, q): n for (v, q, _), n in counters.get(which, metric).items()
            }
    for values in cols.values():
        names |= set(values)
    rows = []
    for vhost, queue in sorted(names):
        k = (vhost, queue)
        added = cols["candidate.added"].get(k, 0)
        lost = cols["candidate.lost"].get(k, 0)
        unchanged = cols["candidate.unchanged"].get(k, 0)
        actual = cols["actual"].get(k, 0)
        current = cols["current.added"].get(k, 0) + cols["current.unchanged"].get(k, 0)
        rows.append(
            {
                "vhost": vhost,
                "queue": queue,
                "actual": actual,
                "current": current,
                "candidate": added + unchanged,
                "added": added,
                "lost": lost,
                "unchanged": unchanged,
                "change": added - lost,
                "in_candidate": k in candidate.queues,
            }
        )
    schema = pa.schema(
        [
            ("vhost", pa.string()),
            ("queue", pa.string()),
            ("actual", pa.int64()),
            ("current", pa.int64()),
            ("candidate", pa.int64()),
            ("added", pa.int64()),
            ("lost", pa.int64()),
            ("unchanged", pa.int64()),
            ("change", pa.int64()),
            ("in_candidate", pa.bool_()),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def bindings_diff(counters: Analysis, current: Definitions, candidate: Definitions) -> pa.Table:
    merged: dict[tuple, dict[str, Any]] = {}
    for which, defs, label in ((CURRENT, current, "current"), (CANDIDATE, candidate, "candidate")):
        hits = {id_: n for (_, _, id_), n in counters.get(which, "binding").items()}
        for b in defs.bindings:
            key = (
                b.vhost,
                b.source,
                b.destination_type,
                b.destination,
                b.routing_key,
                b.arguments_json(),
            )
            row = merged.setdefault(
                key,
                {
                    "vhost": b.vhost,
                    "source": b.source,
                    "destination_type": b.destination_type,
                    "destination": b.destination,
                    "routing_key": b.routing_key,
                    "arguments": key[-1],
                    "in_current": False,
                    "in_candidate": False,
                    "hits_current": 0,
                    "hits_candidate": 0,
                },
            )
            row[f"in_{label}"] = True
            row[f"hits_{label}"] = hits.get(b.id, 0)
    schema = pa.schema(
        [
            ("vhost", pa.string()),
            ("source", pa.string()),
            ("destination_type", pa.string()),
            ("destination", pa.string()),
            ("routing_key", pa.string()),
            ("arguments", pa.string()),
            ("in_current", pa.bool_()),
            ("in_candidate", pa.bool_()),
            ("hits_current", pa.int64()),
            ("hits_candidate", pa.int64()),
        ]
    )
    return pa.Table.from_pylist([merged[k] for k in sorted(merged)], schema=schema)


def run_whatif(
    spark: Any, scan: ArchiveScan, current: Definitions, candidate: Definitions, out: Path
) -> dict[str, Any]:
    """Compute, write and render the comparison; returns the summary (also ``summary.json``)."""
    from .render import render_whatif

    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    counters = analyse(spark, scan, [current, candidate])
    analysed = time.perf_counter()
    tables = {
        "queues": queues_table(counters, current, candidate),
        "bindings": bindings_diff(counters, current, candidate),
    }
    paths = []
    for name, table in tables.items():
        path = out / f"{name}.parquet"
        pq.write_table(table, path)
        paths.append(path)
    rows = counters.total(ALL, "rows")
    q = tables["queues"]
    summary = {
        "command": "whatif",
        "archive": str(scan.root),
        "definitions": current.path,
        "candidate": candidate.path,
        "window": scan.window,
        "files_read": len(scan.files),
        "files_skipped": [{"path": str(p), "reason": why} for p, why in scan.skipped],
        "unreadable": unreadable(counters),
        "rows_in_files": scan.rows,
        "rows_read": rows,
        "rows_routed": counters.total(CANDIDATE, "routed"),
        "rows_unknown_exchange": counters.total(CANDIDATE, "unknown_exchange"),
        "deliveries_actual": int(pc.sum(q["actual"]).as_py() or 0),
        "deliveries_candidate": int(pc.sum(q["candidate"]).as_py() or 0),
        "deliveries_added": int(pc.sum(q["added"]).as_py() or 0),
        "deliveries_lost": int(pc.sum(q["lost"]).as_py() or 0),
        "messages_changed": rows - counters.total(CANDIDATE, "agree"),
        "current_agree_rate": counters.total(CURRENT, "agree") / rows if rows else 0.0,
        "unknown_exchanges": sorted(
            {f"{v}/{x}" for (v, x, _) in counters.get(CANDIDATE, "unknown_exchange")}
        ),
    }
    html = render_whatif(out, tables, summary)
    summary["seconds"] = {
        "analyse": analysed - started,  # the Spark job: read, group, route, sum
        "output": time.perf_counter() - analysed,  # tables, charts, page
        "workers": stage_seconds(counters),  # inside the analysis, all workers added up
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    summary["outputs"] = [str(p) for p in (*paths, out / "summary.json", html)]
    return summary
