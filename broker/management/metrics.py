"""Prometheus families with RabbitMQ's names, so RabbitMQ's Grafana dashboards show RoarMQ.

Nothing here runs per message. Message totals are sums, at scrape time, of the integers
exchanges and queues keep anyway (`stats_in`, `stats_delivered`...), plus what deleted ones
had counted (`Totals.retire_*`), so every `_total` only ever grows; connection, channel and
queue churn is counted where it happens, which is never on the message path.
Families, labels and types follow RabbitMQ 3.10's rabbitmq_prometheus, so its published
Grafana dashboards work unchanged (tests/management/test_grafana_dashboards.py runs the
RabbitMQ-Overview dashboard's queries through a real Prometheus).
`/metrics` carries the aggregated families (as RabbitMQ's `/metrics`), `/metrics/per-object`
has one series per queue and per channel instead (as RabbitMQ's `/metrics/per-object`),
which costs a line per queue and so is asked for explicitly.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterator
from importlib import metadata
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)

from .. import __version__
from ..core.delayed import LATENESS_BUCKETS
from ..core.stream import metric_families as stream_families
from ..ops.stalls import GC_BUCKETS, GC_WATCH, STALL_KINDS
from ..routing.delayed import DelayedIndex
from ..store.segments import FSYNC_BUCKETS

if TYPE_CHECKING:
    from ..core.exchange import Exchange
    from ..core.queue import Queue
    from ..server import Broker


#: A queue's message counters (broker/core/queue.py), kept past its deletion by `Totals`.
QUEUE_COUNTERS = (
    "stats_published", "stats_delivered", "stats_acked", "stats_dead_lettered",
    "stats_get", "stats_get_no_ack", "stats_get_empty",
    "stats_redelivered", "stats_no_ack",
)  # fmt: skip

#: RabbitMQ 3.10's `queue_type` label of its per-queue-type global counters: one series per
#: type, whether or not such queues exist (as RabbitMQ, which creates all three at boot).
RABBIT_QUEUE_TYPES = {
    "classic": "rabbit_classic_queue",
    "quorum": "rabbit_quorum_queue",
    "stream": "rabbit_stream_queue",
}

#: The `protocol` label of RabbitMQ's global counters; AMQP 0-9-1 is the only one here.
PROTOCOL = "amqp091"

#: `rabbitmq_build_info`'s `prometheus_client_version`: the client library serving /metrics.
CLIENT_VERSION = metadata.version("prometheus_client")


class Totals:
    """Counters of churn, and what deleted queues and exchanges had counted."""

    def __init__(self) -> None:
        self.started = time.time()
        self.connections_opened = 0
        self.channels_opened = 0
        self.queues_declared = 0
        self.queues_created = 0
        self.queues_at_start = 0
        self.confirmed = 0
        self.returned = 0
        self.received_confirm = 0  # of closed channels
        self.received = 0  # of deleted exchanges
        self.unroutable = 0
        # the stream protocol's messages (its global series, protocol="stream")
        self.stream_received = 0
        self.stream_confirmed = 0
        self.stream_delivered = 0
        # bytes of stored chunks sent from their segment files: by sendfile, and read into
        # memory first because the socket was full
        self.stream_file_bytes_sent = 0
        self.stream_file_bytes_copied = 0
        # of deleted queues, by queue type (RabbitMQ's delivery counters are per type)
        self.retired = {t: dict.fromkeys(QUEUE_COUNTERS, 0) for t in RABBIT_QUEUE_TYPES}

    def retire_exchange(self, x: Exchange) -> None:
        self.received += x.stats_in
        self.unroutable += x.stats_unroutable

    def retire_queue(self, q: Queue) -> None:
        retired = self.retired.setdefault(q.queue_type, dict.fromkeys(QUEUE_COUNTERS, 0))
        for name in QUEUE_COUNTERS:
            retired[name] += getattr(q, name)

    def retire_channel(self, ch: Any) -> None:
        """A channel is gone: keep its count of publishes in confirm mode (`publish_seq`,
        the confirm sequence it keeps anyway) for `messages_received_confirm`, and its
        `message_stats` in its vhost's (RabbitMQ's vhost counts outlive the channels)."""
        self.received_confirm += ch.publish_seq
        kept = ch.vhost.channel_stats
        for i, n in enumerate(channel_counts(ch)):
            kept[i] += n


#: A channel's and a vhost's `message_stats`, in RabbitMQ 3.10's order for a vhost; a
#: channel shows the first four once it published, the rest once it took a message.
CHANNEL_STATS = (
    "publish", "confirm", "return_unroutable", "drop_unroutable",
    "get", "get_no_ack", "deliver", "deliver_no_ack", "redeliver", "ack", "deliver_get",
    "get_empty",
)  # fmt: skip
PUBLISH_STATS = 4


def channel_counts(ch: Any) -> tuple[int, ...]:
    """A channel's counters in CHANNEL_STATS order. Every delivery and basic.get-ok takes a
    delivery tag, so `delivery_tag` is deliver_get and deliver is what the others leave."""
    taken = ch.delivery_tag
    returned, dropped, redelivered, get, get_no_ack, get_empty, nacked = ch.stats
    # a publish in confirm mode is confirmed unless still waiting or nacked
    confirmed = ch.publish_seq - len(ch._acks_waiting) - len(ch._acks_ready) - nacked
    return (
        ch.stats_published, confirmed, returned, dropped,
        get, get_no_ack, taken - get - ch.stats_no_ack, ch.stats_no_ack - get_no_ack,
        redelivered, ch.stats_acked, taken, get_empty,
    )  # fmt: skip


def channel_stats(ch: Any) -> dict[str, int]:
    """A channel's `message_stats` as RabbitMQ shows them: the publishing counters once it
    published, the delivering ones once it took (or asked for) a message."""
    counts = channel_counts(ch)
    out: dict[str, int] = {}
    if ch.stats_published:
        out.update(zip(CHANNEL_STATS[:PUBLISH_STATS], counts[:PUBLISH_STATS], strict=True))
    if ch.delivery_tag or ch.stats[5]:  # took a message, or asked for one (get_empty)
        out.update(zip(CHANNEL_STATS[PUBLISH_STATS:], counts[PUBLISH_STATS:], strict=True))
    return out


def vhost_counts(vhost: Any, channels: Any) -> list[int]:
    """A vhost's `message_stats` (CHANNEL_STATS order): its closed channels' and those of
    `channels` (its live ones)."""
    total = list(vhost.channel_stats)
    for ch in channels:
        for i, n in enumerate(channel_counts(ch)):
            total[i] += n
    return total


def queue_counts(q: Any) -> dict[str, int]:
    """A queue's (or `queue_sums`') `message_stats`, as RabbitMQ splits them: deliveries to
    consumers and basic.get, each by ack mode, with `deliver_get` their sum."""
    delivered = q.stats_delivered  # every consumer delivery and every basic.get answered
    return {
        "publish": q.stats_published,
        "deliver_get": delivered,
        "deliver": delivered - q.stats_get - q.stats_no_ack,
        "deliver_no_ack": q.stats_no_ack - q.stats_get_no_ack,
        "ack": q.stats_acked,
        "redeliver": q.stats_redelivered,
        "get": q.stats_get,
        "get_no_ack": q.stats_get_no_ack,
        "get_empty": q.stats_get_empty,
    }


class QueueSums:
    """Every queue's counters added up, deleted queues' included: `queue_counts` reads it as
    it reads one queue. With `queue_type`, `queues` are that type's and only that type's
    deleted queues are added. `add` adds more queues (the rate sampler sums the queues as
    it walks them, a slice a loop turn, instead of in one go)."""

    def __init__(self, broker: Broker, queues: list[Queue], queue_type: str | None = None) -> None:
        retired = broker.totals.retired
        kinds = list(retired.values()) if queue_type is None else [retired.get(queue_type, {})]
        for name in QUEUE_COUNTERS:
            past = sum(k.get(name, 0) for k in kinds)
            setattr(self, name, past + sum(map(attrgetter(name), queues)))

    def add(self, queues: list[Queue]) -> None:
        for name in QUEUE_COUNTERS:
            setattr(self, name, getattr(self, name) + sum(map(attrgetter(name), queues)))


def global_counts(broker: Broker, queues: QueueSums | None = None) -> dict[str, int]:
    """The broker's message totals since start, in RabbitMQ's `message_stats` names
    (`queues`: every queue's counters already summed)."""
    t: Totals = broker.totals
    vhosts = list(broker.vhosts.values())
    if queues is None:
        queues = QueueSums(broker, [q for v in vhosts for q in v.queues.values()])
    exchanges = [x for v in vhosts for x in v.exchanges.values()]
    received = t.received + sum(x.stats_in for x in exchanges)
    unroutable = t.unroutable + sum(x.stats_unroutable for x in exchanges)
    counts = queue_counts(queues)
    return {
        "publish": received,
        "confirm": t.confirmed,
        "return_unroutable": t.returned,
        "drop_unroutable": max(unroutable - t.returned, 0),
        **{k: v for k, v in counts.items() if k != "publish"},  # "publish" is into queues
    }


def churn_counts(broker: Broker) -> dict[str, int]:
    """Connections, channels and queues opened and closed since start (`churn_rates`)."""
    t: Totals = broker.totals
    channels = sum(len(c.channels) for c in broker.connections)
    queues = sum(len(v.queues) for v in broker.vhosts.values())
    return {
        "connection_created": t.connections_opened,
        "connection_closed": t.connections_opened - len(broker.connections),
        "channel_created": t.channels_opened,
        "channel_closed": max(t.channels_opened - channels, 0),
        "queue_declared": t.queues_declared,
        "queue_created": t.queues_created,
        "queue_deleted": max(t.queues_at_start + t.queues_created - queues, 0),
    }


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


#: The relays of broker/links/ in /metrics: (prefix, what, the broker's attribute, the row
#: field of their state and its values, what "moved" means for them).
LINK_FAMILIES = (
    (
        "roarmq_shovel",
        "Dynamic shovels",
        "shovels",
        ("state", ("starting", "running", "terminated")),
        "Messages the shovels published to their destinations",
    ),
    (
        "roarmq_federation_link",
        "Federation links",
        "federation",
        ("status", ("starting", "running", "error")),
        "Messages the federation links published downstream",
    ),
)


def _link_families(b: Any) -> Iterator[Any]:
    """Shovels and federation links on this node: how many in each state (`roarmq_shovels`,
    `roarmq_federation_links`), messages moved and sessions started again after a failure
    (each after its reconnect-delay), all of a kind together."""
    for prefix, what, attribute, (field, states), moved in LINK_FAMILIES:
        relays = getattr(b, attribute)
        family = GaugeMetricFamily(
            prefix + "s", f"{what} running on this node, by {field}", labels=[field]
        )
        counts = dict.fromkeys(states, 0)
        for row in relays.rows():
            counts[row[field]] = counts.get(row[field], 0) + 1
        for state, n in counts.items():
            family.add_metric([state], n)
        yield family
        yield CounterMetricFamily(prefix + "_messages_moved", moved, value=relays.moved())
        yield CounterMetricFamily(
            prefix + "_reconnects",
            f"{what}: sessions started again after a failure",
            value=relays.reconnects(),
        )


def _by_protocol(kind: type, name: str, doc: str, value: float, stream: float | None = None) -> Any:
    """One of RabbitMQ's global families: its `protocol="amqp091"` series, and the stream
    protocol's (`protocol="stream"`) where it counts that too."""
    family = kind(name, doc, labels=["protocol"])
    family.add_metric([PROTOCOL], value)
    if stream is not None:
        family.add_metric(["stream"], stream)
    return family


def _archive_drops(archive: Any) -> Iterator[Any]:
    """What the archive could not keep, by reason: its writer was behind (`writer_behind`), or
    the disk refused the write (`write_failed`: full, EIO), plus every failed write."""
    for unit, doc, behind, failed in (
        ("batches", "Archive batches dropped", archive.dropped_batches, archive.failed_batches),
        ("rows", "Envelopes dropped from the archive", archive.dropped_rows, archive.failed_rows),
    ):
        family = CounterMetricFamily(f"roarmq_archive_{unit}_dropped", doc, labels=["reason"])
        family.add_metric(["writer_behind"], behind)
        family.add_metric(["write_failed"], failed)
        yield family
    yield _counter(
        "roarmq_archive_write_errors",
        "Archive writes (journal appends, data files) that failed; conversions are retried",
        archive.write_errors,
    )


def _delayed(exchanges: list[Any]) -> Iterator[Any]:
    """Delayed exchanges' schedules: what they hold, what they routed, and how late."""
    schedules = [x.index.schedule for x in exchanges if isinstance(x.index, DelayedIndex)]
    held = GaugeMetricFamily(
        "roarmq_delayed_messages",
        "Messages a delayed exchange holds until they are due",
        labels=["vhost", "exchange"],
    )
    for schedule in schedules:
        held.add_metric([schedule.vhost.name, schedule.exchange.name], schedule.message_count())
    yield held
    yield _counter(
        "roarmq_delayed_routed",
        "Delayed messages routed once due, over all delayed exchanges",
        sum(s.routed for s in schedules),
    )
    counts = [sum(column) for column in zip(*(s.lateness_buckets for s in schedules), strict=True)]
    yield HistogramMetricFamily(
        "roarmq_delayed_lateness_seconds",
        "How long past its due time each delayed message was routed",
        buckets=_cumulative(LATENESS_BUCKETS, counts or [0] * (len(LATENESS_BUCKETS) + 1)),
        sum_value=sum(s.lateness_seconds for s in schedules),
    )


def _cumulative(bounds: tuple[float, ...], counts: list[int]) -> list[tuple[str, int]]:
    """A histogram's buckets as Prometheus has them: per upper bound (the last +Inf), how many
    observations were at most that (`counts` holds each bucket's own, the last over the top)."""
    running, buckets = 0, []
    for bound, n in zip((*bounds, float("inf")), counts, strict=True):
        running += n
        buckets.append(("+Inf" if bound == float("inf") else str(bound), running))
    return buckets


#: The collector's families with one series per generation: (type, name, help, the
#: GcGeneration field it reads).
GC_FAMILIES = (
    (CounterMetricFamily, "roarmq_gc_collections", "Garbage collector passes", "collections"),
    (
        GaugeMetricFamily,
        "roarmq_gc_pause_max_seconds",
        "Longest garbage collector pass since start",
        "longest",
    ),
    (
        CounterMetricFamily,
        "roarmq_gc_objects_collected",
        "Objects the collector freed",
        "collected",
    ),
    (
        CounterMetricFamily,
        "roarmq_gc_objects_uncollectable",
        "Objects the collector found unreachable but could not free",
        "uncollectable",
    ),
)


def _gc_families() -> Iterator[Any]:
    """The cyclic garbage collector's passes by generation (broker/ops/stalls.py's GcWatch: the
    whole process's, since the first broker in it started). Not what gc.freeze() holds:
    counting it walks the frozen list, a millisecond per 30,000 objects, on the loop."""
    gens = list(enumerate(GC_WATCH.generations))
    for kind, name, doc, field in GC_FAMILIES:
        family = kind(name, doc, labels=["generation"])
        for generation, g in gens:
            family.add_metric([str(generation)], getattr(g, field))
        yield family
    pauses = HistogramMetricFamily(
        "roarmq_gc_pause_seconds",
        "How long each garbage collector pass held the process",
        labels=["generation"],
    )
    for generation, g in gens:
        pauses.add_metric(
            [str(generation)], _cumulative(GC_BUCKETS, g.buckets), sum_value=g.seconds
        )
    yield pauses


class _Collector:
    """Read at scrape time; `per_object` adds a series per queue or exchange."""

    def __init__(self, broker: Broker, per_object: bool = False) -> None:
        self.broker = broker
        self.per_object = per_object


class RoarCollector(_Collector):
    """RoarMQ's own families: the routing cache, bindings, the store's fsyncs, the archive."""

    def collect(self) -> Iterator[Any]:
        yield from self._state()
        b = self.broker
        exchanges = [x for v in b.vhosts.values() for x in v.exchanges.values()]
        topics = [x for x in exchanges if hasattr(x.index, "cached_keys")]
        yield _counter(
            "roarmq_routing_cache_hits",
            "Topic routes answered from the routing-key cache",
            sum(x.index.hits for x in topics),
        )
        yield _counter(
            "roarmq_routing_cache_misses",
            "Topic routes that walked the trie",
            sum(x.index.misses for x in topics),
        )
        yield _gauge(
            "roarmq_routing_cache_size",
            "Routing keys cached, over all topic exchanges",
            sum(x.index.cached_keys() for x in topics),
        )
        yield _gauge(
            "roarmq_bindings",
            "Bindings, over all exchanges (the default exchange's implicit ones not counted)",
            sum(len(x.index) for x in exchanges if x.name),
        )
        yield from _delayed(exchanges)
        store = b.store
        log = getattr(store, "log", None)
        if log is not None:
            histogram = HistogramMetricFamily(
                "roarmq_store_fsync_seconds",
                "fdatasync latency of the message store's group commits",
                buckets=_cumulative(FSYNC_BUCKETS, log.fsync_buckets),
                sum_value=log.fsync_seconds,
            )
            yield histogram
            status = b.store_status()
            yield _gauge(
                "roarmq_store_failed",
                "1 while the message store cannot write (persistent publishes are nacked)",
                int(status["state"] == "failed"),
            )
            yield _counter(
                "roarmq_store_failures",
                "Times a message store write or fsync failed",
                status["failures"],
            )
            yield _counter(
                "roarmq_store_resumes",
                "Times the message store recovered in place",
                status["resumes"],
            )
            yield _counter(
                "roarmq_store_publishes_nacked",
                "Publishes nacked because the store failed while they waited for an fsync",
                status["nacked"],
            )
            yield _counter(
                "roarmq_store_publishes_refused",
                "Persistent publishes that found the message store failed",
                status["refused"],
            )
        archive = b.archive
        if archive is not None:
            yield _counter(
                "roarmq_archive_rows_recorded", "Envelopes recorded", archive.recorded_rows
            )
            yield _counter(
                "roarmq_archive_rows_written", "Envelopes written to Parquet", archive.written_rows
            )
            yield from _archive_drops(archive)
        yield from stream_families(b, self.per_object, rabbit=False)
        if self.per_object:
            labels = ["vhost", "exchange"]
            bindings = GaugeMetricFamily(
                "roarmq_exchange_bindings", "Bindings, per exchange", labels=labels
            )
            cached = GaugeMetricFamily(
                "roarmq_exchange_routing_cache_size",
                "Cached keys, per topic exchange",
                labels=labels,
            )
            for x in exchanges:
                if x.name:
                    bindings.add_metric([x.vhost.name, x.name], len(x.index))
            for x in topics:
                cached.add_metric([x.vhost.name, x.name], x.index.cached_keys())
            yield bindings
            yield cached

    def _state(self) -> Iterator[Any]:
        """Connections, memory, disk, alarms and flow, and (per object) queues and exchanges."""
        b = self.broker
        yield GaugeMetricFamily(
            "roarmq_connections", "Open AMQP connections", value=len(b.connections)
        )
        yield GaugeMetricFamily(
            "roarmq_queued_bytes", "Bytes of ready message bodies", value=b.queued_bytes
        )
        yield GaugeMetricFamily(
            "roarmq_memory_alarm",
            "1 while the memory alarm blocks publishers",
            value=1 if "memory" in b.alarms else 0,
        )
        yield GaugeMetricFamily(
            "roarmq_disk_alarm",
            "1 while the disk-free alarm blocks publishers",
            value=1 if "disk" in b.alarms else 0,
        )
        res = b.resources
        yield GaugeMetricFamily(
            "roarmq_resident_memory_bytes", "Resident memory at the last sample", value=res.rss
        )
        yield GaugeMetricFamily(
            "roarmq_memory_high_watermark_bytes", "The memory alarm's mark", value=res.high
        )
        if res.disk_free is not None:
            yield GaugeMetricFamily(
                "roarmq_disk_free_bytes", "Free space on the data directory", value=res.disk_free
            )
        yield GaugeMetricFamily(
            "roarmq_disk_free_limit_bytes", "The disk alarm's mark", value=res.disk_limit
        )
        yield GaugeMetricFamily(
            "roarmq_connections_flow_held",
            "Connections not read because a queue they publish to is in flow state",
            value=sum(1 for c in b.connections if c.flow_state() == "flow"),
        )
        if b.loop_lag is not None:
            yield GaugeMetricFamily(
                "roarmq_event_loop_lag_max_seconds",
                "Longest event-loop stall since the last scrape ([diagnostics] loop_lag_probe_ms)",
                value=b.loop_lag.take_max(),
            )
            stalls = CounterMetricFamily(
                "roarmq_event_loop_stalls",
                "Event-loop stalls of [diagnostics] stall_threshold_ms or more, by what explains "
                "them (GET /api/diagnostics/stalls has each)",
                labels=["kind"],
            )
            for kind in STALL_KINDS:
                stalls.add_metric([kind], b.loop_lag.by_kind.get(kind, 0))
            yield stalls
        yield from _gc_families()
        yield from _link_families(b)
        if not self.per_object:
            return
        ready = GaugeMetricFamily(
            "roarmq_queue_messages_ready", "Ready messages", labels=["vhost", "queue"]
        )
        unacked = GaugeMetricFamily(
            "roarmq_queue_messages_unacked", "Unacknowledged messages", labels=["vhost", "queue"]
        )
        consumers = GaugeMetricFamily(
            "roarmq_queue_consumers", "Consumers", labels=["vhost", "queue"]
        )
        published = CounterMetricFamily(
            "roarmq_queue_messages_published", "Messages enqueued", labels=["vhost", "queue"]
        )
        delivered = CounterMetricFamily(
            "roarmq_queue_messages_delivered",
            "Messages delivered to consumers or basic.get",
            labels=["vhost", "queue"],
        )
        x_in = CounterMetricFamily(
            "roarmq_exchange_messages_published_in",
            "Messages published to the exchange",
            labels=["vhost", "exchange"],
        )
        x_unroutable = CounterMetricFamily(
            "roarmq_exchange_messages_unroutable",
            "Messages the exchange routed nowhere",
            labels=["vhost", "exchange"],
        )
        for vhost in b.vhosts.values():
            for q in vhost.queues.values():
                labels = [vhost.name, q.name]
                ready.add_metric(labels, q.message_count())
                unacked.add_metric(labels, q.unacked)
                consumers.add_metric(labels, q.consumer_count)
                published.add_metric(labels, q.stats_published)
                delivered.add_metric(labels, q.stats_delivered)
            for x in vhost.exchanges.values():
                x_in.add_metric([vhost.name, x.name], x.stats_in)
                x_unroutable.add_metric([vhost.name, x.name], x.stats_unroutable)
        yield from (ready, unacked, consumers, published, delivered, x_in, x_unroutable)


class RabbitCollector(_Collector):
    """RabbitMQ's `rabbitmq_*` families, where RoarMQ has the same quantity, with RabbitMQ
    3.10's labels: `protocol` on the global counters, `protocol` and `queue_type` on the
    delivery ones (a series per queue type, zeros included, as RabbitMQ)."""

    def collect(self) -> Iterator[Any]:
        b = self.broker
        t: Totals = b.totals
        vhosts = list(b.vhosts.values())
        queues = [q for v in vhosts for q in v.queues.values()]
        exchanges = [x for v in vhosts for x in v.exchanges.values()]
        channels = [ch for c in b.connections for ch in c.channels.values()]
        consumers = sum(q.consumer_count for q in queues)
        ready = sum(q.message_count() for q in queues)
        unacked = sum(q.unacked for q in queues)
        received = t.received + sum(x.stats_in for x in exchanges)
        unroutable = t.unroutable + sum(x.stats_unroutable for x in exchanges)

        yield from self._identity()
        yield _gauge("rabbitmq_connections", "Connections currently open", len(b.connections))
        yield _gauge("rabbitmq_channels", "Channels currently open", len(channels))
        yield _gauge("rabbitmq_consumers", "Consumers currently connected", consumers)
        yield _gauge("rabbitmq_queues", "Queues available", len(queues))
        if self.per_object:  # per-object mode has them per queue and per channel instead
            yield from self._per_queue(queues)
            yield self._per_channel(b)
        else:
            yield _gauge("rabbitmq_queue_messages_ready", "Messages ready to be delivered", ready)
            yield _gauge(
                "rabbitmq_queue_messages_unacked", "Messages delivered, not yet acked", unacked
            )
            yield _gauge(
                "rabbitmq_queue_messages", "Ready and unacknowledged messages", ready + unacked
            )
            yield _gauge("rabbitmq_queue_consumers", "Consumers on queues", consumers)
            # The Overview dashboard's "Publishers" is rabbitmq_channels minus this.
            yield _gauge(
                "rabbitmq_channel_consumers",
                "Consumers on channels",
                sum(len(ch.consumers) for ch in channels),
            )
        yield _counter("rabbitmq_connections_opened", "Connections opened", t.connections_opened)
        yield _counter(
            "rabbitmq_connections_closed",
            "Connections closed or terminated",
            t.connections_opened - len(b.connections),
        )
        yield _counter("rabbitmq_channels_opened", "Channels opened", t.channels_opened)
        yield _counter(
            "rabbitmq_channels_closed",
            "Channels closed",
            max(t.channels_opened - len(channels), 0),
        )
        yield _counter("rabbitmq_queues_declared", "Queues declared", t.queues_declared)
        yield _counter("rabbitmq_queues_created", "Queues created", t.queues_created)
        yield _counter(
            "rabbitmq_queues_deleted",
            "Queues deleted",
            max(t.queues_at_start + t.queues_created - len(queues), 0),
        )
        g = "rabbitmq_global_"
        sc = list(b.stream_connections)
        stream_in = t.stream_received
        for name, doc, value, stream in (
            ("messages_received", "Messages received from publishers", received, stream_in),
            (
                "messages_received_confirm",
                "Messages received from publishers expecting confirmations",
                t.received_confirm + sum(ch.publish_seq for ch in channels),
                stream_in,
            ),
            ("messages_routed", "Messages routed to at least one queue", received - unroutable,
             stream_in),
            ("messages_unroutable_returned", "Unroutable messages returned", t.returned, None),
            ("messages_unroutable_dropped", "Unroutable messages dropped", unroutable - t.returned,
             None),
            ("messages_confirmed", "Messages confirmed to publishers", t.confirmed,
             t.stream_confirmed),
            ("messages_delivered", "Messages delivered to consumers", None, t.stream_delivered),
        ):  # fmt: skip
            if value is None:
                family = CounterMetricFamily(g + name, doc, labels=["protocol"])
                family.add_metric(["stream"], stream)
                yield family
                continue
            yield _by_protocol(CounterMetricFamily, g + name, doc, max(value, 0), stream)
        publishers = sum(1 for ch in channels if ch.stats_published)
        stream_publishers = sum(len(c.publishers) for c in sc)
        stream_consumers = sum(len(c.subscriptions) for c in sc)
        yield _by_protocol(
            GaugeMetricFamily, g + "publishers", "Publishers", publishers, stream_publishers
        )
        yield _by_protocol(
            GaugeMetricFamily, g + "consumers", "Consumers", consumers, stream_consumers
        )
        yield from self._per_queue_type(queues)
        yield from stream_families(b, self.per_object, rabbit=True)
        yield from self._process(b)

    def _identity(self) -> Iterator[Any]:
        """`rabbitmq_build_info` and `rabbitmq_identity_info`, whose `rabbitmq_node` and
        `rabbitmq_cluster` labels every dashboard panel joins on. RabbitMQ's `erlang_version`
        label is left out (no Erlang here), as is `rabbitmq_cluster_permanent_id` (RoarMQ keeps
        no cluster id apart from its name)."""
        b = self.broker
        yield InfoMetricFamily(
            "rabbitmq_build",
            "RoarMQ's version, in RabbitMQ's build_info family",
            value={
                "rabbitmq_version": __version__,
                "product_name": "RoarMQ",
                "product_version": __version__,
                "prometheus_plugin_version": __version__,  # /metrics is RoarMQ's own code
                "prometheus_client_version": CLIENT_VERSION,
            },
        )
        yield InfoMetricFamily(
            "rabbitmq_identity",
            "Node and cluster names",
            value={"rabbitmq_node": b.node_name, "rabbitmq_cluster": b.cluster_name},
        )

    def _per_queue_type(self, queues: list[Queue]) -> Iterator[Any]:
        """The delivery counters, per queue type, deleted queues' counts included."""
        by_type: dict[str, list[Queue]] = {t: [] for t in RABBIT_QUEUE_TYPES}
        others = [q for q in queues if q.queue_type != "classic"]  # usually none: one pass
        by_type["classic"] = [q for q in queues if q.queue_type == "classic"] if others else queues
        for q in others:
            by_type.setdefault(q.queue_type, []).append(q)
        sums = {t: QueueSums(self.broker, qs, t) for t, qs in by_type.items()}
        counts = {RABBIT_QUEUE_TYPES.get(t, t): queue_counts(s) for t, s in sums.items()}
        g = "rabbitmq_global_messages_"
        for name, doc, key in (
            ("delivered", "Messages delivered to consumers and basic.get", "deliver_get"),
            ("delivered_consume_manual_ack", "Deliveries to be acked", "deliver"),
            ("delivered_consume_auto_ack", "Deliveries with auto-ack", "deliver_no_ack"),
            ("delivered_get_manual_ack", "basic.get answered, to be acked", "get"),
            ("delivered_get_auto_ack", "basic.get answered with auto-ack", "get_no_ack"),
            ("get_empty", "basic.get answered empty", "get_empty"),
            ("acknowledged", "Messages acknowledged by consumers", "ack"),
            ("redelivered", "Deliveries flagged redelivered", "redeliver"),
        ):
            family = CounterMetricFamily(g + name, doc, labels=["protocol", "queue_type"])
            for queue_type, c in counts.items():
                family.add_metric([PROTOCOL, queue_type], c[key])
            yield family
        # RoarMQ's one total; RabbitMQ 3.10 splits dead-lettering by reason and strategy.
        yield _counter(
            g + "dead_lettered",
            "Messages dead-lettered",
            sum(s.stats_dead_lettered for s in sums.values()),
        )

    @staticmethod
    def _process(b: Broker) -> Iterator[Any]:
        """The node's resources, in RabbitMQ's `node_metrics` families."""
        usage = resource.getrusage(resource.RUSAGE_SELF)
        max_fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        yield _gauge(
            "rabbitmq_process_resident_memory_bytes",
            "Memory used in bytes (resident set)",
            b.resources.rss,
        )
        yield _gauge(
            "rabbitmq_resident_memory_limit_bytes", "The memory alarm's mark", b.resources.high
        )
        if b.resources.disk_free is not None:
            yield _gauge(
                "rabbitmq_disk_space_available_bytes",
                "Disk space available on the data directory",
                b.resources.disk_free,
            )
        yield _gauge(
            "rabbitmq_disk_space_available_limit_bytes",
            "The disk alarm's mark",
            b.resources.disk_limit,
        )
        yield _gauge(
            "rabbitmq_alarms_memory_used_watermark",
            "1 while the memory alarm is set",
            1 if "memory" in b.alarms else 0,
        )
        yield _gauge(
            "rabbitmq_alarms_free_disk_space_watermark",
            "1 while the disk alarm is set",
            1 if "disk" in b.alarms else 0,
        )
        try:
            fds = len(os.listdir("/proc/self/fd"))
        except OSError:
            fds = 0
        yield _gauge("rabbitmq_process_open_fds", "Open file descriptors", fds)
        yield _gauge("rabbitmq_process_max_fds", "File descriptor limit", max_fds)
        # RabbitMQ counts client sockets against a budget of its own; RoarMQ's budget is
        # `[limits] max_connections`, or, when that is 0, the descriptor limit they share.
        yield _gauge(
            "rabbitmq_process_open_tcp_sockets", "Open AMQP client sockets", len(b.connections)
        )
        yield _gauge(
            "rabbitmq_process_max_tcp_sockets",
            "AMQP client sockets limit ([limits] max_connections, else the descriptor limit)",
            b.config.limits.max_connections or max_fds,
        )
        yield _counter(
            "rabbitmq_process_cpu_seconds",
            "CPU time used by the broker process",
            usage.ru_utime + usage.ru_stime,
        )
        yield _gauge(
            "rabbitmq_erlang_uptime_seconds",
            "Seconds since the broker started (RabbitMQ's family; no Erlang here)",
            time.time() - b.totals.started,
        )

    @staticmethod
    def _per_channel(b: Broker) -> GaugeMetricFamily:
        """`rabbitmq_channel_consumers` per channel, labelled with the API's channel name
        (RabbitMQ labels it with the channel's Erlang pid)."""
        family = GaugeMetricFamily(
            "rabbitmq_channel_consumers", "Consumers on a channel", labels=["channel"]
        )
        for c in b.connections:
            for ch in c.channels.values():
                family.add_metric([ch.name], len(ch.consumers))
        return family

    @staticmethod
    def _per_queue(queues: list[Queue]) -> Iterator[Any]:
        labels = ["vhost", "queue"]
        families = {
            "ready": GaugeMetricFamily(
                "rabbitmq_queue_messages_ready", "Ready messages, per queue", labels=labels
            ),
            "unacked": GaugeMetricFamily(
                "rabbitmq_queue_messages_unacked", "Unacked messages, per queue", labels=labels
            ),
            "messages": GaugeMetricFamily(
                "rabbitmq_queue_messages", "Ready and unacked, per queue", labels=labels
            ),
            "consumers": GaugeMetricFamily(
                "rabbitmq_queue_consumers", "Consumers, per queue", labels=labels
            ),
            "published": CounterMetricFamily(
                "rabbitmq_queue_messages_published", "Messages enqueued", labels=labels
            ),
        }
        for q in queues:
            key = [q.vhost.name, q.name]
            ready = q.message_count()
            families["ready"].add_metric(key, ready)
            families["unacked"].add_metric(key, q.unacked)
            families["messages"].add_metric(key, ready + q.unacked)
            families["consumers"].add_metric(key, q.consumer_count)
            families["published"].add_metric(key, q.stats_published)
        yield from families.values()
