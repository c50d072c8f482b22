"""RabbitMQ's published Grafana dashboards, read against RoarMQ.

The dashboards are not copied here; `PANELS` states what RabbitMQ-Overview asks of the
broker: per panel, the families it reads and how it combines them. Every panel joins its
series to the node's identity, `... * on(instance) group_left(rabbitmq_cluster[,
rabbitmq_node]) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster",
namespace="$namespace"}`, sums (per node, `by(rabbitmq_node)`, on the time series panels)
and takes `rate(...[60s])` of counters. The first test checks the families and labels on a
scrape; the second runs every panel's query through a real Prometheus (`.tools/prometheus`,
which `make tools` extracts from Debian's package) scraping `/metrics` and
`/metrics/per-object`.

Source: github.com/rabbitmq/rabbitmq-server,
deps/rabbitmq_prometheus/docker/grafana/dashboards/RabbitMQ-Overview.json at tag v3.10.8
(commit 5b67ea2bbd4c09e8ad2d5b2b67bf1b5feff29231; the file, blob 01a505f4215, is the same
through v3.10.25).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pika
import pytest
from machine import missing
from prometheus_client.parser import text_string_to_metric_families

from roarmq.broker.testing import BrokerThread, ephemeral_config

# slow (Prometheus): `make check` leaves it out
pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]

PROMETHEUS = Path(__file__).resolve().parents[2] / ".tools" / "prometheus"

#: The dashboard's template variables: (variable, series it reads, label whose values it
#: offers). `instance` and `job` come from Prometheus, `namespace` from its config
#: (Kubernetes service discovery sets it; without it `namespace=""` matches every series).
VARIABLES = (
    ("namespace", "rabbitmq_identity_info", "namespace"),
    ("rabbitmq_cluster", 'rabbitmq_identity_info{namespace="$namespace"}', "rabbitmq_cluster"),
)

#: The join every panel makes; `{node}` is `, rabbitmq_node` on the per-node panels.
JOIN = (
    "on(instance) group_left(rabbitmq_cluster{node}) rabbitmq_identity_info"
    '{{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace"}}'
)

#: Labels the panels read from the result: legends `{{rabbitmq_node}}`, the nodes table.
IDENTITY_LABELS = ("rabbitmq_node", "rabbitmq_cluster")
BUILD_LABELS = ("rabbitmq_version",)  # the table's "RabbitMQ" column (Erlang/OTP: none here)

#: RabbitMQ-Overview's panels (v3.10.8): title -> (shape, terms). Terms are families, `-`
#: before one subtracts it; a `_total` family is read as `rate(...[60s])`. Shapes:
#: "stat" sum(term * join) per term (the single-value panels, cluster-wide);
#: "table" term * join (instant, the nodes table); "node" (term * join) per node;
#: "by_node" sum(terms * join) by(rabbitmq_node) (the time series panels).
PANELS = {
    "Ready messages": ("stat", ["rabbitmq_queue_messages_ready"]),
    "Incoming messages / s": ("stat", ["rabbitmq_global_messages_received_total"]),
    "Publishers": ("stat", ["rabbitmq_channels", "-rabbitmq_channel_consumers"]),
    "Connections": ("stat", ["rabbitmq_connections"]),
    "Queues": ("stat", ["rabbitmq_queues"]),
    "Unacknowledged messages": ("stat", ["rabbitmq_queue_messages_unacked"]),
    "Outgoing messages / s": (
        "stat",
        [
            "rabbitmq_global_messages_redelivered_total",
            "rabbitmq_global_messages_delivered_consume_auto_ack_total",
            "rabbitmq_global_messages_delivered_consume_manual_ack_total",
            "rabbitmq_global_messages_delivered_get_auto_ack_total",
            "rabbitmq_global_messages_delivered_get_manual_ack_total",
        ],
    ),
    "Consumers": ("stat", ["rabbitmq_consumers"]),
    "Channels": ("stat", ["rabbitmq_channels"]),
    "Nodes": ("stat", ["rabbitmq_build_info"]),
    "(nodes table)": ("table", ["rabbitmq_build_info"]),
    "Memory available before publishers blocked": (
        "node",
        ["rabbitmq_resident_memory_limit_bytes", "-rabbitmq_process_resident_memory_bytes"],
    ),
    "Disk space available before publishers blocked": (
        "node",
        ["rabbitmq_disk_space_available_bytes"],
    ),
    "File descriptors available": (
        "node",
        ["rabbitmq_process_max_fds", "-rabbitmq_process_open_fds"],
    ),
    "TCP sockets available": (
        "node",
        ["rabbitmq_process_max_tcp_sockets", "-rabbitmq_process_open_tcp_sockets"],
    ),
    "Messages ready to be delivered to consumers": (
        "by_node",
        ["rabbitmq_queue_messages_ready"],
    ),
    "Messages pending consumer acknowledgement": (
        "by_node",
        ["rabbitmq_queue_messages_unacked"],
    ),
    "Messages published / s": ("by_node", ["rabbitmq_global_messages_received_total"]),
    "Messages confirmed to publishers / s": (
        "by_node",
        ["rabbitmq_global_messages_confirmed_total"],
    ),
    "Messages routed to queues / s": ("by_node", ["rabbitmq_global_messages_routed_total"]),
    "Messages unconfirmed to publishers / s": (
        "by_node",
        [
            "rabbitmq_global_messages_received_confirm_total",
            "-rabbitmq_global_messages_confirmed_total",
        ],
    ),
    "Unroutable messages dropped / s": (
        "by_node",
        ["rabbitmq_global_messages_unroutable_dropped_total"],
    ),
    "Unroutable messages returned to publishers / s": (
        "by_node",
        ["rabbitmq_global_messages_unroutable_returned_total"],
    ),
    "Messages delivered / s": (
        "by_node",
        [
            "rabbitmq_global_messages_delivered_consume_auto_ack_total",
            "rabbitmq_global_messages_delivered_consume_manual_ack_total",
        ],
    ),
    "Messages redelivered / s": ("by_node", ["rabbitmq_global_messages_redelivered_total"]),
    "Messages delivered with manual ack / s": (
        "by_node",
        ["rabbitmq_global_messages_delivered_consume_manual_ack_total"],
    ),
    "Messages delivered auto ack / s": (
        "by_node",
        ["rabbitmq_global_messages_delivered_consume_auto_ack_total"],
    ),
    "Messages acknowledged / s": ("by_node", ["rabbitmq_global_messages_acknowledged_total"]),
    "Polling operations with auto ack / s": (
        "by_node",
        ["rabbitmq_global_messages_delivered_get_auto_ack_total"],
    ),
    "Polling operations that yield no result / s": (
        "by_node",
        ["rabbitmq_global_messages_get_empty_total"],
    ),
    "Polling operations with manual ack / s": (
        "by_node",
        ["rabbitmq_global_messages_delivered_get_manual_ack_total"],
    ),
    "Total queues": ("node", ["rabbitmq_queues"]),
    "Queues declared / s": ("by_node", ["rabbitmq_queues_declared_total"]),
    "Queues created / s": ("by_node", ["rabbitmq_queues_created_total"]),
    "Queues deleted / s": ("by_node", ["rabbitmq_queues_deleted_total"]),
    "Total channels": ("node", ["rabbitmq_channels"]),
    "Channels opened / s": ("by_node", ["rabbitmq_channels_opened_total"]),
    "Channels closed / s": ("by_node", ["rabbitmq_channels_closed_total"]),
    "Total connections": ("node", ["rabbitmq_connections"]),
    "Connections opened / s": ("by_node", ["rabbitmq_connections_opened_total"]),
    "Connections closed / s": ("by_node", ["rabbitmq_connections_closed_total"]),
}

#: Rate panels that stay at zero after `traffic` (every confirm is sent at once).
ZERO_RATES = {"Messages unconfirmed to publishers / s"}

#: The other dashboards in that folder, and why they do not apply to RoarMQ.
NOT_APPLICABLE = {
    "Erlang-Distribution.json": "erlang_vm_dist_*: links between Erlang nodes; one Python "
    "process, no clustering",
    "Erlang-Distributions-Compare.json": "erlang_vm_dist_*, node_exporter and PerfTest "
    "series comparing Erlang distribution transports",
    "Erlang-Memory-Allocators.json": "erlang_vm_allocators: the BEAM's memory allocators",
    "RabbitMQ-Quorum-Queues-Raft.json": "rabbitmq_raft_*: Raft logs; RoarMQ's quorum queues "
    "are single-node queues without Raft",
    "RabbitMQ-Stream.json": 'rabbitmq_global_*{protocol="stream"} and stream errors; RoarMQ '
    "has no streams or stream protocol",
    "RabbitMQ-PerfTest.json": "perftest_*: PerfTest's own metrics, not the broker's",
    "inet_tcp_metrics.json": "inet_tcp_metrics_*: Erlang distribution TCP internals",
    "rabbitmq-exporter_vs_rabbitmq-prometheus.json": "scrape durations of the retired "
    "rabbitmq_exporter against rabbitmq_prometheus",
}

CLUSTER = "grafana-check"


def panel_query(shape: str, terms: list[str]) -> str:
    """A panel's PromQL, in the dashboard's form (template variables not yet substituted)."""
    join = JOIN.format(node="" if shape == "stat" else ", rabbitmq_node")
    parts = []
    for term in terms:
        sign, name = ("-", term[1:]) if term.startswith("-") else ("+", term)
        series = f"rate({name}[60s])" if name.endswith("_total") else name
        part = f"({series} * {join})"
        parts.append((sign, f"sum{part}" if shape == "stat" else part))
    expr = parts[0][1] + "".join(f" {sign} {part}" for sign, part in parts[1:])
    return f"sum({expr}) by(rabbitmq_node)" if shape == "by_node" else expr


def families_of(shape_terms: tuple[str, list[str]]) -> list[str]:
    return [term.lstrip("-") for term in shape_terms[1]]


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> its label sets and values."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def total(samples, name: str) -> float:
    return sum(value for _, value in samples[name])


class Traffic:
    """Connections, channels and queues in every state the dashboard shows, left open."""

    READY, UNACKED, QUEUES, CONNECTIONS, CHANNELS, CONSUMERS = 3, 1, 4, 2, 3, 2
    PUBLISHED = 16  # all on a confirm channel, two of them unroutable
    QUEUE_NAMES = {"orders", "audit", "backlog", "polled"}

    def __init__(self, url: str) -> None:
        self.url = url
        self.conns: list[pika.BlockingConnection] = []

    def run(self) -> None:
        params = pika.URLParameters(self.url)
        closed = pika.BlockingConnection(params)  # opened and closed: connection churn
        closed.channel().close()  # channel churn
        closed.close()
        pub = pika.BlockingConnection(params)
        sub = pika.BlockingConnection(params)
        self.conns += [pub, sub]
        ch = pub.channel()
        ch.confirm_delivery()
        for name in ("orders", "audit", "backlog", "polled", "temp"):
            ch.queue_declare(name)
        ch.queue_declare("orders")  # declared again: counted, not created
        ch.queue_delete("temp")
        for queue, n in (("orders", 5), ("audit", 3), ("backlog", 4), ("polled", 2)):
            for i in range(n):
                ch.basic_publish("", queue, f"{queue} {i}".encode())
        ch.basic_publish("amq.direct", "nowhere", b"dropped")
        with pytest.raises(pika.exceptions.UnroutableError):
            ch.basic_publish("amq.direct", "nowhere", b"returned", mandatory=True)

        consume = sub.channel()
        got: list[str] = []
        nacked: list[bool] = []

        def on_order(c, method, _props, _body):
            if not nacked:  # the first once back to the queue: a redelivery
                nacked.append(True)
                c.basic_nack(method.delivery_tag, requeue=True)
            else:
                c.basic_ack(method.delivery_tag)
                got.append("orders")

        consume.basic_consume("orders", on_order)
        consume.basic_consume("audit", lambda *_: got.append("audit"), auto_ack=True)
        deadline = time.monotonic() + 10
        while len(got) < 8 and time.monotonic() < deadline:
            sub.process_data_events(time_limit=0.1)
        assert len(got) == 8

        poll = sub.channel()
        method, _, _ = poll.basic_get("polled")
        poll.basic_ack(method.delivery_tag)
        assert poll.basic_get("polled", auto_ack=True)[0] is not None
        assert poll.basic_get("polled")[0] is None  # get_empty
        assert poll.basic_get("backlog")[0] is not None  # left unacked

    def close(self) -> None:
        for conn in self.conns:
            if conn.is_open:
                conn.close()


def test_overview_families_and_labels(tmp_path):
    """Every family and label RabbitMQ-Overview reads is on a scrape of each endpoint."""
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        assert b.api("PUT", "/api/cluster-name", {"name": CLUSTER})[0] == 204
        traffic = Traffic(b.url)
        try:
            traffic.run()
            needed = {name for panel in PANELS.values() for name in families_of(panel)}
            for path in ("/metrics", "/metrics/per-object"):
                s = scrape(b.mgmt_url + path)
                missing = sorted(n for n in needed | {"rabbitmq_identity_info"} if n not in s)
                assert not missing, f"{path} lacks {missing}"
                ((identity, _),) = s["rabbitmq_identity_info"]
                assert all(identity.get(label) for label in IDENTITY_LABELS)
                assert identity["rabbitmq_cluster"] == CLUSTER
                assert identity["rabbitmq_node"] == b.broker.node_name
                ((build, _),) = s["rabbitmq_build_info"]
                assert all(build.get(label) for label in BUILD_LABELS)
                # Nothing made up for what RoarMQ does not have.
                assert not [n for n in s if n.startswith(("rabbitmq_raft_", "erlang_vm_"))]
                assert total(s, "rabbitmq_channel_consumers") == Traffic.CONSUMERS
                assert total(s, "rabbitmq_global_publishers") == 1  # the one that published
                assert total(s, "rabbitmq_process_open_tcp_sockets") == Traffic.CONNECTIONS
            per_object = scrape(b.mgmt_url + "/metrics/per-object")
            ready = per_object["rabbitmq_queue_messages_ready"]
            assert {labels["queue"] for labels, _ in ready} == Traffic.QUEUE_NAMES
            assert len(per_object["rabbitmq_channel_consumers"]) == Traffic.CHANNELS
        finally:
            traffic.close()
        # Publishes on confirm channels stay counted once the channels are gone.
        confirm = "rabbitmq_global_messages_received_confirm_total"
        assert total(scrape(b.mgmt_url + "/metrics"), confirm) == Traffic.PUBLISHED
        # Deliveries are per queue type, as RabbitMQ's, deleted queues' included.
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.queue_declare("qq", durable=True, arguments={"x-queue-type": "quorum"})
        ch.basic_publish("", "qq", b"x")
        assert ch.basic_get("qq", auto_ack=True)[0] is not None
        ch.queue_delete("qq")
        conn.close()
        s = scrape(b.mgmt_url + "/metrics")
        by_type = {
            labels["queue_type"]: value
            for labels, value in s["rabbitmq_global_messages_delivered_get_auto_ack_total"]
        }
        assert by_type == {
            "rabbit_classic_queue": 1,
            "rabbit_quorum_queue": 1,
            "rabbit_stream_queue": 0,
        }


# -- the same panels, evaluated by Prometheus ------------------------------------------


class Prometheus:
    """`.tools/prometheus` on a loopback port of its choosing, its data in a temp dir."""

    def __init__(self, tmp: Path, mgmt_url: str) -> None:
        target = urllib.parse.urlsplit(mgmt_url).netloc
        # /metrics as RabbitMQ's docker-compose setup scrapes it (no namespace label), and
        # /metrics/per-object as a Kubernetes one would (namespace from discovery), kept
        # apart by `instance`: the 3.10 dashboards join on instance alone.
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {
                    "job_name": "rabbitmq",
                    "static_configs": [{"targets": [target]}],
                },
                {
                    "job_name": "rabbitmq-per-object",
                    "metrics_path": "/metrics/per-object",
                    "static_configs": [
                        {
                            "targets": [target],
                            "labels": {"instance": "per-object", "namespace": "roarmq"},
                        }
                    ],
                },
            ],
        }
        (tmp / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        self.log = tmp / "prometheus.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    str(PROMETHEUS),
                    f"--config.file={tmp / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp / 'data'}",
                    "--web.listen-address=127.0.0.1:0",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.url = self._listening(time.monotonic() + 15)

    def _listening(self, deadline: float) -> str:
        while time.monotonic() < deadline:
            found = re.search(
                r'msg="Listening on" address=(127\.0\.0\.1:\d+)', self.log.read_text()
            )
            if found and self._ready("http://" + found.group(1)):
                return "http://" + found.group(1)
            assert self.proc.poll() is None, self.log.read_text()[-2000:]
            time.sleep(0.05)
        raise AssertionError("prometheus did not get ready: " + self.log.read_text()[-2000:])

    @staticmethod
    def _ready(url: str) -> bool:
        """Prometheus listens before its TSDB opens and answers 503 until then: `/-/ready`."""
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def get(self, path: str, **params: str) -> object:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as resp:
            reply = json.load(resp)
        assert reply["status"] == "success", reply
        return reply["data"]

    def query(self, expr: str) -> list[dict]:
        data = self.get("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", data
        return data["result"]

    def wait(self, expr: str, ok, deadline: float) -> None:
        """Until `ok(result)`: scrapes are 1 s apart."""
        while time.monotonic() < deadline:
            result = self.query(expr)
            if ok(result):
                return
            time.sleep(0.2)
        raise AssertionError(f"never true: {expr} -> {self.query(expr)}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def test_overview_panels_in_prometheus(tmp_path):
    """Each RabbitMQ-Overview panel's query, as Grafana sends it, answers with RoarMQ's data."""
    if not PROMETHEUS.exists():
        missing(
            ".tools/prometheus is absent: `make tools` extracts it from Debian's prometheus "
            "package (needs apt-get and dpkg-deb)",
            "ROARMQ_EXPECT_TOOLS",
        )
    started = time.monotonic()
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        assert b.api("PUT", "/api/cluster-name", {"name": CLUSTER})[0] == 204
        prom = Prometheus(tmp_path, b.mgmt_url)
        traffic = Traffic(b.url)
        try:
            # A scrape of each endpoint before the traffic, so that every rate has a base.
            prom.wait("up == 1", lambda r: len(r) == 2, time.monotonic() + 15)
            traffic.run()
            # The traffic's last step (a basic.get left unacked) seen on both endpoints.
            last = "sum by(job) (rabbitmq_global_messages_delivered_get_manual_ack_total) >= 2"
            prom.wait(last, lambda r: len(r) == 2, time.monotonic() + 10)

            # The template variables, as Grafana's label_values() asks for them.
            # Grafana selects the first value; the next variable's query uses it.
            variables: dict[str, list[str]] = {}
            for name, series, label in VARIABLES:
                match = series.replace("$namespace", variables.get("namespace", [""])[0])
                variables[name] = prom.get(f"/api/v1/label/{label}/values", **{"match[]": match})
            assert variables["namespace"] == ["roarmq"]  # /metrics/per-object's job
            assert variables["rabbitmq_cluster"] == [CLUSTER]

            for namespace in ("", "roarmq"):  # /metrics, then /metrics/per-object
                for title, (shape, terms) in PANELS.items():
                    expr = panel_query(shape, terms)
                    expr = expr.replace("$rabbitmq_cluster", CLUSTER)
                    expr = expr.replace("$namespace", namespace)
                    result = prom.query(expr)
                    where = f"{title!r} (namespace={namespace!r}): {expr}"
                    check_panel(title, shape, result, b.broker.node_name, where)
        finally:
            traffic.close()
            prom.stop()
    assert time.monotonic() - started < 40


def check_panel(title, shape, result, node, where) -> None:
    """The panel has a series, for our node, with a value that fits the traffic."""
    assert len(result) == 1, f"{where} -> {result}"
    (series,) = result
    value = float(series["value"][1])
    assert math.isfinite(value), where
    if shape != "stat":  # legends and the table read the node's identity
        assert series["metric"].get("rabbitmq_node") == node, where
    if shape == "table":
        assert series["metric"]["rabbitmq_cluster"] == CLUSTER, where
        assert all(series["metric"].get(label) for label in BUILD_LABELS), where
    expected = {
        "Ready messages": Traffic.READY,
        "Messages ready to be delivered to consumers": Traffic.READY,
        "Unacknowledged messages": Traffic.UNACKED,
        "Messages pending consumer acknowledgement": Traffic.UNACKED,
        "Queues": Traffic.QUEUES,
        "Total queues": Traffic.QUEUES,
        "Connections": Traffic.CONNECTIONS,
        "Total connections": Traffic.CONNECTIONS,
        "Channels": Traffic.CHANNELS,
        "Total channels": Traffic.CHANNELS,
        "Consumers": Traffic.CONSUMERS,
        "Publishers": Traffic.CHANNELS - Traffic.CONSUMERS,
        "Nodes": 1,
        "(nodes table)": 1,
    }
    if title in expected:
        assert value == expected[title], where
    elif title in ZERO_RATES:
        assert value == 0, where
    else:  # the traffic moved every other counter; memory, disk, fds, sockets are left
        assert value > 0, where
