"""Random sequences of client methods: whatever a client sends, the broker answers with a
proper AMQP error or carries on, never an internal error, and keeps serving everyone."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.rawclient import RawClient

from roarmq.broker.testing import BrokerThread, ephemeral_config
from roarmq.protocol import spec
from roarmq.protocol.properties import BasicProperties

# slow (random client sessions by the hundred): `make check` leaves it out
pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

names = st.sampled_from(["", "a", "b", "amq.direct", "amq.topic", "amq.gen-x", "c.d"])
keys = st.sampled_from(["", "a", "a.b", "#", "*.b", "a/+", "k"])
xtypes = st.sampled_from(["direct", "fanout", "topic", "headers", "x-bogus"])
arg_values = st.one_of(
    st.integers(-5, 70000),
    st.booleans(),
    st.text(max_size=8),
    st.sampled_from(["drop-head", "reject-publish", "quorum", "stream", "all", "any", "mqtt", "a"]),
    st.none(),
)
arguments = st.dictionaries(
    st.sampled_from(
        [
            "x-message-ttl",
            "x-expires",
            "x-max-length",
            "x-max-length-bytes",
            "x-overflow",
            "x-dead-letter-exchange",
            "x-dead-letter-routing-key",
            "x-max-priority",
            "x-queue-type",
            "x-single-active-consumer",
            "x-delivery-limit",
            "x-match",
            "x-priority",
            "alternate-exchange",
            "x-topic-syntax",
            "format",
        ]
    ),
    arg_values,
    max_size=3,
)
flags = st.booleans()
tags = st.integers(0, 6)

client_methods = st.one_of(
    st.builds(
        spec.ExchangeDeclare,
        exchange=names,
        type=xtypes,
        passive=flags,
        durable=flags,
        auto_delete=flags,
        internal=flags,
        arguments=arguments,
    ),
    st.builds(spec.ExchangeDelete, exchange=names, if_unused=flags),
    st.builds(
        spec.ExchangeBind, destination=names, source=names, routing_key=keys, arguments=arguments
    ),
    st.builds(spec.ExchangeUnbind, destination=names, source=names, routing_key=keys),
    st.builds(
        spec.QueueDeclare,
        queue=names,
        passive=flags,
        durable=flags,
        exclusive=flags,
        auto_delete=flags,
        arguments=arguments,
    ),
    st.builds(spec.QueueBind, queue=names, exchange=names, routing_key=keys, arguments=arguments),
    st.builds(spec.QueueUnbind, queue=names, exchange=names, routing_key=keys),
    st.builds(spec.QueuePurge, queue=names),
    st.builds(spec.QueueDelete, queue=names, if_unused=flags, if_empty=flags),
    st.builds(spec.BasicQos, prefetch_count=st.integers(0, 3), global_=flags),
    st.builds(
        spec.BasicConsume,
        queue=names,
        consumer_tag=st.sampled_from(["", "t1", "t2"]),
        no_ack=flags,
        exclusive=flags,
        arguments=arguments,
    ),
    st.builds(spec.BasicCancel, consumer_tag=st.sampled_from(["t1", "t2", "zz"])),
    st.builds(spec.BasicGet, queue=names, no_ack=flags),
    st.builds(spec.BasicAck, delivery_tag=tags, multiple=flags),
    st.builds(spec.BasicNack, delivery_tag=tags, multiple=flags, requeue=flags),
    st.builds(spec.BasicReject, delivery_tag=tags, requeue=flags),
    st.builds(spec.BasicRecover, requeue=st.just(True)),
    st.builds(spec.ConfirmSelect),
    st.builds(spec.TxSelect),
    st.builds(spec.TxCommit),
    st.builds(spec.TxRollback),
    st.builds(spec.ChannelFlow, active=flags),
    st.builds(spec.ChannelClose, reply_code=st.just(200), reply_text=st.just("bye")),
    st.builds(spec.ChannelOpen),
)
publishes = st.builds(
    lambda ex, key, props: ("publish", ex, key, props),
    names,
    keys,
    st.builds(
        BasicProperties,
        delivery_mode=st.sampled_from([None, 1, 2]),
        priority=st.sampled_from([None, 0, 9, 255]),
        expiration=st.sampled_from([None, "0", "100", "x"]),
        headers=st.sampled_from([None, {"CC": ["a"]}, {"BCC": ["b"]}, {"format": "a"}]),
        reply_to=st.sampled_from([None, "amq.rabbitmq.reply-to"]),
        user_id=st.sampled_from([None, "guest", "eve"]),
    ),
)
steps = st.lists(
    st.tuples(st.integers(1, 3), st.one_of(client_methods, publishes)), min_size=1, max_size=25
)


@pytest.fixture(scope="module")
def chaos_broker(tmp_path_factory):
    errors: list = []
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path_factory.mktemp("chaos")))) as b:
        b.call(lambda: b._loop.set_exception_handler(lambda loop, ctx: errors.append(ctx)))
        b.errors = errors
        yield b


SENTINEL = 4  # a channel the random steps never touch


async def run_steps(port: int, sequence: list) -> list:
    """Send the steps, then a basic.qos on the sentinel channel: the broker handles frames
    in order, so its qos-ok means every step before it has been answered."""
    c = await RawClient.connect(port)
    for ch in (1, 2, 3, SENTINEL):
        await c.open_channel(ch)
    for channel, step in sequence:
        if isinstance(step, tuple):
            _, ex, key, props = step
            c.publish(channel, ex, key, b"chaos", props)
        else:
            c.send(channel, step)
    c.send(SENTINEL, spec.BasicQos(prefetch_count=1))
    closes = []
    while True:
        frame = await c.next_frame(timeout=10)
        method = frame.method
        if isinstance(method, spec.ConnectionClose):
            closes.append(method)
            c.send(0, spec.ConnectionCloseOk())
            break
        if isinstance(method, spec.ChannelClose):
            closes.append(method)
            c.send(frame.channel, spec.ChannelCloseOk())
        if isinstance(method, spec.BasicQosOk) and frame.channel == SENTINEL:
            break
    await c.close()
    return closes


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(sequence=steps)
def test_random_method_sequences_never_break_the_broker(chaos_broker, sequence):
    closes = asyncio.run(run_steps(chaos_broker.port, sequence))
    for close in closes:
        assert close.reply_code != 541, close.reply_text
        assert close.reply_code in (200, 403, 404, 405, 406, 501, 502, 503, 504, 505, 530, 540)
    assert not chaos_broker.errors, chaos_broker.errors
    # Everyone else is still served.
    alive = asyncio.run(
        run_steps(chaos_broker.port, [(1, spec.QueueDeclare(queue="", exclusive=True))])
    )
    assert alive == []
