"""Stream filtering through pika against a real broker.

Publishers set the `x-stream-filter-value` header; consumers pass `x-stream-filter` (a
string or an array of strings) and `x-stream-match-unfiltered`. RoarMQ skips whole chunks
by their bitmap of filter values and then filters message by message, so what a consumer
gets is exactly what it asked for (RabbitMQ 3.13's Bloom filter needs a client-side pass).
"""

from __future__ import annotations

import time

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker
from support.faultlib import BrokerProcess

pytestmark = pytest.mark.timeout(90)

STREAM = {"x-queue-type": "stream"}
VALUES = ("emea", "amer", "apac")


def connect(target) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.URLParameters(target.url() if callable(target.url) else target.url)
    )


def props(value: str | None) -> pika.BasicProperties:
    headers = None if value is None else {"x-stream-filter-value": value}
    return pika.BasicProperties(delivery_mode=2, headers=headers)


def publish(conn, queue: str, values: list[str | None]) -> None:
    """Publish one message per value (body "<i>"), fast, then wait until all are there."""
    ch = conn.channel()
    for i, value in enumerate(values):
        ch.basic_publish("", queue, str(i).encode(), props(value))
    ch.close()
    deadline = time.monotonic() + 20
    want = None
    while time.monotonic() < deadline:
        n = conn.channel().queue_declare(queue, passive=True).method.message_count
        want = n
        if n >= len(values):
            return
        time.sleep(0.05)
    raise AssertionError(f"{want} of {len(values)} messages retained")


def read(conn, queue: str, arguments: dict, count: int, timeout: float = 5.0):
    """(x-stream-offset, filter value, body) of what a consumer gets: `count` or what came
    within `timeout`, then nothing more within a short grace."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=200)
    got: list[tuple[int, str | None, bytes]] = []

    def on_message(ch_, method, p, body) -> None:
        headers = p.headers or {}
        got.append((headers["x-stream-offset"], headers.get("x-stream-filter-value"), body))
        ch_.basic_ack(method.delivery_tag)

    ch.basic_consume(queue, on_message, arguments={"x-stream-offset": "first", **arguments})
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    conn.process_data_events(0.3)  # anything extra would show up now
    return got


def expected(values: list[str | None], wanted, unfiltered: bool):
    return [
        (i, v, str(i).encode())
        for i, v in enumerate(values)
        if (v in wanted if v is not None else unfiltered)
    ]


def interleaved(n: int) -> list[str | None]:
    """The three values round-robin, every seventh message without a value."""
    return [None if i % 7 == 3 else VALUES[i % 3] for i in range(n)]


def skipped(thread_broker, name: str) -> int:
    return thread_broker.call(
        lambda: thread_broker.broker.vhosts["/"].queues[name].filter_chunks_skipped
    )


def test_one_value_list_and_match_unfiltered(thread_broker):
    conn = connect(thread_broker)
    conn.channel().queue_declare("s", durable=True, arguments=STREAM)
    values = interleaved(3000)  # every chunk (index block) holds all three values
    publish(conn, "s", values)

    want = expected(values, {"emea"}, False)
    got = read(conn, "s", {"x-stream-filter": "emea"}, len(want))
    assert got == want  # exactly those, in order, with their offsets: no client pass

    want = expected(values, {"amer", "apac"}, False)
    assert read(conn, "s", {"x-stream-filter": ["amer", "apac"]}, len(want)) == want

    want = expected(values, {"apac"}, True)
    args = {"x-stream-filter": "apac", "x-stream-match-unfiltered": True}
    assert read(conn, "s", args, len(want)) == want

    args = {"x-stream-filter": "apac", "x-stream-match-unfiltered": False}
    want = expected(values, {"apac"}, False)
    assert read(conn, "s", args, len(want)) == want

    # without x-stream-filter: everything (match-unfiltered alone changes nothing)
    got = read(conn, "s", {"x-stream-match-unfiltered": False}, len(values))
    assert [o for o, _, _ in got] == list(range(len(values)))
    # a value nobody published: nothing, and every closed chunk is skipped unread
    assert read(conn, "s", {"x-stream-filter": "nowhere"}, 1, timeout=1) == []
    conn.close()


def test_live_tailing_filtered(thread_broker):
    conn = connect(thread_broker)
    conn.channel().queue_declare("t", durable=True, arguments=STREAM)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=50)
    got: list = []
    ch.basic_consume(
        "t",
        lambda c, m, p, b: (
            got.append((p.headers["x-stream-offset"], b)),
            c.basic_ack(m.delivery_tag),
        ),
        arguments={"x-stream-filter": "amer"},
    )
    values = interleaved(300)
    publish(conn, "t", values)
    want = [(o, b) for o, _, b in expected(values, {"amer"}, False)]
    deadline = time.monotonic() + 5
    while len(got) < len(want) and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    conn.process_data_events(0.2)
    assert got == want
    conn.close()


def test_selective_filter_skips_chunks(thread_broker):
    conn = connect(thread_broker)
    conn.channel().queue_declare("s", durable=True, arguments=STREAM)
    # 4 chunks of only "emea"/"amer", then a few "apac" at the end
    values: list[str | None] = ["emea" if i % 2 else "amer" for i in range(4096)]
    values += ["apac"] * 20
    publish(conn, "s", values)
    before = skipped(thread_broker, "s")
    want = expected(values, {"apac"}, False)
    assert read(conn, "s", {"x-stream-filter": "apac"}, len(want)) == want
    assert skipped(thread_broker, "s") - before >= 4
    # with match-unfiltered, chunks without unfiltered messages are still skipped
    before = skipped(thread_broker, "s")
    args = {"x-stream-filter": "apac", "x-stream-match-unfiltered": True}
    assert read(conn, "s", args, len(want)) == want
    assert skipped(thread_broker, "s") - before >= 4
    # a consumer of "amer" reads those chunks: nothing skipped
    before = skipped(thread_broker, "s")
    want = expected(values, {"amer"}, False)
    assert read(conn, "s", {"x-stream-filter": "amer"}, len(want)) == want
    assert skipped(thread_broker, "s") == before
    conn.close()


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        (
            {"x-stream-filter": 5},
            "PRECONDITION_FAILED - invalid arg 'x-stream-filter' for queue 's' in vhost '/': "
            "expected a string or a non-empty array of strings",
        ),
        (
            {"x-stream-filter": []},
            "PRECONDITION_FAILED - invalid arg 'x-stream-filter' for queue 's' in vhost '/': "
            "expected a string or a non-empty array of strings",
        ),
        (
            {"x-stream-filter": "a", "x-stream-match-unfiltered": "yes"},
            "PRECONDITION_FAILED - invalid arg 'x-stream-match-unfiltered' for queue 's' in "
            "vhost '/': expected a boolean",
        ),
    ],
)
def test_bad_filter_arguments(thread_broker, arguments, text):
    conn = connect(thread_broker)
    conn.channel().queue_declare("s", durable=True, arguments=STREAM)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.basic_consume("s", lambda *a: None, arguments=arguments)
    assert (exc.value.reply_code, exc.value.reply_text) == (406, text)
    conn.close()


@pytest.mark.parametrize("crash", [False, True], ids=["restart", "kill-9"])
def test_filtering_survives_restart(tmp_path, crash):
    proc = BrokerProcess(tmp_path / "data").start()
    try:
        conn = connect(proc)
        args = {**STREAM, "x-stream-max-segment-size-bytes": 65536}
        conn.channel().queue_declare("s", durable=True, arguments=args)
        values = ["emea"] * 2048 + interleaved(1000)
        publish(conn, "s", values)
        time.sleep(0.3)  # retained = fsynced
        if crash:
            proc.kill9()
        else:
            conn.close()
            proc.stop()
        proc.start()
        conn = connect(proc)
        conn.channel().queue_declare("s", durable=True, arguments=args)
        for wanted, unfiltered in (({"apac"}, False), ({"emea", "amer"}, True)):
            want = expected(values, wanted, unfiltered)
            arguments = {"x-stream-filter": sorted(wanted), "x-stream-match-unfiltered": unfiltered}
            assert read(conn, "s", arguments, len(want)) == want
        # appended after the restart: the same values get the same answers
        more = interleaved(30)
        ch = conn.channel()
        for i, value in enumerate(more):
            ch.basic_publish("", "s", str(len(values) + i).encode(), props(value))
        values += more
        time.sleep(0.5)
        want = expected(values, {"apac"}, False)
        assert read(conn, "s", {"x-stream-filter": "apac"}, len(want)) == want
        conn.close()
    finally:
        proc.stop()
