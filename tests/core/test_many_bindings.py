"""One queue bound to a fanout exchange by 20,000 routing keys and to a headers exchange by
20,000 argument tables, over real sockets: bound, bound again (each a no-op), routed through
(one copy per message however many bindings lead to the queue) and unbound, with aio-pika for
what a client does one at a time and pipelined raw frames for the thousands.

Each bind and unbind must find the binding it names without going through the queue's other
bindings (broker/routing/bindings.py's identity dicts): the index's work is counted (ids looked
at, argument tables keyed) and bounded per binding, not timed (speed is bench/binds.py's, in
docs/benchmarks.md "Many bindings to one queue"). Before, each search went through every
binding of the queue: here 199,990,000 ids for the 20,000 fanout binds.
"""

from __future__ import annotations

import random
from collections import Counter

import aio_pika
import pytest
from aio_pika import ExchangeType, Message
from aio_pika.exceptions import DeliveryError
from support.rawclient import RawClient

from roarmq.broker.routing import bindings

pytestmark = pytest.mark.timeout(120)

N = 20_000


class Work(Counter):
    """What the index's searches did: ``ids`` looked at, ``tables`` keyed."""

    def within(self, per_binding: int, n: int = N) -> None:
        assert self["ids"] <= per_binding * n, f"{self['ids']:,} ids looked at for {n:,} bindings"
        assert self["tables"] <= per_binding * n, f"{self['tables']:,} tables keyed"
        self.clear()

    def check(self, index: bindings.BindingTable) -> None:
        """``index.check_ids()``, whose own work is not counted."""
        index.check_ids()
        self.clear()


@pytest.fixture
def work(monkeypatch) -> Work:
    """Count the work of ``bindings``' searches (the broker runs in this process)."""
    counted = Work()

    def looking(real):
        def looked_at(*args):
            ids = list(real(*args))
            counted["ids"] += len(ids)
            return ids

        return looked_at

    real_key = bindings.arguments_key

    def arguments_key(arguments):
        counted["tables"] += 1
        return real_key(arguments)

    monkeypatch.setattr(bindings, "ids_iter", looking(bindings.ids_iter))
    monkeypatch.setattr(bindings, "ids_intersect", looking(bindings.ids_intersect))
    monkeypatch.setattr(bindings, "arguments_key", arguments_key)
    return counted


async def test_20000_fanout_and_headers_bindings_of_one_queue(broker, work):
    conn = await aio_pika.connect(broker.url)
    ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
    fx = await ch.declare_exchange("many-f", ExchangeType.FANOUT)
    hx = await ch.declare_exchange("many-h", ExchangeType.HEADERS)
    queue = await ch.declare_queue("many")
    exchanges = broker.broker.vhosts["/"].exchanges
    fanout, headers = exchanges["many-f"].index, exchanges["many-h"].index
    raw = await RawClient.connect(broker.port)
    await raw.open_channel(1)
    bound = {
        "many-f": [(f"k{i}", None) for i in range(N)],
        "many-h": [("", {"x-match": "all", "h": i}) for i in range(N)],
    }

    for name, index in (("many-f", fanout), ("many-h", headers)):
        await raw.bind_all(1, "many", name, bound[name])
        assert len(index) == N
        work.within(4)
        await raw.bind_all(1, "many", name, bound[name])  # each one bound already: no-ops
        assert len(index) == N
        work.within(4)
        work.check(index)
    await queue.bind(fx, routing_key="k7")
    await queue.bind(hx, "", arguments={"x-match": "all", "h": 7})
    await queue.bind(hx, "", arguments={"x-match": "all", "h": "7"})  # a string: a new binding
    assert (len(fanout), len(headers)) == (N, N + 1)

    await fx.publish(Message(b"fanout"), routing_key="any key")
    await hx.publish(Message(b"headers", headers={"h": 12345}), routing_key="")
    with pytest.raises(DeliveryError):  # 312 NO_ROUTE: no binding has h = N
        await hx.publish(Message(b"none", headers={"h": N}), routing_key="", mandatory=True)
    got = sorted([(await queue.get(no_ack=True)).body for _ in range(2)])
    assert got == [b"fanout", b"headers"]  # one copy each, whatever bindings lead there
    assert await queue.get(fail=False) is None

    await queue.unbind(hx, "", arguments={"x-match": "all", "h": "7"})
    work.clear()
    for name, index in (("many-f", fanout), ("many-h", headers)):
        await raw.unbind_all(1, "many", name, random.Random(1).sample(bound[name], N))
        assert len(index) == 0 and not index.has_bindings()
        work.within(4)
        work.check(index)
    await queue.unbind(fx, routing_key="k7")  # not bound any more: fine, as in RabbitMQ
    await queue.unbind(hx, "", arguments={"x-match": "all", "h": 7})
    for exchange in (fx, hx):
        with pytest.raises(DeliveryError):
            await exchange.publish(Message(b"m", headers={"h": 7}), routing_key="", mandatory=True)
    assert await queue.get(fail=False) is None
    await raw.close()
    await conn.close()
