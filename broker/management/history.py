"""RabbitMQ's range parameters: `lengths_age`/`lengths_incr` and `msg_rates_age`/
`msg_rates_incr` on GET /api/overview, /api/queues/{vhost}/{name} and
/api/exchanges/{vhost}/{name}, answered from the rate sampler's history (broker/management/rates.py).

With `X_age=A&X_incr=I` (seconds), each `*_details` object the range covers gains, as in
RabbitMQ 3.10 (rabbit_mgmt_stats:format_range), `samples` — the counter's (or the queue
length's) value at every I seconds of the last A, newest first, as
`{"sample": value, "timestamp": ms}` — and, with two samples or more, `avg_rate` (per second,
oldest to newest sample) and `avg` (of the samples). `lengths` covers the message counts
(`messages`, `messages_ready`, `messages_unacknowledged`, or the overview's `queue_totals`),
`msg_rates` the `message_stats` counters (and the overview's `churn_rates`). Times that the
history does not reach (before the broker started, or an object was first sampled) have no
sample. Looking at a queue or an exchange keeps its history while it is looked at.

One wrapper (`ranged`) around the three handlers, in the route table: they build their rows
as ever, and this adds the samples to the JSON they answer.
"""

from __future__ import annotations

import json
import math
from typing import Any

from aiohttp import web

from .context import bad_request, broker_of, rates_of
from .rates import DEPTH_FIELDS

#: The range families this broker keeps (RabbitMQ also has data_rates and node_stats).
PREFIXES = ("lengths", "msg_rates")
#: The most samples one series may ask for.
MAX_SAMPLES = 1000


def ranges(request: web.Request) -> dict[str, tuple[int, int, int]]:
    """{prefix: (first, last, incr) in ms} for each range the query asks for; a range
    needs both its _age and _incr, as RabbitMQ's (one alone is no range)."""
    out = {}
    for prefix in PREFIXES:
        age, incr = request.query.get(prefix + "_age"), request.query.get(prefix + "_incr")
        if age is None or incr is None:
            continue
        try:
            age_s, incr_s = int(age), int(incr)
        except ValueError:
            raise bad_request(f"invalid_range_parameters: {prefix}_age and _incr") from None
        if age_s < 0 or incr_s <= 0 or age_s // incr_s >= MAX_SAMPLES:
            raise bad_request(
                f"invalid_range_parameters: {prefix}_age / {prefix}_incr must be from 0 to "
                f"{MAX_SAMPLES - 1} samples"
            )
        now = broker_of(request).clock.wall() * 1000
        step = incr_s * 1000
        last = math.ceil(now / step) * step  # (RabbitMQ's range_ceil): the newest sample is in
        out[prefix] = (last - age_s * 1000, last, step)
    return out


def _details(details: dict[str, Any], points: list[tuple[float, float]]) -> None:
    """RabbitMQ's samples, avg_rate and avg in one `*_details` (points oldest first)."""
    details["samples"] = [{"sample": _number(v), "timestamp": int(t)} for t, v in reversed(points)]
    if len(points) > 1:
        (t1, v1), (t2, v2) = points[0], points[-1]
        details["avg_rate"] = round((v2 - v1) * 1000 / (t2 - t1), 1) if t2 > t1 else 0.0
        details["avg"] = round(sum(v for _, v in points) / len(points), 1)


def _number(value: float) -> float | int:
    return int(value) if value == int(value) else value


def _counters(request: web.Request, key: Any, obj: Any, stats: Any, span: Any) -> None:
    """Samples into each `name_details` of `stats` the history has `name` for."""
    if not isinstance(stats, dict):
        return
    names = tuple(n for n in stats if f"{n}_details" in stats)
    series = rates_of(request).history.series(key, obj, names, *span)
    if series is None:
        return
    for name, points in series.items():
        _details(stats[f"{name}_details"], points)


def _lengths(request: web.Request, key: Any, obj: Any, row: dict[str, Any], span: Any) -> None:
    """Samples into the messages*_details of `row` (a queue's row, or `queue_totals`)."""
    series = rates_of(request).history.series(key, obj, DEPTH_FIELDS, *span)
    if series is None:
        return
    ready, unacked = series["_ready"], series["_unacked"]
    total = [(t, r + u) for (t, r), (_, u) in zip(ready, unacked, strict=True)]
    for field, points in (
        ("messages_ready", ready),
        ("messages_unacknowledged", unacked),
        ("messages", total),
    ):
        details = row.get(field + "_details")
        if isinstance(details, dict):
            _details(details, points)


def _overview(request: web.Request, body: dict[str, Any], asked: Any) -> None:
    if "msg_rates" in asked:
        _counters(request, "global", None, body.get("message_stats"), asked["msg_rates"])
        _counters(request, "churn", None, body.get("churn_rates"), asked["msg_rates"])
    if "lengths" in asked and isinstance(body.get("queue_totals"), dict):
        _lengths(request, "depth", None, body["queue_totals"], asked["lengths"])


def _object(request: web.Request) -> Any:
    """The queue or exchange the path names (the handler has answered 200: it exists)."""
    vhost = broker_of(request).vhosts.get(request.match_info["vhost"])
    name = request.match_info["name"]
    if vhost is None:
        return None
    if "/api/queues/" in request.path:
        return vhost.queues.get(name)
    return vhost.exchanges.get("" if name == "amq.default" else name)


def ranged(handler: Any) -> Any:
    """GET /api/overview's, a queue's or an exchange's handler, answering the range
    parameters too: its JSON gains the samples asked for. A queue or an exchange looked at
    keeps its history while it is looked at (`RateSampler.watch`)."""

    async def answer(request: web.Request) -> web.StreamResponse:
        asked = ranges(request)  # a bad range is a 400 before anything is done
        response = await handler(request)
        if not isinstance(response, web.Response) or response.status != 200:
            return response
        obj = None if "name" not in request.match_info else _object(request)
        if obj is not None:
            rates_of(request).watch(obj)
        if not asked or response.body is None:
            return response
        body = json.loads(response.body)  # type: ignore[arg-type]
        if obj is None:
            _overview(request, body, asked)
        else:
            if "msg_rates" in asked:
                span = asked["msg_rates"]
                _counters(request, id(obj), obj, body.get("message_stats"), span)
            if "lengths" in asked and "/api/queues/" in request.path:
                _lengths(request, id(obj), obj, body, asked["lengths"])
        return web.json_response(body)

    return answer
