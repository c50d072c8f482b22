"""Start-up and shutdown as an operator sees them one clear line for each
reason the broker cannot start, and its life logged at the default level, in JSON if asked."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pika
import pytest

pytestmark = pytest.mark.timeout(120)
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def start(data_dir: Path, *extra: str, config: Path | None = None) -> subprocess.Popen:
    argv = [sys.executable, "-m", "roarmq", "--port", "0", "--mgmt-port", "0"]
    if config is not None:
        argv += ["--config", str(config)]
    return subprocess.Popen(
        [*argv, "--data-dir", str(data_dir), *extra],
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_started(proc: subprocess.Popen) -> tuple[int, list[str]]:
    lines = []
    while True:
        line = proc.stderr.readline()
        assert line, "exited before it started:\n" + "".join(lines)
        lines.append(line)
        m = re.search(r"AMQP on .* port (\d+)", line)
        if m:
            return int(m.group(1)), lines


def stop(proc: subprocess.Popen) -> list[str]:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return err.splitlines(keepends=True)


def test_unusable_data_dir_is_one_line_and_exit_1(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = start(blocker / "data")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert f"cannot start: data dir {blocker / 'data'} is not usable: Not a directory" in lines[0]


def test_data_dir_in_use_touches_nothing_of_the_running_broker(tmp_path):
    data = tmp_path / "data"
    first = start(data)
    try:
        port, _ = wait_started(first)
        conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{port}"))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("kept", durable=True)
        ch.basic_publish("", "kept", b"before", PERSISTENT)
        before = {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in data.rglob("*")}
        second = start(data)
        _, err = second.communicate(timeout=30)
        assert second.returncode == 1
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert f"data dir {data} is in use by another RoarMQ (pid {first.pid})" in lines[0]
        after = {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in data.rglob("*")}
        assert after == before
        ch.basic_publish("", "kept", b"after", PERSISTENT)  # the first one is unharmed
        assert ch.queue_declare("kept", passive=True).method.message_count == 2
        conn.close()
    finally:
        stop(first)


def test_life_is_logged_at_the_default_level_and_recovery_after_a_crash(tmp_path):
    data = tmp_path / "data"
    proc = start(data)
    port, lines = wait_started(proc)
    text = "".join(lines)
    assert f"new data directory {data}" in text  # first boot: nothing was shut down before
    assert "message store is new: nothing to recover" in text and "clean=" not in text
    conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{port}"))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("dq", durable=True)
    for i in range(5):
        ch.basic_publish("", "dq", b"%d" % i, PERSISTENT)
    method, _, _ = ch.basic_get("dq")
    ch.basic_ack(method.delivery_tag)
    conn.close()
    assert "RoarMQ stopped" in "".join(stop(proc))
    # A clean restart, then a crash, then recovery that says what happened.
    proc = start(data)
    _, lines = wait_started(proc)
    text = "".join(lines)
    assert "message store recovered 4 persistent messages in 1 durable queues" in text
    assert "unclean shutdown" not in text
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    proc = start(data)
    _, lines = wait_started(proc)
    text = "".join(lines)
    assert re.search(r"warning .*recovering after an unclean shutdown", text), text
    assert "message store recovered 4 persistent messages" in text
    stop(proc)


def test_json_log_mode_is_json_on_every_line(tmp_path):
    config = tmp_path / "json.toml"
    config.write_text('[log]\nformat = "json"\n[amqp]\nbind = ["127.0.0.1"]\n')
    proc = start(tmp_path / "data", config=config)
    port, lines = wait_started(proc)
    pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{port}")).close()
    try:
        pika.BlockingConnection(pika.URLParameters(f"amqp://guest:wrong@127.0.0.1:{port}"))
    except pika.exceptions.AMQPError:
        pass
    time.sleep(0.2)  # the refused login's warning reaches the log
    lines += stop(proc)
    docs = [json.loads(line) for line in lines]  # every line parses
    messages = [d["msg"] for d in docs]
    assert any(m.startswith("RoarMQ 0.1.0: AMQP on 127.0.0.1 port") for m in messages)
    assert any(m.startswith("RoarMQ stopped") for m in messages)
    refused = [d for d in docs if d["msg"] == "login refused"]
    assert refused and refused[0]["level"] == "warning"  # "see the broker logfile": it is there


def test_version_and_help_for_every_subcommand():
    roarmq = str(Path(sys.executable).with_name("roarmq"))
    out = subprocess.run([roarmq, "--version"], capture_output=True, text=True)
    assert out.stdout.strip() == "RoarMQ 0.1.0"
    out = subprocess.run(
        [sys.executable, "-m", "roarmq", "--version"], capture_output=True, text=True
    )
    assert out.stdout.strip() == "RoarMQ 0.1.0"
    top = subprocess.run([roarmq, "--help"], capture_output=True, text=True)
    assert top.returncode == 0
    for command in ("serve", "check-config", "ping"):
        assert command in top.stdout
        sub = subprocess.run([roarmq, command, "--help"], capture_output=True, text=True)
        assert sub.returncode == 0 and f"usage: roarmq {command}" in sub.stdout, sub.stderr
    bad = subprocess.run([roarmq, "frobnicate"], capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    env = dict(os.environ)
    ping = subprocess.run(
        [roarmq, "ping", "--port", "1", "--timeout", "2"], capture_output=True, text=True, env=env
    )
    assert ping.returncode == 1 and "no AMQP answer" in ping.stderr
