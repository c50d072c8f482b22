"""Run a real RoarMQ broker inside a test: in the test's own event loop or in a thread.

    async with running_broker() as broker:        # same loop (asyncio clients)
        conn = await aio_pika.connect(broker.url)

    with BrokerThread() as broker:                 # own thread (pika, kombu, any client)
        pika.BlockingConnection(pika.URLParameters(broker.url))

The pytest plugin (`broker.testing.plugin`, registered automatically on install)
offers the `amqp_broker` fixture, which yields such a URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import tempfile
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from ..clock import Clock
from ..config import Config
from ..server import Broker

T = TypeVar("T")


def ephemeral_config(data_dir: str | None = None, **sections: Any) -> Config:
    """Defaults for tests: loopback only, any free port, no management, a temp data dir.

    Keyword arguments replace fields of a section: `ephemeral_config(limits={"heartbeat": 5})`.
    """
    cfg = Config()
    cfg = dataclasses.replace(
        cfg,
        amqp=dataclasses.replace(cfg.amqp, bind=("127.0.0.1",), port=0),
        management=dataclasses.replace(cfg.management, enabled=False, port=0),
        storage=dataclasses.replace(
            cfg.storage, data_dir=data_dir or tempfile.mkdtemp(prefix="roarmq-test-")
        ),
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
    def mgmt_url(self) -> str:
        return f"http://127.0.0.1:{self.broker.mgmt_port}"


@contextlib.asynccontextmanager
async def running_broker(
    config: Config | None = None, *, clock: Clock | None = None, management: bool = False
) -> AsyncIterator[RunningBroker]:
    """An in-process broker on the running loop, on an ephemeral port."""
    broker = Broker(config or ephemeral_config(), clock=clock)
    await broker.start(management=management)
    try:
        yield RunningBroker(broker)
    finally:
        await broker.stop()


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
            self._started.set()
            return
        self._started.set()
        loop.run_forever()
        loop.run_until_complete(self.broker.stop())
        loop.close()

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
