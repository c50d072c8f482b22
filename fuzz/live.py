"""Live-broker fuzzer: hostile connections against a running RoarMQ while a good client works.

Starts a broker (a subprocess on ephemeral loopback ports, its own data dir) and, for
``--seconds``, throws at it from several concurrent workers:

- ``valid``     random but well-formed client sessions (every method the spec lets a
                client send, arguments from pools of interesting values, content with
                odd properties): the broker answers with channel/connection errors;
- ``mutate``    those sessions, bytes flipped/inserted/deleted, frames dropped,
                duplicated, swapped or truncated, lengths lied about;
- ``sequence``  well-formed frames in invalid orders and places (content without a
                method, bodies longer than declared, server-only methods, wrong channels);
- ``values``    well-formed frames carrying the values that broke brokers before: names
                not valid UTF-8, tables and arrays thousands deep, timestamps past year
                9999, ``x-death`` that is not an array, content headers with no flags;
- ``random``    random bytes, before or after a valid handshake;
- ``stream``    the stream protocol's port: its handshake (whole or cut short), commands
                with fields from pools of odd values, some mutated (fuzz/stream_sessions.py).

Meanwhile a well-behaved aio-pika client publishes persistent messages with publisher
confirms to a durable queue and a second one consumes them with acks. The run fails if
the broker dies, the good client loses its connection, a confirmed message does not
arrive, any connection is closed with 541 INTERNAL_ERROR (on the stream port: a close or
answer with the code INTERNAL_ERROR), or the broker's log has an
error or a traceback. Each failing input is saved under ``--crash-dir`` to replay.

    .venv/bin/python fuzz/live.py --seconds 60 --seed 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import stream_sessions
from sessions import STRATEGIES, Session, generate  # fuzz/ is on sys.path

#: The AMQP strategies, and the stream protocol's.
ALL_STRATEGIES = [*STRATEGIES, "stream"]

# -- what the broker answered --------------------------------------------------------------


def closes(data: bytes) -> list[tuple[str, int, str]]:
    """(level, reply code, text) of every connection.close / channel.close the server sent."""
    out = []
    pos = 0
    while pos + 7 <= len(data):
        kind, _channel, size = struct.unpack_from(">BHI", data, pos)
        payload = data[pos + 7 : pos + 7 + size]
        if len(payload) < size:
            break
        if kind == 1 and len(payload) >= 7:
            cid, mid, code = struct.unpack_from(">HHH", payload, 0)
            n = payload[6] if len(payload) > 6 else 0
            text = payload[7 : 7 + n].decode("utf-8", "replace")
            if (cid, mid) == (10, 50):
                out.append(("connection", code, text))
            elif (cid, mid) == (20, 40):
                out.append(("channel", code, text))
        pos += 8 + size
    return out


@dataclass
class Tally:
    connections: Counter = field(default_factory=Counter)
    frames: int = 0
    bytes: int = 0
    codes: Counter = field(default_factory=Counter)
    internal: list[dict[str, Any]] = field(default_factory=list)


async def throw(
    port: int, session: Session, rng: random.Random, tally: Tally, crash_dir: Path, seed: str
) -> None:
    """One hostile connection: its bytes in random pieces, then what came back, tallied."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
    except (TimeoutError, OSError):
        tally.codes["connect-failed"] += 1
        return
    data = b"".join(session.frames)
    tally.connections[session.strategy] += 1
    tally.frames += len(session.frames)
    tally.bytes += len(data)
    received = bytearray()

    async def read_all() -> None:
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                return
            received.extend(chunk)

    reading = asyncio.ensure_future(read_all())
    try:
        pos = 0
        while pos < len(data):  # in random chunks, so the parser sees every split
            step = rng.choice((1, 7, 64, 1000, 65536, len(data)))
            writer.write(data[pos : pos + step])
            pos += step
            if rng.random() < 0.2:
                await writer.drain()
        await writer.drain()
        await asyncio.wait_for(asyncio.shield(reading), rng.choice((0.05, 0.3, 1.0)))
    except (TimeoutError, OSError, ConnectionError):
        pass
    finally:
        reading.cancel()
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), 2)
        except (TimeoutError, OSError, ConnectionError):
            pass
    if session.strategy == "stream":
        for code in stream_sessions.closes(bytes(received)):
            tally.codes[f"stream {code:#04x}"] += 1
            if code == stream_sessions.Code.INTERNAL_ERROR:
                path = crash_dir / f"stream-internal-{seed}.bin"
                path.write_bytes(data)
                tally.internal.append(
                    {"seed": seed, "strategy": "stream", "text": "", "input": str(path)}
                )
        return
    for level, code, text in closes(bytes(received)):
        tally.codes[f"{level} {code}"] += 1
        if code == 541:
            path = crash_dir / f"541-{seed}.bin"
            path.write_bytes(data)
            tally.internal.append(
                {"seed": seed, "strategy": session.strategy, "text": text, "input": str(path)}
            )


# -- the well-behaved client ---------------------------------------------------------------


class GoodClient:
    """Publishes persistent messages with confirms and consumes them with acks."""

    def __init__(self, port: int) -> None:
        self.url = f"amqp://guest:guest@127.0.0.1:{port}/"
        self.queue = f"fuzz-good-{os.getpid()}"
        self.confirmed: set[int] = set()
        self.received: set[int] = set()
        self.errors: list[str] = []
        self.stop = asyncio.Event()
        self.published_all = asyncio.Event()

    async def run_publisher(self) -> None:
        import aio_pika

        conn = await aio_pika.connect(self.url)
        try:
            ch = await conn.channel(publisher_confirms=True)
            await ch.declare_queue(self.queue, durable=True)
            seq = 0
            while not self.stop.is_set():
                batch = []
                for _ in range(20):
                    seq += 1
                    msg = aio_pika.Message(
                        str(seq).encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT
                    )
                    batch.append((seq, ch.default_exchange.publish(msg, routing_key=self.queue)))
                for n, fut in batch:
                    await fut
                    self.confirmed.add(n)
                await asyncio.sleep(0.01)
        except Exception as exc:  # the run fails on any error of the good client
            self.errors.append(f"publisher: {exc!r}")
        finally:
            self.published_all.set()
            await conn.close()

    async def run_consumer(self, ready: asyncio.Event) -> None:
        import aio_pika

        conn = await aio_pika.connect(self.url)
        try:
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=100)
            q = await ch.declare_queue(self.queue, durable=True)
            ready.set()
            async with q.iterator() as it:
                async for msg in it:
                    self.received.add(int(msg.body))
                    await msg.ack()
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            self.errors.append(f"consumer: {exc!r}")
        finally:
            ready.set()
            await conn.close()


# -- the broker under test -----------------------------------------------------------------


class BrokerProcess:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.log_path = work / "broker.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.stream_port = 0

    def start(self) -> None:
        cfg = self.work / "fuzz.toml"
        cfg.write_text('[log]\nlevel = "info"\nformat = "json"\n[management]\nenabled = false\n')
        cmd = [
            sys.executable, "-m", "roarmq", "serve", "--config", str(cfg), "--port", "0",
            "--data-dir", str(self.work / "data"),
        ]  # fmt: skip
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            said = self.log_path.read_text(errors="replace")
            m = re.search(r"AMQP on .*? port (\d+)", said)
            if m:
                self.port = int(m.group(1))
                s = re.search(r"streams on [^,\s]*:(\d+)", said)
                self.stream_port = int(s.group(1)) if s else 0
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(
            f"broker did not start; log:\n{self.log_path.read_text(errors='replace')}"
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def problems(self) -> list[str]:
        """Log lines at error level or above, tracebacks, and anything not JSON."""
        bad = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                if line.strip():
                    bad.append(line)
                continue
            if doc.get("level") in ("error", "critical") or "exc" in doc:
                bad.append(line)
        return bad


# -- the run ---------------------------------------------------------------------------------


async def fuzz(args: argparse.Namespace, broker: BrokerProcess, crash_dir: Path) -> dict[str, Any]:
    tally = Tally()
    good = GoodClient(broker.port)
    ready = asyncio.Event()
    consumer = asyncio.ensure_future(good.run_consumer(ready))
    await ready.wait()
    publisher = asyncio.ensure_future(good.run_publisher())
    deadline = time.monotonic() + args.seconds
    weights = [float(w) for w in args.weights.split(",")]

    async def worker(n: int) -> None:
        i = 0
        while time.monotonic() < deadline and broker.alive():
            seed = f"{args.seed}-{n}-{i}"
            rng = random.Random(seed)
            strategy = rng.choices(ALL_STRATEGIES, weights)[0]
            if strategy == "stream":
                session = Session("stream", stream_sessions.session(rng))
                await throw(broker.stream_port, session, rng, tally, crash_dir, seed)
            else:
                session = generate(rng, strategy)
                await throw(broker.port, session, rng, tally, crash_dir, seed)
            i += 1

    started = time.monotonic()
    await asyncio.gather(*(worker(n) for n in range(args.concurrency)))
    elapsed = time.monotonic() - started
    good.stop.set()
    await asyncio.wait_for(publisher, 30)
    drain_deadline = time.monotonic() + 30
    while not good.confirmed <= good.received and time.monotonic() < drain_deadline:
        await asyncio.sleep(0.1)
    consumer.cancel()
    await asyncio.gather(consumer, return_exceptions=True)
    lost = sorted(good.confirmed - good.received)
    return {
        "seconds": round(elapsed, 1),
        "connections": dict(tally.connections),
        "connections_total": sum(tally.connections.values()),
        "frames": tally.frames,
        "bytes": tally.bytes,
        "closes": dict(sorted(tally.codes.items())),
        "internal_errors": tally.internal,
        "good_client": {
            "confirmed": len(good.confirmed),
            "received": len(good.received),
            "lost": lost[:20],
            "lost_count": len(lost),
            "errors": good.errors,
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--seed", default=str(int(time.time())))
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument(
        "--weights",
        default="2,3,2,2,1,2",
        help=f"relative weights of {','.join(ALL_STRATEGIES)}",
    )
    p.add_argument("--crash-dir", default="fuzz/crashes")
    p.add_argument("--json", help="write the summary here")
    p.add_argument("--keep", action="store_true", help="keep the broker's data dir and log")
    p.add_argument("--replay", nargs="+", metavar="FILE", help="send saved inputs to a new broker")
    args = p.parse_args(argv)
    crash_dir = Path(args.crash_dir)
    crash_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="roarmq-fuzz-"))
    broker = BrokerProcess(work)
    broker.start()
    if args.replay:
        return replay(args.replay, broker)
    try:
        result = asyncio.run(fuzz(args, broker, crash_dir))
        result["broker_alive_at_end"] = broker.alive()
    finally:
        code = broker.stop()
    result["seed"] = args.seed
    result["broker_exit"] = code
    result["log_problems"] = broker.problems()[:50]
    ok = (
        result["broker_alive_at_end"]
        and code == 0
        and not result["internal_errors"]
        and not result["log_problems"]
        and not result["good_client"]["lost_count"]
        and not result["good_client"]["errors"]
    )
    result["ok"] = bool(ok)
    print_summary(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    if ok and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"broker data dir and log kept in {work}")
    return 0 if ok else 1


def replay(files: list[str], broker: BrokerProcess) -> int:
    """Send each saved input on its own connection; print what the broker answered."""

    async def send_all() -> list[list[tuple[str, int, str]]]:
        answers = []
        for f in files:
            reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
            writer.write(Path(f).read_bytes())
            received = b""
            try:
                while chunk := await asyncio.wait_for(reader.read(65536), 2):
                    received += chunk
            except (TimeoutError, ConnectionError):
                pass
            writer.close()
            answers.append(closes(received))
        return answers

    try:
        answers = asyncio.run(send_all())
    finally:
        broker.stop()
    bad = False
    for f, got in zip(files, answers, strict=True):
        print(f"{f}: {got or 'no close'}")
        bad |= any(code == 541 for _, code, _ in got)
    for line in broker.problems():
        print(f"log: {line[:2000]}")
        bad = True
    print(f"broker log: {broker.log_path}")
    return 1 if bad else 0


def print_summary(r: dict[str, Any]) -> None:
    g = r["good_client"]
    rows = [
        ("seed", r["seed"]),
        ("seconds", r["seconds"]),
        ("hostile connections", r["connections_total"]),
        ("  by strategy", ", ".join(f"{k} {v}" for k, v in sorted(r["connections"].items()))),
        ("frames thrown", r["frames"]),
        ("bytes thrown", r["bytes"]),
        ("closes by code", ", ".join(f"{k}: {v}" for k, v in r["closes"].items())),
        ("541 INTERNAL_ERROR", len(r["internal_errors"])),
        ("broker log errors/tracebacks", len(r["log_problems"])),
        (
            "good client confirmed / received / lost",
            f"{g['confirmed']} / {g['received']} / {g['lost_count']}",
        ),
        ("good client errors", "; ".join(g["errors"]) or "none"),
        ("broker alive at end, exit code", f"{r['broker_alive_at_end']}, {r['broker_exit']}"),
        ("result", "OK" if r["ok"] else "FAILED"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    for e in r["internal_errors"][:10]:
        print(f"541: seed {e['seed']} ({e['strategy']}): {e['text']} -> {e['input']}")
    for line in r["log_problems"][:10]:
        print(f"log: {line[:300]}")


if __name__ == "__main__":
    sys.exit(main())
