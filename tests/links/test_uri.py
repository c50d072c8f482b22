"""AMQP URIs read as RabbitMQ's Erlang client reads them (broker/links/uri.py): what each
part means, the defaults, the local broker, and the refusals with RabbitMQ's reasons."""

from __future__ import annotations

import pytest

from roarmq.broker.core.erlang import format_term
from roarmq.broker.links.uri import AmqpUri, UriError, parse_uri, redact


def test_every_part_and_the_defaults():
    uri = parse_uri("amqp://u%40x:p%3Aw@broker.example:5673/prod%2Fa?heartbeat=5")
    assert (uri.host, uri.port, uri.user, uri.password, uri.vhost) == (
        "broker.example",
        5673,
        "u@x",
        "p:w",
        "prod/a",
    )
    assert uri.heartbeat == 5 and uri.tls is None and not uri.local
    plain = parse_uri("AMQP://h")
    assert (plain.scheme, plain.port, plain.user, plain.password) == (
        "amqp",
        5672,
        "guest",
        "guest",
    )
    assert plain.vhost == "/" and plain.heartbeat == 10 and plain.connection_timeout_ms == 60_000
    assert plain.mechanisms == ("PLAIN", "AMQPLAIN")
    assert parse_uri("amqp://h/").vhost == ""  # an empty path is the empty vhost
    assert parse_uri("amqps://h").port == 5671
    assert parse_uri("amqp://[::1]:5680/v").host == "::1"


def test_no_host_and_no_port_is_the_local_broker():
    for text in ("amqp://", "amqp:///v", "amqp://u:p@/v"):
        uri = parse_uri(text)
        assert uri.local and uri.host is None
    assert parse_uri("amqp:///v").vhost == "v" and parse_uri("amqp://").vhost == "/"


def test_query_parameters():
    uri = parse_uri(
        "amqps://h?heartbeat=0&frame_max=8192&channel_max=7&connection_timeout=2500"
        "&auth_mechanism=external&auth_mechanism=amqp_auth_mechanisms:plain"
        "&cacertfile=/c/ca.pem&certfile=/c/cert.pem&keyfile=/c/key.pem&verify=verify_peer"
        "&fail_if_no_peer_cert=true&server_name_indication=other&depth=3&password=kp"
        "&unknown=ignored"
    )
    assert (uri.heartbeat, uri.frame_max, uri.channel_max, uri.connection_timeout_ms) == (
        0,
        8192,
        7,
        2500,
    )
    assert uri.mechanisms == ("EXTERNAL", "PLAIN")
    assert uri.password == "guest"  # `password` in the query is the key file's
    tls = uri.tls
    assert tls is not None
    assert (tls.cacertfile, tls.certfile, tls.keyfile, tls.password) == (
        "/c/ca.pem",
        "/c/cert.pem",
        "/c/key.pem",
        "kp",
    )
    assert (tls.verify, tls.fail_if_no_peer_cert, tls.server_name_indication, tls.depth) == (
        "verify_peer",
        True,
        "other",
        3,
    )
    # over plain amqp the TLS keys mean nothing
    assert parse_uri("amqp://h?cacertfile=/x").tls is None


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("http://h", '{unexpected_uri_scheme,"http"}'),
        ("amqp://h:0", "{port_out_of_range,0}"),
        ("amqp://h:70000", "{port_out_of_range,70000}"),
        ("amqp://:5672", "port_requires_host"),
        ("amqp://h/a/b", '{invalid_vhost,"a/b"}'),
        ("amqp://h/%2", "{unterminated_entity,['%',50]}"),
        ("amqp://h/%zz", "{invalid_entitiy,['%',122,122]}"),
        ("amqp://h?auth_mechanism=crdemo2", '{unknown_mechanism,"crdemo2"}'),
        (
            "amqp://h?heartbeat=x",
            '{invalid_amqp_params_parameter,heartbeat,"x",[{"heartbeat","x"}],'
            '{not_an_integer,"x"}}',
        ),
        (
            "amqp://h?host=other",
            '{invalid_amqp_params_parameter,host,"other",[{"host","other"}],'
            '{parameter_unconfigurable_in_query,host,"other"}}',
        ),
        (
            "amqps://h?verify=maybe",
            '{invalid_ssl_parameter,verify,"maybe",[{"verify","maybe"}],'
            '{invalid_atom_parameter,"maybe"}}',
        ),
        (
            "amqps://h?fail_if_no_peer_cert=yes",
            '{invalid_ssl_parameter,fail_if_no_peer_cert,"yes",[{"fail_if_no_peer_cert","yes"}],'
            '{require_boolean,"yes"}}',
        ),
    ],
)
def test_refusals_carry_rabbitmqs_reason(text, reason):
    with pytest.raises(UriError) as refused:
        parse_uri(text)
    assert format_term(refused.value.term) == reason
    assert str(refused.value) == "{" + reason + "," + format_term(text) + "}"


def test_redacted_drops_credentials_and_query():
    assert redact("amqp://u:secret@h:5673/v?heartbeat=5") == "amqp://h:5673/v"
    assert redact("amqps://u:secret@h") == "amqps://h"
    assert redact("not a uri u:secret@x") == "not a uri u:secret@x"
    assert redact("bad://u:secret@") == "bad://"
    uri = parse_uri("amqp://u:secret@h/v")
    assert "secret" not in repr(uri) and uri.redacted == "amqp://h/v"
    assert isinstance(uri, AmqpUri)
