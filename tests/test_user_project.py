"""RoarMQ as a user's project sees it installed from a wheel into a
fresh venv, next to the user's own `broker` and `pipeline` packages.

The venv gets RoarMQ's wheel (no dependencies); the dependencies (uvloop, pika, pytest...)
come from this environment through a .pth line, so nothing is downloaded.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from roarmq.broker.testing import BrokerThread, ephemeral_config, running_broker

# slow (a pip install into a new venv): `make check` leaves it out
pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

USER_TESTS = """
import sys

import broker
import pika
import pipeline


def test_plugin_imported_nothing_of_the_broker():
    # The plugin loads in every run: only a test using its fixtures may pay for the broker.
    assert "roarmq.pytest_plugin" in sys.modules
    assert not [m for m in sys.modules if m.startswith("roarmq.broker")]


def test_own_packages_are_the_users():
    assert broker.OWNER == "user" and pipeline.OWNER == "user"


def test_per_test_broker(amqp_broker):
    conn = pika.BlockingConnection(pika.URLParameters(amqp_broker))
    conn.channel().queue_declare("user-q")
    conn.close()


def test_session_broker(amqp_broker_session):
    conn = pika.BlockingConnection(pika.URLParameters(amqp_broker_session))
    conn.channel().queue_declare("user-session-q")
    conn.close()


def test_session_broker_is_shared(amqp_broker_session):
    conn = pika.BlockingConnection(pika.URLParameters(amqp_broker_session))
    conn.channel().queue_declare("user-session-q", passive=True)  # declared by the test above
    conn.close()
"""


def test_installed_wheel_beside_a_users_broker_and_pipeline(tmp_path, built_wheel):
    # Nothing of this environment's own import path may leak into the fresh venv.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.pop("VIRTUAL_ENV", None)
    wheel, output = built_wheel
    # Clean metadata: no setuptools deprecation (project.license is an SPDX string).
    assert "deprecated" not in output.lower(), output
    venv = tmp_path / "venv"
    subprocess.run(
        env=env, args=[sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True
    )
    python = venv / "bin" / "python"
    pip = subprocess.run(
        env=env,
        args=[sys.executable, "-m", "pip", "--python", str(python), "install"]
        + ["--no-deps", "--no-cache-dir", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    purelib = subprocess.run(
        env=env,
        args=[str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # Dependencies from this environment (after the venv's own site-packages on sys.path).
    (Path(purelib) / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    installed = sorted(p.name for p in Path(purelib).iterdir())
    assert "broker" not in installed and "pipeline" not in installed and "protocol" not in installed

    project = tmp_path / "project"
    for package in ("broker", "pipeline"):
        (project / package).mkdir(parents=True)
        (project / package / "__init__.py").write_text('OWNER = "user"\n')
    (project / "tests").mkdir()
    (project / "tests" / "test_mine.py").write_text(textwrap.dedent(USER_TESTS))
    run = subprocess.run(
        env=env,
        args=[str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "5 passed" in run.stdout, run.stdout
    # The console script and `python -m roarmq` come from the wheel too.
    script = venv / "bin" / "roarmq"
    assert script.is_file(), pip.stdout + str(sorted(p.name for p in (venv / "bin").iterdir()))
    for argv in ([str(script)], [str(python), "-m", "roarmq"]):
        version = subprocess.run(
            env=env, args=[*argv, "--version"], capture_output=True, text=True, cwd=project
        )
        assert version.stdout.strip() == "RoarMQ 0.1.0", version.stdout + version.stderr


async def test_running_broker_removes_the_data_dir_it_made_up():
    async with running_broker() as b:
        made_up = Path(b.broker.config.storage.data_dir)
        assert made_up.is_dir() and made_up.name.startswith("roarmq-test-")
    assert not made_up.exists()


def test_broker_thread_removes_the_data_dir_it_made_up(tmp_path):
    with BrokerThread() as b:
        made_up = Path(b.broker.config.storage.data_dir)
        assert made_up.is_dir()
    assert not made_up.exists()
    given = tmp_path / "given"
    with BrokerThread(ephemeral_config(data_dir=str(given))):
        pass
    assert given.is_dir()  # a data dir the caller chose is the caller's
