"""The archive is readable while the broker runs `roarmq ctl archive_roll`
closes the open journals into Parquet on demand, and an empty window says which files exist
and why none were read."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pika
import pytest

from roarmq.broker.archive import partitions, pending_journals
from roarmq.broker.testing import BrokerThread, ephemeral_config
from roarmq.pipeline.errors import PipelineError
from roarmq.pipeline.reader import scan_archive

pytestmark = pytest.mark.timeout(120)


def ctl(b, *args: str, user: str = "guest", password: str = "guest") -> tuple[int, str, str]:
    env = {
        **os.environ,
        "ROARMQ_CTL_URL": b.mgmt_url,
        "ROARMQ_CTL_USER": user,
        "ROARMQ_CTL_PASSWORD": password,
    }
    done = subprocess.run(
        [sys.executable, "-m", "roarmq", "ctl", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout, done.stderr


def journals(root: Path) -> list[Path]:
    return [j for _, _, d in partitions(root) for j in pending_journals(d)] if root.exists() else []


def test_archive_roll_makes_a_running_brokers_traffic_readable(tmp_path):
    root = tmp_path / "archive"
    config = ephemeral_config(
        data_dir=str(tmp_path / "d"), archive={"enabled": True, "dir": str(root)}
    )
    with BrokerThread(config, management=True) as b:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        for i in range(25):
            ch.basic_publish("amq.topic", "orders", b"%d" % i)
        deadline = time.monotonic() + 15
        while not journals(root) and time.monotonic() < deadline:
            time.sleep(0.1)  # the batch reaches its journal within a second
        assert journals(root)
        with pytest.raises(PipelineError) as info:
            scan_archive(root)
        text = str(info.value)
        assert text.startswith(f"empty window: no archived messages in {root}: ")
        assert "1 journals still open" in text and "run `roarmq ctl archive_roll`" in text
        # administrators only
        b.api("PUT", "/api/users/watcher", {"password": "w", "tags": "monitoring"})
        code, _, err = ctl(b, "archive_roll", user="watcher", password="w")
        assert code == 1 and "Not administrator user" in err
        for i in range(5):  # still in the batch being filled: roll hands it over first
            ch.basic_publish("amq.topic", "orders", b"late %d" % i)
        conn.process_data_events(0)
        code, out, err = ctl(b, "archive_roll")
        assert code == 0, err
        assert f"Rolling the archive in {root} ..." in out
        assert "1 open journals closed, 1 Parquet files written" in out
        scan = scan_archive(root)
        assert scan.rows == 30 and not scan.journals
        # nothing open: a second roll is harmless, and the broker archives on
        code, out, _ = ctl(b, "--format", "json", "archive_roll")
        assert code == 0 and '"journals_closed": 0' in out
        ch.basic_publish("amq.topic", "orders", b"after")
        conn.close()
    assert scan_archive(root).rows == 31  # the stop rolled the new journal


def test_archive_roll_with_the_archive_off(tmp_path):
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        code, _, err = ctl(b, "archive_roll")
    assert code == 1
    assert "the archive is off: set [archive] enabled = true" in err


def test_empty_window_names_the_files_outside_it(tmp_path):
    root = tmp_path / "archive"
    config = ephemeral_config(
        data_dir=str(tmp_path / "d"), archive={"enabled": True, "dir": str(root)}
    )
    with BrokerThread(config) as b:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        conn.channel().basic_publish("amq.topic", "k", b"x")
        conn.close()
    hour = scan_archive(root).hours[0]
    with pytest.raises(PipelineError) as info:
        scan_archive(root, since="2999-01-01T00")
    assert str(info.value).endswith(
        f"between 2999-01-01T00 and the end: 1 Parquet files outside the window (hours {hour})"
    )
