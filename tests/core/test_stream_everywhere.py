"""Streams everywhere else: management rows, Prometheus, definitions, the traffic archive and
the pipeline, route explain — each through pika against a real broker.

The row fields are RabbitMQ 3.10.8's for a stream (probed: `type: stream`, `messages` =
`messages_ready` = retained, `messages_unacknowledged` 0 whatever the consumers hold,
`members`/`online`/`readers`), plus RoarMQ's `segments`, `first_offset`, `last_offset`
and, in each consumer's row, `offset`/`offset_lag` (the names RabbitMQ's stream plugin gives
its consumers' positions).
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from roarmq.broker.core.stream import Stream
from roarmq.broker.testing import BrokerThread, ephemeral_config

pytestmark = pytest.mark.timeout(120)

PERSISTENT = pika.BasicProperties(delivery_mode=2)
RETENTION = {
    "x-queue-type": "stream",
    "x-max-length-bytes": 10_000_000,
    "x-max-age": "7D",
    "x-stream-max-segment-size-bytes": 4096,
}


def connect(b) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(b.url))


def fill(b, n: int = 50, name: str = "s") -> pika.BlockingConnection:
    conn = connect(b)
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments=RETENTION)
    ch.confirm_delivery()
    for i in range(n):
        ch.basic_publish("", name, b"%03d" % i + b"x" * 200, PERSISTENT)
    ch.close()
    return conn


def hold(conn, queue: str, prefetch: int, tag: str) -> list[int]:
    """A consumer from `first` that takes `prefetch` deliveries and acks none."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=prefetch)
    got: list[int] = []
    ch.basic_consume(
        queue,
        lambda _c, _m, props, _b: got.append(props.headers["x-stream-offset"]),
        arguments={"x-stream-offset": "first"},
        consumer_tag=tag,
    )
    deadline = time.monotonic() + 5
    while len(got) < prefetch and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    return got


def test_management_rows(b):
    conn = fill(b)
    assert hold(conn, "s", 10, "c1") == list(range(10))
    node = b.broker.node_name
    status, row = b.api("GET", "/api/queues/%2F/s")
    assert status == 200
    assert row["type"] == "stream"
    assert (row["messages"], row["messages_ready"], row["messages_unacknowledged"]) == (50, 50, 0)
    assert row["consumers"] == 1
    assert (row["members"], row["online"], row["readers"]) == ([node], [node], {node: 1})
    assert row["segments"] > 1  # 4 KiB segments
    assert (row["first_offset"], row["last_offset"]) == (0, 49)
    assert row["message_bytes"] > 50 * 200
    assert row["arguments"] == RETENTION
    (detail,) = row["consumer_details"]
    assert (detail["consumer_tag"], detail["offset"], detail["offset_lag"]) == ("c1", 10, 40)
    listed = next(r for r in b.api("GET", "/api/queues")[1] if r["name"] == "s")
    assert (listed["messages"], listed["segments"], listed["last_offset"]) == (
        50,
        row["segments"],
        49,
    )
    (consumer,) = b.api("GET", "/api/consumers")[1]
    assert (consumer["queue"]["name"], consumer["offset"], consumer["offset_lag"]) == ("s", 10, 40)
    # a classic queue's consumer row has no stream fields
    ch = conn.channel()
    ch.queue_declare("classic")
    ch.basic_consume("classic", lambda *a: None, consumer_tag="c2")
    conn.process_data_events(0.2)
    rows = {r["consumer_tag"]: r for r in b.api("GET", "/api/consumers")[1]}
    assert "offset" not in rows["c2"] and rows["c1"]["offset"] == 10
    conn.close()


def scrape(b, path: str) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(b.mgmt_url + path, timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_management_purge_and_get_refused_as_rabbitmq_does(b):
    """Purge and get from the management API on a stream: RabbitMQ 3.10.8's 400s and texts
    (probed), not an internal error; the stream keeps its messages."""
    fill(b, 3).close()
    status, body = b.api("DELETE", "/api/queues/%2F/s/contents")
    assert (status, body) == (
        400,
        {
            "error": "bad_request",
            "reason": "queue.purge not supported by stream queues queue 's' in vhost '/'",
        },
    )
    get = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}
    status, body = b.api("POST", "/api/queues/%2F/s/get", get)
    assert (status, body) == (
        400,
        {
            "error": "bad_request",
            "reason": "540 basic.get not supported by stream queues queue 's' in vhost '/'",
        },
    )
    assert b.api("GET", "/api/queues/%2F/s")[1]["messages"] == 3


def test_prometheus_families(b):
    conn = fill(b)
    hold(conn, "s", 10, "c1")
    segments = b.call(lambda: len(b.broker.vhosts["/"].queues["s"].segs))
    m = scrape(b, "/metrics")
    assert m[("roarmq_stream_messages", ())] == 50
    assert m[("roarmq_stream_segments", ())] == segments > 1
    assert m[("roarmq_stream_bytes", ())] > 50 * 200
    assert m[("roarmq_stream_filter_chunks_skipped_total", ())] == 0
    assert m[("rabbitmq_stream_consumer_max_offset_lag", ())] == 40
    assert m[("rabbitmq_queue_messages", ())] == 50  # retained, none "unacked" (RabbitMQ's)
    assert m[("rabbitmq_queue_messages_unacked", ())] == 0
    per = scrape(b, "/metrics/per-object")
    key = (("queue", "s"), ("vhost", "/"))
    assert per[("roarmq_stream_messages", key)] == 50
    assert per[("roarmq_stream_segments", key)] == segments
    assert per[("roarmq_stream_first_offset", key)] == 0
    assert per[("roarmq_stream_committed_offset", key)] == 49
    assert per[("rabbitmq_stream_consumer_max_offset_lag", key)] == 40
    assert per[("rabbitmq_queue_messages", key)] == 50
    conn.close()


def test_definitions_round_trip(b, tmp_path):
    conn = fill(b, 5)
    conn.close()
    status, doc = b.api("GET", "/api/definitions")
    assert status == 200
    (row,) = [q for q in doc["queues"] if q["name"] == "s"]
    assert row == {
        "name": "s",
        "vhost": "/",
        "durable": True,
        "auto_delete": False,
        "arguments": RETENTION,
    }
    assert b.api("POST", "/api/definitions", doc)[0] in (200, 201, 204)  # the same: a no-op
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "other")), management=True) as other:
        assert other.api("POST", "/api/definitions", json.loads(json.dumps(doc)))[0] in (
            200,
            201,
            204,
        )
        q = other.call(lambda: other.broker.vhosts["/"].queues["s"])
        assert type(q) is Stream and q.queue_type == "stream"
        assert (q.max_length_bytes, q.max_age, q.segment_size) == (10_000_000, "7D", 4096)
        assert other.api("GET", "/api/definitions")[1]["queues"] == doc["queues"]
        # a working stream: it takes publishes and replays them
        conn = fill(other, 3)
        got = hold(conn, "s", 3, "c")
        assert got == [0, 1, 2]
        conn.close()


def test_route_explain_shows_streams(b):
    conn = fill(b, 3)
    ch = conn.channel()
    ch.exchange_declare("events", "topic")
    ch.queue_declare("audit")
    ch.queue_bind("s", "events", "order.#")
    ch.queue_bind("audit", "events", "#")
    body = {"routing_key": "order.new", "headers": {"x-stream-filter-value": "emea"}}
    status, result = b.api("POST", "/api/route/%2F/events", body)
    assert status == 200
    assert result["queues"] == ["audit", "s"] and result["streams"] == ["s"]
    types = {r["destination"]: r["queue_type"] for r in result["bindings"]}
    assert types == {"s": "stream", "audit": "classic"}
    note = "stream 's': appended at offset 3 (retained, not removed by consuming)"
    assert f"{note}, filter value 'emea'" in result["notes"]
    result = b.api("GET", "/api/route/%2F/amq.default?routing_key=s")[1]
    assert result["streams"] == ["s"] and result["bindings"][0]["queue_type"] == "stream"
    assert any("no filter value" in n for n in result["notes"])
    result = b.api("GET", "/api/route/%2F/events?routing_key=other")[1]
    assert result["streams"] == [] and result["queues"] == ["audit"]
    conn.close()


def _archive_broker(root: Path) -> BrokerThread:
    cfg = ephemeral_config(
        data_dir=str(root / "data"),
        archive={"enabled": True, "dir": str(root / "archive"), "batch_rows": 8},
    )
    return BrokerThread(cfg, management=True)


def _record_stream_traffic(root: Path) -> dict:
    with _archive_broker(root) as b:
        conn = fill(b, 20)  # through the default exchange
        ch = conn.channel()
        ch.exchange_declare("events", "direct")
        ch.queue_declare("plain")
        ch.queue_bind("s", "events", "k")
        ch.queue_bind("plain", "events", "k")
        ch.confirm_delivery()
        for _ in range(10):
            ch.basic_publish("events", "k", b"both", PERSISTENT)
        conn.close()
        doc = b.api("GET", "/api/definitions")[1]
    (root / "current.json").write_text(json.dumps(doc))
    return doc


def test_the_archive_records_stream_publishes(tmp_path):
    from roarmq.broker.archive import live_files, partitions

    _record_stream_traffic(tmp_path)
    import pyarrow.parquet as pq

    rows = [
        r
        for _, _, directory in partitions(tmp_path / "archive")
        for path in live_files(directory)
        for r in pq.read_table(path).to_pylist()
    ]
    to_stream = [r for r in rows if r["exchange"] == ""]
    assert len(to_stream) == 20
    assert all(r["queues"] == ["s"] and r["queue_count"] == 1 for r in to_stream)
    both = [r for r in rows if r["exchange"] == "events"]
    assert len(both) == 10 and all(r["queues"] == ["plain", "s"] for r in both)


@pytest.mark.slow
def test_the_pipeline_counts_stream_publishes(tmp_path):
    from roarmq.pipeline.cli import main

    _record_stream_traffic(tmp_path)
    out = tmp_path / "report"
    code = main(
        [
            "report",
            "--archive",
            str(tmp_path / "archive"),
            "--definitions",
            str(tmp_path / "current.json"),
            "--out",
            str(out),
            "--master",
            "local[1]",
        ]
    )
    assert code == 0
    import pyarrow.parquet as pq

    queues = {
        (r["vhost"], r["queue"]): r["messages"]
        for r in pq.read_table(out / "queues.parquet").to_pylist()
    }
    assert queues[("/", "s")] == 30 and queues[("/", "plain")] == 10
    summary = json.loads((out / "summary.json").read_text())
    assert summary["agree_rate"] == 1.0  # the definitions route to the stream as the broker did
