"""Run a real RoarMQ broker inside a test: in the test's own event loop or in a thread.

    async with running_broker() as broker:        # same loop (asyncio clients)
        conn = await aio_pika.connect(broker.url)

    with BrokerThread() as broker:                 # own thread (pika, kombu, any client)
        pika.BlockingConnection(pika.URLParameters(broker.url))

The pytest plugin (`roarmq.pytest_plugin`, registered automatically on install) offers
the `amqp_broker` (per test) and `amqp_broker_session` fixtures, which yield such a URL.

A data dir that `ephemeral_config` made up (no `data_dir` given) is removed when the broker
using it stops.

TLS: `ephemeral_config(amqp={"tls": AmqpTlsConfig(enabled=True, port=0, certfile=...,
keyfile=...)})`, then `broker.tls_port` / `broker.amqps_url` (tests/amqp/test_tls.py makes
its certificates with trustme).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import shutil
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from ..config import Config
from ..ops.clock import Clock
from ..server import Broker

T = TypeVar("T")

#: Data dirs ephemeral_config created, removed when the broker using them stops.
_MADE_UP: set[str] = set()


def _remove_made_up(config: Config) -> None:
    path = config.storage.data_dir
    if path in _MADE_UP:
        _MADE_UP.discard(path)
        shutil.rmtree(path, ignore_errors=True)


def ephemeral_config(data_dir: str | None = None, **sections: Any) -> Config:
    """Defaults for tests: loopback only, any free port, no management, a temp data dir.

    Keyword arguments replace fields of a section: `ephemeral_config(limits={"heartbeat": 5})`.
    """
    if data_dir is None:
        data_dir = tempfile.mkdtemp(prefix="roarmq-test-")
        _MADE_UP.add(data_dir)
    cfg = Config()
    cfg = dataclasses.replace(
        cfg,
        amqp=dataclasses.replace(cfg.amqp, bind=("127.0.0.1",), port=0),
        management=dataclasses.replace(cfg.management, enabled=False, port=0),
        storage=dataclasses.replace(cfg.storage, data_dir=data_dir),
    )
    for name, values in sections.items():
        cfg = dataclasses.replace(cfg, **{name: dataclasses.replace(getattr(cfg, name), **values)})
    return cfg


def _url(broker: Broker) -> str:
    # No path: every client reads that as the default vhost "/" (a bare "/" path means
    # the vhost "" to librabbitmq, as the AMQP URI spec says).
    return f"amqp://guest:guest@127.0.0.1:{broker.port}"


class RunningBroker:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    @property
    def port(self) -> int:
        return self.broker.port

    @property
    def url(self) -> str:
        return _url(self.broker)

    @property
    def stream_port(self) -> int:
        """The stream protocol's port ([stream]: any free one in tests)."""
        assert self.broker.stream_port is not None
        return self.broker.stream_port

    @property
    def tls_port(self) -> int:
        """The amqps listener's port ([amqp.tls] enabled)."""
        return self.broker.tls_port

    @property
    def amqps_url(self) -> str:
        return f"amqps://guest:guest@127.0.0.1:{self.broker.tls_port}"

    @property
    def mgmt_url(self) -> str:
        scheme = "https" if self.broker.config.management.tls.enabled else "http"
        return f"{scheme}://127.0.0.1:{self.broker.mgmt_port}"

    def api(
        self, method: str, path: str, body: Any = None, auth: str = "guest:guest"
    ) -> tuple[int, Any]:
        """A blocking management API call -> (status, decoded JSON or None), errors included.

        Blocking: call it from another thread than the broker's (a `BrokerThread`).
        """
        request = urllib.request.Request(
            self.mgmt_url + path,
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={
                "Authorization": "Basic " + base64.b64encode(auth.encode()).decode(),
                "Content-Type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                status, data = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, data = exc.code, exc.read()
        return status, (json.loads(data) if data else None)


@contextlib.asynccontextmanager
async def running_broker(
    config: Config | None = None, *, clock: Clock | None = None, management: bool = False
) -> AsyncIterator[RunningBroker]:
    """An in-process broker on the running loop, on an ephemeral port."""
    config = config or ephemeral_config()
    broker = Broker(config, clock=clock)
    try:
        await broker.start(management=management)
    except BaseException:
        _remove_made_up(config)
        raise
    try:
        yield RunningBroker(broker)
    finally:
        try:
            await broker.stop()
        finally:
            _remove_made_up(config)


class BrokerThread(RunningBroker):
    """A broker on its own event loop in a daemon thread, for blocking clients."""

    def __init__(self, config: Config | None = None, *, management: bool = False) -> None:
        self._config = config or ephemeral_config()
        self._management = management
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> BrokerThread:
        self._thread = threading.Thread(target=self._run, name="roarmq-broker", daemon=True)
        self._thread.start()
        self._started.wait(30)
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        try:
            import uvloop

            loop = uvloop.new_event_loop()
        except ImportError:
            loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        self.broker = Broker(self._config)
        try:
            loop.run_until_complete(self.broker.start(management=self._management))
        except BaseException as exc:  # surfaced to the starting thread
            self._error = exc
            _remove_made_up(self._config)
            self._started.set()
            return
        self._started.set()
        loop.run_forever()
        try:
            loop.run_until_complete(self.broker.stop())
        finally:
            loop.close()
            _remove_made_up(self._config)

    def call(self, fn: Callable[[], T], timeout: float = 10) -> T:
        """Run `fn` on the broker's loop (thread-safely) and return its result."""
        assert self._loop is not None

        async def wrapper() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(wrapper(), self._loop).result(timeout)

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)

    def __enter__(self) -> BrokerThread:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


__all__ = ["BrokerThread", "RunningBroker", "running_broker", "ephemeral_config"]
