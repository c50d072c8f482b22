"""etcd restored from a backup taken before the cluster's latest leaderships: its
revisions go back, so new leader keys get epochs below the terms the vhost logs already
hold. The cluster must raise its epoch base past them and go on: a leader elected,
confirming, and every message confirmed before the restore still there."""

from __future__ import annotations

import shutil

import pika
import pytest
from support.cluster_nodes import (
    TTL,
    agreed_leader,
    by_name,
    drain,
    publish_confirmed,
    three_nodes,
)
from support.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_a_cluster_goes_on_after_etcd_is_restored_from_an_older_backup(etcd, tmp_path):
    with three_nodes(etcd, tmp_path, "replica_lag_ms = 1000\n") as nodes:
        assert until(lambda: agreed_leader(nodes), 30), [n.log.read_text()[-2000:] for n in nodes]
        etcd.stop()
        backup = tmp_path / "etcd-backup"
        shutil.copytree(etcd.data_dir, backup)
        etcd.start()
        confirmed: list[bytes] = []
        for round_ in range(2):  # leaderships the backup never saw
            leader_name = until(lambda: agreed_leader(nodes), 30)
            assert leader_name, [n.log.read_text()[-2000:] for n in nodes]
            leader = by_name(nodes, leader_name)
            confirmed += publish_confirmed(
                leader, "q", [b"r%d-%d" % (round_, i) for i in range(50)]
            )
            leader.kill9()
            leader.start()
        assert until(lambda: agreed_leader(nodes), 30), [n.log.read_text()[-2000:] for n in nodes]

        etcd.stop()
        shutil.rmtree(etcd.data_dir)
        shutil.copytree(backup, etcd.data_dir)
        etcd.start()

        def serving():
            name = agreed_leader(nodes)
            if name is None:
                return None
            try:
                return publish_confirmed(by_name(nodes, name), "q", [b"after"]) and name
            except (pika.exceptions.AMQPError, AssertionError):
                return None

        leader_name = until(serving, 12 * TTL + 30, step=0.5)
        assert leader_name, [n.log.read_text()[-3000:] for n in nodes]
        assert any("before a restore: epoch_base" in n.log.read_text() for n in nodes)
        got = drain(by_name(nodes, leader_name), "q")
        assert set(confirmed) <= set(got), f"{len(set(confirmed) - set(got))} confirmed lost"
        assert got[-1] == b"after"
