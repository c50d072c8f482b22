"""Commands that cannot hurt by accident `roarmq ctl` run as an operator
runs it (a subprocess, credentials from the environment) against a real broker, and the
management API refusing to leave the broker without an administrator."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pika
import pytest

from roarmq.broker.testing import BrokerThread, ephemeral_config

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def b(tmp_path_factory):
    data = tmp_path_factory.mktemp("safety") / "d"
    # Both loopbacks, as the shipped config.toml: the listeners were listed once per address
    # per address (four rows for two).
    config = ephemeral_config(data_dir=str(data), amqp={"bind": ("127.0.0.1", "::1")})
    with BrokerThread(config, management=True) as broker:
        yield broker


def ctl(b, *args: str, user: str = "guest", password: str = "guest") -> tuple[int, str, str]:
    """`python -m roarmq ctl ...` with the URL and credentials in the environment only."""
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


def tags(b, name: str, auth: str = "guest:guest") -> list[str]:
    return b.api("GET", f"/api/users/{name}", auth=auth)[1]["tags"]


def test_environment_gives_url_and_credentials(b):
    code, out, err = ctl(b, "list_users")
    assert code == 0, err
    assert "guest" in out
    b.api("PUT", "/api/users/watcher", {"password": "w", "tags": "monitoring"})
    try:
        code, _, err = ctl(b, "add_vhost", "nope", user="watcher", password="w")
        assert code == 1
        assert "user 'watcher' is not allowed to do this: Not administrator user" in err
        assert "ROARMQ_CTL_USER" in err
    finally:
        b.api("DELETE", "/api/users/watcher")


def test_add_user_refuses_an_existing_user(b):
    code, out, err = ctl(b, "add_user", "guest", "other")
    assert code == 70  # rabbitmqctl's EX_SOFTWARE
    assert err.strip() == 'Error: User "guest" already exists'
    assert tags(b, "guest") == ["administrator"]  # not demoted, password unchanged
    assert b.api("GET", "/api/whoami", auth="guest:guest")[0] == 200
    assert ctl(b, "add_user", "alice", "a1")[0] == 0
    try:
        assert ctl(b, "set_user_tags", "alice", "monitoring")[0] == 0
        code, _, err = ctl(b, "add_user", "alice", "a2")
        assert code == 70 and 'User "alice" already exists' in err
        assert tags(b, "alice") == ["monitoring"]
        assert b.api("GET", "/api/whoami", auth="alice:a1")[0] == 200
        # what add_user must not do, change_password and set_user_tags do
        assert ctl(b, "change_password", "alice", "a2")[0] == 0
        assert b.api("GET", "/api/whoami", auth="alice:a2")[1]["tags"] == ["monitoring"]
    finally:
        b.api("DELETE", "/api/users/alice")


def test_missing_users_in_rabbitmqctls_words(b):
    for command in (
        ["change_password", "bob", "x"],
        ["set_user_tags", "bob", "management"],
        ["delete_user", "bob"],
    ):
        code, _, err = ctl(b, *command)
        assert code == 67, command  # EX_NOUSER
        assert err.strip() == 'Error: User "bob" does not exist'
    assert b.api("GET", "/api/users/bob")[0] == 404  # set_user_tags did not create it


def test_the_last_administrator_stays(b):
    # demoting the only administrator: the API refuses, so ctl and the UI do
    code, _, err = ctl(b, "set_user_tags", "guest", "management")
    assert code == 1
    assert "would leave no administrator" in err and "'guest'" in err
    status, body = b.api("PUT", "/api/users/guest", {"password": "guest", "tags": ""})
    assert status == 400 and "would leave no administrator" in body["reason"]
    assert tags(b, "guest") == ["administrator"]
    # an import that would demote it neither
    defs = {"users": [{"name": "guest", "password": "guest", "tags": "monitoring"}]}
    status, body = b.api("POST", "/api/definitions", defs)
    assert status == 400 and "would leave no administrator" in body["reason"]
    assert tags(b, "guest") == ["administrator"]


def test_nobody_deletes_themselves(b):
    status, body = b.api("DELETE", "/api/users/guest")
    assert status == 400 and "is the user making this request" in body["reason"]
    code, _, err = ctl(b, "delete_user", "guest")
    assert code == 1 and "is the user making this request" in err
    # a second administrator may demote or delete the first, and then not itself
    b.api("PUT", "/api/users/root", {"password": "r", "tags": "administrator"})
    try:
        assert ctl(b, "set_user_tags", "guest", "management")[0] == 0
        assert tags(b, "guest", auth="root:r") == ["management"]
        code, _, err = ctl(b, "set_user_tags", "root", user="root", password="r")
        assert code == 1 and "would leave no administrator" in err
        status, _ = b.api("DELETE", "/api/users/root", auth="root:r")
        assert status == 400
    finally:
        b.api(
            "PUT", "/api/users/guest", {"password": "guest", "tags": "administrator"}, auth="root:r"
        )
        assert b.api("DELETE", "/api/users/root")[0] == 204  # guest deletes root: allowed


def test_errors_in_words(b):
    code, _, err = ctl(b, "route", "x", "key")
    assert code == 1 and err.strip() == "Error: no exchange 'x' in vhost '/'"
    code, _, err = ctl(b, "route", "-p", "shop", "x", "key")
    assert err.strip() == "Error: no vhost 'shop'"
    code, _, err = ctl(b, "delete_queue", "ghost")
    assert err.strip() == "Error: no queue 'ghost' in vhost '/'"
    code, _, err = ctl(b, "clear_policy", "gone")
    assert err.strip() == "Error: no policy 'gone' in vhost '/'"
    code, _, err = ctl(b, "close_connection", "1.2.3.4:5", "bye")
    assert "no connection '1.2.3.4:5'" in err
    for text in (err,):
        assert not re.search(r"\b404\b", text)


def test_status_in_human_units_and_listeners_once(b):
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    try:
        code, out, err = ctl(b, "status")
    finally:
        conn.close()
    assert code == 0, err
    lines = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in out.splitlines())
    assert re.fullmatch(r"\d+\.\d (MiB|GiB) / \d+\.\d (MiB|GiB|TiB)", lines["memory used / limit"])
    assert re.fullmatch(r"\d+\.\d \w?iB / \d+\.\d \w?iB", lines["disk free / limit"])
    amqp = f"amqp {b.port} ({', '.join(b.broker.bound)})"
    assert lines["listeners"] == f"{amqp}, http {b.broker.mgmt_port} (127.0.0.1)"
    rows = b.api("GET", "/api/overview")[1]["listeners"]
    keys = [(r["protocol"], r["ip_address"], r["port"]) for r in rows]
    assert len(keys) == len(set(keys)) == len(b.broker.bound) + 1
    assert {r["ip_address"] for r in rows if r["protocol"] == "amqp"} == set(b.broker.bound)
