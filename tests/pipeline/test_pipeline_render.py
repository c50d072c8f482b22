"""The report and what-if pages: one name for the default exchange, labels that name their
parts, charts that show a one-hour window and small bars, one colour per meaning."""

from __future__ import annotations

import pyarrow as pa
import pytest

from roarmq.pipeline import render


@pytest.fixture
def figures(monkeypatch):
    """Every chart the page makes, by file name, before it is written."""
    made = {}
    save = render._save

    def keep(fig, out, name):
        made[name] = fig.axes[0]
        return save(fig, out, name)

    monkeypatch.setattr(render, "_save", keep)
    return made


def report_tables() -> dict[str, pa.Table]:
    return {
        "hourly": pa.table(
            {
                "vhost": ["/"],
                "hour": ["2024-06-01T13"],
                "messages": [10_000],
                "bytes": [1],
                "unroutable": [3],
            }
        ),
        "top_keys": pa.table(
            {
                "vhost": ["/", "/"],
                "rank": [1, 2],
                "exchange": ["", "logs"],
                "routing_key": ["orders", "app.info"],
                "messages": [9_000, 1_000],
                "bytes": [1, 1],
            }
        ),
        "fanout": pa.table({"vhost": ["/", "/"], "queues": [0, 1], "messages": [3, 9_997]}),
        "exchanges": pa.table(
            {
                "vhost": ["/", "/"],
                "exchange": ["", "logs"],
                "messages": [9_000, 1_000],
                "unroutable": [0, 3],
                "unroutable_rate": [0.0, 0.003],
            }
        ),
        "bindings": pa.table(
            {
                "vhost": ["/"],
                "source": ["logs"],
                "destination_type": ["queue"],
                "destination": ["q.app"],
                "routing_key": ["app.*"],
                "arguments": ["{}"],
                "hits": [997],
            }
        ),
        "queues": pa.table({"vhost": ["/"], "queue": ["q.app"], "messages": [997]}),
    }


def test_report_page_names_and_charts(tmp_path, figures):
    page = render.render_report(tmp_path, report_tables(), {"agree_rate": 1.0}).read_text()
    # The default exchange has one name in tables and charts, never a blank cell.
    assert "<td>(AMQP default)</td>" in page and "<td></td>" not in page
    top = [t.get_text() for t in figures["top_keys.png"].get_yticklabels()]
    assert top == [
        "(AMQP default), key 'orders' (vhost /)",
        "exchange 'logs', key 'app.info' (vhost /)",
    ]
    bindings = [t.get_text() for t in figures["bindings.png"].get_yticklabels()]
    assert bindings == ["'logs' → q.app, key 'app.*' (vhost /)"]
    # One hour is a bar with a title that says so, not a lone dot.
    hourly = figures["hourly.png"]
    assert hourly.get_title() == "Messages in one hour: 2024-06-01T13"
    assert len(hourly.patches) == 1 and not hourly.lines
    # The fan-out chart has a title, and its 3 unroutable messages are labelled, though the
    # bar is too small to see beside 9,997.
    fan = figures["fanout.png"]
    assert fan.get_title() == "Messages by number of queues reached"
    assert [t.get_text() for t in fan.texts] == ["3", "9,997"]


def test_whatif_uses_one_colour_per_meaning(tmp_path, figures):
    queues = pa.table(
        {
            "vhost": ["/"],
            "queue": ["q.app"],
            "actual": [10],
            "current": [10],
            "candidate": [7],
            "added": [2],
            "lost": [5],
            "unchanged": [5],
            "change": [-3],
        }
    )
    bindings = pa.table(
        {
            "vhost": ["/"],
            "source": [""],
            "destination_type": ["queue"],
            "destination": ["q.app"],
            "routing_key": ["q.app"],
            "arguments": ["{}"],
            "in_current": [True],
            "in_candidate": [False],
            "hits_current": [5],
            "hits_candidate": [0],
        }
    )
    render.render_whatif(tmp_path, {"queues": queues, "bindings": bindings}, {})
    seen: dict[str, tuple] = {}
    for ax in figures.values():
        handles, legends = ax.get_legend_handles_labels()
        for handle, legend in zip(handles, legends, strict=True):
            colour = tuple(handle.patches[0].get_facecolor())
            assert seen.setdefault(legend, colour) == colour, legend
    assert {"actually received", "candidate", "added", "lost", "current"} <= set(seen)
    assert len(set(seen.values())) == len(seen)  # no two meanings share a colour
