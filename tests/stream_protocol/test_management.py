"""Stream connections, publishers and consumers in the management API, shaped as
RabbitMQ's stream management plugin shapes them; closing one from the API."""

from __future__ import annotations

import asyncio
import urllib.request

from rstream import AMQPMessage, ConsumerOffsetSpecification, OffsetType
from support.stream_clients import collect, consumer_of, producer_of


def test_stream_clients_are_listed_with_their_counts_and_offsets(mgmt_broker):
    rows: dict[str, object] = {}

    async def clients() -> None:
        async with producer_of(mgmt_broker) as producer, consumer_of(mgmt_broker) as consumer:
            await producer.create_stream("watched")
            for i in range(5):
                await producer.send_wait("watched", AMQPMessage(body=b"%d" % i))
            await collect(
                consumer,
                "watched",
                ConsumerOffsetSpecification(OffsetType.FIRST),
                5,
                unsubscribe=False,
            )
            loop = asyncio.get_running_loop()
            for path in ("connections", "publishers", "consumers", "connections/%2F"):
                rows[path] = await loop.run_in_executor(
                    None, mgmt_broker.api, "GET", f"/api/stream/{path}"
                )
            rows["metrics"] = await loop.run_in_executor(None, _scrape, mgmt_broker)

    asyncio.run(clients())
    status, connections = rows["connections"]
    assert status == 200 and len(connections) >= 2
    assert {c["protocol"] for c in connections} == {"stream"}
    assert {c["user"] for c in connections} == {"guest"}
    assert rows["connections/%2F"][1] == connections
    status, publishers = rows["publishers"]
    (publisher,) = [p for p in publishers if p["queue"]["name"] == "watched"]
    assert publisher["published"] == 5 and publisher["confirmed"] == 5
    assert publisher["queue"] == {"name": "watched", "vhost": "/"}
    status, consumers = rows["consumers"]
    (consumer,) = consumers
    assert consumer["queue"]["name"] == "watched"
    assert consumer["consumed"] == 5 and consumer["offset"] == 5 and consumer["offset_lag"] == 0
    assert consumer["connection_details"]["user"] == "guest"
    metrics = rows["metrics"]
    for line in (
        'rabbitmq_global_messages_received_total{protocol="stream"} 5.0',
        'rabbitmq_global_messages_confirmed_total{protocol="stream"} 5.0',
        'rabbitmq_global_messages_delivered_total{protocol="stream"} 5.0',
        'rabbitmq_global_publishers{protocol="stream"} 1.0',
        'rabbitmq_global_consumers{protocol="stream"} 1.0',
    ):
        assert line in metrics, line


def _scrape(broker) -> str:
    with urllib.request.urlopen(broker.mgmt_url + "/metrics", timeout=10) as response:
        return response.read().decode()
