"""Federation's runtime parameters checked as RabbitMQ 3.10.8's
rabbit_federation_parameters checks them (broker/links/federation_definition.py)."""

from __future__ import annotations

import pytest

from roarmq.broker.links.federation_definition import (
    Upstream,
    UpstreamError,
    check_upstream,
    check_upstream_set,
)


def test_an_upstream_and_its_defaults():
    uris, settings = check_upstream("up", {"uri": "amqp://u:p@remote/v", "max-hops": 2})
    up = Upstream.read("up", uris, settings)
    assert (up.uris[0].host, up.uris[0].vhost, up.max_hops) == ("remote", "v", 2)
    assert (up.prefetch_count, up.reconnect_delay, up.ack_mode, up.expires) == (
        1000,
        5,
        "on-confirm",
        None,
    )
    uris, _ = check_upstream("up", {"uri": ["amqp://a", "amqp://b"]})
    assert [u.host for u in uris] == ["a", "b"]


@pytest.mark.parametrize(
    ("value", "errors"),
    [
        ({}, ['Key "uri" not found in up']),
        ({"uri": "x://"}, ['"x://" not a valid URI: {{unexpected_uri_scheme,"x"},"x://"}']),
        (
            {"uri": "amqp://", "max-hops": "a", "zzz": 1},
            [
                'Unrecognised terms [{<<"zzz">>,1}] in up',
                'max-hops should be a number, actually was <<"a">>',
            ],
        ),
        (
            {"uri": "amqp://", "ack-mode": "never"},
            [
                'ack-mode should be one of [<<"no-ack">>,<<"on-publish">>,<<"on-confirm">>], '
                'actually was <<"never">>'
            ],
        ),
        (
            {"uri": "amqp://", "trust-user-id": 1},
            ["trust-user-id should be boolean, actually was 1"],
        ),
    ],
)
def test_upstream_refusals(value, errors):
    with pytest.raises(UpstreamError) as refused:
        check_upstream("up", value)
    assert refused.value.errors == errors


def test_an_upstream_set():
    assert check_upstream_set("s", [{"upstream": "a"}, {"upstream": "b", "max-hops": 3}]) == [
        ("a", {}),
        ("b", {"max-hops": 3}),
    ]
    with pytest.raises(UpstreamError) as refused:
        check_upstream_set("s", [{"max-hops": 3}, {"upstream": 1}])
    assert refused.value.errors == [
        'Key "upstream" not found in s',
        "upstream should be binary, actually was 1",
    ]
    with pytest.raises(UpstreamError):
        check_upstream_set("s", {"upstream": "a"})
