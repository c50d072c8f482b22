"""A dynamic shovel at work: it consumes from its source and republishes to its
destination, as RabbitMQ's `rabbit_amqp091_shovel` does (the engine, acknowledgement
modes, flow and reconnects: `relay.py`).

A session: connect to a source URI and a destination URI (one at random, then the others
if it fails), declare what the definition names (a destination queue, or the source
queue, each declared durable if a passive declare finds none; for a source exchange, an
exclusive server-named queue bound with `src-exchange-key`), set the source prefetch
(not in `no-ack`), and consume. Each delivery is published to the destination queue (by
the default exchange), or to `dest-exchange` (the message's own exchange if none) with
`dest-exchange-key` (its own routing key if none); its properties are the source's
unless `dest-publish-properties`, `dest-add-forward-headers` (an `x-shovelled` entry, as
RabbitMQ writes it) or `dest-add-timestamp-header` (`x-shovelled-timestamp`) change them.

`src-delete-after` (`queue-length`: the messages the queue held when the shovel started;
a count: that many) ends the shovel once that many are done with (confirmed, published,
or delivered by mode); its owner then removes its parameter.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from roarmq.protocol import spec
from roarmq.protocol.frames import ContentHeader
from roarmq.protocol.properties import BasicProperties
from roarmq.protocol.tables import Int64

from .client import AmqpClient, ClientChannel
from .relay import Connect, Relay, connect_network, ensure_queue, status_time
from .shovel_definition import ShovelDefinition

ROUTING_HEADER = "x-shovelled"
TIMESTAMP_HEADER = "x-shovelled-timestamp"


class Shovel(Relay):
    """One dynamic shovel (module doc). `on_finished` runs when `src-delete-after` is
    reached (its owner clears the parameter); `connect` makes the connections."""

    kind = "shovel"

    def __init__(
        self,
        vhost: str,
        name: str,
        definition: ShovelDefinition,
        *,
        cluster_name: str,
        node: str,
        connect: Connect = connect_network,
        on_finished: Callable[[], object] = lambda: None,
    ) -> None:
        super().__init__(
            vhost,
            name,
            ack_mode=definition.ack_mode,
            prefetch=definition.prefetch_count,
            reconnect_delay=definition.reconnect_delay,
            connect=connect,
            on_finished=on_finished,
        )
        self.definition = definition
        self.cluster_name = cluster_name
        self.node = node
        self._consumer_arguments = definition.src_consumer_args
        self.src_uri: str | None = None  # the URIs of the current session, redacted
        self.dest_uri: str | None = None

    async def _prepare(self) -> tuple[AmqpClient, ClientChannel, AmqpClient, str, int | None]:
        d = self.definition
        src = await self.connect_any(d.src_uris)
        dest = await self.connect_any(d.dest_uris)
        self.src_uri, self.dest_uri = src.uri.redacted, dest.uri.redacted
        if d.dest_queue is not None:
            await ensure_queue(dest, d.dest_queue, d.dest_queue_args)
        src_ch = await src.channel()
        if d.src_queue is not None:
            await ensure_queue(src, d.src_queue, d.src_queue_args)
            queue = d.src_queue
        else:
            ok = await src_ch.call(spec.QueueDeclare(queue="", exclusive=True))
            queue = ok.queue
            bind = spec.QueueBind(
                queue=queue, exchange=d.src_exchange or "", routing_key=d.src_exchange_key
            )
            await src_ch.call(bind)
        remaining: int | None = None
        if d.delete_after == "queue-length":
            ok = await src_ch.call(spec.QueueDeclare(queue=queue, passive=True))
            remaining = ok.message_count
        elif isinstance(d.delete_after, int):
            remaining = d.delete_after
        return src, src_ch, dest, queue, remaining

    def _target(
        self, exchange: str, routing_key: str, redelivered: bool, header: ContentHeader
    ) -> tuple[str, str, ContentHeader]:
        d = self.definition
        if d.dest_queue is not None:
            exchange, routing_key = "", d.dest_queue
        else:
            if d.dest_exchange is not None:
                exchange = d.dest_exchange
            if d.dest_exchange_key is not None:
                routing_key = d.dest_exchange_key
        return exchange, routing_key, self._header(header)

    def _header(self, header: ContentHeader) -> ContentHeader:
        """The content header to publish: the source's as it is, unless the definition
        sets properties or adds headers (then decoded, changed, encoded)."""
        d = self.definition
        if not (d.publish_properties or d.add_forward_headers or d.add_timestamp_header):
            return header
        props = BasicProperties.decode(header.raw)
        for key, value in d.publish_properties.items():
            setattr(props, key, value)
        headers = dict(props.headers or {})
        if d.add_forward_headers:
            entry = {
                "shovelled-by": self.cluster_name,
                "shovel-type": "dynamic",
                "shovel-name": self.name,
                "shovel-vhost": self.vhost,
                "src-uri": self.src_uri or "",
                "dest-uri": self.dest_uri or "",
            }
            if d.src_queue is not None:
                entry["src-queue"] = d.src_queue
            else:
                entry["src-exchange"] = d.src_exchange or ""
                entry["src-exchange-key"] = d.src_exchange_key
            for key, value in (
                ("dest-exchange", d.dest_exchange),
                ("dest-exchange-key", d.dest_exchange_key),
                ("dest-queue", d.dest_queue),
            ):
                if value is not None:
                    entry[key] = value
            earlier = headers.get(ROUTING_HEADER)
            headers[ROUTING_HEADER] = [entry, *(earlier if isinstance(earlier, list) else [])]
        if d.add_timestamp_header:
            headers[TIMESTAMP_HEADER] = Int64(int(time.time()))
        props.headers = headers
        return ContentHeader.from_properties(props, 60, header.body_size)

    # -- what the API shows ----------------------------------------------------------------

    def row(self) -> dict[str, Any]:
        """GET /api/shovels' row (RabbitMQ's fields), no credentials."""
        d = self.definition
        row: dict[str, Any] = {
            "node": self.node,
            "timestamp": status_time(self.changed_at),
            "name": self.name,
            "vhost": self.vhost,
            "type": "dynamic",
            "state": self.state,
        }
        if self.state == "terminated":
            row["reason"] = self.reason
            return row
        row.update(
            {
                "src_uri": self.src_uri,
                "src_protocol": "amqp091",
                "dest_protocol": "amqp091",
                "dest_uri": self.dest_uri,
            }
        )
        if d.src_queue is not None:
            row["src_queue"] = d.src_queue
        else:
            row["src_exchange"] = d.src_exchange
            row["src_exchange_key"] = d.src_exchange_key
        for key, value in (
            ("dest_exchange", d.dest_exchange),
            ("dest_exchange_key", d.dest_exchange_key),
            ("dest_queue", d.dest_queue),
        ):
            if value is not None:
                row[key] = value
        return row
