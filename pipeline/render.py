"""HTML pages with PNG charts (matplotlib, Agg backend) for ``report`` and ``whatif``.

Charts go to ``<out>/charts/``; the page links them relatively, so the output directory can be
copied or served as it is. Tables on the page are capped (``MAX_ROWS``); the Parquet files hold
everything.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

MAX_ROWS = 50
MAX_BARS = 20

#: The default exchange's one name on every page, chart and table (RabbitMQ's UI says so too).
DEFAULT_EXCHANGE = "(AMQP default)"
#: Columns that hold an exchange name, shown as DEFAULT_EXCHANGE when empty.
_EXCHANGE_COLUMNS = frozenset({"exchange", "source"})
#: One colour per meaning across both pages: what the broker recorded, what the current and
#: the candidate definitions route, what the candidate adds and loses.
COLOURS = {
    "actually received": "#7f7f7f",
    "current": "#1f77b4",
    "candidate": "#9467bd",
    "added": "#2ca02c",
    "lost": "#d62728",
}
_DEFAULT_COLOUR = "#1f77b4"

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1100px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0; }
.note { color: #666; font-size: 0.9em; }
"""


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.2%}" if 0 <= value <= 1 else f"{value:,.2f}"
    return str(value)


def _table(table: pa.Table, columns: Sequence[str] | None = None, limit: int = MAX_ROWS) -> str:
    columns = list(columns or table.column_names)
    rows = table.select(columns).slice(0, limit).to_pylist()
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for row in rows:
        cells = []
        for c in columns:
            v = row[c]
            if c in _EXCHANGE_COLUMNS and v == "":
                v = DEFAULT_EXCHANGE
            num = isinstance(v, int | float) and not isinstance(v, bool)
            cells.append(
                f'<td class="n">{_fmt(v)}</td>'
                if num
                else f"<td>{html.escape(_fmt(v) if v is not None else '')}</td>"
            )
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = ""
    if table.num_rows > limit:
        more = f'<p class="note">{limit} of {table.num_rows:,} rows shown.</p>'
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{more}"


def _summary(summary: dict[str, Any], keys: Sequence[str]) -> str:
    rows = "".join(
        f"<tr><th>{html.escape(k.replace('_', ' '))}</th>"
        f'<td class="n">{html.escape(_fmt(summary[k]))}</td></tr>'
        for k in keys
        if k in summary
    )
    return f"<table>{rows}</table>"


def _skipped(summary: dict[str, Any]) -> str:
    """Files the driver skipped (unreadable or of another schema) and files the executors
    could not read (the run then also fails, see `pipeline.cli`)."""
    parts = []
    skipped = summary.get("files_skipped") or []
    if skipped:
        items = "".join(
            f"<li><code>{html.escape(s['path'])}</code>: {html.escape(s['reason'])}</li>"
            for s in skipped[:MAX_ROWS]
        )
        parts.append(f"<h2>Skipped files</h2><ul>{items}</ul>")
    unreadable = summary.get("unreadable") or []
    if unreadable:
        items = "".join(f"<li><code>{html.escape(u)}</code></li>" for u in unreadable[:MAX_ROWS])
        parts.append(
            "<h2>Files the executors could not read</h2>"
            '<p class="note">The counts on this page leave these files out.</p>'
            f"<ul>{items}</ul>"
        )
    return "".join(parts)


def _save(fig: Any, out: Path, name: str) -> str:
    charts = out / "charts"
    charts.mkdir(exist_ok=True)
    fig.tight_layout()
    fig.savefig(charts / name, dpi=100)
    _plt().close(fig)
    return f'<img src="charts/{name}" alt="{html.escape(name)}">'


def _short(text: str, limit: int = 70) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _key_label(vhost: str, exchange: str, key: str | None = None) -> str:
    """ "exchange 'logs', key 'app.info' (vhost /)": each part named, none read as a path."""
    text = f"exchange '{exchange}'" if exchange else DEFAULT_EXCHANGE
    if key is not None:
        text += f", key '{key}'"
    return _short(f"{text} (vhost {vhost})")


def _binding_label(r: dict[str, Any]) -> str:
    source = f"'{r['source']}'" if r["source"] else DEFAULT_EXCHANGE
    return _short(f"{source} → {r['destination']}, key '{r['routing_key']}' (vhost {r['vhost']})")


def _queue_label(vhost: str, queue: str) -> str:
    return _short(f"{queue} (vhost {vhost})")


def _barh(
    out: Path, name: str, title: str, labels: list[str], series: dict[str, list[float]], xlabel: str
) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, max(2.5, 0.35 * len(labels) + 1)))
    n = len(series)
    height = 0.8 / max(n, 1)
    for i, (legend, values) in enumerate(series.items()):
        ys = [y + i * height for y in range(len(labels))]
        colour = COLOURS.get(legend, _DEFAULT_COLOUR)
        bars = ax.barh(ys, values, height=height, label=legend, color=colour)
        ax.bar_label(bars, labels=[_fmt(v) for v in values], fontsize=7, padding=2)
    ax.margins(x=0.12)  # room for the longest bar's label
    ax.set_yticks([y + height * (n - 1) / 2 for y in range(len(labels))])
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    if n > 1:
        ax.legend()
    return _save(fig, out, name)


def _page(title: str, body: str) -> str:
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}'
        f"</title><style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>{body}"
        "</body></html>\n"
    )


def render_report(out: Path, tables: dict[str, pa.Table], summary: dict[str, Any]) -> Path:
    plt = _plt()
    parts = [
        _summary(
            summary,
            [
                "archive",
                "definitions",
                "window",
                "files_read",
                "rows_read",
                "rows_routed",
                "rows_unknown_exchange",
                "unroutable",
                "unroutable_rate",
                "agree_rate",
                "bindings",
                "bindings_never_matched",
            ],
        )
    ]
    if summary.get("agree_rate", 1) < 0.99:
        parts.append(
            '<p class="note">Routing with these definitions reproduces the recorded '
            "queues for fewer than 99% of messages: the definitions may not describe "
            "this window.</p>"
        )
    parts.append(_skipped(summary))

    hourly = tables["hourly"]
    parts.append("<h2>Messages per hour</h2>")
    if hourly.num_rows:
        # Bars, one group per hour: a window of one hour is one group, not a lone dot.
        fig, ax = plt.subplots(figsize=(10, 3.5))
        hours = sorted(set(hourly["hour"].to_pylist()))
        vhosts = sorted(set(hourly["vhost"].to_pylist()))
        width = 0.8 / len(vhosts)
        for i, vhost in enumerate(vhosts):
            rows = [r for r in hourly.to_pylist() if r["vhost"] == vhost]
            counts = {r["hour"]: r["messages"] for r in rows}
            ax.bar(
                [x + (i - (len(vhosts) - 1) / 2) * width for x in range(len(hours))],
                [counts.get(h, 0) for h in hours],
                width=width,
                label=f"vhost {vhost}",
            )
        step = max(1, len(hours) // 12)
        ax.set_xticks(range(0, len(hours), step))
        ax.set_xticklabels(hours[::step], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("messages")
        ax.set_title(
            "Messages per hour (UTC)" if len(hours) > 1 else f"Messages in one hour: {hours[0]}"
        )
        ax.legend()
        parts.append(_save(fig, out, "hourly.png"))

    top = tables["top_keys"]
    parts.append("<h2>Top routing keys</h2>")
    if top.num_rows:
        best = top.sort_by([("messages", "descending")]).slice(0, MAX_BARS).to_pylist()
        parts.append(
            _barh(
                out,
                "top_keys.png",
                "Top routing keys",
                [_key_label(r["vhost"], r["exchange"], r["routing_key"]) for r in best],
                {"messages": [r["messages"] for r in best]},
                "messages",
            )
        )
        parts.append(_table(top))

    fan = tables["fanout"]
    parts.append("<h2>Fan-out (queues a message reached)</h2>")
    if fan.num_rows:
        fig, ax = plt.subplots(figsize=(8, 3))
        totals: dict[int, int] = {}
        for r in fan.to_pylist():
            totals[r["queues"]] = totals.get(r["queues"], 0) + r["messages"]
        xs = sorted(totals)
        bars = ax.bar([str(x) for x in xs], [totals[x] for x in xs], color=_DEFAULT_COLOUR)
        # Every bar carries its count: a bar too small to see still says how many.
        ax.bar_label(bars, labels=[_fmt(totals[x]) for x in xs], fontsize=8, padding=2)
        ax.margins(y=0.15)
        ax.set_xlabel("queues reached (0 = unroutable)")
        ax.set_ylabel("messages")
        ax.set_title("Messages by number of queues reached")
        parts.append(_save(fig, out, "fanout.png"))
        parts.append(_table(fan))

    ex = tables["exchanges"]
    parts.append("<h2>Unroutable messages by exchange</h2>")
    if ex.num_rows:
        best = ex.slice(0, MAX_BARS).to_pylist()
        parts.append(
            _barh(
                out,
                "unroutable.png",
                "Unroutable rate by exchange (busiest first)",
                [_key_label(r["vhost"], r["exchange"]) for r in best],
                {"unroutable rate": [r["unroutable_rate"] for r in best]},
                "unroutable / messages",
            )
        )
        parts.append(_table(ex))

    b = tables["bindings"]
    parts.append("<h2>Binding hits</h2>")
    if b.num_rows:
        ranked = b.sort_by([("hits", "descending")])
        best = ranked.slice(0, MAX_BARS).to_pylist()
        parts.append(
            _barh(
                out,
                "bindings.png",
                "Most used bindings",
                [_binding_label(r) for r in best],
                {"hits": [r["hits"] for r in best]},
                "messages matched",
            )
        )
        parts.append(_table(ranked))
        never = b.filter(pa.compute.equal(b["hits"], 0))
        parts.append(f"<h2>Bindings that never matched ({never.num_rows:,})</h2>")
        if never.num_rows:
            parts.append(_table(never))

    q = tables["queues"]
    parts.append("<h2>Messages per queue (as recorded)</h2>")
    parts.append(_table(q))
    path = out / "report.html"
    path.write_text(_page("RoarMQ traffic report", "".join(parts)))
    return path


def render_whatif(out: Path, tables: dict[str, pa.Table], summary: dict[str, Any]) -> Path:
    parts = [
        _summary(
            summary,
            [
                "archive",
                "definitions",
                "candidate",
                "window",
                "files_read",
                "rows_read",
                "rows_routed",
                "rows_unknown_exchange",
                "messages_changed",
                "deliveries_actual",
                "deliveries_candidate",
                "deliveries_added",
                "deliveries_lost",
                "current_agree_rate",
            ],
        )
    ]
    if summary.get("current_agree_rate", 1) < 0.99:
        parts.append(
            '<p class="note">The current definitions reproduce the recorded queues '
            "for fewer than 99% of messages: they may not describe this window.</p>"
        )
    parts.append(_skipped(summary))
    q = tables["queues"]
    changed = q.filter(
        pa.compute.or_(pa.compute.greater(q["added"], 0), pa.compute.greater(q["lost"], 0))
    )
    parts.append(f"<h2>Queues whose traffic changes ({changed.num_rows:,} of {q.num_rows:,})</h2>")
    if changed.num_rows:
        rows = sorted(changed.to_pylist(), key=lambda r: -(r["added"] + r["lost"]))[:MAX_BARS]
        labels = [_queue_label(r["vhost"], r["queue"]) for r in rows]
        parts.append(
            _barh(
                out,
                "queues.png",
                "Messages per queue: recorded vs candidate",
                labels,
                {
                    "actually received": [r["actual"] for r in rows],
                    "candidate": [r["candidate"] for r in rows],
                },
                "messages",
            )
        )
        parts.append(
            _barh(
                out,
                "changes.png",
                "Added and lost messages per queue",
                labels,
                {"added": [r["added"] for r in rows], "lost": [r["lost"] for r in rows]},
                "messages",
            )
        )
        parts.append(_table(changed.sort_by([("change", "descending")])))
    parts.append("<h2>All queues</h2>")
    parts.append(_table(q))
    b = tables["bindings"]
    diff = b.filter(
        pa.compute.or_(pa.compute.invert(b["in_current"]), pa.compute.invert(b["in_candidate"]))
    )
    parts.append(f"<h2>Bindings added or removed ({diff.num_rows:,})</h2>")
    if diff.num_rows:
        rows = diff.to_pylist()[:MAX_BARS]
        parts.append(
            _barh(
                out,
                "bindings.png",
                "Hits of added / removed bindings",
                [_binding_label(r) for r in rows],
                {
                    "current": [r["hits_current"] for r in rows],
                    "candidate": [r["hits_candidate"] for r in rows],
                },
                "messages matched",
            )
        )
        parts.append(_table(diff))
    parts.append("<h2>All bindings</h2>")
    parts.append(_table(b.sort_by([("hits_candidate", "descending")])))
    path = out / "whatif.html"
    path.write_text(_page("RoarMQ what-if: candidate definitions", "".join(parts)))
    return path
