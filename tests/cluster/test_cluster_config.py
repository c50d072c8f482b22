"""[cluster] and --cluster-etcd/--node/--replication-port: validated like every section;
absent, nothing of the cluster is imported (invariant 7)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from roarmq.broker.__main__ import _load, _parser, check_config
from roarmq.broker.config import ClusterConfig, Config, ConfigError, parse_config


def test_cluster_section_parsed_with_defaults():
    cfg = parse_config({"cluster": {"etcd": ["http://10.0.0.1:2379/"], "node": "n1"}})
    assert cfg.cluster == ClusterConfig(etcd=("http://10.0.0.1:2379",), node="n1")
    assert cfg.cluster.name == "roarmq" and cfg.cluster.replicas == 3
    assert cfg.cluster.min_in_sync is None and cfg.cluster.lease_ttl == 5
    assert parse_config({}).cluster is None and Config().cluster is None


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"node": "n1"}, "[cluster] etcd: missing"),
        ({"etcd": "http://e:2379"}, "[cluster] node: missing"),
        ({"etcd": [], "node": "n"}, "[cluster] etcd: must be a non-empty list"),
        ({"etcd": ["e:2379"], "node": "n"}, "[cluster] etcd[0]: must be an etcd client URL"),
        ({"etcd": ["http://e"], "node": "a b"}, "[cluster] node: must be letters"),
        ({"etcd": ["http://e"], "node": "n", "lease_ttl": 1}, "[cluster] lease_ttl"),
        ({"etcd": ["http://e"], "node": "n", "replicas": 0}, "[cluster] replicas"),
        ({"etcd": ["http://e"], "node": "n", "replicas": 2, "min_in_sync": 3}, "min_in_sync"),
        ({"etcd": ["http://e"], "node": "n", "advertise": "host"}, "[cluster] advertise"),
        ({"etcd": ["http://e"], "node": "n", "replication_port": 0}, "replication_port"),
        ({"etcd": ["http://e"], "node": "n", "nodes": 3}, "[cluster] nodes: unknown setting"),
    ],
)
def test_cluster_errors_name_the_key(section, message):
    with pytest.raises(ConfigError) as info:
        parse_config({"cluster": section})
    assert message in str(info.value)


def test_command_line_flags(tmp_path):
    args = _parser("roarmq").parse_args(
        [
            "--cluster-etcd",
            "http://a:2379,http://b:2379",
            "--node",
            "n1",
            "--replication-port",
            "7000",
        ]
    )
    cluster = _load(args).cluster
    assert cluster.etcd == ("http://a:2379", "http://b:2379")
    assert (cluster.node, cluster.replication_port) == ("n1", 7000)
    # The flags override a [cluster] from the file, keeping its other keys.
    conf = tmp_path / "c.toml"
    conf.write_text('[cluster]\netcd = ["http://e:2379"]\nnode = "x"\nreplicas = 2\n')
    cluster = _load(_parser("roarmq").parse_args(["--config", str(conf), "--node", "y"])).cluster
    assert (cluster.etcd, cluster.node, cluster.replicas) == (("http://e:2379",), "y", 2)
    with pytest.raises(ConfigError, match="node: missing"):
        _load(_parser("roarmq").parse_args(["--cluster-etcd", "http://a:2379"]))
    with pytest.raises(ConfigError, match="--replication-port"):
        _load(_parser("roarmq").parse_args(["--config", str(conf), "--replication-port", "0"]))


def test_check_config_validates_cluster(tmp_path, capsys):
    good = tmp_path / "good.toml"
    good.write_text('[cluster]\netcd = ["http://127.0.0.1:2379"]\nnode = "n1"\n')
    assert check_config(str(good)) == 0
    bad = tmp_path / "bad.toml"
    bad.write_text('[cluster]\netcd = ["http://127.0.0.1:2379"]\nnode = "n1"\nlease_ttl = "5"\n')
    assert check_config(str(bad)) == 1
    assert "[cluster] lease_ttl: must be an integer" in capsys.readouterr().err


def test_single_node_imports_nothing_of_the_cluster():
    """Only the seam (the core's own module, whose single-node answers are constants)."""
    code = (
        "import sys, roarmq.broker.server, roarmq.broker.__main__, roarmq.broker.config;"
        "print([m for m in sys.modules"
        " if m.startswith(('roarmq.broker.cluster.', 'roarmq.broker.replog'))"
        " or m == 'roarmq.broker.cluster' or 'etcd' in m])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
