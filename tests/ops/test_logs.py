"""Logs an operator can alert on a clean shutdown is one notice with the
number of connections closed and no warnings; the first boot says "new data directory"
without a `clean=False`; the archive's state at start-up in one line; and the package ships
its web UI without setuptools warnings."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pika
import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


def start(data_dir: Path, config: Path | None = None) -> subprocess.Popen:
    argv = [sys.executable, "-m", "roarmq", "--port", "0", "--mgmt-port", "0"]
    if config is not None:
        argv += ["--config", str(config)]
    return subprocess.Popen([*argv, "--data-dir", str(data_dir)], stderr=subprocess.PIPE, text=True)


def wait_started(proc: subprocess.Popen) -> tuple[int, str]:
    lines = []
    while True:
        line = proc.stderr.readline()
        assert line, "exited before it started:\n" + "".join(lines)
        lines.append(line)
        m = re.search(r"AMQP on .* port (\d+)", line)
        if m:
            return int(m.group(1)), "".join(lines)


def stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return err


def test_first_boot_then_a_clean_shutdown_with_clients(tmp_path):
    data = tmp_path / "data"
    config = tmp_path / "c.toml"
    config.write_text('[amqp]\nbind = ["127.0.0.1"]\n')
    proc = start(data, config)
    port, text = wait_started(proc)
    assert f"new data directory {data}" in text
    assert "message store is new: nothing to recover" in text
    assert "clean=" not in text and "warning" not in text
    clients = [
        pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{port}"))
        for _ in range(3)
    ]
    for c in clients:
        c.channel().queue_declare("", exclusive=True)
    err = stop(proc)
    # one notice with the count; nothing at WARNING or above for a planned stop
    assert not re.search(r"^\S+ (warning|error|critical) ", err, re.M), err
    assert "closing connection on error" not in err
    stopped = [line for line in err.splitlines() if "RoarMQ stopped" in line]
    assert len(stopped) == 1 and "notice" in stopped[0], err
    assert "3 connections closed" in stopped[0]
    for c in clients:
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            c.process_data_events(1)
    # the second boot is not new, and says the first stop was clean
    proc = start(data, config)
    _, text = wait_started(proc)
    assert f"data dir {data}" in text and "new data directory" not in text
    assert re.search(r"message store recovered 0 persistent messages.* clean=True", text), text
    stop(proc)


def test_archive_state_at_start_up_in_one_line(tmp_path):
    archive = tmp_path / "archive"
    config = tmp_path / "c.toml"
    config.write_text(
        f'[amqp]\nbind = ["127.0.0.1"]\n[archive]\nenabled = true\ndir = "{archive}"\n'
        "roll_minutes = 5\n"
    )
    hour = archive / "vhost=%2F" / "hour=2024-05-01T13"
    hour.mkdir(parents=True)
    (hour / ".part-20240501T130000-abcdef-1.journal").write_bytes(b"")  # left by a crash
    proc = start(tmp_path / "data", config)
    _, text = wait_started(proc)
    lines = [line for line in text.splitlines() if "roarmq.archive" in line]
    state = [line for line in lines if "archive enabled in" in line]
    assert len(state) == 1, text
    assert f"archive enabled in {archive}: 0 Parquet files; 1 journals left open" in state[0]
    assert "every 5 min (roarmq ctl archive_roll: now)" in state[0]
    assert state[0].split()[1] == "notice"
    stop(proc)


def test_the_web_ui_ships_without_setuptools_warnings():
    """setuptools warns ("Package 'roarmq.broker.www' ... would be ignored") for every
    directory of package data that is not itself a listed package; `make run` printed 40
    lines of it. Every directory under a package that holds files must be listed. (Building a
    wheel from a copy, `pip wheel --no-deps .`, shows no warning; too slow for a test.)"""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = config["package-dir"]
    listed = set(config["packages"])
    for package in list(listed):
        base = dirs.get(package) or dirs[package.rsplit(".", 1)[0]] + "/" + package.split(".")[-1]
        for sub in (ROOT / base).iterdir():
            if not sub.is_dir() or sub.name.startswith((".", "_")) or sub.name == "__pycache__":
                continue
            if not any(f.is_file() and not f.name.endswith(".pyc") for f in sub.iterdir()):
                continue
            assert f"{package}.{sub.name}" in listed, f"{sub} ships unlisted: setuptools warns"
    data = config["package-data"]
    assert data["roarmq.broker.www"] == ["*.html", "*.js", "*.css"]
    assert not any(p.startswith("www/") for p in data.get("roarmq.broker", []))
