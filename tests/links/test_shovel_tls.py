"""A shovel whose source is reached over amqps, with the TLS options RabbitMQ's URI query
takes (`cacertfile`, `certfile`, `keyfile`, `verify`, `server_name_indication`): it moves
messages from a broker it verified, and refuses one whose certificate its CA did not sign
(the shovel terminated, the reason in its row)."""

from __future__ import annotations

import urllib.parse

import pika
import pytest
import trustme
from support.waiting import until

from roarmq.broker.config import AmqpTlsConfig
from roarmq.broker.testing import BrokerThread, ephemeral_config

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    client = ca.issue_cert("shovel.example.org")
    paths = {}
    for name, blobs in {
        "ca": [ca.cert_pem],
        "other-ca": [other.cert_pem],
        "server": server.cert_chain_pems,
        "server-key": [server.private_key_pem],
        "client": client.cert_chain_pems,
        "client-key": [client.private_key_pem],
    }.items():
        for blob in blobs:
            blob.write_to_path(str(d / f"{name}.pem"), append=True)
        paths[name] = str(d / f"{name}.pem")
    return paths


@pytest.fixture
def tls_source(tmp_path, pki):
    tls = AmqpTlsConfig(
        enabled=True,
        port=0,
        certfile=pki["server"],
        keyfile=pki["server-key"],
        cafile=pki["ca"],
    )
    cfg = ephemeral_config(data_dir=str(tmp_path / "src"), amqp={"tls": tls, "plain": True})
    with BrokerThread(cfg) as b:
        yield b


def shovel_value(port: int, **query: str) -> dict:
    uri = f"amqps://guest:guest@localhost:{port}/%2F?" + urllib.parse.urlencode(query)
    return {
        "src-uri": uri,
        "src-queue": "outbound",
        "dest-uri": "amqp://",
        "dest-queue": "inbound",
        "reconnect-delay": 1,
    }


def test_a_shovel_moves_messages_from_a_broker_it_verified_over_tls(tls_source, mgmt_broker, pki):
    src = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tls_source.port))
    ch = src.channel()
    ch.queue_declare("outbound", durable=True)
    for i in range(50):
        ch.basic_publish("", "outbound", b"t%d" % i, pika.BasicProperties(delivery_mode=2))
    value = shovel_value(
        tls_source.broker.tls_port,
        cacertfile=pki["ca"],
        certfile=pki["client"],
        keyfile=pki["client-key"],
        verify="verify_peer",
        server_name_indication="localhost",
    )
    status, _ = mgmt_broker.api("PUT", "/api/parameters/shovel/%2F/tls", {"value": value})
    assert status == 201
    dest = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", mgmt_broker.port))

    def moved() -> int:
        return dest.channel().queue_declare("inbound", durable=True).method.message_count

    assert until(lambda: moved() == 50, 20), moved()
    (row,) = mgmt_broker.api("GET", "/api/shovels")[1]
    assert row["state"] == "running"
    # as RabbitMQ's amqp_uri:remove_credentials shows it: no user, password or query
    assert row["src_uri"] == f"amqps://localhost:{tls_source.broker.tls_port}/%2F"
    src.close()
    dest.close()


def test_a_certificate_its_ca_did_not_sign_is_refused(tls_source, mgmt_broker, pki):
    value = shovel_value(
        tls_source.broker.tls_port,
        cacertfile=pki["other-ca"],
        verify="verify_peer",
        server_name_indication="localhost",
    )
    assert mgmt_broker.api("PUT", "/api/parameters/shovel/%2F/tls", {"value": value})[0] == 201

    def terminated():
        rows = mgmt_broker.api("GET", "/api/shovels")[1]
        return rows[0] if rows and rows[0]["state"] == "terminated" else None

    row = until(terminated, 15)
    assert row, mgmt_broker.api("GET", "/api/shovels")
    assert "CERTIFICATE_VERIFY_FAILED" in row["reason"], row
