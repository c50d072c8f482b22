"""Load processes for ``bench/throughput.py``: an AMQP publisher and consumer on our own codec.

    python bench/lib/amqp_load.py consumer  --port P --scenario JSON
    python bench/lib/amqp_load.py publisher --port P --scenario JSON
    python bench/lib/amqp_load.py probe     --port P
    python bench/lib/amqp_load.py declare   --port P --scenario JSON      (bench/persistence.py)
    python bench/lib/amqp_load.py recovery  --port P --scenario JSON      (bench/persistence.py)

Run by path as a child process (``lib.LOAD``); bench/streams.py imports its client
(``connect``) instead.

Each runs in its own process (``throughput.py`` pins them with ``taskset``) on
uvloop, with an ``asyncio.Protocol`` client over ``protocol/``: ``FrameParser``
for everything received, ``encode_method``/``encode_content`` for everything
sent. The hot paths only reuse bytes those encoders produced:

* publisher: each routing key's method + content header + body-frame head is
  encoded once; a message is that prefix plus a 16-byte body (send time from
  ``time.monotonic_ns()``, sequence number, both u64) and the frame-end octet.
  Messages go out in batches of ``batch`` per ``transport.write``; writing
  waits while the transport is paused (``pause_writing``), and with confirms
  at most ``window`` messages are unconfirmed.
* consumer: receive time is ``time.monotonic_ns()`` once per ``data_received``
  chunk; latency is that minus the send time in the body (CLOCK_MONOTONIC is
  system-wide, so it compares across processes). Manual acks are single
  (``multiple=False``), one per delivery, packed from a template checked
  against ``encode_method`` at start-up.

Optional scenario settings for ``throughput.py``'s newer scenarios:

* ``queues`` (default 1): the consumer declares that many auto-delete queues
  (``{queue}.{k}``), binds each to the exchange and consumes each with its own
  consumer on the one channel (fanout); it expects ``messages * queues``
  deliveries.
* ``scan`` (no-ack only): once consuming, received bytes are not run through
  ``FrameParser`` but walked frame by frame (head + frame-end octet checked):
  a body frame's first 8 bytes are the send time, content headers and
  basic.deliver are skipped, any other method frame goes to ``FrameParser``.
  About six times the parser's rate, so ten deliveries per message do not make
  the consumer the bottleneck (single-frame bodies only, as in the benchmark).
* ``rate`` (msg/s): the publisher is paced against a monotonic schedule, in
  bursts of ``rate / 1000`` messages (at least 1, at most ``batch``): message
  ``i`` is not written before ``start + i / rate``. ``publish_rate`` in its
  result is messages / (last write - first write). A paced publisher runs on
  asyncio's own event loop, not uvloop: its ``transport.write`` sends at once
  when nothing is buffered, while uvloop queues writes to the end of the loop
  iteration. Measured at 10,000 msg/s (GarageMQ; RoarMQ alike), the uvloop
  publisher put a 0.55 ms p99 under every broker and rate (p50 0.18 ms), the
  asyncio one 0.22 ms (p50 0.10 ms); a bare TCP relay on the same cores 0.09 ms.

Both roles report their CPU time: the consumer ``cpu_pct`` (its CPU time over
its receive window / the window), the publisher ``cpu_s``.

The consumer declares the topology, prints one ``{"ready": true}`` line, then
one JSON result line; the publisher prints one JSON result line. Both stop at
their deadline (``timeout`` seconds) and report what they measured.

Optional publisher settings (``bench/persistence.py``; absent, the publisher
behaves as above):

* ``body_size`` (default 16): bodies of that many bytes, the first 16 as
  above, the rest zeros.
* ``delivery_mode``: set in the content header (2 = persistent); absent, no
  properties at all.
* ``routing_key``: publish every message with this key (instead of the
  scenario's topology), e.g. to the default exchange ``""`` and a queue name.
* ``declare_queue`` (+ ``durable``): queue.declare it before publishing.
* ``confirm_latency``: with confirms, the time from writing each publish to
  receiving the basic.ack (or nack) covering it; p50/p99/max and confirmed
  msgs/s (confirmed / (last confirm - first write)) in the result.

``declare`` declares a queue (``passive`` to only ask for its message count)
and prints the count. ``recovery`` is started before a broker restarts: it
prints ``{"ready": true}``, then polls the port until a TCP connection is
accepted, completes the AMQP handshake, and passively declares ``queue`` until
its message_count reaches ``expect``, printing the CLOCK_MONOTONIC times (ns)
of each step.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import signal
import sys
import time
from pathlib import Path
from struct import Struct
from typing import Any

if __name__ == "__main__":  # run by path: sys.path[0] is bench/lib, and lib lives in bench/
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import lib  # noqa: E402, F401 - first: this tree's roarmq is the one measured (lib.REPO)
from roarmq.protocol import spec  # noqa: E402
from roarmq.protocol.frames import (  # noqa: E402
    PROTOCOL_HEADER,
    ContentMessage,
    FrameParser,
    Heartbeat,
    MethodFrame,
    encode_content,
    encode_method,
)
from roarmq.protocol.properties import BasicProperties  # noqa: E402

CHANNEL = 1
BODY_SIZE = 16  # send time (u64 ns) + sequence (u64)
_pack_body = Struct(">QQB").pack  # body + the frame-end octet that closes the body frame
_unpack_body = Struct(">QQ").unpack_from
_pack_head = Struct(">QQ").pack  # the first 16 bytes of a longer body
# basic.ack on channel 1: frame head, class 60 / method 80, delivery tag, multiple bit, frame end.
_pack_ack = Struct(">BHIHHQBB").pack
_unpack_frame_head = Struct(">BHI").unpack_from  # type, channel, payload size
_unpack_u64 = Struct(">Q").unpack_from
_DELIVER = b"\x00\x3c\x00\x3c"  # class 60 (basic), method 60 (deliver)


# -- topology ----------------------------------------------------------------------


def topology(scenario: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(binding keys of the one queue, routing keys the publisher cycles through).

    direct: one binding ``bench.key``; every message is published with it.
    topic:  ``bindings`` wildcard patterns on one topic exchange, all to the one queue:
            ``s{i}.*.x`` for even i, ``s{i}.#`` for odd i. Routing keys are
            ``s{i}.w{j}.x`` (even i) / ``s{i}.w{j}.y`` (odd i), so each key matches
            exactly one binding; ``topic_keys`` distinct keys spread evenly over the
            bindings, in a fixed shuffled order (seed 1), cycled by the publisher.
            shape "leading" (topic-1000-lead): ``*.e{i}.#`` for even i, ``#.o{i}`` for odd
            i, keys ``p{j}.e{i}.z`` / ``p{j}.q.o{i}``: still one match per key, but no
            prefix of a key prunes the patterns, so a trie walk visits far more nodes.
    """
    if scenario["exchange_type"] in ("direct", "fanout"):  # fanout ignores the key
        return ["bench.key"], ["bench.key"]
    n = scenario["bindings"]
    leading = scenario.get("shape") == "leading"
    if leading:
        patterns = [f"*.e{i}.#" if i % 2 == 0 else f"#.o{i}" for i in range(n)]
    else:
        patterns = [f"s{i}.*.x" if i % 2 == 0 else f"s{i}.#" for i in range(n)]
    keys = []
    for k in range(scenario["topic_keys"]):
        i, j = k % n, k // n
        if leading:
            keys.append(f"p{j}.e{i}.z" if i % 2 == 0 else f"p{j}.q.o{i}")
        else:
            keys.append(f"s{i}.w{j}.x" if i % 2 == 0 else f"s{i}.w{j}.y")
    random.Random(1).shuffle(keys)
    return patterns, keys


# -- the client ----------------------------------------------------------------------


class BrokerClosed(Exception):
    pass


class Client(asyncio.Protocol):
    """A minimal AMQP client: handshake and synchronous methods, plus the two hot paths."""

    def __init__(self) -> None:
        self.parser = FrameParser(expect_protocol_header=False)
        self.transport: asyncio.Transport | None = None
        self.replies: asyncio.Queue[Any] = asyncio.Queue()
        self.frame_max = 131072
        self.server_properties: dict[str, Any] = {}
        self.error: str | None = None
        self.lost = asyncio.get_running_loop().create_future()
        self._resume: asyncio.Future[None] | None = None
        self.paused = False
        # consumer
        self.on_deliveries = None  # callable(list of ContentMessage, now_ns)
        # consumer, scan mode: latencies appended here, then on_scanned(now_ns) per chunk
        self.scan_latencies: list[int] | None = None
        self.on_scanned = None
        self._scan_buf = bytearray()
        # publisher confirms
        self.confirmed = 0
        self.nacked = 0
        self._acked: bytearray = bytearray()
        self._floor = 0
        self._confirm_waiter: asyncio.Future[None] | None = None
        # confirm latency: write time (monotonic ns) by delivery tag, when recorded
        self.sent_at: list[int] | None = None
        self.confirm_latencies: list[int] = []
        self.last_confirm_ns = 0

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.error is None:
            self.error = f"connection lost: {exc}" if exc else "connection closed by broker"
        if not self.lost.done():
            self.lost.set_result(None)
        self._wake()
        self.replies.put_nowait(BrokerClosed(self.error))

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self._resume is not None and not self._resume.done():
            self._resume.set_result(None)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        if self.scan_latencies is not None:
            self._scan(data, now)
            return
        try:
            events = self.parser.feed(data)
        except Exception as exc:  # a codec error: report it, stop
            self.error = f"frame error: {exc!r}"
            self.transport.close()  # type: ignore[union-attr]
            return
        self._dispatch(events, now)

    def _scan(self, data: bytes, now: int) -> None:
        """Scan mode: walk whole frames, latency from each body frame, the rest skipped."""
        buf = self._scan_buf
        buf += data
        end = len(buf)
        pos = 0
        lat = self.scan_latencies
        append = lat.append  # type: ignore[union-attr]
        head = _unpack_frame_head
        u64 = _unpack_u64
        while end - pos >= 7:
            kind, _, size = head(buf, pos)
            nxt = pos + size + 8
            if nxt > end:
                break
            if buf[nxt - 1] != 0xCE:
                self.error = f"frame error: no frame-end octet at {pos} (type {kind})"
                self.transport.close()  # type: ignore[union-attr]
                return
            if kind == 3:  # content body: send time first
                if size >= 8:
                    append(now - u64(buf, pos + 7)[0])
            elif kind == 1 and buf[pos + 7 : pos + 11] != _DELIVER:  # e.g. consume-ok, close
                try:
                    events = FrameParser(expect_protocol_header=False).feed(bytes(buf[pos:nxt]))
                except Exception as exc:
                    self.error = f"frame error: {exc!r}"
                    self.transport.close()  # type: ignore[union-attr]
                    return
                self._dispatch(events, now)
            pos = nxt
        del buf[:pos]
        if self.on_scanned is not None:
            self.on_scanned(now)

    def _dispatch(self, events: list[Any], now: int) -> None:
        deliveries = None
        for ev in events:
            if type(ev) is ContentMessage:
                if deliveries is None:
                    deliveries = []
                deliveries.append(ev)
            elif type(ev) is MethodFrame:
                method = ev.method
                kind = type(method)
                if kind is spec.BasicAck or kind is spec.BasicNack:
                    self._confirm(method.delivery_tag, method.multiple, kind is spec.BasicNack, now)
                elif kind is spec.ConnectionClose or kind is spec.ChannelClose:
                    self.error = f"{kind.__name__}: {method.reply_code} {method.reply_text}"
                    if kind is spec.ConnectionClose:
                        self.transport.write(encode_method(0, spec.ConnectionCloseOk()))  # type: ignore[union-attr]
                    self.replies.put_nowait(BrokerClosed(self.error))
                else:
                    self.replies.put_nowait(method)
            elif type(ev) is not Heartbeat:
                self.replies.put_nowait(ev.method)  # a basic.return or get-ok: unexpected
        if deliveries is not None and self.on_deliveries is not None:
            self.on_deliveries(deliveries, now)

    # confirms: delivery tags 1..n, possibly acked out of order or with multiple=True
    def expect_confirms(self, n: int) -> None:
        self._acked = bytearray(n + 2)

    def _confirm(self, tag: int, multiple: bool, nack: bool, now: int = 0) -> None:
        acked = self._acked
        before = self.confirmed
        sent_at = self.sent_at
        if multiple:
            for t in range(self._floor + 1, min(tag, len(acked) - 1) + 1):
                if not acked[t]:
                    acked[t] = 1
                    self.confirmed += 1
                    self.nacked += nack
                    if sent_at is not None:
                        self.confirm_latencies.append(now - sent_at[t])
            self._floor = max(self._floor, tag)
        elif tag < len(acked) and not acked[tag]:
            acked[tag] = 1
            self.confirmed += 1
            self.nacked += nack
            if sent_at is not None:
                self.confirm_latencies.append(now - sent_at[tag])
        if self.confirmed != before:
            self.last_confirm_ns = now
            self._wake()

    def _wake(self) -> None:
        w = self._confirm_waiter
        if w is not None and not w.done():
            w.set_result(None)
        r = self._resume
        if r is not None and not r.done() and self.lost.done():
            r.set_result(None)

    def confirm_progress(self) -> asyncio.Future:
        """A future done at the next confirm. Made here, not in a coroutine: `wait_for` runs a
        coroutine's first step a loop turn later, and a confirm read in that turn found no
        waiter to wake, stalling a window-1 publisher until its deadline."""
        self._confirm_waiter = asyncio.get_running_loop().create_future()
        return self._confirm_waiter

    async def writable(self) -> None:
        if self.paused and not self.lost.done():
            self._resume = asyncio.get_running_loop().create_future()
            await self._resume

    # synchronous methods
    def send(self, channel: int, method: Any) -> None:
        self.transport.write(encode_method(channel, method))  # type: ignore[union-attr]

    async def reply(self, kind: type, timeout: float = 30.0) -> Any:
        got = await asyncio.wait_for(self.replies.get(), timeout)
        if isinstance(got, BrokerClosed):
            raise got
        if not isinstance(got, kind):
            raise BrokerClosed(f"expected {kind.__name__}, got {got!r}")
        return got

    async def call(self, method: Any, kind: type) -> Any:
        self.send(CHANNEL, method)
        return await self.reply(kind)

    async def handshake(self) -> None:
        self.transport.write(PROTOCOL_HEADER)  # type: ignore[union-attr]
        start = await self.reply(spec.ConnectionStart)
        self.server_properties = start.server_properties or {}
        self.send(
            0,
            spec.ConnectionStartOk(
                client_properties={
                    "product": "roarmq-bench",
                    "capabilities": {
                        "publisher_confirms": True,
                        "basic.nack": True,
                        "consumer_cancel_notify": True,
                    },
                },
                mechanism="PLAIN",
                response=b"\x00guest\x00guest",
                locale="en_US",
            ),
        )
        tune = await self.reply(spec.ConnectionTune)
        self.frame_max = tune.frame_max or 131072
        self.parser.frame_max = tune.frame_max
        self.send(
            0,
            spec.ConnectionTuneOk(
                channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0
            ),
        )
        self.send(0, spec.ConnectionOpen(virtual_host="/"))
        await self.reply(spec.ConnectionOpenOk)
        await self.call(spec.ChannelOpen(), spec.ChannelOpenOk)

    async def close(self, timeout: float = 10.0) -> None:
        if self.lost.done():
            return
        try:
            self.send(0, spec.ConnectionClose(reply_code=200, reply_text="bye"))
            await asyncio.wait_for(self.reply(spec.ConnectionCloseOk), timeout)
        except (BrokerClosed, TimeoutError, ConnectionError):
            pass
        finally:
            self.transport.close()  # type: ignore[union-attr]


async def connect(port: int) -> Client:
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(Client, "127.0.0.1", port)
    await asyncio.wait_for(client.handshake(), 30)
    return client


def _prop(props: dict[str, Any], name: str) -> str:
    value = props.get(name, "")
    return value.decode() if isinstance(value, bytes) else str(value)


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def percentile(sorted_values: list[int], q: float) -> float:
    """Nearest-rank percentile of an ascending list (ns -> ms)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), math.ceil(q / 100 * len(sorted_values))))
    return sorted_values[rank - 1] / 1e6


# -- roles -------------------------------------------------------------------------


async def consumer(port: int, sc: dict[str, Any], stop: asyncio.Event) -> dict[str, Any]:
    deadline = time.monotonic() + sc["timeout"]
    client = await connect(port)
    exchange, queue = sc["exchange"], sc.get("queue", "bench.q")
    nqueues = sc.get("queues", 1)
    queues = [queue] if nqueues == 1 else [f"{queue}.{k}" for k in range(nqueues)]
    patterns, _ = topology(sc)
    await client.call(
        spec.ExchangeDeclare(exchange=exchange, type=sc["exchange_type"]), spec.ExchangeDeclareOk
    )
    bind_s = 0.0  # time from the first queue.bind sent to the last bind-ok received
    for k, name in enumerate(queues):
        if sc.get("key_per_queue"):  # queue k gets only key "bench.key.k" (no fan-out)
            patterns = [f"bench.key.{k}"]
        # auto-delete: gone with this consumer, so a reused broker keeps no leftovers
        declare = spec.QueueDeclare(
            queue=name,
            durable=sc.get("durable", False),
            auto_delete=True,
            arguments=sc.get("queue_arguments") or {},
        )
        await client.call(declare, spec.QueueDeclareOk)
        bind_started = time.perf_counter()
        for pattern in patterns:  # pipelined: all binds out, then all bind-oks in
            client.send(CHANNEL, spec.QueueBind(queue=name, exchange=exchange, routing_key=pattern))
        for _ in patterns:
            await client.reply(spec.QueueBindOk)
        bind_s += time.perf_counter() - bind_started
    binds = len(patterns) * len(queues)
    no_ack = not sc["manual_ack"]
    if sc["prefetch"]:
        await client.call(spec.BasicQos(prefetch_count=sc["prefetch"]), spec.BasicQosOk)

    expected = sc["messages"] * (1 if sc.get("key_per_queue") else nqueues)
    latencies: list[int] = []
    state = {"first_send": 0, "last_recv": 0, "cpu_first": 0.0, "cpu_last": 0.0, "first_recv": 0}
    cpu = time.process_time
    done = asyncio.get_running_loop().create_future()
    transport = client.transport
    ack_template = encode_method(CHANNEL, spec.BasicAck(delivery_tag=0x0102030405060708))
    assert ack_template == _pack_ack(1, CHANNEL, 13, 60, 80, 0x0102030405060708, 0, 0xCE)
    lat_append = latencies.append

    def on_deliveries(batch: list[ContentMessage], now: int) -> None:
        if not latencies:
            state["first_send"] = _unpack_body(batch[0].body)[0]
            state["first_recv"] = now
            state["cpu_first"] = cpu()
        for ev in batch:
            lat_append(now - _unpack_body(ev.body)[0])
        if not no_ack:
            transport.write(
                b"".join(
                    [
                        _pack_ack(1, CHANNEL, 13, 60, 80, ev.method.delivery_tag, 0, 0xCE)
                        for ev in batch
                    ]
                )
            )
        state["last_recv"] = now
        state["cpu_last"] = cpu()
        if len(latencies) >= expected and not done.done():
            done.set_result(None)

    def on_scanned(now: int) -> None:  # scan mode: latencies appended by the client
        if not latencies:
            return
        if not state["first_send"]:
            state["first_send"] = now - latencies[0]  # received in this chunk
            state["first_recv"] = now
            state["cpu_first"] = cpu()
        state["last_recv"] = now
        state["cpu_last"] = cpu()
        if len(latencies) >= expected and not done.done():
            done.set_result(None)

    if sc.get("scan") and no_ack:
        client.scan_latencies = latencies
        client.on_scanned = on_scanned
    else:
        client.on_deliveries = on_deliveries
    for k, name in enumerate(queues):
        await client.call(
            spec.BasicConsume(
                queue=name, consumer_tag=f"bench{k}" if k else "bench", no_ack=no_ack
            ),
            spec.BasicConsumeOk,
        )
    emit(
        {
            "ready": True,
            "server": _prop(client.server_properties, "product"),
            "version": _prop(client.server_properties, "version"),
        }
    )

    waiters = [done, client.lost, asyncio.ensure_future(stop.wait())]
    await asyncio.wait(
        waiters, timeout=max(0.0, deadline - time.monotonic()), return_when=asyncio.FIRST_COMPLETED
    )
    client.on_deliveries = client.on_scanned = None
    waiters[2].cancel()
    received = len(latencies)
    latencies.sort()
    elapsed = (state["last_recv"] - state["first_send"]) / 1e9 if received else 0.0
    window = (state["last_recv"] - state["first_recv"]) / 1e9
    result = {
        "received": received,
        "expected": expected,
        "timed_out": received < expected,
        "elapsed_s": elapsed,
        "msgs_per_s": received / elapsed if elapsed > 0 else 0.0,
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "p999_ms": percentile(latencies, 99.9),
        "max_ms": latencies[-1] / 1e6 if latencies else float("nan"),
        "cpu_pct": 100 * (state["cpu_last"] - state["cpu_first"]) / window
        if window > 0.01
        else None,
        "error": client.error,
        "binds": binds,
        "binds_per_s": binds / bind_s if bind_s > 0 else None,
    }
    client.transport.close()  # type: ignore[union-attr]
    return result


async def publisher(port: int, sc: dict[str, Any], stop: asyncio.Event) -> dict[str, Any]:
    deadline = time.monotonic() + sc["timeout"]
    client = await connect(port)
    n, batch, window = sc["messages"], sc["batch"], sc["window"]
    confirms = sc["confirms"]
    body_size = sc.get("body_size", BODY_SIZE)
    if body_size < BODY_SIZE or body_size > client.frame_max - 8:
        raise ValueError(f"body_size must be {BODY_SIZE}..{client.frame_max - 8} (one body frame)")
    if sc.get("declare_queue"):
        await client.call(
            spec.QueueDeclare(queue=sc["declare_queue"], durable=sc.get("durable", False)),
            spec.QueueDeclareOk,
        )
    if confirms:
        client.expect_confirms(n)
        await client.call(spec.ConfirmSelect(), spec.ConfirmSelectOk)
    sent_at = None
    if confirms and sc.get("confirm_latency"):
        sent_at = client.sent_at = [0] * (n + 2)  # by delivery tag = seq + 1
    keys = [sc["routing_key"]] if "routing_key" in sc else topology(sc)[1]
    props = BasicProperties()
    if sc.get("delivery_mode") is not None:
        props = BasicProperties(delivery_mode=sc["delivery_mode"])
    pad = bytes(body_size - BODY_SIZE)  # after the send time and sequence number
    prefixes = []
    for key in keys:
        method = spec.BasicPublish(exchange=sc["exchange"], routing_key=key)
        frames = encode_content(CHANNEL, method, props, b"\0" * body_size, client.frame_max)
        prefixes.append(frames[: -(body_size + 1)])  # up to and including the body frame head
    nkeys = len(prefixes)
    transport = client.transport
    mono = time.monotonic_ns
    sent = 0
    first_write_ns = last_write_ns = 0
    rate = sc.get("rate", 0)  # msg/s; 0: unthrottled
    burst = max(1, min(batch, rate // 1000))  # paced: ~1 ms of messages per write
    cpu0 = time.process_time()
    t0 = time.monotonic()
    while sent < n and not stop.is_set() and not client.lost.done():
        if time.monotonic() > deadline:
            break
        if rate and first_write_ns:  # message `sent` is due at first write + sent / rate
            delay = (first_write_ns + sent * 1_000_000_000 // rate - mono()) / 1e9
            if delay > 0:
                await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
                continue
        if client.paused:
            try:
                await asyncio.wait_for(client.writable(), max(0.01, deadline - time.monotonic()))
            except TimeoutError:
                pass
            continue
        count = min(burst if rate else batch, n - sent)
        if confirms:
            room = window - (sent - client.confirmed)
            if room <= 0:
                try:
                    await asyncio.wait_for(
                        client.confirm_progress(), max(0.01, deadline - time.monotonic())
                    )
                except TimeoutError:
                    pass
                continue
            count = min(count, room)
        parts = []
        if not pad:
            for seq in range(sent, sent + count):
                parts.append(prefixes[seq % nkeys])
                parts.append(_pack_body(mono(), seq, 0xCE))
        else:
            for seq in range(sent, sent + count):
                parts.append(prefixes[seq % nkeys])
                parts.append(_pack_head(mono(), seq))
                parts.append(pad)
                parts.append(b"\xce")
        if not first_write_ns:
            first_write_ns = mono()
        transport.write(b"".join(parts))  # type: ignore[union-attr]
        last_write_ns = mono()
        if sent_at is not None:  # write time: just after the write of its batch
            now = mono()
            for tag in range(sent + 1, sent + count + 1):
                sent_at[tag] = now
        sent += count
        await asyncio.sleep(0)  # let confirms / pause_writing in
    t_written = time.monotonic()
    while confirms and client.confirmed < sent and not client.lost.done() and not stop.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            await asyncio.wait_for(client.confirm_progress(), remaining)
        except TimeoutError:
            break
    t_end = time.monotonic()
    cpu_s = time.process_time() - cpu0
    if not confirms and not client.lost.done() and not stop.is_set():
        # one round trip on the publishing channel before connection.close: GarageMQ drops
        # the publishes a channel has not routed yet when the connection closes
        with contextlib.suppress(BrokerClosed, TimeoutError):
            client.send(CHANNEL, spec.BasicQos(prefetch_count=0))
            await client.reply(spec.BasicQosOk, max(1.0, min(10.0, deadline - time.monotonic())))
    error = client.error
    unexpected = []  # e.g. connection.blocked: anything the broker sent that nobody awaited
    while not client.replies.empty():
        got = client.replies.get_nowait()
        unexpected.append(str(got) if isinstance(got, BrokerClosed) else type(got).__name__)
    await client.close(timeout=max(1.0, min(10.0, deadline - time.monotonic())))
    result = {
        "sent": sent,
        "confirmed": client.confirmed,
        "nacked": client.nacked,
        "write_s": t_written - t0,
        "total_s": t_end - t0,
        "cpu_s": cpu_s,
        "publish_rate": (sent - 1) * 1e9 / (last_write_ns - first_write_ns)
        if sent > 1 and last_write_ns > first_write_ns
        else None,
        "error": error,
    }
    if unexpected:
        result["unexpected"] = unexpected[:20]
    if sent_at is not None:
        lat = client.confirm_latencies
        lat.sort()
        span = (client.last_confirm_ns - first_write_ns) / 1e9 if lat else 0.0
        result.update(
            {
                "confirm_elapsed_s": span,
                "confirmed_per_s": client.confirmed / span if span > 0 else 0.0,
                "confirm_p50_ms": percentile(lat, 50),
                "confirm_p99_ms": percentile(lat, 99),
                "confirm_max_ms": lat[-1] / 1e6 if lat else float("nan"),
            }
        )
    return result


async def declare(port: int, sc: dict[str, Any]) -> dict[str, Any]:
    client = await connect(port)
    ok = await client.call(
        spec.QueueDeclare(
            queue=sc["queue"], durable=sc.get("durable", True), passive=sc.get("passive", False)
        ),
        spec.QueueDeclareOk,
    )
    await client.close()
    return {
        "queue": ok.queue,
        "message_count": ok.message_count,
        "consumer_count": ok.consumer_count,
    }


async def recovery(port: int, sc: dict[str, Any], stop: asyncio.Event) -> dict[str, Any]:
    """Times (CLOCK_MONOTONIC ns) at which a restarting broker accepts, speaks AMQP, has the count.

    Polls every ``interval_ms``: TCP connect until one is accepted (``accept_ns``),
    then the handshake (``open_ns``: connection.open-ok and channel.open-ok), then a
    passive queue.declare of ``queue`` until message_count >= ``expect``
    (``count_ns``). Without ``queue`` it stops after the handshake.
    """
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + sc["timeout"]
    interval = sc.get("interval_ms", 5) / 1000
    out: dict[str, Any] = {
        "accept_ns": None,
        "open_ns": None,
        "count_ns": None,
        "message_count": None,
        "polls": 0,
        "error": None,
    }
    emit({"ready": True})
    client = None
    while not stop.is_set() and time.monotonic() < deadline:
        out["polls"] += 1
        try:
            transport, client = await loop.create_connection(Client, "127.0.0.1", port)
        except OSError:
            client = None
            await asyncio.sleep(interval)
            continue
        if out["accept_ns"] is None:
            out["accept_ns"] = time.monotonic_ns()
        try:
            await asyncio.wait_for(client.handshake(), max(0.1, deadline - time.monotonic()))
        except (BrokerClosed, OSError, TimeoutError) as exc:
            out["error"] = f"handshake: {type(exc).__name__}: {exc}"
            transport.close()
            client = None
            await asyncio.sleep(interval)
            continue
        out["open_ns"] = time.monotonic_ns()
        break
    if client is None or out["open_ns"] is None:
        out["error"] = out["error"] or "timed out waiting for the port"
        return out
    out["error"] = None
    queue = sc.get("queue")
    while queue and not stop.is_set() and time.monotonic() < deadline:
        try:
            ok = await client.call(
                spec.QueueDeclare(queue=queue, durable=True, passive=True), spec.QueueDeclareOk
            )
        except BrokerClosed as exc:  # e.g. 404 while the queue is not back yet: new channel
            out["error"] = str(exc)
            if client.lost.done():
                break
            client.send(CHANNEL, spec.ChannelCloseOk())
            await asyncio.sleep(interval)
            await client.call(spec.ChannelOpen(), spec.ChannelOpenOk)
            continue
        out["message_count"] = ok.message_count
        if ok.message_count >= sc.get("expect", 0):
            out["count_ns"] = time.monotonic_ns()
            out["error"] = None
            break
        await asyncio.sleep(interval)
    else:
        if queue and out["count_ns"] is None:
            out["error"] = out["error"] or "timed out waiting for the message count"
    await client.close()
    return out


async def probe(port: int) -> dict[str, Any]:
    client = await connect(port)
    props = client.server_properties
    await client.close()
    return {"product": _prop(props, "product"), "version": _prop(props, "version")}


async def amain(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        if args.role == "probe":
            emit(await probe(args.port))
            return 0
        sc = json.loads(args.scenario)
        if args.role == "declare":
            emit(await declare(args.port, sc))
            return 0
        if args.role == "recovery":
            emit(await recovery(args.port, sc, stop))
            return 0
        role = consumer if args.role == "consumer" else publisher
        emit(await role(args.port, sc, stop))
        return 0
    except (BrokerClosed, OSError, TimeoutError, ValueError) as exc:
        emit({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    finally:
        # done: a SIGTERM from now on just ends the process (asyncio's loop would otherwise
        # complain about its closed wakeup fd while shutting down)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("role", choices=["consumer", "publisher", "probe", "declare", "recovery"])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--scenario", default="{}", help="scenario settings as JSON")
    args = p.parse_args()
    if args.role == "publisher" and json.loads(args.scenario).get("rate"):
        return asyncio.run(amain(args))  # paced: asyncio's own loop, see the module docstring
    try:
        import uvloop
    except ImportError:
        return asyncio.run(amain(args))
    return uvloop.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
