"""What the cluster tests and bench/cluster.py share: `FaultLoad` (publishers with confirms and
consumers across a cluster's nodes while faults run) and `api_call`."""

from __future__ import annotations

import base64
import contextlib
import json
import random
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable

import pika


def api_call(
    port: int, method: str, path: str, body=None, auth=("guest", "guest")
) -> tuple[int, dict, object]:
    """One management API call on 127.0.0.1:`port`: (status, headers, decoded body or None);
    an HTTP error is an answer too."""
    token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Basic {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            text = resp.read()
            return resp.status, dict(resp.headers), json.loads(text) if text else None
    except urllib.error.HTTPError as exc:
        text = exc.read()
        return exc.code, dict(exc.headers), json.loads(text) if text else None


# -- the fault workload (tests/cluster/test_fault_rounds.py and bench/cluster.py) ----------

LED_BY = re.compile(r"led by node '([^']+)' at ([^\s:']+):(\d+)")
PERSISTENT = pika.BasicProperties(delivery_mode=2)


class FaultLoad:
    """One publisher with confirms and one consumer with manual acks, each in a thread,
    each on a random endpoint; on any error (a 530 is followed to the leader it names,
    anything else: another random endpoint) they reconnect and the publisher republishes
    its unconfirmed message. Bodies are the message ids, a counter. A publish whose confirm
    has not come after ``confirm_timeout`` (a frozen leader) has its socket shut, which
    counts as an error like any other. An endpoint that failed is avoided for
    ``avoid_failed`` seconds (while another is left), as a client with a list of hosts
    tries the next one: a frozen node still accepts TCP connections (the kernel answers)
    and costs a whole handshake timeout per try, so picking uniformly again could spend a
    whole freeze retrying it."""

    def __init__(
        self,
        endpoints: Callable[[], list[tuple[str, int]]],
        *,
        queue: str = "faults",
        arguments: dict | None = None,
        confirm_timeout: float = 2.0,
        idle_reconnect: float = 3.0,
        prefetch: int = 200,
        publishers: int = 1,
        avoid_failed: float = 5.0,
    ) -> None:
        self.endpoints = endpoints
        self.queue = queue
        self.arguments = arguments
        self.confirm_timeout = confirm_timeout
        self.idle_reconnect = idle_reconnect
        self.prefetch = prefetch
        self.avoid_failed = avoid_failed
        self._failed_at: dict[tuple[str, int], float] = {}  # endpoint -> when it last failed
        self.first_publish: dict[int, float] = {}
        self.confirmed: dict[int, float] = {}
        self.consumed: Counter[int] = Counter()
        self.errors: Counter[str] = Counter()
        self.republished = 0
        self._lock = threading.Lock()
        self._stop_publishing = threading.Event()
        self._stop = threading.Event()
        self._armed: dict[int, tuple[float, socket.socket]] = {}  # publisher -> deadline
        self._publishers = [
            threading.Thread(target=self._publisher, args=(i,), daemon=True)
            for i in range(publishers)
        ]
        self._threads = [
            *self._publishers,
            threading.Thread(target=self._consumer, daemon=True),
            threading.Thread(target=self._watchdog, daemon=True),
        ]

    # -- lifecycle
    def start(self) -> FaultLoad:
        for t in self._threads:
            t.start()
        return self

    def stop_publishing(self) -> None:
        self._stop_publishing.set()
        for t in self._publishers:
            t.join(15)

    def drain(self, timeout: float) -> bool:
        """Until every confirmed id has been consumed (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.lost():
                return True
            time.sleep(0.1)
        return not self.lost()

    def stop(self) -> None:
        self._stop_publishing.set()
        self._stop.set()
        for t in self._threads:
            t.join(15)

    # -- figures
    def lost(self) -> set[int]:
        with self._lock:
            return set(self.confirmed) - set(self.consumed)

    def duplicated(self) -> int:
        with self._lock:
            return sum(n - 1 for n in self.consumed.values() if n > 1)

    def first_confirm_after(self, t0: float) -> float | None:
        """Seconds from ``t0`` to the first confirm of a message first published after it."""
        with self._lock:
            times = [
                self.confirmed[i]
                for i, t in self.first_publish.items()
                if t >= t0 and i in self.confirmed
            ]
        return min(times) - t0 if times else None

    def confirmed_between(self, t0: float, t1: float) -> int:
        with self._lock:
            return sum(1 for t in self.confirmed.values() if t0 <= t <= t1)

    def wait_confirm_after(self, t0: float, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            took = self.first_confirm_after(t0)
            if took is not None:
                return took
            time.sleep(0.02)
        return self.first_confirm_after(t0)

    def summary(self) -> dict:
        return {
            "published": len(self.first_publish),
            "confirmed": len(self.confirmed),
            "consumed": len(self.consumed),
            "lost": len(self.lost()),
            "duplicated": self.duplicated(),
            "republished": self.republished,
            "errors": dict(self.errors),
        }

    # -- clients
    def _pick(self) -> tuple[str, int]:
        """A random endpoint that has not failed in the last ``avoid_failed`` s; when every
        one has, the one that failed longest ago."""
        endpoints = self.endpoints()
        now = time.monotonic()
        failed = {e: self._failed_at.get(e, -1e9) for e in endpoints}
        fresh = [e for e in endpoints if now - failed[e] > self.avoid_failed]
        return random.choice(fresh) if fresh else min(endpoints, key=failed.__getitem__)

    def _failed(self, endpoint: tuple[str, int]) -> None:
        self._failed_at[endpoint] = time.monotonic()

    def _connect(self) -> pika.BlockingConnection:
        first = self._pick()
        try:
            return self._connect_from(first)
        except Exception:
            self._failed(first)
            raise

    def _connect_from(self, endpoint: tuple[str, int]) -> pika.BlockingConnection:
        host, port = endpoint
        for _hop in range(3):
            params = pika.ConnectionParameters(
                host,
                port,
                connection_attempts=1,
                socket_timeout=1.0,
                stack_timeout=2.0,
                blocked_connection_timeout=2.0,
                heartbeat=0,
            )
            try:
                return pika.BlockingConnection(params)
            except pika.exceptions.ProbableAccessDeniedError as exc:
                found = LED_BY.search(str(exc))
                if found is None:  # no leader at the moment, being recovered
                    raise
                host, port = found.group(2), int(found.group(3))
        raise ConnectionError("530 hops did not end")

    def _note(self, exc: BaseException) -> None:
        with self._lock:
            self.errors[type(exc).__name__] += 1

    def _watchdog(self) -> None:
        while not self._stop.is_set():
            for key, (deadline, sock) in list(self._armed.items()):
                if time.monotonic() > deadline:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                    self._armed.pop(key, None)
            time.sleep(0.05)

    def _publisher(self, me: int) -> None:
        pending: int | None = None
        while not self._stop_publishing.is_set():
            conn = None
            try:
                conn = self._connect()
                endpoint = conn._impl.params.host, conn._impl.params.port
                sock = conn._impl._transport._sock  # to shut it when a confirm hangs
                ch = conn.channel()
                ch.confirm_delivery()
                ch.queue_declare(self.queue, durable=True, arguments=self.arguments)
                while not self._stop_publishing.is_set():
                    if pending is None:
                        with self._lock:
                            pending = len(self.first_publish)
                            self.first_publish[pending] = time.monotonic()
                    self._armed[me] = (time.monotonic() + self.confirm_timeout, sock)
                    ch.basic_publish("", self.queue, b"%d" % pending, PERSISTENT, mandatory=True)
                    self._armed.pop(me, None)
                    with self._lock:
                        self.confirmed[pending] = time.monotonic()
                    pending = None
            except Exception as exc:  # any error: reconnect and republish
                self._armed.pop(me, None)
                self._note(exc)
                if conn is not None:  # e.g. a confirm that never came: try another node
                    self._failed(endpoint)
                if pending is not None:
                    with self._lock:
                        self.republished += 1
                time.sleep(0.05)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()

    def _consumer(self) -> None:
        while not self._stop.is_set():
            conn = None
            try:
                conn = self._connect()
                ch = conn.channel()
                ch.queue_declare(self.queue, durable=True, arguments=self.arguments)
                ch.basic_qos(prefetch_count=self.prefetch)
                last = time.monotonic()
                for method, _props, body in ch.consume(self.queue, inactivity_timeout=0.25):
                    if self._stop.is_set():
                        break
                    if method is None:
                        if time.monotonic() - last > self.idle_reconnect:
                            break  # maybe on a frozen or deposed node: go elsewhere
                        continue
                    last = time.monotonic()
                    with self._lock:
                        self.consumed[int(body)] += 1
                    ch.basic_ack(method.delivery_tag)
            except Exception as exc:
                self._note(exc)
                time.sleep(0.05)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
