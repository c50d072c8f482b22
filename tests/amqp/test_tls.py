"""TLS: the amqps listener, SASL EXTERNAL, HTTPS management, and what /api/connections
reports, through aio-pika, pika and kombu. Certificates are made per run with trustme (a CA,
a server certificate, client certificates, and a second CA nobody here trusts)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import socket
import ssl
import subprocess
import time
import tomllib
import urllib.error
import urllib.request
from base64 import b64encode
from dataclasses import dataclass
from pathlib import Path

import aio_pika
import kombu
import pika
import pytest
import trustme
from cryptography import x509
from support.rawclient import RawClient

from roarmq.broker.__main__ import check_config, read_connection_start
from roarmq.broker.amqp import tls
from roarmq.broker.config import (
    AmqpTlsConfig,
    ConfigError,
    PermissionConfig,
    TlsConfig,
    UserConfig,
    parse_config,
)
from roarmq.broker.ops.logs import NOTICE
from roarmq.broker.testing import BrokerThread, ephemeral_config, running_broker
from roarmq.protocol import spec
from roarmq.protocol.frames import PROTOCOL_HEADER

pytestmark = pytest.mark.timeout(60)

CLIENT_CN = "tls-client"


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path  # CN=tls-client, signed by our CA
    client_key: Path
    stranger_cert: Path  # CN=stranger (no such user), signed by our CA
    stranger_key: Path
    other_ca: Path  # a CA the broker does not trust
    other_client_cert: Path  # CN=tls-client, signed by the other CA
    other_client_key: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca, other = trustme.CA(), trustme.CA()

    def write(name: str, *blobs: trustme.Blob) -> Path:
        for blob in blobs:
            blob.write_to_path(str(d / name), append=True)
        return d / name

    def issue(authority: trustme.CA, name: str, cn: str) -> tuple[Path, Path]:
        cert = authority.issue_cert(
            f"{cn}.example.org", common_name=cn, organization_name="RoarMQ tests"
        )
        return write(f"{name}.pem", *cert.cert_chain_pems), write(
            f"{name}.key", cert.private_key_pem
        )

    server = ca.issue_cert("127.0.0.1", "localhost")
    client_cert, client_key = issue(ca, "client", CLIENT_CN)
    stranger_cert, stranger_key = issue(ca, "stranger", "stranger")
    other_client_cert, other_client_key = issue(other, "other-client", CLIENT_CN)
    return Pki(
        ca=write("ca.pem", ca.cert_pem),
        server_cert=write("server.pem", *server.cert_chain_pems),
        server_key=write("server.key", server.private_key_pem),
        client_cert=client_cert,
        client_key=client_key,
        stranger_cert=stranger_cert,
        stranger_key=stranger_key,
        other_ca=write("other-ca.pem", other.cert_pem),
        other_client_cert=other_client_cert,
        other_client_key=other_client_key,
    )


def tls_settings(pki: Pki, **values) -> AmqpTlsConfig:
    base = dict(
        enabled=True,
        port=0,
        certfile=str(pki.server_cert),
        keyfile=str(pki.server_key),
        cafile=str(pki.ca),
    )
    return AmqpTlsConfig(**{**base, **values})


def broker_config(tmp_path: Path, pki: Pki, *, plain: bool = True, management_tls=None, **tls_):
    """Loopback broker with [amqp.tls] on a free port, and a user named like the client
    certificate's CN (for EXTERNAL)."""
    cfg = ephemeral_config(
        data_dir=str(tmp_path / "data"), amqp={"tls": tls_settings(pki, **tls_), "plain": plain}
    )
    if management_tls is not None:
        cfg = dataclasses.replace(
            cfg, management=dataclasses.replace(cfg.management, tls=management_tls)
        )
    return dataclasses.replace(
        cfg,
        users=cfg.users + (UserConfig(CLIENT_CN, "not-used-by-external", ()),),
        permissions=cfg.permissions + (PermissionConfig(CLIENT_CN, "/"),),
    )


#: What a client sees when the broker refuses its handshake, or it refuses the broker's.
REFUSED = (ConnectionError, EOFError, ssl.SSLError, aio_pika.exceptions.AMQPError)

REQUIRE_CERT = {"verify": "verify_peer", "fail_if_no_peer_cert": True}


def client_context(pki: Pki, *, cert: str | None = "client", trust: Path | None = None):
    ctx = ssl.create_default_context(cafile=str(trust or pki.ca))
    if cert is not None:
        ctx.load_cert_chain(getattr(pki, f"{cert}_cert"), getattr(pki, f"{cert}_key"))
    return ctx


def amqps(port: int, query: str = "") -> str:
    return f"amqps://guest:guest@127.0.0.1:{port}/{query}"


async def roundtrip_aiopika(conn: aio_pika.abc.AbstractConnection, body: bytes) -> None:
    """Publish one message and consume it back over `conn`."""
    ch = await conn.channel()
    q = await ch.declare_queue("", exclusive=True)
    await ch.default_exchange.publish(aio_pika.Message(body), routing_key=q.name)
    async with q.iterator() as it:
        async for message in it:
            await message.ack()
            assert message.body == body
            break


def roundtrip_pika(conn: pika.BlockingConnection, body: bytes) -> None:
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, body)
    for _method, _props, got in ch.consume(q, auto_ack=True, inactivity_timeout=5):
        assert got == body
        break
    ch.cancel()


def pika_params(pki: Pki, port: int, *, cert: str | None = "client", credentials=None):
    return pika.ConnectionParameters(
        "127.0.0.1",
        port,
        credentials=credentials or pika.PlainCredentials("guest", "guest"),
        ssl_options=pika.SSLOptions(client_context(pki, cert=cert), "127.0.0.1"),
        connection_attempts=1,
    )


def kombu_ssl(pki: Pki, cert: str | None = "client") -> dict:
    opts = {"ca_certs": str(pki.ca), "cert_reqs": ssl.CERT_REQUIRED, "server_hostname": "127.0.0.1"}
    if cert is not None:
        opts["certfile"] = str(getattr(pki, f"{cert}_cert"))
        opts["keyfile"] = str(getattr(pki, f"{cert}_key"))
    return opts


def start_mechanisms(sock: socket.socket) -> list[str]:
    """Send the protocol header and read connection.start's mechanisms."""
    mechanisms = read_connection_start(sock).mechanisms
    return (mechanisms.decode() if isinstance(mechanisms, bytes) else mechanisms).split()


def tls_socket(port: int, ctx: ssl.SSLContext) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    return ctx.wrap_socket(raw, server_hostname="127.0.0.1")


def handshake_failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == "TLS handshake failed"]


# -- connecting -----------------------------------------------------------------------------


async def test_aiopika_without_client_certificate(tmp_path, pki, caplog):
    caplog.set_level(NOTICE)
    async with running_broker(broker_config(tmp_path, pki)) as b:
        conn = await aio_pika.connect(amqps(b.tls_port), ssl_context=client_context(pki, cert=None))
        try:
            await roundtrip_aiopika(conn, b"over tls")
        finally:
            await conn.close()
        plain = await aio_pika.connect(b.url)  # the plain listener still works beside it
        try:
            await roundtrip_aiopika(plain, b"in the clear")
        finally:
            await plain.close()
        start = [r.getMessage() for r in caplog.records if r.getMessage().startswith("RoarMQ ")]
        assert start == [
            f"RoarMQ 0.1.0: AMQP on 127.0.0.1 port {b.port}, amqps on 127.0.0.1:{b.tls_port}, "
            f"streams on 127.0.0.1:{b.stream_port}"
        ]


async def test_aiopika_with_required_client_certificate(tmp_path, pki):
    async with running_broker(broker_config(tmp_path, pki, **REQUIRE_CERT)) as b:
        conn = await aio_pika.connect(amqps(b.tls_port), ssl_context=client_context(pki))
        try:
            await roundtrip_aiopika(conn, b"mutual tls")
        finally:
            await conn.close()


def test_pika_with_client_certificate(tmp_path, pki):
    with BrokerThread(broker_config(tmp_path, pki, **REQUIRE_CERT)) as b:
        conn = pika.BlockingConnection(pika_params(pki, b.tls_port))
        try:
            roundtrip_pika(conn, b"pika over tls")
        finally:
            conn.close()


def test_kombu_with_client_certificate(tmp_path, pki):
    with BrokerThread(broker_config(tmp_path, pki, **REQUIRE_CERT)) as b:
        with kombu.Connection(
            f"pyamqp://guest:guest@127.0.0.1:{b.tls_port}//", ssl=kombu_ssl(pki)
        ) as conn:
            q = conn.SimpleQueue("kombu-tls")
            q.put({"n": 1})
            message = q.get(timeout=5)
            assert message.payload == {"n": 1}
            message.ack()
            q.close()


def test_tls_only(tmp_path, pki, caplog):
    caplog.set_level(NOTICE)
    cfg = broker_config(tmp_path, pki, plain=False)
    with BrokerThread(cfg) as b:
        assert b.broker.ports == []
        conn = pika.BlockingConnection(pika_params(pki, b.tls_port, cert=None))
        try:
            roundtrip_pika(conn, b"tls only")
        finally:
            conn.close()
        start = [r.getMessage() for r in caplog.records if r.getMessage().startswith("RoarMQ ")]
        # (the stream protocol's listeners are its own, as RabbitMQ's stream plugin's are)
        assert start == [
            f"RoarMQ 0.1.0: amqps on 127.0.0.1:{b.tls_port}, streams on 127.0.0.1:{b.stream_port}"
        ]
    parsed = parse_config(
        {
            "amqp": {
                "plain": False,
                "tls": {
                    "enabled": True,
                    "certfile": str(pki.server_cert),
                    "keyfile": str(pki.server_key),
                },
            }
        }
    )
    assert not parsed.amqp.plain and parsed.amqp.tls.port == 5671


# -- refusals -------------------------------------------------------------------------------


async def test_refusals_are_logged_and_harm_no_one_else(tmp_path, pki, caplog):
    """No client certificate when one is required, a certificate from a CA the broker does
    not trust, a client that does not trust the broker's CA, plain AMQP sent to the TLS
    port: each is refused and logged with the peer, while an open connection works on."""
    caplog.set_level(logging.INFO)
    async with running_broker(broker_config(tmp_path, pki, **REQUIRE_CERT)) as b:
        bystander = await aio_pika.connect(amqps(b.tls_port), ssl_context=client_context(pki))
        for ctx in (
            client_context(pki, cert=None),  # no client certificate
            client_context(pki, cert="other_client"),  # one from a CA the broker does not trust
            client_context(pki, trust=pki.other_ca),  # the client does not trust the broker
        ):
            with pytest.raises(REFUSED):
                await aio_pika.connect(amqps(b.tls_port), ssl_context=ctx, timeout=5)
        reader, writer = await asyncio.open_connection("127.0.0.1", b.tls_port)
        writer.write(PROTOCOL_HEADER)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, no answer
        writer.close()
        await roundtrip_aiopika(bystander, b"still here")
        await bystander.close()
        await asyncio.sleep(0.1)
        reasons = [r.reason for r in handshake_failures(caplog)]
        assert all(r.levelname == "WARNING" for r in handshake_failures(caplog))
        assert all(r.conn.startswith("127.0.0.1:") for r in handshake_failures(caplog))
        assert "peer did not return a certificate" in reasons
        assert any(r.startswith("certificate verify failed") for r in reasons)
        assert "wrong version number" in reasons  # the AMQP header is no ClientHello
        assert len(reasons) == 4, reasons
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR and "roarmq" in r.name]


def test_refusals_on_uvloop(tmp_path, pki, caplog):
    """The same refusals on the broker's production loop (BrokerThread runs uvloop)."""
    caplog.set_level(logging.INFO)
    with BrokerThread(broker_config(tmp_path, pki, **REQUIRE_CERT)) as b:
        bystander = pika.BlockingConnection(pika_params(pki, b.tls_port))
        for ctx in (
            client_context(pki, cert=None),
            client_context(pki, cert="other_client"),
            client_context(pki, trust=pki.other_ca),
        ):
            with pytest.raises((ssl.SSLError, ConnectionError)):
                with tls_socket(b.tls_port, ctx) as sock:
                    start_mechanisms(sock)  # TLS 1.3: a refused client learns it on reading
        with socket.create_connection(("127.0.0.1", b.tls_port), timeout=5) as sock:
            sock.sendall(PROTOCOL_HEADER)
            assert sock.recv(100) == b""
        roundtrip_pika(bystander, b"still here")
        bystander.close()
        time.sleep(0.1)
    reasons = [r.reason for r in handshake_failures(caplog)]
    assert len(reasons) == 4, reasons
    assert "peer did not return a certificate" in reasons
    assert any(r.startswith("certificate verify failed") for r in reasons)
    assert "wrong version number" in reasons


async def test_optional_client_certificate_is_still_verified(tmp_path, pki):
    """verify_peer without fail_if_no_peer_cert: no certificate is fine, a bad one is not."""
    async with running_broker(broker_config(tmp_path, pki, verify="verify_peer")) as b:
        conn = await aio_pika.connect(amqps(b.tls_port), ssl_context=client_context(pki, cert=None))
        await roundtrip_aiopika(conn, b"no cert needed")
        await conn.close()
        with pytest.raises(REFUSED):
            bad = client_context(pki, cert="other_client")
            await (await aio_pika.connect(amqps(b.tls_port), ssl_context=bad, timeout=5)).close()


async def test_handshake_timeout(tmp_path, pki, caplog, monkeypatch):
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(tls, "HANDSHAKE_TIMEOUT", 0.3)
    async with running_broker(broker_config(tmp_path, pki)) as b:
        reader, writer = await asyncio.open_connection("127.0.0.1", b.tls_port)
        started = time.monotonic()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # we said nothing; it hung up
        assert time.monotonic() - started < 3
        writer.close()
        await asyncio.sleep(0.05)
        assert any("handshake" in r.reason for r in handshake_failures(caplog))


async def test_handshakes_in_progress_are_bounded(tmp_path, pki, caplog, monkeypatch):
    """Sockets that never finish their handshake cannot pile up: past MAX_HANDSHAKES new ones
    are closed at once, and a client arriving after the stalled ones time out gets in."""
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(tls, "MAX_HANDSHAKES", 3)
    monkeypatch.setattr(tls, "HANDSHAKE_TIMEOUT", 0.5)
    async with running_broker(broker_config(tmp_path, pki)) as b:
        stalled = [await asyncio.open_connection("127.0.0.1", b.tls_port) for _ in range(3)]
        await asyncio.sleep(0.1)
        reader, writer = await asyncio.open_connection("127.0.0.1", b.tls_port)
        assert await asyncio.wait_for(reader.read(), 0.4) == b""  # closed before the timeout
        writer.close()
        assert b.broker.tls.refused == 1
        assert any("at their bound" in r.getMessage() for r in caplog.records)
        for r, w in stalled:
            assert await asyncio.wait_for(r.read(), 5) == b""
            w.close()
        conn = await aio_pika.connect(amqps(b.tls_port), ssl_context=client_context(pki))
        await roundtrip_aiopika(conn, b"after the stall")
        await conn.close()


# -- SASL EXTERNAL --------------------------------------------------------------------------

EXTERNAL_ON = {**REQUIRE_CERT, "external_auth": True}


async def test_external_aiopika(tmp_path, pki):
    cfg = broker_config(tmp_path, pki, **EXTERNAL_ON)
    async with running_broker(cfg) as b:
        url = f"amqps://127.0.0.1:{b.tls_port}/?auth=EXTERNAL"
        conn = await aio_pika.connect(url, ssl_context=client_context(pki))
        try:
            await roundtrip_aiopika(conn, b"who am i")
            (c,) = b.broker.connections
            assert (c.user.name, c.auth_mechanism) == (CLIENT_CN, "EXTERNAL")
        finally:
            await conn.close()


def test_external_pika_and_kombu(tmp_path, pki):
    with BrokerThread(broker_config(tmp_path, pki, **EXTERNAL_ON)) as b:
        creds = pika.credentials.ExternalCredentials()
        conn = pika.BlockingConnection(pika_params(pki, b.tls_port, credentials=creds))
        try:
            roundtrip_pika(conn, b"pika external")
            users = b.call(lambda: [(c.user.name, c.auth_mechanism) for c in b.broker.connections])
            assert users == [(CLIENT_CN, "EXTERNAL")]
        finally:
            conn.close()
        with kombu.Connection(
            f"pyamqp://127.0.0.1:{b.tls_port}//", ssl=kombu_ssl(pki), login_method="EXTERNAL"
        ) as kc:
            q = kc.SimpleQueue("kombu-external")
            q.put("hello")
            message = q.get(timeout=5)
            assert message.payload == "hello"
            message.ack()
            q.close()
        # A password login over the same TLS listener still works when the client asks for it.
        conn = pika.BlockingConnection(pika_params(pki, b.tls_port))
        conn.close()


def test_external_refused_for_unknown_user(tmp_path, pki):
    with BrokerThread(broker_config(tmp_path, pki, **EXTERNAL_ON)) as b:
        creds = pika.credentials.ExternalCredentials()
        with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
            pika.BlockingConnection(
                pika_params(pki, b.tls_port, cert="stranger", credentials=creds)
            )
        assert "403" in str(info.value) and "EXTERNAL" in str(info.value)


def test_external_offered_only_with_a_verified_certificate(tmp_path, pki):
    cfg = broker_config(tmp_path, pki, verify="verify_peer", external_auth=True)
    with BrokerThread(cfg) as b:
        with socket.create_connection(("127.0.0.1", b.port), timeout=5) as plain:
            assert start_mechanisms(plain) == ["PLAIN", "AMQPLAIN"]
        with tls_socket(b.tls_port, client_context(pki, cert=None)) as no_cert:
            assert start_mechanisms(no_cert) == ["PLAIN", "AMQPLAIN"]
        with tls_socket(b.tls_port, client_context(pki)) as with_cert:
            assert start_mechanisms(with_cert) == ["PLAIN", "AMQPLAIN", "EXTERNAL"]
    # Off unless enabled: a verified certificate alone does not offer it.
    with BrokerThread(broker_config(tmp_path / "off", pki, verify="verify_peer")) as b:
        with tls_socket(b.tls_port, client_context(pki)) as with_cert:
            assert start_mechanisms(with_cert) == ["PLAIN", "AMQPLAIN"]


async def test_external_asked_for_where_not_offered(tmp_path, pki):
    """A client sending EXTERNAL on the plain listener asks for a mechanism not offered there:
    RabbitMQ's 503 COMMAND_INVALID "unknown authentication mechanism"."""
    async with running_broker(broker_config(tmp_path, pki, **EXTERNAL_ON)) as b:
        client = await RawClient.connect(b.port, handshake=False)
        client.write(PROTOCOL_HEADER)
        await client.expect(spec.ConnectionStart)
        caps = {"authentication_failure_close": True}
        start_ok = spec.ConnectionStartOk(
            client_properties={"capabilities": caps},
            mechanism="EXTERNAL",
            response=b"",
            locale="en_US",
        )
        client.send(0, start_ok)
        close = await client.expect(spec.ConnectionClose)
        assert (close.reply_code, close.reply_text) == (
            503,
            "COMMAND_INVALID - unknown authentication mechanism 'EXTERNAL'",
        )
        assert all(c.user is None for c in b.broker.connections)
        await client.close()


def test_cert_login_from(pki):
    cert = {
        "subject": ((("organizationName", "RoarMQ tests"),), (("commonName", "alice"),)),
        "subjectAltName": (("DNS", "a.example"), ("email", "alice@example.org")),
    }

    def login(**cfg) -> str | None:
        return tls.cert_login(cert, AmqpTlsConfig(**cfg))

    assert login() == "alice"
    assert login(cert_login_from="distinguished_name") == "CN=alice,O=RoarMQ tests"
    san = {"cert_login_from": "subject_alternative_name"}
    assert login(**san) == "a.example"
    assert login(**san, cert_login_san_type="email") == "alice@example.org"
    assert login(**san, cert_login_san_index=1) is None
    assert tls.cert_login({"subject": ()}, AmqpTlsConfig()) is None


def test_rfc4514_escaping_as_rabbitmq():
    name = (
        (("countryName", "SE"),),
        (("organizationName", 'a,b+c"d;e<f>g\\h'),),
        (("organizationalUnitName", " #lead and trail "),),
        (("commonName", "x"), ("userId", "ö~")),
    )
    assert tls.rfc4514(name) == (
        'CN=x+UID=\\C3\\B6\\7E,OU=\\ #lead and trail\\ ,O=a\\,b\\+c\\"d\\;e\\<f\\>g\\\\h,C=SE'
    )


# -- management -----------------------------------------------------------------------------


def get_json(url: str, ctx: ssl.SSLContext | None = None):
    req = urllib.request.Request(
        url, headers={"Authorization": "Basic " + b64encode(b"guest:guest").decode()}
    )
    with urllib.request.urlopen(req, context=ctx, timeout=5) as resp:
        return json.load(resp)


def openssl_name(cert: Path, which: str) -> str:
    """What `openssl x509 -nameopt RFC2253` prints: RabbitMQ's README names it as the form
    its peer_cert_subject takes."""
    out = subprocess.run(
        ["openssl", "x509", "-in", str(cert), "-noout", f"-{which}", "-nameopt", "RFC2253"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return out.split("=", 1)[1]


def test_https_management_and_connection_list(tmp_path, pki):
    mgmt_tls = TlsConfig(enabled=True, certfile=str(pki.server_cert), keyfile=str(pki.server_key))
    cfg = broker_config(tmp_path, pki, verify="verify_peer", management_tls=mgmt_tls)
    with BrokerThread(cfg, management=True) as b:
        assert b.mgmt_url.startswith("https://")
        https = client_context(pki, cert=None)
        assert get_json(f"{b.mgmt_url}/api/overview", https)["product_name"] == "RoarMQ"
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP: no answer
            get_json(f"http://127.0.0.1:{b.broker.mgmt_port}/api/overview")
        with pytest.raises(urllib.error.URLError):  # a client that does not trust our CA
            get_json(
                f"{b.mgmt_url}/api/overview", client_context(pki, cert=None, trust=pki.other_ca)
            )

        plain = pika.BlockingConnection(pika.URLParameters(b.url))
        tls13 = pika.BlockingConnection(pika_params(pki, b.tls_port))
        ctx12 = client_context(pki)
        ctx12.maximum_version = ssl.TLSVersion.TLSv1_2
        tls12 = pika.BlockingConnection(
            pika.ConnectionParameters(
                "127.0.0.1",
                b.tls_port,
                credentials=pika.PlainCredentials("guest", "guest"),
                ssl_options=pika.SSLOptions(ctx12, "127.0.0.1"),
            )
        )
        try:
            rows = get_json(f"{b.mgmt_url}/api/connections", https)
        finally:
            for c in (plain, tls13, tls12):
                c.close()

    by_protocol = {row["ssl_protocol"]: row for row in rows}
    assert set(by_protocol) == {None, "tlsv1.3", "tlsv1.2"}
    # As RabbitMQ 3.10.8 reports a plain connection.
    assert {k: v for k, v in by_protocol[None].items() if k in tls.PLAIN_REPORT} == (
        tls.PLAIN_REPORT
    )
    assert by_protocol[None]["auth_mechanism"] == "PLAIN"

    row = by_protocol["tlsv1.3"]
    assert row["ssl"] is True and row["auth_mechanism"] == "PLAIN"
    # trustme's keys are ECDSA; OpenSSL's first TLS 1.3 suite is TLS_AES_256_GCM_SHA384.
    assert (row["ssl_key_exchange"], row["ssl_cipher"], row["ssl_hash"]) == (
        "any",
        "aes_256_gcm",
        "aead",
    )
    assert row["peer_cert_subject"] == openssl_name(pki.client_cert, "subject")
    assert row["peer_cert_subject"].startswith(f"CN={CLIENT_CN},OU=")
    assert row["peer_cert_issuer"] == openssl_name(pki.client_cert, "issuer")
    cert = x509.load_pem_x509_certificate(pki.client_cert.read_bytes())
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    assert row["peer_cert_validity"] == (
        f"{cert.not_valid_before_utc.strftime(fmt)} - {cert.not_valid_after_utc.strftime(fmt)}"
    )
    row = by_protocol["tlsv1.2"]
    assert (row["ssl_key_exchange"], row["ssl_cipher"], row["ssl_hash"]) == (
        "ecdhe_ecdsa",
        "aes_256_gcm",
        "aead",
    )


# -- configuration --------------------------------------------------------------------------


def test_config_errors_name_the_key(tmp_path, pki):
    server = {"enabled": True, "certfile": str(pki.server_cert), "keyfile": str(pki.server_key)}
    cases = {
        "[amqp.tls] certfile: missing": {"amqp": {"tls": {"enabled": True}}},
        f"[amqp.tls] cafile: {tmp_path}/nope.pem: no such file": {
            "amqp": {"tls": {**server, "cafile": str(tmp_path / "nope.pem")}}
        },
        "[amqp.tls] verfy: unknown setting": {"amqp": {"tls": {"verfy": "verify_peer"}}},
        "[amqp.tls] verify: must be one of verify_none, verify_peer": {
            "amqp": {"tls": {"verify": "none"}}
        },
        '[amqp.tls] fail_if_no_peer_cert: needs verify = "verify_peer"': {
            "amqp": {"tls": {"fail_if_no_peer_cert": True}}
        },
        "[amqp.tls] cafile: missing": {"amqp": {"tls": {**server, "verify": "verify_peer"}}},
        '[amqp.tls] external_auth: needs verify = "verify_peer"': {
            "amqp": {"tls": {**server, "external_auth": True}}
        },
        "[amqp] plain: false leaves no AMQP listener": {"amqp": {"plain": False}},
        "[amqp.tls] port: 5672 is also the plain [amqp] port": {
            "amqp": {"tls": {**server, "port": 5672}}
        },
        "[management.tls] port: unknown setting": {"management": {"tls": {"port": 1}}},
        "[amqp.tls] cert_login_from: must be one of": {"amqp": {"tls": {"cert_login_from": "cn"}}},
    }
    for expected, doc in cases.items():
        with pytest.raises(ConfigError) as info:
            parse_config(doc)
        assert str(info.value).startswith(expected), (expected, str(info.value))


def test_check_config_loads_the_certificates(tmp_path, pki, capsys):
    good = tmp_path / "good.toml"
    good.write_text(
        f'[amqp.tls]\nenabled = true\ncertfile = "{pki.server_cert}"\nkeyfile = "{pki.server_key}"\n'
        f'cafile = "{pki.ca}"\nverify = "verify_peer"\nfail_if_no_peer_cert = true\n'
        f'[management.tls]\nenabled = true\ncertfile = "{pki.server_cert}"\n'
        f'keyfile = "{pki.server_key}"\n'
    )
    assert check_config(str(good)) == 0
    mismatched = tmp_path / "mismatched.toml"  # the client's key does not go with the cert
    mismatched.write_text(
        f'[amqp.tls]\nenabled = true\ncertfile = "{pki.server_cert}"\n'
        f'keyfile = "{pki.client_key}"\n'
    )
    assert check_config(str(mismatched)) == 1
    err = capsys.readouterr().err
    assert "[amqp.tls] certfile, keyfile: no certificate and matching private key" in err
    assert "key values mismatch" in err
    not_a_ca = tmp_path / "not-a-ca.toml"
    not_a_ca.write_text(
        f'[amqp.tls]\nenabled = true\ncertfile = "{pki.server_cert}"\n'
        f'keyfile = "{pki.server_key}"\ncafile = "{good}"\n'
    )
    assert check_config(str(not_a_ca)) == 1
    assert "[amqp.tls] cafile: no CA certificates in" in capsys.readouterr().err


def test_the_shipped_config_example_parses(pki):
    """config.toml's commented-out TLS settings ("#key = value"), uncommented, are valid."""
    text = (Path(__file__).parents[2] / "config.toml").read_text()
    lines = [line[1:] for line in text.splitlines() if line[:1] == "#" and line[1:2] not in " #"]
    example = "\n".join(lines)
    assert "[amqp.tls]" in example and "[management.tls]" in example
    for name in ("server.pem", "server.key", "ca.pem"):
        path = {"server.pem": pki.server_cert, "server.key": pki.server_key, "ca.pem": pki.ca}[name]
        example = example.replace(f"/etc/roarmq/{name}", str(path))
    cfg = parse_config(tomllib.loads(example))
    assert cfg.amqp.tls.enabled and cfg.management.tls.enabled
    tls.check(cfg)


def test_the_openssl_recipe_in_the_docs(tmp_path):
    """docs/security.md's test-certificate commands, run as written, give certificates a
    broker loads and an EXTERNAL login as the client certificate's CN (app1)."""
    doc = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    section = doc.split("### Test certificates with openssl", 1)[1]
    script = section.split("```sh\n", 1)[1].split("```", 1)[0]
    subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, check=True, capture_output=True)
    pki = tmp_path
    cfg = ephemeral_config(
        data_dir=str(tmp_path / "data"),
        amqp={
            "tls": AmqpTlsConfig(
                enabled=True,
                port=0,
                certfile=str(pki / "server.pem"),
                keyfile=str(pki / "server.key"),
                cafile=str(pki / "ca.pem"),
                verify="verify_peer",
                fail_if_no_peer_cert=True,
                external_auth=True,
            )
        },
    )
    cfg = dataclasses.replace(
        cfg,
        users=cfg.users + (UserConfig("app1", "unused", ()),),
        permissions=cfg.permissions + (PermissionConfig("app1", "/"),),
    )
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    ctx.load_cert_chain(str(pki / "client.pem"), str(pki / "client.key"))
    with BrokerThread(cfg) as b:
        conn = pika.BlockingConnection(
            pika.ConnectionParameters(
                "localhost",
                b.tls_port,
                ssl_options=pika.SSLOptions(ctx, "localhost"),
                credentials=pika.credentials.ExternalCredentials(),
            )
        )
        roundtrip_pika(conn, b"from the docs")
        subjects = b.call(
            lambda: [c.tls.report()["peer_cert_subject"] for c in b.broker.connections]
        )
        assert subjects == ["CN=app1,O=Example"]
        conn.close()
