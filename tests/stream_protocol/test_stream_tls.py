"""The stream protocol over TLS ([stream.tls]): PLAIN inside TLS, and SASL EXTERNAL as the
user a verified client certificate names (the [amqp.tls] cert_login rules)."""

from __future__ import annotations

import dataclasses
import ssl

import pytest
import trustme
from rstream import AMQPMessage, Producer, SlasMechanism
from rstream import exceptions as rex

from roarmq.broker.config import PermissionConfig, StreamTlsConfig, UserConfig
from roarmq.broker.testing import ephemeral_config, running_broker


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.private_key_and_cert_chain_pem.write_to_path(str(d / "server.pem"))
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    client = ca.issue_cert("streamer.example.org", common_name="streamer")
    client.private_key_and_cert_chain_pem.write_to_path(str(d / "client.pem"))
    return d


def _context(d, with_cert: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(d / "ca.pem"))
    if with_cert:
        ctx.load_cert_chain(str(d / "client.pem"))
    return ctx


async def test_plain_and_external_over_tls(tmp_path, certificates):
    d = certificates
    tls = StreamTlsConfig(
        enabled=True,
        port=0,
        certfile=str(d / "server.pem"),
        keyfile=str(d / "server.pem"),
        cafile=str(d / "ca.pem"),
        verify="verify_peer",
    )
    cfg = ephemeral_config(data_dir=str(tmp_path / "data"), stream={"tls": tls})
    cfg = dataclasses.replace(
        cfg,
        users=cfg.users + (UserConfig("streamer", "unused-by-external", ()),),
        permissions=cfg.permissions + (PermissionConfig("streamer", "/"),),
    )
    async with running_broker(cfg) as broker:
        port = broker.broker.stream_tls.port

        async def send(**options) -> None:
            async with Producer("127.0.0.1", port=port, **options) as producer:
                await producer.create_stream("secure", exists_ok=True)
                await producer.send_wait("secure", AMQPMessage(body=b"over tls"))

        await send(ssl_context=_context(d, False), username="guest", password="guest")
        await send(
            ssl_context=_context(d, True),
            username="",
            password="",
            sasl_configuration_mechanism=SlasMechanism.MechanismExternal,
        )
        assert broker.broker.vhosts["/"].queues["secure"].message_count() == 2
        with pytest.raises(rex.AuthenticationFailure):  # no certificate: no user to be
            await send(
                ssl_context=_context(d, False),
                username="",
                password="",
                sasl_configuration_mechanism=SlasMechanism.MechanismExternal,
            )
