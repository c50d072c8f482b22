"""What a peer that has not finished the handshake may send: frames of at most 4096 bytes.

RabbitMQ holds frames to the spec's minimum frame size until connection.tune-ok
(``frame_too_large`` in its log); so does RoarMQ, so a stranger cannot make the broker
buffer a negotiated-size frame before it has authenticated.
"""

from __future__ import annotations

from support.rawclient import RawClient

from roarmq.protocol import spec
from roarmq.protocol.frames import PROTOCOL_HEADER, encode_method


def _start_ok(product_size: int) -> bytes:
    return encode_method(
        0,
        spec.ConnectionStartOk(
            client_properties={"product": "x" * product_size},
            mechanism="PLAIN",
            response=b"\x00guest\x00guest",
            locale="en_US",
        ),
    )


async def test_large_frame_before_tune_closes_the_connection(broker) -> None:
    client = await RawClient.connect(broker.port, handshake=False)
    frame = _start_ok(5000)
    assert len(frame) > spec.FRAME_MIN_SIZE
    client.write(PROTOCOL_HEADER + frame)
    await client.expect(spec.ConnectionStart)
    close = await client.expect(spec.ConnectionClose)
    assert close.reply_code == 501
    assert "4096" in close.reply_text
    other = await RawClient.connect(broker.port)  # everyone else is served as before
    await other.open_channel(1)
    await other.close()


async def test_frame_within_the_minimum_is_accepted_and_the_limit_lifts_after_tune(broker) -> None:
    client = await RawClient.connect(broker.port, handshake=False)
    client.write(PROTOCOL_HEADER + _start_ok(3000))
    await client.expect(spec.ConnectionStart)
    tune = await client.expect(spec.ConnectionTune)
    client.send(0, spec.ConnectionTuneOk(channel_max=0, frame_max=tune.frame_max, heartbeat=0))
    client.send(0, spec.ConnectionOpen(virtual_host="/"))
    await client.expect(spec.ConnectionOpenOk)
    await client.open_channel(1)
    # A 100 kB method frame (a queue.declare with big arguments) is fine once tuned.
    client.send(1, spec.QueueDeclare(queue="preauth", arguments={"big": "y" * 100_000}))
    ok = await client.expect(spec.QueueDeclareOk)
    assert ok.queue == "preauth"
