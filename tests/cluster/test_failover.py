"""Replicated vhosts end to end: three real nodes on a real etcd, pika with confirms.

Every message confirmed before a kill -9 of the leader is on the new leader; a follower
killed with kill -9 leaves the in-sync set (the leader keeps confirming) and rejoins it
after catching up on restart."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import struct
import subprocess
import urllib.error
import urllib.parse
import urllib.request

import pika
import pytest
from machine import missing
from support.cluster_nodes import (
    PERSISTENT,
    TTL,
    Node,
    agreed_leader,
    by_name,
    connect,
    drain,
    placement,
    publish_confirmed,
    three_nodes,
)
from support.clusterlib import api_call
from support.waiting import until

from roarmq.broker.store.segments import SegmentLog

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

N = 200
REVOKED = "refuses connections: its process is gone; revoking its lease"


@pytest.fixture
def cluster(etcd, tmp_path):
    with three_nodes(etcd, tmp_path, "replica_lag_ms = 1000\n") as nodes:
        yield nodes


def test_leader_kill9_loses_nothing_confirmed(cluster):
    leader_name = until(lambda: agreed_leader(cluster), 30)
    assert leader_name, [n.log.read_text()[-2000:] for n in cluster]
    leader = by_name(cluster, leader_name)
    confirmed = publish_confirmed(leader, "q", [b"m%d" % i for i in range(N)])
    assert len(confirmed) == N

    leader.kill9()
    survivors = [n for n in cluster if n is not leader]

    def new_leader():
        name = agreed_leader(survivors, size=len(placement(survivors[0])[2]))
        return name if name not in (None, leader_name) else None

    successor_name = until(new_leader, 4 * TTL + 5, step=0.1)
    assert successor_name, [n.log.read_text()[-3000:] for n in survivors]
    successor = by_name(survivors, successor_name)
    other = next(n for n in survivors if n is not successor)
    # The other survivor hands its clients to the successor.
    conn = pika.BlockingConnection(other.params())
    assert conn.channel().queue_declare("q", passive=True).method.message_count >= len(confirmed)
    conn.close()

    more = publish_confirmed(successor, "q", [b"after%d" % i for i in range(50)])
    got = drain(successor, "q")
    lost = set(confirmed) - set(got)
    assert not lost, f"{len(lost)} confirmed messages lost"
    assert got[: len(confirmed)] == confirmed  # in publish order
    assert got[len(confirmed) :] == more
    # The process is gone (its port refuses): a follower revoked its lease, no TTL wait.
    assert any(REVOKED in n.log.read_text() for n in survivors)


def test_a_frozen_leader_is_replaced_by_lease_expiry_not_revoked(cluster):
    """SIGSTOP: the frozen leader's ports still accept connections, so nobody may take it
    for dead and revoke its lease (a live leader confirms until its lease runs out): it is
    replaced when its lease expires, then follows the new leader once thawed."""
    leader_name = until(lambda: agreed_leader(cluster), 30)
    assert leader_name, [n.log.read_text()[-2000:] for n in cluster]
    leader = by_name(cluster, leader_name)
    publish_confirmed(leader, "q", [b"before"])
    leader.freeze()
    survivors = [n for n in cluster if n is not leader]
    try:

        def new_leader():
            name = placement(survivors[0])[0]
            return name if name not in (None, leader_name) else None

        assert until(new_leader, 4 * TTL + 5, step=0.1)
    finally:
        leader.thaw()
    assert not any(REVOKED in n.log.read_text() for n in survivors)
    # The name agreed on, not a second look: the nodes may disagree for a moment again.
    successor_name = until(lambda: agreed_leader(cluster), 30)
    assert successor_name, "the thawed node did not rejoin"
    successor = by_name(cluster, successor_name)
    assert drain(successor, "q") == [b"before"]


def test_follower_kill9_shrinks_then_rejoins(cluster):
    leader_name = until(lambda: agreed_leader(cluster), 30)
    assert leader_name, [n.log.read_text()[-2000:] for n in cluster]
    leader = by_name(cluster, leader_name)
    victim = next(n for n in cluster if n is not leader)
    publish_confirmed(leader, "q", [b"before%d" % i for i in range(50)])

    victim.kill9()
    # Publishing goes on: confirms wait for the dead follower until the ISR shrinks.
    confirmed = publish_confirmed(leader, "q", [b"during%d" % i for i in range(50)])
    assert len(confirmed) == 50
    in_sync = leader.api("/api/vhosts/%2F")["in_sync"]
    assert victim.name not in in_sync and leader_name in in_sync
    # Its port refused: it left at once, not after replica_lag_ms of waiting confirms.
    assert f"in-sync member {victim.name} is not running" in leader.log.read_text()

    victim.start()

    def rejoined():
        return victim.name in leader.api("/api/vhosts/%2F")["in_sync"]

    assert until(rejoined, 20), victim.log.read_text()[-3000:]
    assert len(drain(leader, "q")) == 100


#: Each fdatasync of the node with the replaced disk takes this long (strace's delay_exit):
#: its catch-up takes seconds, so "in sync" reported before it holds everything shows.
SLOW_FSYNC_US = 300_000


@contextlib.contextmanager
def fsync_fault(pid: int, fault: str):
    """Every fdatasync of process `pid` (all its threads) gets strace's `fault` (its
    inject= rule after the call's name) while the block runs: strace attached, then
    detached (the process goes on untraced)."""
    strace = shutil.which("strace")
    if strace is None:
        missing("strace is not installed", "ROARMQ_EXPECT_PACKAGES")
    args = [strace, "-f", "-qq", "-o", "/dev/null", "-p", str(pid), "-e", "trace=fdatasync"]
    args += ["-e", f"inject=fdatasync:{fault}"]
    tracer = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def tracers() -> set[int]:
        found = set()
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(FileNotFoundError):
                status = open(f"/proc/{pid}/task/{task}/status").read()
                found.add(int(status.split("TracerPid:")[1].split()[0]))
        return found

    try:
        assert until(lambda: tracers() == {tracer.pid} or tracer.poll() is not None, 10)
        assert tracer.poll() is None, tracer.stderr.read().decode()  # type: ignore[union-attr]
        yield
    finally:
        if tracer.poll() is None:
            tracer.send_signal(signal.SIGINT)  # detaches from every thread and exits
            tracer.wait(10)


def test_a_replaced_disk_is_in_sync_only_once_it_holds_every_confirmed_message(cluster):
    """A follower's disk is replaced: kill -9, its data dir emptied, restarted (with slow
    fsyncs, so that its catch-up takes seconds). Once the leader reports it in sync the
    two other nodes die: it then leads alone and must hold every confirmed message. (A
    follower's acked offset used to be a remembered maximum: the empty copy was back in
    the set as soon as it connected, and the messages it had not copied yet were lost.)"""
    leader_name = until(lambda: agreed_leader(cluster), 30)
    assert leader_name, [n.log.read_text()[-2000:] for n in cluster]
    leader = by_name(cluster, leader_name)
    victim = next(n for n in cluster if n is not leader)
    pad = os.urandom(16 << 10)
    confirmed = publish_confirmed(leader, "q", [b"%06d" % i + pad for i in range(600)])

    victim.kill9()
    shutil.rmtree(victim.data_dir)
    victim.start()
    assert victim.proc is not None

    def reported_in_sync():
        return victim.name in leader.api("/api/vhosts/%2F")["in_sync"]

    with fsync_fault(victim.proc.pid, f"delay_exit={SLOW_FSYNC_US}"):
        assert until(reported_in_sync, 90, step=0.05), victim.log.read_text()[-3000:]
        for node in cluster:
            if node is not victim:
                node.kill9()
    assert until(lambda: placement(victim)[0] == victim.name, 4 * TTL + 10, step=0.1), (
        victim.log.read_text()[-3000:]
    )
    got = drain(victim, "q")
    lost = set(confirmed) - set(got)
    assert not lost, f"{len(lost)} of {len(confirmed)} confirmed messages lost"
    assert got == confirmed


def test_a_leader_left_alone_nacks_instead_of_confirming_on_one_copy(cluster):
    """min_in_sync defaults to a majority of the vhost's members (2 of 3), checked when a
    confirm is released: with both followers gone the leader nacks, so no single lost
    disk can take a confirmed message with it."""
    leader_name = until(lambda: agreed_leader(cluster), 30)
    assert leader_name, [n.log.read_text()[-2000:] for n in cluster]
    leader = by_name(cluster, leader_name)
    assert publish_confirmed(leader, "q", [b"before"]) == [b"before"]
    conn = connect(leader)
    ch = conn.channel()
    ch.confirm_delivery()
    for node in cluster:
        if node is not leader:
            node.kill9()
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", "q", b"alone", PERSISTENT, mandatory=True)
    conn.close()


def test_a_leader_whose_log_fails_hands_over_instead_of_nacking_forever(cluster):
    """The leader's fdatasyncs fail (EIO, strace): it nacks what waits, gives its key back
    and does not campaign again with a failed log, so another in-sync member leads and
    confirms, holding everything confirmed before."""
    leader_name = until(lambda: agreed_leader(cluster), 30)
    assert leader_name, [n.log.read_text()[-2000:] for n in cluster]
    leader = by_name(cluster, leader_name)
    before = publish_confirmed(leader, "q", [b"before%d" % i for i in range(20)])
    survivors = [n for n in cluster if n is not leader]
    assert leader.proc is not None
    with fsync_fault(leader.proc.pid, "error=EIO"):
        conn = connect(leader)
        ch = conn.channel()
        ch.confirm_delivery()
        with pytest.raises((pika.exceptions.NackError, pika.exceptions.AMQPConnectionError)):
            ch.basic_publish("", "q", b"failed", PERSISTENT, mandatory=True)

        def successor():
            name = placement(survivors[0])[0]
            return name if name not in (None, leader_name) else None

        assert until(successor, 4 * TTL + 10, step=0.1), leader.log.read_text()[-3000:]
    assert "its vhost log failed" in leader.log.read_text()
    new = by_name(cluster, successor())
    after = publish_confirmed(new, "q", [b"after"])
    got = drain(new, "q")
    assert set(before) <= set(got) and got[-1:] == after


def quorum_check(node: Node) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{node.mgmt_port}/api/health/checks/node-is-quorum-critical",
        headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="},  # guest:guest
    )
    try:
        with urllib.request.urlopen(request, timeout=2) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_node_is_quorum_critical_says_which_node_can_be_stopped(cluster):
    """All three in sync: any one can stop (2 copies left, min_in_sync 2). With one
    follower gone, each of the other two is critical: stopping it would leave one copy."""
    leader_name = until(lambda: agreed_leader(cluster), 30)
    assert leader_name, [n.log.read_text()[-2000:] for n in cluster]
    leader = by_name(cluster, leader_name)
    publish_confirmed(leader, "q", [b"m"])
    assert [quorum_check(n) for n in cluster] == [(200, {"status": "ok"})] * 3
    victim = next(n for n in cluster if n is not leader)
    victim.kill9()
    rest = [n for n in cluster if n is not victim]

    def critical():
        return all(quorum_check(n)[0] == 503 for n in rest)

    assert until(critical, 4 * TTL + 5), [quorum_check(n) for n in rest]
    # The leader's own view of each member (GET /api/vhosts/{vhost}: "member_status").
    rows = {row["node"]: row for row in leader.api("/api/vhosts/%2F")["member_status"]}
    assert set(rows) == {n.name for n in cluster} - {leader_name}
    assert not rows[victim.name]["in_sync"] and not rows[victim.name]["connected"]
    (other,) = [n for n in rest if n is not leader]
    assert rows[other.name]["in_sync"] and rows[other.name]["connected"]
    assert rows[other.name]["behind"] == 0 and rows[other.name]["last_heard_ms"] < 5000
    status, body = quorum_check(leader)
    assert body["reason"] == (
        "There are quorum queues that would lose their quorum if the target node is shut down"
    )
    assert body["vhosts"] == ["/"]
    assert body["queues"] == [
        {
            "name": "q",
            "readable_name": "queue 'q' in vhost '/'",
            "virtual_host": "/",
            "type": "classic",
        }
    ]
    # The other follower gone too: the node left alone is the last copy, not "a single
    # node cluster".
    other.kill9()

    def alone() -> bool:
        return [n["name"] for n in leader.api("/api/nodes") if n["running"]] == [leader.name]

    assert until(alone, 4 * TTL + 5), leader.api("/api/nodes")
    status, body = quorum_check(leader)
    assert status == 503 and body["vhosts"] == ["/"], body


def test_a_vhost_whose_copy_cannot_be_opened_does_not_keep_the_node_from_the_others(cluster):
    """A follower restarted with a record of a kind this version does not know in its copy
    of "/": that copy stays out (the error logged, looked at again later) and the node
    still follows, and rejoins the in-sync set of, another vhost."""
    put = ("PUT", "/api/vhosts/other")
    assert until(lambda: api_call(cluster[0].mgmt_port, *put)[0] in (201, 204), 30)

    def in_sync(node: Node, vhost: str) -> set[str]:
        return set(node.api(f"/api/vhosts/{urllib.parse.quote(vhost, safe='')}")["in_sync"])

    names = {n.name for n in cluster}
    assert until(lambda: all(in_sync(cluster[0], v) == names for v in ("/", "other")), 60)
    leader = by_name(cluster, until(lambda: agreed_leader(cluster), 30))
    follower = next(n for n in cluster if n is not leader)
    follower.stop()
    assert until(lambda: follower.name not in in_sync(leader, "other"), 30)  # it left both
    log = SegmentLog.open(follower.data_dir / "vhosts" / "%2F" / "log", segment_size=1 << 20)
    log.append(struct.pack(">cIQ", b"q", 0, 1) + b"from a newer version")
    log.sync_now()
    log.close()
    follower.start()
    assert until(lambda: "looked at again in" in follower.log.read_text(), 30)
    assert until(lambda: follower.name in in_sync(leader, "other"), 60), follower.log.read_text()[
        -3000:
    ]
    text = follower.log.read_text()
    assert "not of this version's log" in text and "looked at again in" in text, text[-3000:]
    assert follower.name not in in_sync(leader, "/")
