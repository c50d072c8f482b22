"""The one `python -m roarmq` process of the tests: its command line and its config file are
written here and nowhere else.

`BrokerProcess` runs a broker (a cluster node when given a `ClusterOptions`) on its own
ports and data dir, its output appended to a log file, and controls it by its PID
(kill -9, SIGSTOP/SIGCONT, SIGTERM: `ControlledProcess`). `start()` waits until the log
says it serves, and starts it again on other ports when one was taken meanwhile;
`start(wait=False)` only starts it (a cluster node's test waits on its API). `under`
runs it under another command (strace); `launcher` starts the command line some other
way (inside a network namespace: tests/support/jepsen.py).

Its users: tests/support/faultlib.py (a broker to crash and fault), cluster_nodes.py (the
loopback trio on one etcd) and jepsen.py (a node in a namespace of its own).
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from base64 import b64encode
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from .process import ControlledProcess
from .waiting import free_port, until

ROOT = Path(__file__).resolve().parents[2]
GUEST = ("guest", "guest")

#: Starts a command line as `subprocess.Popen` does: (argv, stdout=..., stderr=..., cwd=...).
Launcher = Callable[..., "subprocess.Popen[bytes]"]


@dataclass
class ClusterOptions:
    """The [cluster] section of a node (and its command line's --cluster-etcd, --node)."""

    etcd: Sequence[str]
    node: str
    advertise: str | None = None
    lease_ttl: int | None = None
    #: Further lines of the section, as written ("replica_lag_ms = 1000\n").
    keys: str = ""


class BrokerProcess(ControlledProcess):
    """`python -m roarmq` on `host`, AMQP and management on free ports unless given,
    management always on; a cluster node when `cluster` is given (its replication port
    too). The config file is written anew at each start from the attributes, so a test may
    change a port, `extra` or `under` between starts."""

    #: Seconds `stop` waits after SIGTERM before SIGKILL.
    STOP_GRACE = 20.0
    #: Tries `start()` makes when a port it picked was taken meanwhile.
    START_TRIES = 5
    #: Seconds `start()` waits for the log to say the broker serves.
    START_TIMEOUT = 30.0

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        mgmt_port: int | None = None,
        repl_port: int | None = None,
        stream_port: int | None = None,
        host: str = "127.0.0.1",
        storage: str = "",
        extra: str = "",
        cluster: ClusterOptions | None = None,
        log_level: str = "info",
        log: Path | None = None,
        config: Path | None = None,
        under: Sequence[str] = (),
        launcher: Launcher | None = None,
        credentials: tuple[str, str] = GUEST,
        api_timeout: float = 10.0,
    ) -> None:
        """`storage`: lines of the [storage] section; `extra`: further sections, after the
        others; `log`, `config`: the files (beside the data dir, named by the port, unless
        given); `api_timeout`: the management calls' default timeout."""
        super().__init__()
        self.data_dir = Path(data_dir)
        self.host = host
        self._given = {
            "port": port is not None,
            "mgmt_port": mgmt_port is not None,
            "repl_port": repl_port is not None,
            "stream_port": stream_port is not None,
        }
        self.port = port or free_port()
        self.mgmt_port = mgmt_port or free_port()
        self.repl_port = (repl_port or free_port()) if cluster is not None else None
        self.stream_port = stream_port or free_port()  # the stream protocol's
        self.storage = storage
        self.extra = extra
        self.cluster_options = cluster
        self.log_level = log_level
        self.log = log or self.data_dir.parent / f"broker-{self.port}.log"
        self.config = config or self.data_dir.parent / f"broker-{self.port}.toml"
        self.under = list(under)
        self.launcher: Launcher = launcher or subprocess.Popen
        self.credentials = credentials
        self.api_timeout = api_timeout

    # -- the command line and the config, in one place

    def config_text(self) -> str:
        host = json.dumps(self.host)
        text = (
            f"[amqp]\nbind = [{host}]\nport = {self.port}\n\n"
            f"[management]\nenabled = true\nbind = {host}\nport = {self.mgmt_port}\n\n"
            f"[stream]\nport = {self.stream_port}\n\n"
        )
        if self.storage:
            text += f"[storage]\n{self.storage.rstrip()}\n\n"
        if self.cluster_options is not None:
            c = self.cluster_options
            text += (
                f"[cluster]\netcd = [{', '.join(json.dumps(u) for u in c.etcd)}]\n"
                f"node = {json.dumps(c.node)}\nreplication_port = {self.repl_port}\n"
            )
            if c.advertise is not None:
                text += f"advertise = {json.dumps(c.advertise)}\n"
            if c.lease_ttl is not None:
                text += f"lease_ttl = {c.lease_ttl}\n"
            text += (c.keys.rstrip() + "\n\n") if c.keys else "\n"
        return text + self.extra

    def argv(self) -> list[str]:
        argv = [*self.under, sys.executable, "-m", "roarmq", "--config", str(self.config)]
        argv += ["--port", str(self.port), "--data-dir", str(self.data_dir)]
        if (c := self.cluster_options) is not None:
            argv += ["--cluster-etcd", ",".join(c.etcd), "--node", c.node]
            argv += ["--replication-port", str(self.repl_port)]
        return [*argv, "--log-level", self.log_level]

    # -- starting

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, wait: bool = True) -> Self:
        """Start it (nothing if it runs); with `wait`, until its log says it serves (a port
        taken meanwhile by another test's process: new ports, up to START_TRIES times; a
        connection alone would reach whatever holds the port)."""
        if self.running:
            return self
        if not wait:
            self._launch()
            return self
        for _ in range(self.START_TRIES):
            if self._serves(self._launch()):
                return self
            self._new_ports()
        raise AssertionError(f"broker did not start: {self.tail(2000)}")

    def _launch(self) -> int:
        """Write the config, start the process; the log's size before it (where its
        output begins)."""
        for path in (self.config, self.log):
            path.parent.mkdir(parents=True, exist_ok=True)
        self.config.write_text(self.config_text())
        offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            self.proc = self.launcher(self.argv(), stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        self.frozen = False
        return offset

    def _serves(self, offset: int) -> bool:
        """True once the log (from `offset`) says it serves; False if it exited because a
        port was in use; AssertionError if it exited for another reason or is silent."""
        ready = f"AMQP on {self.host} port {self.port}"

        def outcome() -> str | None:
            said = self._said(offset)
            if ready in said:
                return "serves"
            return "exited:" + said if self.proc.poll() is not None else None  # type: ignore[union-attr]

        state = until(outcome, self.START_TIMEOUT, 0.02)
        if state == "serves":
            return True
        assert state is not None, f"broker did not start: {self._said(offset)[-2000:]}"
        assert "address already in use" in state, state
        return False

    def _said(self, offset: int) -> str:
        with open(self.log, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def _new_ports(self) -> None:
        """Other free ports for those not given."""
        for name, given in self._given.items():
            if not given and getattr(self, name) is not None:
                setattr(self, name, free_port())

    # -- what tests ask of it

    def url(self) -> str:
        user, password = self.credentials
        return f"amqp://{user}:{password}@{self.host}:{self.port}"

    def _request(
        self, path: str, method: str = "GET", body: object = None
    ) -> urllib.request.Request:
        token = b64encode(":".join(self.credentials).encode()).decode()
        request = urllib.request.Request(
            f"http://{self.host}:{self.mgmt_port}{path}",
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={"Authorization": f"Basic {token}"},
        )
        if body is not None:
            request.add_header("Content-Type", "application/json")
        return request

    def api(self, path: str, timeout: float | None = None) -> Any:
        """The decoded JSON of a management GET (an HTTP error raises: it is an OSError,
        which `until` counts as no answer)."""
        timeout = self.api_timeout if timeout is None else timeout
        with urllib.request.urlopen(self._request(path), timeout=timeout) as resp:
            return json.loads(resp.read())

    def call(
        self, path: str, method: str = "GET", body: object = None, timeout: float | None = None
    ) -> tuple[int, Any]:
        """(status, decoded JSON body or None) of any management call; an HTTP error is an
        answer too."""
        timeout = self.api_timeout if timeout is None else timeout
        try:
            with urllib.request.urlopen(self._request(path, method, body), timeout=timeout) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    def metrics(self) -> str:
        url = f"http://{self.host}:{self.mgmt_port}/metrics"
        with urllib.request.urlopen(url, timeout=self.api_timeout) as resp:
            return resp.read().decode()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self, chars: int = 3000) -> str:
        """The log's last `chars` characters ("(no log)" before it has one)."""
        try:
            return self.log_text()[-chars:]
        except OSError:
            return "(no log)"
