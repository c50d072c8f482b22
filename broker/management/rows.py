"""The JSON rows the API lists objects as, in RabbitMQ's field names and order.

Pure functions of the broker's objects (and the rate sampler for `*_details`), so a
list, a single object's page and a paged list build a row the same way.
"""

from __future__ import annotations

import base64
import urllib.parse
from typing import TYPE_CHECKING, Any

from roarmq.protocol.properties import BasicProperties

from ..amqp.tls import PLAIN_REPORT
from ..core.definitions_json import json_safe
from ..core.erlang import args_hash as arguments_hash
from ..core.exchange import Exchange
from ..routing.delayed import DelayedIndex
from .metrics import CHANNEL_STATS, channel_stats, queue_counts, vhost_counts

if TYPE_CHECKING:
    from ..server import Broker
    from .rates import RateSampler


def stats(rates: RateSampler | None, key: Any, counts: dict[str, int]) -> dict[str, Any]:
    """Counters with their rates where a sampler keeps them."""
    if rates is None:
        return dict(counts)
    return rates.stats(key, counts)


def exchange_row(x: Any, rates: RateSampler | None = None) -> dict[str, Any]:
    row = _exchange_row(x, rates)
    if isinstance(x.index, DelayedIndex):
        # The delayed-message plugin's field, and when the next of them is due (ms since
        # the epoch; null when it holds none).
        schedule = x.index.schedule
        row["messages_delayed"] = schedule.message_count()
        row["messages_delayed_next_due"] = schedule.next_due_ms
    return row


def _exchange_row(x: Any, rates: RateSampler | None) -> dict[str, Any]:
    return {
        "name": x.name,
        "vhost": x.vhost.name,
        "type": x.type,
        "durable": x.durable,
        "auto_delete": x.auto_delete,
        "internal": x.internal,
        "arguments": json_safe(x.arguments),
        "policy": x.policy.name if x.policy is not None else None,
        "user_who_performed_action": "rmq-internal" if x.builtin else None,
        "message_stats": stats(
            rates, x, {"publish_in": x.stats_in, "publish_out": x.stats_in - x.stats_unroutable}
        ),
    }


def queue_row(q: Any, broker: Broker, rates: RateSampler, detailed: bool = False) -> dict[str, Any]:
    """A queue as GET /api/queues lists it; `detailed` (one queue's page) adds what
    needs a pass over the channels: consumer details."""
    return {
        "name": q.name,
        "vhost": q.vhost.name,
        "durable": q.durable,
        "auto_delete": q.auto_delete,
        "exclusive": q.exclusive_owner is not None,
        "arguments": json_safe(q.arguments),
        "type": q.queue_type,
        "messages_ready": q.message_count(),
        "messages_unacknowledged": q.unacked,
        "messages": q.message_count() + q.unacked,
        **rates.depth(q),
        "message_bytes_ready": q.ready_bytes,
        "message_bytes_unacknowledged": q.unacked_bytes,
        "message_bytes": q.ready_bytes + q.unacked_bytes,
        "messages_persistent": q.persistent,
        "message_bytes_persistent": q.persistent_bytes,
        "consumer_utilisation": rates.utilisation(q),
        "consumer_capacity": rates.utilisation(q),
        **rates.idle_since(q),
        "consumers": q.consumer_count,
        "state": "running",
        "node": broker.cluster.leader_of(q.vhost.name),
        "exclusive_consumer_tag": None,
        "memory": q.ready_bytes if q.store is None else 0,  # bodies held in memory
        "consumer_details": [] if not detailed else consumer_details(broker, q),
        "policy": q.policy.name if q.policy is not None else None,
        "operator_policy": q.operator_policy.name if q.operator_policy is not None else None,
        "effective_policy_definition": q.effective_policy,
        "message_stats": stats(rates, q, queue_counts(q)),
        **(stream_row(q) if q.queue_type == "stream" else {}),
        **(quorum_row(q, broker) if q.queue_type in ("quorum", "stream") else {}),
        # returned messages waiting out a quorum queue's delayed retry
        **(
            {"messages_delayed": q.retrying(), "messages_dlx": q.dead_lettering()}
            if q.queue_type == "quorum"
            else {}
        ),
    }


def quorum_row(q: Any, broker: Broker) -> dict[str, Any]:
    """A quorum queue (or a stream) on a cluster node, as RabbitMQ's: its vhost's leader,
    members and the members running now (node names): both are replicated with the
    vhost's log."""
    cluster = broker.cluster
    members = cluster.members(q.vhost.name)
    running = cluster.running()
    return {
        "leader": cluster.leader_of(q.vhost.name),
        "members": members,
        "online": [n for n in members if n in running],
    }


def stream_row(q: Any) -> dict[str, Any]:
    """A stream's own columns: retained messages (nothing is ever unacknowledged away from
    it), its bytes on disk, segments and offsets; `members`, `online` and `readers` as
    RabbitMQ 3.10 shows a stream (its node, and its consumers there)."""
    node = q.vhost.broker.node_name
    return {
        "messages": q.message_count(),
        "messages_ready": q.message_count(),
        "messages_unacknowledged": 0,
        "message_bytes": q.retained_bytes,
        "message_bytes_ready": q.retained_bytes,
        "message_bytes_unacknowledged": 0,
        "messages_persistent": q.message_count(),
        "message_bytes_persistent": q.retained_bytes,
        "memory": 0,
        "members": [node],
        "online": [node],
        "readers": {node: q.consumer_count},
        "segments": len(q.segs),
        "first_offset": q.first_offset,
        "last_offset": q.committed - 1,  # the newest message consumers can read (-1: none)
        "committed_offset": q.committed - 1,
        "filter_chunks_skipped": q.filter_chunks_skipped,  # blocks a filter let a reader skip
    }


def _quote_key(text: str) -> str:
    """RabbitMQ's quote for a properties key: form-encoding (space as "+") that leaves only
    letters, digits and ".-_" bare, so the key holds no "/" and no "~"."""
    return urllib.parse.quote_plus(text, safe=".-_").replace("~", "%7E")


def properties_key(key: str, arguments: dict[str, Any] | None) -> str:
    """What names one binding among those between two ends, as RabbitMQ 3.10 packs it: the
    quoted routing key, then "~" and the arguments' hash if there are arguments ("~" alone
    for an empty key without them): erlang:phash2 of the arguments, as RabbitMQ computes it
    (`erlang.args_hash`). Two bindings that differ only in arguments differ here."""
    if not arguments:
        return _quote_key(key) if key else "~"
    return f"{_quote_key(key)}~{_quote_key(arguments_hash(arguments))}"


def matches_properties_key(props: str, key: str, arguments: dict[str, Any] | None) -> bool:
    """Whether a request's properties key names this binding. As in RabbitMQ, the key part
    is unquoted first, so a raw routing key (what some clients send) names it too."""
    quoted, tilde, wanted_hash = props.partition("~")
    if urllib.parse.unquote_plus(quoted) != key:
        return False
    if not arguments:
        return not wanted_hash
    return bool(tilde) and urllib.parse.unquote_plus(wanted_hash) == arguments_hash(arguments)


def binding_row(vhost: str, source: str, dest: Any, key: str, args: Any) -> dict[str, Any]:
    return {
        "source": source,
        "vhost": vhost,
        "destination": dest.name,
        "destination_type": "exchange" if isinstance(dest, Exchange) else "queue",
        "routing_key": key,
        "arguments": json_safe(args or {}),
        "properties_key": properties_key(key, args),
    }


def message_row(
    msg: Any,
    props: BasicProperties,
    data: bytes,
    redelivered: bool,
    left: int,
    body: dict[str, Any],
    truncate: int | None,
) -> dict[str, Any]:
    """A message as POST /api/queues/{vhost}/{name}/get answers it, with the properties
    its delivery carries (`props`); `body` is that request's (its `encoding`)."""
    shown = data[:truncate] if truncate is not None else data
    encoding = "string"
    if body.get("encoding") == "base64":
        payload, encoding = base64.b64encode(shown).decode(), "base64"
    else:
        try:
            payload = shown.decode()
        except UnicodeDecodeError:
            payload, encoding = base64.b64encode(shown).decode(), "base64"
    return {
        "payload_bytes": len(data),
        "redelivered": redelivered,
        "exchange": msg.exchange,
        "routing_key": msg.routing_key,
        "message_count": left,
        "properties": json_safe(
            {
                k: getattr(props, k)
                for k in BasicProperties.__slots__
                if getattr(props, k) is not None
            }
        ),
        "payload": payload,
        "payload_encoding": encoding,
    }


def connections_by_vhost(broker: Broker) -> dict[Any, list[Any]]:
    """The open connections of each vhost (one pass, for a list of vhost rows)."""
    out: dict[Any, list[Any]] = {}
    for c in broker.connections:
        if c.vhost is not None:
            out.setdefault(c.vhost, []).append(c)
    return out


def vhost_row(
    vhost: Any, broker: Broker, rates: RateSampler | None = None, conns: list[Any] | None = None
) -> dict[str, Any]:
    """A vhost as RabbitMQ 3.10 lists it: its channels' message_stats (closed ones' too),
    its connections' octets (`conns`: its open connections, if known) and its queues'
    depths, each with its rate."""
    queues = vhost.queues.values()
    ready = sum(q.message_count() for q in queues)
    unacked = sum(q.unacked for q in queues)
    if conns is None:
        conns = connections_by_vhost(broker).get(vhost, [])
    counts = vhost_counts(vhost, (ch for c in conns for ch in c.channels.values()))
    octets = {
        "send_oct": sum(c.send_oct for c in conns),
        "recv_oct": sum(c.recv_oct for c in conns),
    }
    row = {
        "name": vhost.name,
        "description": vhost.metadata["description"],
        "tags": list(vhost.metadata["tags"]),
        "metadata": {
            "description": vhost.metadata["description"],
            "tags": list(vhost.metadata["tags"]),
        },
        "default_queue_type": vhost.metadata["default_queue_type"],
        "tracing": vhost.tracing,
        "cluster_state": {broker.node_name: "running"},
        **stats(rates, vhost, octets),
        "messages_ready": ready,
        "messages_unacknowledged": unacked,
        "messages": ready + unacked,
        **(rates.depth(vhost) if rates is not None else {}),
        "message_stats": stats(rates, vhost, dict(zip(CHANNEL_STATS, counts, strict=True))),
    }
    row.update(broker.cluster.vhost_placement(vhost.name))  # a cluster's, from etcd
    return row


def connection_row(c: Any, broker: Broker, rates: RateSampler) -> dict[str, Any]:
    transport = c.transport
    local = transport.get_extra_info("sockname") if transport is not None else None
    return {
        "name": c.name,
        "node": broker.node_name,
        "type": "network",
        "protocol": "AMQP 0-9-1",
        "user": getattr(c.user, "name", None),
        "user_who_performed_action": getattr(c.user, "name", None),
        "vhost": getattr(c.vhost, "name", None),
        "state": c.flow_state(),
        "channels": len(c.channels),
        "channel_max": c.channel_max,
        "frame_max": c.frame_max,
        "timeout": c.heartbeat,
        "peer_host": c.peer[0] if c.peer else None,
        "peer_port": c.peer[1] if c.peer else None,
        "host": local[0] if isinstance(local, tuple) else None,
        "port": local[1] if isinstance(local, tuple) else None,
        "client_properties": json_safe(c.client_properties),
        "auth_mechanism": c.auth_mechanism,
        **(c.tls.report() if c.tls is not None else PLAIN_REPORT),
        "connected_at": c.connected_at,
        "recv_cnt": c.recv_cnt,
        "send_cnt": c.send_cnt,
        "send_pend": transport.get_write_buffer_size() if transport is not None else 0,
        **stats(rates, c, {"recv_oct": c.recv_oct, "send_oct": c.send_oct}),
    }


def channel_row(conn: Any, ch: Any, rates: RateSampler) -> dict[str, Any]:
    peer = conn.peer or (None, None)
    return {
        **rates.idle_since(ch),
        "name": ch.name,
        "number": ch.id,
        "user": conn.user.name if conn.user is not None else None,
        "vhost": conn.vhost.name if conn.vhost is not None else None,
        "connection_details": {"name": conn.name, "peer_host": peer[0], "peer_port": peer[1]},
        "node": conn.broker.node_name,
        "user_who_performed_action": conn.user.name if conn.user is not None else None,
        "consumer_count": len(ch.consumers),
        "messages_unacknowledged": len(ch.unacked),
        "messages_unconfirmed": len(ch._acks_waiting) + len(ch._acks_ready),
        "pending_raft_commands": 0,
        "prefetch_count": ch.prefetch_count,
        "global_prefetch_count": ch.prefetch_global,
        "confirm": bool(ch.confirm),
        "transactional": ch.tx is not None,
        "state": "running",
        **({"message_stats": stats(rates, ch, counts)} if (counts := channel_stats(ch)) else {}),
    }


def _channel_details(conn: Any, ch: Any) -> dict[str, Any]:
    return {
        "name": ch.name,
        "number": ch.id,
        "connection_name": conn.name,
        "user": conn.user.name,
    }


def consumer_row(conn: Any, ch: Any, c: Any) -> dict[str, Any]:
    """A consumer as GET /api/consumers lists it."""
    return {
        "consumer_tag": c.tag,
        "queue": {"name": c.queue.name, "vhost": conn.vhost.name},
        "channel_details": _channel_details(conn, ch),
        "ack_required": not c.no_ack,
        "prefetch_count": c.prefetch,
        "exclusive": bool(getattr(c, "exclusive", False)),
        "arguments": {},
        **(c.queue.position(c) if c.queue.queue_type == "stream" else {}),
    }


def consumer_details(broker: Broker, q: Any) -> list[dict[str, Any]]:
    """A queue's consumers, as its own page lists them."""
    return [
        {
            "consumer_tag": c.tag,
            "channel_details": _channel_details(conn, ch),
            "ack_required": not c.no_ack,
            "prefetch_count": c.prefetch,
            "exclusive": bool(c.exclusive),
            "arguments": json_safe(c.arguments or {}),
            "active": True,
            **(q.position(c) if q.queue_type == "stream" else {}),
        }
        for conn in broker.connections
        for ch in conn.channels.values()
        for c in ch.consumers.values()
        if c.queue is q
    ]
