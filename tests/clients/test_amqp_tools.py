"""librabbitmq's command-line tools (Debian's amqp-tools), unmodified.

`make test` installs amqp-tools through apt when it can (as root with apt-get);
without them this module says why it did not run.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
from machine import missing
from support.waiting import until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def amqp_tools() -> None:
    if shutil.which("amqp-publish") is None:
        missing(
            "amqp-tools is not installed (Debian package amqp-tools; `make test` installs it "
            "with apt-get when run as root)",
            "ROARMQ_EXPECT_PACKAGES",
        )


def run(*args: str, input: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, input=input, capture_output=True, timeout=20, check=True)


def test_declare_publish_get_consume(thread_broker):
    url = thread_broker.url
    out = run("amqp-declare-queue", "--url", url, "-q", "tools-q").stdout.decode().strip()
    assert out == "tools-q"
    for i in range(3):
        run("amqp-publish", "--url", url, "-r", "tools-q", "-b", f"hello {i}")
    got = run("amqp-get", "--url", url, "-q", "tools-q").stdout
    assert got == b"hello 0"
    consumed = run("amqp-consume", "--url", url, "-q", "tools-q", "-c", "2", "cat").stdout
    assert consumed == b"hello 1hello 2"


def test_publish_through_topic_exchange(thread_broker):
    url = thread_broker.url
    run("amqp-declare-queue", "--url", url, "-q", "tools-topic")
    subprocess.run(
        ["amqp-publish", "--url", url, "-e", "amq.topic", "-r", "a.b", "-b", "x"],
        check=True,
        timeout=20,
    )
    # Bind with amqp-consume's -e/-r options and check delivery of a later publish.
    proc = subprocess.Popen(
        ["amqp-consume", "--url", url, "-e", "amq.topic", "-r", "logs.#", "-c", "1", "cat"],
        stdout=subprocess.PIPE,
    )
    try:

        def bound() -> int:  # amq.topic's bindings, read in the broker's thread
            return len(thread_broker.broker.vhosts["/"].exchanges["amq.topic"].index)

        until(lambda: thread_broker.call(bound), 10, 0.05)
        run("amqp-publish", "--url", url, "-e", "amq.topic", "-r", "logs.app.error", "-b", "boom")
        out, _ = proc.communicate(timeout=10)
        assert out == b"boom"
    finally:
        proc.kill()
