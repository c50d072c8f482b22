"""Command line: the `roarmq` console script and `python -m roarmq [options]`.

`roarmq serve [options]` is the same as `python -m roarmq [options]`; `roarmq check-config
FILE` validates a config file; `roarmq --version`. (`python -m broker` still works from a
checkout.)
"""

from __future__ import annotations

import sys

if __package__ == "broker":  # `python -m broker` in a checkout: run the one roarmq copy
    from roarmq.broker.__main__ import main as _main

    sys.exit(_main(prog="python -m broker"))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextlib  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from . import __version__  # noqa: E402
from .config import LOG_LEVELS, Config, ConfigError, load_config  # noqa: E402
from .errors import StartupError  # noqa: E402
from .ops.logs import NOTICE, setup_logging  # noqa: E402
from .store.segments import make_dirs_durably  # noqa: E402

log = logging.getLogger("roarmq.server")


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="RoarMQ, an AMQP 0-9-1 message broker.")
    p.add_argument("--config", metavar="FILE", help="TOML config file (default: built-in defaults)")
    p.add_argument("--port", type=int, metavar="N", help="AMQP port (0 = any free port)")
    p.add_argument("--mgmt-port", type=int, metavar="N", help="management HTTP port")
    p.add_argument(
        "--stream-port",
        type=int,
        metavar="N",
        help="stream protocol port (default 5552 beside AMQP's 5672; 0 = any free port)",
    )
    p.add_argument("--data-dir", metavar="DIR", help="directory for durable data")
    p.add_argument("--log-level", choices=LOG_LEVELS, type=str.lower, help="log verbosity")
    p.add_argument(
        "--cluster-etcd",
        metavar="URL[,URL...]",
        help="etcd client URLs: run as a cluster node ([cluster] etcd; docs/cluster.md)",
    )
    p.add_argument(
        "--node", metavar="NAME", help="this node's name in the cluster ([cluster] node)"
    )
    p.add_argument(
        "--replication-port", type=int, metavar="N", help="port peers replicate over ([cluster])"
    )
    p.add_argument(
        "--check-config", metavar="FILE", help="validate a config file, then exit 0 (ok) or 1"
    )
    p.add_argument("--version", action="version", version=f"RoarMQ {__version__}")
    return p


def check_config(path: str) -> int:
    from .amqp.tls import check as check_tls

    try:
        check_tls(load_config(path))  # the certificates and keys load, not only the keys parse
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 1
    print(f"{path}: ok")
    return 0


def read_connection_start(sock: Any) -> Any:
    """Send the AMQP protocol header on a connected socket and return the broker's
    connection.start (ConnectionError if it hangs up first; ProtocolError on garbage)."""
    from roarmq.protocol import spec
    from roarmq.protocol.frames import PROTOCOL_HEADER, FrameParser, MethodFrame

    parser = FrameParser(expect_protocol_header=False)
    sock.sendall(PROTOCOL_HEADER)
    while True:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed before connection.start")
        for ev in parser.feed(data):
            if isinstance(ev, MethodFrame) and isinstance(ev.method, spec.ConnectionStart):
                return ev.method


def ping(host: str, port: int, timeout: float) -> int:
    """Health check: the broker answers the AMQP protocol header with connection.start.

    Proves the listener accepts and the event loop runs (a bare TCP connect does not);
    needs no credentials. Exit 0 if it answered, 1 otherwise.
    """
    import socket

    from roarmq.protocol.errors import ProtocolError

    try:
        with socket.create_connection((host, port), timeout) as sock:
            sock.settimeout(timeout)
            start = read_connection_start(sock)
    except (OSError, ProtocolError) as exc:
        print(f"{host}:{port}: no AMQP answer: {exc}", file=sys.stderr)
        return 1
    product = start.server_properties.get("product", "?")
    version = start.server_properties.get("version", "?")
    print(f"{host}:{port}: {product} {version} answered")
    return 0


def _load(args: argparse.Namespace) -> Config:
    config = load_config(args.config) if args.config else Config()
    user, password = os.environ.get("ROARMQ_DEFAULT_USER"), os.environ.get("ROARMQ_DEFAULT_PASS")
    if user is not None or password is not None:
        config = config.with_default_user(user or "", password or "")
    return config.with_overrides(
        port=args.port,
        mgmt_port=args.mgmt_port,
        stream_port=args.stream_port,
        data_dir=args.data_dir,
        log_level=args.log_level,
        cluster_etcd=args.cluster_etcd,
        node=args.node,
        replication_port=args.replication_port,
    )


def lock_data_dir(path: str) -> int:
    """Create the data dir and hold its lock for the broker's lifetime (returns the fd).

    Taken before anything in the dir is opened, so a second broker pointed at the same
    dir touches nothing of the running one's state.
    """
    import fcntl

    where = Path(path).resolve()
    try:
        make_dirs_durably(where)
        fd = os.open(where / "roarmq.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StartupError(
            f"data dir {where} is not usable: {exc.strerror or exc} "
            "(set [storage] data_dir or --data-dir to a writable directory)"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise StartupError(
            f"data dir {where} is in use by another RoarMQ (pid {owner}); stop it or "
            "choose another --data-dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


async def serve(config: Config) -> None:
    from .server import Broker

    where = Path(config.storage.data_dir).resolve()
    new = not where.is_dir() or not any(p.name != "roarmq.lock" for p in where.iterdir())
    lock = lock_data_dir(config.storage.data_dir)
    try:
        if new:  # first boot: nothing to recover, and no shutdown before it, clean or not
            log.log(NOTICE, "new data directory %s", where, extra={"new": True})
        else:
            log.log(NOTICE, "data dir %s", where)
        broker = Broker(config)
        # Handlers before the start line is logged: a SIGTERM sent the moment a supervisor
        # (or a test) reads it must stop the broker cleanly, not kill it.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        if not await _started_unless_stopped(broker, stop):
            log.log(NOTICE, "stopping: signal received while starting")
            await broker.stop()
            return
        broker.gc_schedule = tune_gc(loop)
        try:
            await stop.wait()
            log.log(NOTICE, "stopping: signal received")
        finally:
            broker.gc_schedule.stop()
            await broker.stop()
    finally:
        os.close(lock)


async def _started_unless_stopped(broker: Any, stop: asyncio.Event) -> bool:
    """Start the broker unless a signal comes first (False: the start was cancelled). A
    cluster node waits for etcd at start for up to join_timeout: a supervisor's SIGTERM in
    that time must stop it then, not once the wait is over or by SIGKILL."""
    starting = asyncio.ensure_future(broker.start())
    signalled = asyncio.ensure_future(stop.wait())
    await asyncio.wait((starting, signalled), return_when=asyncio.FIRST_COMPLETED)
    if starting.done():
        signalled.cancel()
        starting.result()  # a StartupError says why the start failed
        return True
    starting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await starting
    return False


def tune_gc(loop: asyncio.AbstractEventLoop) -> Any:
    """Fewer, shorter collections, start-up's objects frozen, full passes when idle: the
    rules and what each costs are broker/ops/gc_schedule.py's. (A larger first threshold than
    CPython's: bench/hotpath.py's in-process loop (direct) went from ~6.6 to ~5.8 us a
    message.)"""
    from .ops.gc_schedule import tune

    return tune(loop)


def run(coro_factory) -> None:  # type: ignore[no-untyped-def]
    """Run on uvloop when it is installed, plain asyncio otherwise."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro_factory())
    else:
        uvloop.run(coro_factory())


def main(argv: list[str] | None = None, prog: str = "python -m roarmq") -> int:
    args = _parser(prog).parse_args(argv)
    if args.check_config:
        return check_config(args.check_config)
    from .amqp.tls import check as check_tls

    try:
        config = _load(args)
        check_tls(config)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 1
    setup_logging(config.log.level, config.log.format)
    try:
        run(lambda: serve(config))
    except StartupError as exc:
        log.critical("cannot start: %s", exc)
        return 1
    except OSError as exc:  # a listener: address in use, not available...
        log.critical("cannot start: %s", exc)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


SUBCOMMANDS = {
    "serve": "run the broker (options: roarmq serve --help)",
    "check-config": "validate a TOML config file: exit 0 if valid, 1 naming the bad key",
    "ping": "health check: exit 0 if a broker answers the AMQP handshake",
    "ctl": "rabbitmqctl's everyday commands over the management API (roarmq ctl --help)",
    "cluster-demo": "start (or stop) a local etcd and three cluster nodes to try a cluster",
}


def cli(argv: list[str] | None = None) -> int:
    """The `roarmq` console script: subcommands, `serve` being the broker itself."""
    argv = sys.argv[1:] if argv is None else argv
    top = argparse.ArgumentParser(
        prog="roarmq",
        description="RoarMQ, an AMQP 0-9-1 message broker.",
        epilog="Run `roarmq COMMAND --help` for a command's options.",
    )
    top.add_argument("--version", action="version", version=f"RoarMQ {__version__}")
    commands = top.add_subparsers(dest="command", metavar="COMMAND")
    for name, text in SUBCOMMANDS.items():
        # serve's options are parsed by main(); here it only needs to be listed
        commands.add_parser(name, help=text, add_help=False)
    if not argv or argv[0].startswith("-"):
        top.parse_args(argv)  # --help / --version exit here
        top.print_usage(sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "serve":
        return main(rest, prog="roarmq serve")
    if command == "ctl":
        from .cli.ctl import main as ctl

        return ctl(rest)
    if command == "cluster-demo":
        from .cli.cluster_demo import main as cluster_demo

        return cluster_demo(rest)
    if command == "check-config":
        p = argparse.ArgumentParser(prog="roarmq check-config", description=SUBCOMMANDS[command])
        p.add_argument("file", metavar="FILE", help="the TOML config file")
        return check_config(p.parse_args(rest).file)
    if command == "ping":
        p = argparse.ArgumentParser(prog="roarmq ping", description=SUBCOMMANDS[command])
        p.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1")
        p.add_argument("--port", type=int, default=5672, help="default 5672")
        p.add_argument("--timeout", type=float, default=5.0, metavar="S", help="default 5 s")
        a = p.parse_args(rest)
        return ping(a.host, a.port, a.timeout)
    top.parse_args(argv)  # an unknown command: argparse names the choices and exits 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
