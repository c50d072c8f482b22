"""A dynamic shovel's definition checked as RabbitMQ 3.10.8's rabbit_shovel_parameters
checks it (broker/links/shovel_definition.py): what it reads, and each refusal in
RabbitMQ's words and order (the texts are its format strings with its `~p` terms)."""

from __future__ import annotations

import pytest

from roarmq.broker.links.shovel_definition import DefinitionError, check_shovel

BASE = {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b"}


def refusals(value, **kw) -> list[str]:
    with pytest.raises(DefinitionError) as refused:
        check_shovel("s1", value, **kw)
    assert str(refused.value) == "Validation failed\n\n" + "".join(
        e + "\n" for e in refused.value.errors
    )
    return refused.value.errors


def test_what_a_definition_reads_and_its_defaults():
    d = check_shovel("s1", BASE)
    assert (d.src_queue, d.dest_queue, d.dest_exchange, d.dest_exchange_key) == (
        "a",
        "b",
        None,
        None,
    )
    assert (d.ack_mode, d.prefetch_count, d.delete_after, d.reconnect_delay) == (
        "on-confirm",
        1000,
        "never",
        5,
    )
    assert [u.local for u in d.src_uris] == [True]
    full = check_shovel(
        "s2",
        {
            "src-uri": ["amqp://u:p@h1", "amqp://u:p@h2:5673/v"],
            "src-exchange": "x",
            "src-exchange-key": "k.#",
            "src-consumer-args": {"x-priority": 5},
            "prefetch-count": 10,  # the pre-3.7 name ...
            "src-prefetch-count": 20,  # ... the newer wins
            "delete-after": "queue-length",
            "dest-uri": "amqps://remote",
            "dest-exchange": "out",
            "add-forward-headers": True,
            "dest-add-timestamp-header": True,
            "dest-publish-properties": {"delivery_mode": 2, "app_id": "shovel"},
            "ack-mode": "on-publish",
            "reconnect-delay": 2.5,
        },
    )
    assert [u.host for u in full.src_uris] == ["h1", "h2"]
    assert (full.src_exchange, full.src_exchange_key, full.prefetch_count) == ("x", "k.#", 20)
    assert (full.delete_after, full.add_forward_headers, full.add_timestamp_header) == (
        "queue-length",
        True,
        True,
    )
    assert full.publish_properties == {"delivery_mode": 2, "app_id": "shovel"}
    assert (full.ack_mode, full.reconnect_delay) == ("on-publish", 2.5)
    assert full.dest_uris[0].tls is not None and full.src_consumer_args == {"x-priority": 5}


@pytest.mark.parametrize(
    ("change", "errors"),
    [
        ({"src-queue": None}, ["Must specify 'src-exchange' or 'src-queue'"]),
        ({"src-exchange": "x"}, ["Cannot specify 'src-exchange' and 'src-queue'"]),
        ({"dest-exchange": "x"}, ["Cannot specify 'dest-exchange' and 'dest-queue'"]),
        (
            {"ack-mode": "no-ack", "src-delete-after": 5},
            ["Cannot specify 'no-ack' and numerical 'delete-after'"],
        ),
        ({"src-uri": None}, ['Key "src-uri" not found in s1']),
        (
            {"src-uri": "http://x"},
            ['"http://x" not a valid URI: {{unexpected_uri_scheme,"http"},"http://x"}'],
        ),
        (
            {"dest-uri": ["amqp://", "foo://"]},
            ['"foo://" not a valid URI: {{unexpected_uri_scheme,"foo"},"foo://"}'],
        ),
        ({"src-uri": 5}, ["src-uri should be list, actually was 5"]),
        ({"foo": 1, "bar": "x"}, ['Unrecognised terms [{<<"bar">>,<<"x">>},{<<"foo">>,1}] in s1']),
        (
            {"src-prefetch-count": "x"},
            ['src-prefetch-count should be a number, actually was <<"x">>'],
        ),
        (
            {"ack-mode": "sometimes"},
            [
                'ack-mode should be one of [<<"no-ack">>,<<"on-publish">>,<<"on-confirm">>], '
                'actually was <<"sometimes">>'
            ],
        ),
        (
            {"src-delete-after": "soon"},
            [
                'src-delete-after should be a number greater than or equal to 0, "never" or '
                '"queue-length", actually was <<"soon">>'
            ],
        ),
        (
            {"dest-add-forward-headers": "yes"},
            ['dest-add-forward-headers should be boolean, actually was <<"yes">>'],
        ),
        ({"dest-queue": "q" * 256}, ["dest-queue should be less than 255 bytes, actually was 256"]),
        (
            {"dest-publish-properties": {"nope": 1, "priority": "high"}},
            [
                'Unrecognised terms [{<<"nope">>,1}] in dest-publish-properties',
                'priority should be a number, actually was <<"high">>',
            ],
        ),
        (
            {"src-consumer-args": {"x-foo": 1}},
            ['Unrecognised terms [{<<"x-foo">>,1}] in src-consumer-args'],
        ),
        ({"src-consumer-args": "x"}, ['src-consumer-args not a list <<"x">>']),
    ],
)
def test_refusals_in_rabbitmqs_words(change, errors):
    value = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    assert refusals(value) == errors


def test_several_refusals_come_in_rabbitmqs_order():
    """The source and destination rules first; then the key rules, the last rule's first
    (rabbit_parameter_validation:proplist's fold), unknown keys before them."""
    value = {
        "src-uri": "amqp://",
        "dest-uri": "amqp://",
        "reconnect-delay": "x",
        "zzz": 1,
        "dest-queue": 1,
    }
    assert refusals(value) == [
        "Must specify 'src-exchange' or 'src-queue'",
        'Unrecognised terms [{<<"zzz">>,1}] in s1',
        "dest-queue should be binary, actually was 1",
        'reconnect-delay should be a number, actually was <<"x">>',
    ]


def test_a_local_uri_needs_a_vhost_the_user_may_use_and_amqp10_is_ours_to_refuse():
    errors = refusals(
        {**BASE, "dest-uri": "amqp:///other"}, user="bob", may_use_vhost=lambda v: v == "/"
    )
    assert errors == ['user "bob" may not connect to vhost "other"']
    assert refusals({**BASE, "src-protocol": "amqp10"})[0].startswith(
        "src-protocol amqp10 is not supported"
    )
    assert refusals("x") == ['s1 not a list <<"x">>']
