"""Users stay as the operator left them, and the management API shows each user what its
tags allow (RabbitMQ 3.10.8's answers, checked against a running RabbitMQ)."""

from __future__ import annotations

import dataclasses
import logging
from urllib.parse import quote

import pika
import pika.exceptions
import pytest
from pika.exceptions import ProbableAccessDeniedError, ProbableAuthenticationError

from roarmq.broker.config import PermissionConfig, UserConfig
from roarmq.broker.core.auth import hash_password
from roarmq.broker.core.persistence import DEFINITIONS_FILE
from roarmq.broker.store.definitions import DefinitionStore, PermissionDef, UserDef
from roarmq.broker.testing import BrokerThread, ephemeral_config

pytestmark = pytest.mark.timeout(60)


def config(data_dir, users=None, permissions=None):
    cfg = ephemeral_config(data_dir=str(data_dir))
    if users is not None:
        cfg = dataclasses.replace(cfg, users=users, permissions=permissions or ())
    return cfg


def amqp_login(b: BrokerThread, user: str, password: str) -> bool:
    params = pika.ConnectionParameters(
        "127.0.0.1", b.port, credentials=pika.PlainCredentials(user, password)
    )
    try:
        pika.BlockingConnection(params).close()
    except (ProbableAuthenticationError, ProbableAccessDeniedError):
        return False
    return True


def test_a_password_changed_through_the_api_survives_a_restart(tmp_path):
    with BrokerThread(config(tmp_path), management=True) as b:
        status, _ = b.api("PUT", "/api/users/guest", {"password": "n3w", "tags": "administrator"})
        assert status == 204
    with BrokerThread(config(tmp_path), management=True) as b:
        assert not amqp_login(b, "guest", "guest")
        assert amqp_login(b, "guest", "n3w")
        assert b.api("GET", "/api/overview")[0] == 401
        assert b.api("GET", "/api/overview", auth="guest:n3w")[0] == 200


def test_a_user_deleted_through_the_api_stays_deleted(tmp_path, caplog):
    with BrokerThread(config(tmp_path), management=True) as b:
        assert (
            b.api("PUT", "/api/users/admin", {"password": "pw", "tags": "administrator"})[0] == 201
        )
        assert b.api("DELETE", "/api/users/guest", auth="admin:pw")[0] == 204
    caplog.set_level(logging.INFO)
    with BrokerThread(config(tmp_path), management=True) as b:  # config still names guest
        assert not amqp_login(b, "guest", "guest")
        status, users = b.api("GET", "/api/users", auth="admin:pw")
        assert [u["name"] for u in users] == ["admin"]
    notes = [r for r in caplog.records if "seed only a new data dir" in r.getMessage()]
    assert notes and notes[0].users == "guest"


def test_the_config_seeds_a_new_data_dir_only(tmp_path):
    only_admin = (UserConfig("admin", "pw", ("administrator",)),)
    perms = (PermissionConfig("admin", "/"),)
    with BrokerThread(config(tmp_path / "new", only_admin, perms), management=True) as b:
        assert not amqp_login(b, "guest", "guest")  # a config without guest has no guest
        assert amqp_login(b, "admin", "pw")
    with BrokerThread(config(tmp_path / "old"), management=True) as b:
        assert amqp_login(b, "guest", "guest")
    # Removing guest from the config of a data dir already seeded changes nothing.
    with BrokerThread(config(tmp_path / "old", only_admin, perms), management=True) as b:
        assert amqp_login(b, "guest", "guest")
        assert not amqp_login(b, "admin", "pw")


def add_user(b: BrokerThread, name: str, tags: str, vhosts=("/",)) -> None:
    assert b.api("PUT", f"/api/users/{name}", {"password": "pw", "tags": tags})[0] == 201
    for vhost in vhosts:
        perms = {"configure": ".*", "write": ".*", "read": ".*"}
        path = f"/api/permissions/{vhost.replace('/', '%2F')}/{name}"
        assert b.api("PUT", path, perms)[0] in (201, 204)


ADMIN_PATHS = ["/api/users", "/api/users/guest", "/api/permissions", "/api/definitions"]


def test_management_api_authorization_by_tags(tmp_path):
    with BrokerThread(config(tmp_path), management=True) as b:
        assert b.api("PUT", "/api/vhosts/private")[0] == 201
        add_user(b, "mg", "management")
        add_user(b, "mon", "monitoring", vhosts=())
        add_user(b, "nobody", "")
        conn = pika.BlockingConnection(pika.URLParameters(b.url))  # guest's connection
        ch = conn.channel()
        ch.queue_declare("in-root")
        mg_conn = pika.BlockingConnection(
            pika.ConnectionParameters(
                "127.0.0.1", b.port, credentials=pika.PlainCredentials("mg", "pw")
            )
        )

        for path in ["/api/overview", "/api/queues", *ADMIN_PATHS]:
            assert b.api("GET", path, auth="nobody:pw") == (
                401,
                {"error": "not_authorised", "reason": "Not management user"},
            )
        for user in ("mg", "mon"):
            for path in ADMIN_PATHS:
                assert b.api("GET", path, auth=f"{user}:pw") == (
                    401,
                    {"error": "not_authorised", "reason": "Not administrator user"},
                ), (user, path)
            assert b.api("PUT", "/api/vhosts/nope", auth=f"{user}:pw")[0] == 401
            assert b.api("DELETE", "/api/vhosts/private", auth=f"{user}:pw")[0] == 401
        assert b.api("GET", "/api/overview", auth="mg:wrong") == (
            401,
            {"error": "not_authorized", "reason": "Login failed"},
        )
        assert b.api("GET", "/api/whoami", auth="mg:pw") == (
            200,
            {"name": "mg", "tags": ["management"]},
        )

        # A management user sees its own vhosts' objects and its own connections.
        vhosts = [v["name"] for v in b.api("GET", "/api/vhosts", auth="mg:pw")[1]]
        assert vhosts == ["/"]
        assert "in-root" in [q["name"] for q in b.api("GET", "/api/queues", auth="mg:pw")[1]]
        refused = {
            "error": "not_authorised",
            "reason": "User not authorised to access virtual host",
        }
        assert b.api("GET", "/api/queues/private", auth="mg:pw") == (401, refused)
        assert b.api("GET", "/api/queues/nope", auth="mg:pw")[0] == 404
        assert b.api("GET", "/api/vhost-limits/private", auth="mg:pw") == (401, refused)
        users = {c["user"] for c in b.api("GET", "/api/connections", auth="mg:pw")[1]}
        assert users == {"mg"}
        # Monitoring sees every connection; the administrator everything.
        users = {c["user"] for c in b.api("GET", "/api/connections", auth="mon:pw")[1]}
        assert users == {"mg", "guest"}
        vhosts = {v["name"] for v in b.api("GET", "/api/vhosts", auth="mon:pw")[1]}
        assert vhosts == {"/", "private"}  # monitoring lists every vhost, as RabbitMQ
        assert b.api("GET", "/api/queues/private", auth="mon:pw") == (401, refused)
        assert b.api("GET", "/api/nodes", auth="mon:pw")[0] == 200
        assert b.api("GET", "/api/nodes", auth="mg:pw") == (
            401,
            {"error": "not_authorised", "reason": "Not monitor user"},
        )
        assert b.api("GET", "/api/users")[0] == 200
        assert "password_hash" in b.api("GET", "/api/users")[1][0]
        mg_conn.close()
        conn.close()


def test_each_failed_login_is_one_line_with_the_peer_and_no_secret(tmp_path, caplog):
    """A password guesser leaves one warning per attempt, with the peer address and the user
    name (for fail2ban and people), and never the password or the stored hash."""
    caplog.set_level(logging.INFO)
    with BrokerThread(config(tmp_path), management=True) as b:
        for user in ("guest", "guest", "no-such-user"):
            assert not amqp_login(b, user, "s3cret-guess")
        assert b.api("GET", "/api/overview", auth="guest:s3cret-guess")[0] == 401
        assert b.api("GET", "/api/overview", auth="nobody:s3cret-guess")[0] == 401
        assert b.api("GET", "/api/overview")[0] == 200  # right password: no line
        stored_hash = b.broker.auth.users["guest"].password_hash
    amqp = [r for r in caplog.records if r.getMessage() == "login refused"]
    assert [r.levelno for r in amqp] == [logging.WARNING] * 3
    assert all(r.conn.startswith("127.0.0.1:") for r in amqp)
    assert [r.reason for r in amqp] == [
        "user 'guest' - invalid credentials",
        "user 'guest' - invalid credentials",
        "user 'no-such-user' - invalid credentials",
    ]
    http = [r for r in caplog.records if r.getMessage() == "HTTP login refused"]
    assert [(r.peer, r.user) for r in http] == [("127.0.0.1", "guest"), ("127.0.0.1", "nobody")]
    everything = " ".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert "s3cret-guess" not in everything
    assert stored_hash not in everything


def test_only_its_user_or_an_administrator_closes_a_connection(tmp_path):
    with BrokerThread(config(tmp_path), management=True) as b:
        add_user(b, "mg", "management")
        add_user(b, "mon", "monitoring")
        conn = pika.BlockingConnection(pika.URLParameters(b.url))  # guest's
        mine = pika.BlockingConnection(
            pika.ConnectionParameters(
                "127.0.0.1", b.port, credentials=pika.PlainCredentials("mg", "pw")
            )
        )
        names = {c["user"]: c["name"] for c in b.api("GET", "/api/connections")[1]}
        path = "/api/connections/{}".format
        refused = (
            401,
            {"error": "not_authorised", "reason": "User not authorised to access object"},
        )
        for user in ("mg", "mon"):  # monitoring sees every connection but closes none
            assert b.api("DELETE", path(quote(names["guest"], safe="")), auth=f"{user}:pw") == (
                refused
            )
        assert b.api("DELETE", path(quote(names["mg"], safe="")), auth="mg:pw")[0] == 204
        assert b.api("DELETE", path(quote(names["guest"], safe="")))[0] == 204
        assert b.api("DELETE", path("nope"))[0] == 404
        for c in (conn, mine):
            try:
                c.close()
            except pika.exceptions.AMQPError:
                pass


def test_a_first_start_that_died_before_its_seed_seeds_again(tmp_path):
    DefinitionStore(tmp_path / DEFINITIONS_FILE).close()  # the schema, but no seed committed
    with BrokerThread(config(tmp_path)) as b:
        assert amqp_login(b, "guest", "guest")


def test_a_store_seeded_before_the_seed_mark_is_not_seeded_again(tmp_path):
    store = DefinitionStore(tmp_path / DEFINITIONS_FILE)  # as older RoarMQs left it: no mark
    store.put_vhost("/")
    store.put_user(UserDef("admin", hash_password("pw"), ("administrator",), False))
    store.put_permission(PermissionDef("admin", "/", ".*", ".*", ".*"))
    store.close()
    for _ in range(2):
        with BrokerThread(config(tmp_path)) as b:  # the config names guest only
            assert not amqp_login(b, "guest", "guest")
            assert amqp_login(b, "admin", "pw")
