"""config.toml validation, command-line overrides, and the installed package's entry points."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.waiting import free_port

from roarmq.broker.config import Config, ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


def test_shipped_config_is_valid_and_matches_defaults():
    cfg = load_config(ROOT / "config.toml")
    assert cfg == Config()
    assert cfg.amqp.bind == ("127.0.0.1", "::1") and cfg.amqp.port == 5672
    assert cfg.management.bind == "127.0.0.1" and cfg.management.port == 15672
    assert cfg.limits.max_message_size == 128 * 1024 * 1024
    assert (cfg.limits.frame_max, cfg.limits.channel_max, cfg.limits.heartbeat) == (
        131072,
        2047,
        60,
    )
    assert cfg.storage.data_dir == "./data"
    assert [u.name for u in cfg.users] == ["guest"] and cfg.users[0].loopback_only


@pytest.mark.parametrize(
    "doc, key",
    [
        ({"amqp": {"prot": 5672}}, "[amqp] prot"),
        ({"amqp": {"port": "5672"}}, "[amqp] port"),
        ({"amqp": {"port": 70000}}, "[amqp] port"),
        ({"amqp": {"bind": ["not-an-ip"]}}, "[amqp] bind[0]"),
        ({"limits": {"frame_max": 100}}, "[limits] frame_max"),
        ({"log": {"level": "loud"}}, "[log] level"),
        ({"managment": {}}, "managment"),
        ({"users": [{"name": "u"}]}, "password"),
        ({"permissions": [{"user": "ghost", "vhost": "/"}]}, "user"),
        ({"permissions": [{"user": "guest", "vhost": "/", "read": "("}]}, "read"),
        ({"archive": {"roll_minutes": 0}}, "[archive] roll_minutes"),
        ({"archive": {"roll_minutes": "5"}}, "[archive] roll_minutes"),
        ({"archive": {"roll_minutes": 1441}}, "[archive] roll_minutes"),
    ],
)
def test_bad_config_names_the_key(doc, key):
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    assert key in str(info.value)


def test_roll_minutes_takes_fractions():
    assert parse_config({"archive": {"roll_minutes": 0.5}}).archive.roll_minutes == 0.5
    assert parse_config({"archive": {"roll_minutes": 1440}}).archive.roll_minutes == 1440


def test_check_config_cli(tmp_path):
    good = subprocess.run(
        [sys.executable, "-m", "roarmq", "--check-config", str(ROOT / "config.toml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert good.returncode == 0, good.stderr
    bad_file = tmp_path / "bad.toml"
    bad_file.write_text("[limits]\nheartbeat = -1\n")
    bad = subprocess.run(
        [sys.executable, "-m", "roarmq", "--check-config", str(bad_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1
    assert "[limits] heartbeat" in bad.stderr
    broken = tmp_path / "broken.toml"
    broken.write_text("[amqp\n")
    out = subprocess.run(
        [sys.executable, "-m", "roarmq", "--check-config", str(broken)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and "not valid TOML" in out.stderr


def test_overrides_win_over_file():
    cfg = Config().with_overrides(port=1234, mgmt_port=0, data_dir="/tmp/x", log_level="INFO")
    assert (cfg.amqp.port, cfg.management.port, cfg.storage.data_dir, cfg.log.level) == (
        1234,
        0,
        "/tmp/x",
        "info",
    )


@pytest.mark.parametrize("argv0", [[sys.executable, "-m", "roarmq"], "roarmq-serve"])
def test_daemon_starts_serves_and_stops(tmp_path, argv0):
    """The real daemon as a subprocess: starts in well under a second, speaks AMQP, stops on SIGTERM."""
    import pika

    if argv0 == "roarmq-serve":
        argv0 = [str(Path(sys.executable).with_name("roarmq")), "serve"]
    port, mgmt = free_port(), free_port()
    data = tmp_path / "data"
    started = time.monotonic()
    # The container's way to a network-reachable user (RabbitMQ: RABBITMQ_DEFAULT_USER/_PASS).
    env = dict(os.environ, ROARMQ_DEFAULT_USER="ops", ROARMQ_DEFAULT_PASS="s3cret")
    proc = subprocess.Popen(
        [
            *argv0,
            "--config",
            str(ROOT / "config.toml"),
            "--port",
            str(port),
            "--mgmt-port",
            str(mgmt),
            "--data-dir",
            str(data),
            "--log-level",
            "info",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = ""
        while "RoarMQ" not in line:  # info-level log lines may come first
            line = proc.stderr.readline()
            assert line, "the broker exited before it started"
        assert f"port {port}" in line, line
        conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{port}"))
        ch = conn.channel()
        ch.queue_declare("cli-q", exclusive=True)
        conn.close()
        conn6 = pika.BlockingConnection(pika.ConnectionParameters(host="::1", port=port))
        conn6.close()
        ops = pika.BlockingConnection(pika.URLParameters(f"amqp://ops:s3cret@127.0.0.1:{port}"))
        ops.channel().queue_declare("ops-q", exclusive=True)
        ops.close()
        roarmq = str(Path(sys.executable).with_name("roarmq"))
        ping = subprocess.run(
            [roarmq, "ping", "--port", str(port)], capture_output=True, text=True, timeout=30
        )
        assert ping.returncode == 0 and "RoarMQ" in ping.stdout, ping.stderr
        assert data.is_dir()
        import urllib.request

        req = urllib.request.Request(f"http://127.0.0.1:{mgmt}/api/overview")
        req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert b"RoarMQ" in resp.read()
        with urllib.request.urlopen(f"http://127.0.0.1:{mgmt}/metrics", timeout=5) as resp:
            assert b"roarmq_connections" in resp.read()
        assert time.monotonic() - started < 30
    finally:
        proc.terminate()
        proc.wait(10)
    assert proc.returncode == 0


@pytest.mark.slow  # a pip install: not in `make check`
@pytest.mark.timeout(600)  # the install compiles the message path's modules (setup.py)
def test_dockerfile_install_and_check_config_steps(tmp_path, built_wheel):
    """Docker cannot run here: do what the Dockerfile does, step for step, outside it."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert dockerfile.startswith("#") and "FROM python:3.11-slim AS build" in dockerfile
    assert re.search(r"^FROM python:3.11-slim$", dockerfile, re.M)  # the image: no compiler
    assert re.search(r"^EXPOSE 5672 15672$", dockerfile, re.M)
    assert 'CMD ["roarmq", "ping", "--port", "5672"]' in dockerfile  # the AMQP handshake
    assert re.search(r"^USER roarmq$", dockerfile, re.M)  # not root
    assert 'CMD ["python", "-m", "roarmq", "--config", "/etc/roarmq/config.toml"]' in dockerfile
    assert "COPY roarmq ./roarmq" in dockerfile and "COPY pyproject.toml setup.py" in dockerfile
    # RUN pip wheel --no-deps --wheel-dir /wheels .   (stage one: compiles where it can;
    # the same command as the session's `built_wheel`, which the user-project test shares)
    assert "pip wheel --no-cache-dir --no-deps --wheel-dir /wheels ." in dockerfile
    wheel, _output = built_wheel
    # RUN pip install /wheels/*.whl  (stage two; dependencies are already in this venv)
    target = tmp_path / "site"
    assert "pip install --no-cache-dir /wheels/*.whl" in dockerfile
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target)]
        + [str(wheel)],
        check=True,
        timeout=120,
    )
    if shutil.which("cc") and not os.environ.get("ROARMQ_NO_EXTENSIONS"):  # as stage one's gcc
        built = {p.stem.split(".")[0] for p in target.glob("roarmq/broker/*/*.so")}
        assert {"message", "queue", "channel", "connection", "exchange"} <= built, built
    # RUN sed ... /etc/roarmq/config.toml && python -m broker --check-config ...
    etc = tmp_path / "etc-roarmq"
    etc.mkdir()
    conf = etc / "config.toml"
    conf.write_text((ROOT / "config.toml").read_text())
    sed = re.search(r"RUN (sed -i .*?/etc/roarmq/config.toml)", dockerfile, re.S).group(1)
    sed = sed.replace("\\\n", " ").replace("/etc/roarmq/config.toml", str(conf))
    subprocess.run(sed, shell=True, check=True, timeout=30)
    text = conf.read_text()
    assert 'bind = ["0.0.0.0"]' in text
    # Everything stateful under the volume; guest never reachable from the network.
    assert 'data_dir = "/var/lib/roarmq"' in text and 'dir = "/var/lib/roarmq/archive"' in text
    assert re.search(r'^name = "guest"\n.*\n.*\nloopback_only = true$', text, re.M)
    env = dict(os.environ, PYTHONPATH=str(target))
    check = subprocess.run(
        [sys.executable, "-m", "roarmq", "--check-config", str(conf)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stderr
    where = subprocess.run(
        [sys.executable, "-c", "import roarmq.broker, roarmq.protocol; print(roarmq.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert where.stdout.startswith(str(target))
    # One import namespace: nothing generic lands in site-packages.
    names = {p.name for p in target.iterdir() if not p.name.endswith("-info")}
    assert names - {"bin"} == {"roarmq"}, names  # bin: the roarmq console script


def test_pytest_plugin_fixture(pytester):
    pytester.makepyfile(
        """
        import pika

        def test_with_broker(amqp_broker):
            conn = pika.BlockingConnection(pika.URLParameters(amqp_broker))
            ch = conn.channel()
            ch.queue_declare("plugin-q")
            ch.basic_publish("", "plugin-q", b"hi")
            assert ch.basic_get("plugin-q", auto_ack=True)[2] == b"hi"
            conn.close()
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
