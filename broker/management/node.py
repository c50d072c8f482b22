"""The node as a whole: overview, nodes, health checks, aliveness, parameters, extensions,
and the Prometheus scrape."""

from __future__ import annotations

import asyncio
import gc
import os
import time
from typing import Any

from aiohttp import web
from prometheus_client import generate_latest

from roarmq.protocol.frames import ContentHeader
from roarmq.protocol.properties import BasicProperties

from .. import __version__
from ..core.definitions_json import RABBITMQ_API_VERSION
from ..core.message import Message
from ..ops.stalls import GC_WATCH
from ..routing import EXCHANGE_TYPES
from .context import SERVER, bad_request, broker_of, not_found, rates_of, vhosts_of
from .metrics import churn_counts, global_counts


def _exchange_types() -> list[dict[str, Any]]:
    """GET /api/overview's exchange_types: the registry's, by name, as RabbitMQ lists them."""
    return [
        {"name": t.name, "description": t.description, "enabled": True}
        for t in sorted(EXCHANGE_TYPES.values(), key=lambda t: t.name)
    ]


async def metrics(request: web.Request) -> web.Response:
    """/metrics (aggregated families) and /metrics/per-object (a series per queue)."""
    server = request.app[SERVER]
    return web.Response(
        body=generate_latest(
            server.per_object if request.path.endswith("/per-object") else server.registry
        ),
        content_type="text/plain",
        charset="utf-8",
    )


async def overview(request: web.Request) -> web.Response:
    b, rates = broker_of(request), rates_of(request)
    queues = [q for v in b.vhosts.values() for q in v.queues.values()]
    ready = sum(q.message_count() for q in queues)
    unacked = sum(q.unacked for q in queues)
    return web.json_response(
        {
            "product_name": "RoarMQ",
            "product_version": __version__,
            "management_version": __version__,
            # The RabbitMQ API level this one follows (tools branch on it).
            "rabbitmq_version": RABBITMQ_API_VERSION,
            "cluster_name": b.cluster_name,
            "node": b.node_name,
            "message_stats": rates.stats("global", global_counts(b)),
            "churn_rates": rates.stats("churn", churn_counts(b)),
            "exchange_types": _exchange_types(),
            "queue_totals": {
                "messages": ready + unacked,
                "messages_ready": ready,
                "messages_unacknowledged": unacked,
                **rates.depth("depth"),
            },
            "object_totals": {
                "channels": sum(len(c.channels) for c in b.connections),
                "connections": len(b.connections),
                "queues": len(queues),
                "exchanges": sum(len(v.exchanges) for v in b.vhosts.values()),
                "consumers": sum(q.consumer_count for q in queues),
            },
            "listeners": _listeners(b),
            "memory_alarm": "memory" in b.alarms,
            "disk_free_alarm": "disk" in b.alarms,
            "mem_used": b.resources.rss,
            "mem_limit": b.resources.high,
            "disk_free": b.resources.disk_free,
            "disk_free_limit": b.resources.disk_limit,
            "message_store": b.store_status(),
        }
    )


def _listeners(b: Any) -> list[dict[str, Any]]:
    # One row an address, as RabbitMQ: ``bound`` and ``ports`` are parallel lists (one entry
    # a socket); crossing them listed every address once for every address.
    rows = [
        {"node": b.node_name, "protocol": "amqp", "ip_address": host, "port": port}
        for host, port in zip(b.bound, b.ports, strict=False)
    ]
    if b.tls is not None:
        rows += [
            {
                "node": b.node_name,
                "protocol": "amqp/ssl",
                "ip_address": h,
                "port": b.tls.port,
            }
            for h in (b.tls.bound or ["127.0.0.1"])
        ]
    scheme = "https" if b.config.management.tls.enabled else "http"
    rows.append(
        {
            "node": b.node_name,
            "protocol": scheme,
            "ip_address": b.config.management.bind,
            "port": b.mgmt_port,
        }
    )
    return rows


async def nodes(request: web.Request) -> web.Response:
    b = broker_of(request)
    res = b.resources
    node = {
        "name": b.node_name,
        "type": "disc",
        "running": True,
        "mem_used": res.rss,
        "mem_limit": res.high,
        "mem_alarm": "memory" in b.alarms,
        "disk_free": res.disk_free,
        "disk_free_limit": res.disk_limit,
        "disk_free_alarm": "disk" in b.alarms,
        "message_store": b.store_status(),
        "uptime": int((time.time() - b.totals.started) * 1000),
        "processors": os.cpu_count(),
    }
    rows = b.cluster.node_rows(node)
    if "name" in request.match_info:
        for row in rows:
            if row["name"] == request.match_info["name"]:
                return web.json_response(row)
        raise not_found()
    return web.json_response(rows)


async def aliveness(request: web.Request) -> web.Response:
    """RabbitMQ's aliveness test: declare a queue, publish to it and get the message."""
    vhost = vhosts_of(request)[0]
    queue, _ = vhost.declare_queue("aliveness-test", None, durable=False)
    props = BasicProperties()
    msg = Message("", queue.name, ContentHeader.from_properties(props, body_size=4), b"test")
    vhost.enqueue(msg, [queue])
    entry = queue.get()
    if entry is None or entry.msg.body != b"test":
        return web.json_response({"status": "failed", "reason": "no message"}, status=503)
    queue.stats_get_no_ack += 1
    queue.stats_no_ack += 1
    queue.settle(entry)
    return web.json_response({"status": "ok"})


async def health_ok(request: web.Request) -> web.Response:
    # A single node with nothing mirrored or replicated: these checks always pass.
    return web.json_response({"status": "ok"})


async def quorum_critical(request: web.Request) -> web.Response:
    """RabbitMQ's node-is-quorum-critical: 503 when stopping this node now would leave a
    replicated vhost without enough live in-sync copies to confirm (its `min_in_sync`),
    or without any to lead it; the vhost's durable queues are listed as RabbitMQ lists
    the quorum queues that would lose their quorum."""
    b = broker_of(request)
    if len(b.cluster.nodes()) == 1:  # the cluster's only node (not: the only one running)
        return web.json_response({"status": "ok", "reason": "single node cluster"})
    critical = b.cluster.quorum_critical()
    if not critical:
        return web.json_response({"status": "ok"})
    queues = [
        {
            "name": queue.name,
            "readable_name": f"queue '{queue.name}' in vhost '{name}'",
            "virtual_host": name,
            "type": queue.queue_type,
        }
        for name in critical
        if (vhost := b.vhosts.get(name)) is not None
        for queue in vhost.queues.values()
        if queue.durable
    ]
    return web.json_response(
        {
            "status": "failed",
            "reason": "There are quorum queues that would lose their quorum if the target "
            "node is shut down",
            "queues": queues,
            "vhosts": critical,
        },
        status=503,
    )


async def alarms(request: web.Request) -> web.Response:
    """RabbitMQ's alarms check, and a message store that cannot write counts as one."""
    b = broker_of(request)
    reasons = [f"{name} alarm" for name in sorted(b.alarms)]
    store = b.store_status()
    if store["state"] == "failed":
        reasons.append(f"message store failed: {store['error']}")
    if reasons:
        return web.json_response({"status": "failed", "reason": "; ".join(reasons)}, status=503)
    return web.json_response({"status": "ok"})


async def port_listener(request: web.Request) -> web.Response:
    b = broker_of(request)
    port = request.match_info["port"]
    listening = [str(p) for p in b.ports]
    if b.tls is not None:
        listening.append(str(b.tls.port))
    listening.append(str(b.mgmt_port))
    if port in listening:
        return web.json_response({"status": "ok", "port": int(port)})
    reason = f"No active listener on port {port}"
    return web.json_response({"status": "failed", "reason": reason}, status=503)


async def protocol_listener(request: web.Request) -> web.Response:
    b = broker_of(request)
    protocol = request.match_info["protocol"]
    have = {"amqp": bool(b.ports), "amqp/ssl": b.tls is not None}
    have["amqps"] = have["amqp/ssl"]
    have["http"] = True
    if have.get(protocol):
        return web.json_response({"status": "ok", "protocol": protocol})
    reason = f"No active listener for protocol {protocol}"
    return web.json_response({"status": "failed", "reason": reason}, status=503)


async def extensions(request: web.Request) -> web.Response:
    return web.json_response([])


async def global_parameters(request: web.Request) -> web.Response:
    return web.json_response([{"name": "cluster_name", "value": broker_of(request).cluster_name}])


async def archive_roll(request: web.Request) -> web.Response:
    """POST /api/archive/roll (administrator; `roarmq ctl archive_roll`): close every open
    archive journal into its Parquet file now, so the pipeline reads up to this moment
    while the broker runs. Answers once the files are written."""
    archive = broker_of(request).archive
    if archive is None:
        raise bad_request("the archive is off: set [archive] enabled = true (docs/operations.md)")
    try:
        result = await asyncio.wrap_future(archive.roll())
    except RuntimeError as exc:  # closing with the broker
        raise bad_request(f"the archive cannot roll now: {exc}") from None
    return web.json_response({**result, "dir": str(archive.root.resolve())})


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


async def stalls(request: web.Request) -> web.Response:
    """GET /api/diagnostics/stalls[?since=ID]: the event-loop stalls the probe kept (those
    after stall ID), the jobs' run times and the collector's passes (docs/operations.md)."""
    b = broker_of(request)
    diagnostics = b.config.diagnostics
    since = request.query.get("since", "0")
    if not since.isdigit():
        raise bad_request("since: must be a stall id (a whole number)")
    lag, jobs = b.loop_lag, b.clock.jobs
    kept = [s.as_json() for s in lag.stalls if s.id > int(since)] if lag is not None else []
    return web.json_response(
        {
            "probe_ms": diagnostics.loop_lag_probe_ms if lag is not None else 0,
            "threshold_ms": diagnostics.stall_threshold_ms,
            "recorded": lag.recorded if lag is not None else 0,
            "by_kind": dict(lag.by_kind) if lag is not None else {},
            "stalls": kept,
            "jobs": sorted(
                (
                    {"name": name, "runs": runs, "total_ms": _ms(total), "max_ms": _ms(most)}
                    for name, (runs, total, most) in (jobs.jobs.items() if jobs else ())
                ),
                key=lambda j: -j["max_ms"],
            ),
            "gc": {
                "idle_passes": b.gc_schedule.idle_passes if b.gc_schedule else None,
                "thresholds": list(gc.get_threshold()),
                "pending": list(gc.get_count()),
                # start-up's objects frozen (a `roarmq serve` process); never counted here:
                # gc.get_freeze_count() walks the whole frozen list (ms per 30,000 objects)
                "frozen_at_start": b.gc_schedule is not None,
                "generations": [
                    {
                        "generation": n,
                        "collections": g.collections,
                        "pause_total_ms": _ms(g.seconds),
                        "pause_max_ms": _ms(g.longest),
                        "collected": g.collected,
                        "uncollectable": g.uncollectable,
                    }
                    for n, g in enumerate(GC_WATCH.generations)
                ],
            },
        }
    )
