"""broker/core/queue_arguments.py's table driven directly: no broker, no socket.

Each row's good and bad values (the parsed value, or RabbitMQ's exact 406 text), the queue
types' rules, equivalence on redeclaration, policy validation and how an argument, a
policy and an operator policy combine. What a client sees of the same rules over AMQP is
in test_errors_raw.py, test_policies.py and test_semantics_raw.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from roarmq.broker.core import queue_arguments as qa
from roarmq.broker.core.policy import PolicyError, effective_definition, make_policy
from roarmq.broker.core.queue import Queue
from roarmq.protocol.errors import SoftError


def parse(args: dict[str, Any], durable: bool = True, exclusive: bool = False) -> dict[str, Any]:
    return qa.parse(args, "q", "/", durable, exclusive, False)


def refusal(args: dict[str, Any], **props: Any) -> str:
    with pytest.raises(SoftError) as err:
        parse(args, **props)
    assert err.value.reply_code == 406
    return err.value.text


def invalid(key: str, detail: str) -> str:
    return f"invalid arg '{key}' for queue 'q' in vhost '/': {detail}"


# One good value per row, and bad ones with RabbitMQ's detail.
GOOD = {
    "x-expires": 1,
    "x-message-ttl": 0,
    "x-dead-letter-exchange": "dlx",
    "x-max-length": 0,
    "x-max-length-bytes": 10,
    "x-max-priority": 255,
    "x-overflow": "reject-publish-dlx",
    "x-queue-mode": "lazy",
    "x-queue-type": "quorum",
    "x-single-active-consumer": True,
    "x-delivery-limit": 0,
    "x-dead-letter-strategy": "at-least-once",
    "x-delayed-retry-type": "failed",
    "x-delayed-retry-min": 1000,
    "x-delayed-retry-max": 30000,
    "x-consumer-timeout": 60000,
    "x-max-age": "7D",
    "x-stream-max-segment-size-bytes": 1000,
}

BAD = [
    ("x-expires", 0, "{value_zero,0}"),
    ("x-expires", -5, "{value_negative,-5}"),
    ("x-expires", "1", '"expected integer, got longstr"'),
    ("x-message-ttl", -1, "{value_negative,-1}"),
    ("x-message-ttl", 1.5, '"expected integer, got double"'),
    ("x-message-ttl", True, '"expected integer, got bool"'),
    ("x-message-ttl", None, '"expected integer, got void"'),
    ("x-max-length", -1, "{value_negative,-1}"),
    ("x-max-length-bytes", "big", '"expected integer, got longstr"'),
    ("x-max-priority", 256, "{value_too_large,256}"),
    ("x-max-priority", -1, "{value_negative,-1}"),
    ("x-delivery-limit", -2, "{value_negative,-2}"),
    ("x-consumer-timeout", -1, "{value_negative,-1}"),
    ("x-delayed-retry-type", "later", '{unacceptable_value,<<"later">>}'),
    ("x-delayed-retry-type", 1, "{unacceptable_type,signedint}"),
    ("x-delayed-retry-min", -1, "{value_negative,-1}"),
    ("x-delayed-retry-max", "1s", '"expected integer, got longstr"'),
    ("x-dead-letter-exchange", 5, "{unacceptable_type,signedint}"),
    ("x-dead-letter-exchange", b"dlx", "{unacceptable_type,longstr}"),
    ("x-overflow", "nope", '{unacceptable_value,<<"nope">>}'),
    ("x-overflow", None, "{unacceptable_type,void}"),
    ("x-overflow", 5, "{unacceptable_type,signedint}"),
    ("x-queue-mode", "weird", "\"unsupported queue mode 'weird'\""),
    ("x-queue-mode", 1, "{unacceptable_type,signedint}"),
    ("x-queue-mode", None, "{unacceptable_type,void}"),
    ("x-single-active-consumer", 1, "{unacceptable_type,signedint}"),
    ("x-single-active-consumer", "yes", "{unacceptable_type,longstr}"),
    ("x-single-active-consumer", None, "{unacceptable_type,void}"),
    ("x-dead-letter-strategy", "bogus", "invalid_dlx_strategy"),
    ("x-dead-letter-strategy", None, "{unacceptable_type,void}"),
    ("x-dead-letter-strategy", 5, "{unacceptable_type,signedint}"),
    ("x-queue-type", "nope", '"nope" is not a valid queue type (classic, quorum, stream)'),
    ("x-queue-type", None, '"None" is not a valid queue type (classic, quorum, stream)'),
    ("x-max-age", "1x", "invalid_max_age"),
    ("x-max-age", "0s", "invalid_max_age"),
    ("x-max-age", 5, "{unacceptable_type,signedint}"),
    ("x-stream-max-segment-size-bytes", -5, "{value_negative,-5}"),
    ("x-stream-max-segment-size-bytes", "x", '"expected integer, got longstr"'),
]


def test_every_argument_has_a_good_value_here() -> None:
    assert set(GOOD) | {"x-dead-letter-routing-key"} == {r.argument for r in qa.EQUIVALENCE} | {
        "x-queue-mode",
        "x-consumer-timeout",
        # RabbitMQ 4.3's, which 3.10.8 (whose redeclaration rules these are) never compares
        "x-delayed-retry-type",
        "x-delayed-retry-min",
        "x-delayed-retry-max",
    }


@pytest.mark.parametrize("key", sorted(GOOD))
def test_a_good_value_is_kept_by_row_name(key: str) -> None:
    given = parse(declared(key, GOOD[key]))
    assert given[key.removeprefix("x-")] == GOOD[key]


@pytest.mark.parametrize(("key", "value", "detail"), BAD)
def test_a_bad_value_is_406_with_rabbitmq_text(key: str, value: Any, detail: str) -> None:
    assert refusal(declared(key, value)) == invalid(key, detail)


#: Arguments a classic queue refuses outright ("of queue type rabbit_classic_queue").
QUORUM_ONLY = {"x-dead-letter-strategy"}


def declared(key: str, value: Any) -> dict[str, Any]:
    """The arguments of a declare that sets `key`, on a queue type that takes it."""
    return {"x-queue-type": "quorum", key: value} if key in QUORUM_ONLY else {key: value}


def test_absent_and_void() -> None:
    assert parse({}) == {"queue-type": "classic"}
    # A void string argument counts as absent here (the channel refuses a void
    # x-dead-letter-exchange before: its type); unknown arguments are ignored.
    assert parse({"x-dead-letter-exchange": None, "x-foo": [1]}) == {
        "queue-type": "classic",
        "dead-letter-exchange": None,
    }
    assert parse({"x-queue-type": b"quorum"})["queue-type"] == "quorum"


def test_routing_key_requires_exchange() -> None:
    detail = "Key 'x-dead-letter-exchange' is mandatory if 'x-dead-letter-routing-key' is present"
    for args in (
        {"x-dead-letter-routing-key": "rk"},
        {"x-dead-letter-routing-key": "rk", "x-dead-letter-exchange": None},
    ):
        assert refusal(args) == invalid("x-dead-letter-routing-key", detail)
    assert parse({"x-dead-letter-routing-key": None})["dead-letter-routing-key"] is None
    both = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "rk"}
    assert parse(both)["dead-letter-routing-key"] == "rk"


def test_checks_run_in_table_order_queue_type_first() -> None:
    bad = {"x-max-length": -1, "x-message-ttl": -1, "x-expires": 0}
    assert refusal(bad) == invalid("x-expires", "{value_zero,0}")
    assert refusal({**bad, "x-queue-type": "nope"}).startswith("invalid arg 'x-queue-type'")


@pytest.mark.parametrize(
    ("props", "refused"),
    [
        ({"durable": False}, "non-durable"),
        ({"exclusive": True}, "exclusive"),
        ({"durable": False, "exclusive": True}, "non-durable"),
    ],
)
def test_quorum_queues_refuse_properties(props: dict, refused: str) -> None:
    text = refusal({"x-queue-type": "quorum"}, **props)
    assert text == f"invalid property '{refused}' for queue 'q' in vhost '/'"
    assert parse({"x-queue-type": "classic"}, **props)["queue-type"] == "classic"
    with pytest.raises(SoftError) as err:
        qa.parse({"x-queue-type": "quorum"}, "q", "/", True, None, True)
    assert "invalid property 'auto-delete'" in err.value.text


# -- redeclaration ---------------------------------------------------------------------


def test_equivalence_compares_table_rows_in_order() -> None:
    assert [r.argument for r in qa.EQUIVALENCE] == [
        "x-expires",
        "x-message-ttl",
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-dead-letter-strategy",
        "x-max-length",
        "x-max-length-bytes",
        "x-max-priority",
        "x-overflow",
        "x-queue-type",
        "x-single-active-consumer",
        "x-delivery-limit",
        "x-max-age",
        "x-stream-max-segment-size-bytes",
    ]
    current = dict(GOOD, **{"x-foo": 1})
    assert qa.inequivalent(current, current) is None
    # Not compared: queue-mode, consumer-timeout, delayed retry, unknown arguments.
    lax = {
        k: v
        for k, v in current.items()
        if k not in ("x-queue-mode", "x-consumer-timeout") and "delayed-retry" not in k
    }
    assert qa.inequivalent(lax, current) is None
    assert qa.inequivalent({**current, "x-max-length": 1}, current) == ("x-max-length", 1, 0)
    assert qa.inequivalent({**current, "x-message-ttl": 5, "x-expires": 9}, current) == (
        "x-expires",
        9,
        1,
    )
    absent = {k: v for k, v in current.items() if k != "x-single-active-consumer"}
    assert qa.inequivalent(absent, current) == ("x-single-active-consumer", None, True)


def test_equivalence_takes_an_unset_queue_type_as_classic() -> None:
    for unset in ({}, {"x-queue-type": None}, {"x-queue-type": ""}):
        assert qa.inequivalent(unset, {"x-queue-type": "classic"}) is None
    got = qa.inequivalent({"x-queue-type": "quorum"}, {})
    assert got == ("x-queue-type", "quorum", "classic")
    # Other defaults are not assumed: absent and explicit differ, as in RabbitMQ.
    assert qa.inequivalent({"x-overflow": "drop-head"}, {}) == ("x-overflow", "drop-head", None)


# -- policies --------------------------------------------------------------------------


def policy_error(definition: dict, operator: bool = False) -> str:
    with pytest.raises(PolicyError) as err:
        make_policy("/", "p", {"pattern": "^q", "definition": definition}, operator)
    return str(err.value).removeprefix("Validation failed\n\n").removesuffix("\n")


@pytest.mark.parametrize(
    ("key", "good", "bad", "text"),
    [
        ("message-ttl", 0, -1, "-1 is not a valid message TTL"),
        ("expires", 1, 0, "0 is not a valid queue expiry"),
        ("max-length", 0, "1", '<<"1">> is not a valid maximum length'),
        ("max-length-bytes", 5, True, "true is not a valid maximum length in bytes"),
        ("delivery-limit", 3, 1.5, "1.5 is not a valid delivery limit"),
        ("consumer-timeout", 0, -3, "-3 is not a valid consumer timeout"),
        ("overflow", "reject-publish", "bogus", '<<"bogus">> is not a valid overflow value'),
        ("queue-mode", "default", "eager", '<<"eager">> is not a valid queue-mode value'),
        ("dead-letter-exchange", "", 5, "5 is not a valid dead letter exchange name"),
        ("dead-letter-routing-key", "rk", False, "false is not a valid dead letter routing key"),
        ("max-age", "1D", 7, "7 is not a valid max-age value"),
        ("alternate-exchange", "ae", 1, "1 is not a valid alternate exchange name"),
    ],
)
def test_policy_keys(key: str, good: Any, bad: Any, text: str) -> None:
    policy = make_policy("/", "p", {"pattern": "^q", "definition": {key: good}})
    assert policy.definition == {key: good}
    assert policy_error({key: bad}) == text


def test_policy_keys_are_the_tables() -> None:
    queue_keys = {r.name for r in qa.ARGUMENTS if r.merge is not qa.ARGUMENT_ONLY}
    assert set(qa.POLICY_KEYS) == queue_keys
    for key in ("max-priority", "queue-type", "single-active-consumer", "x-message-ttl"):
        assert policy_error({key: 1}) == f'[{{<<"{key}">>,1}}] are not recognised policy settings'


def test_operator_policies_set_only_the_limits() -> None:
    assert set(qa.OPERATOR_KEYS) == {
        "message-ttl",
        "expires",
        "max-length",
        "max-length-bytes",
        "delivery-limit",
    }
    text = policy_error({"max-length": 1, "overflow": "drop-head"}, operator=True)
    assert text == '[{<<"overflow">>,<<"drop-head">>}] are not recognised policy settings'
    assert policy_error({"max-length": -1}, operator=True) == "-1 is not a valid maximum length"


def test_operator_policy_caps_the_policy() -> None:
    policy = make_policy("/", "p", {"pattern": "", "definition": {"max-length": 5, "expires": 10}})
    operator = make_policy(
        "/", "o", {"pattern": "", "definition": {"max-length": 9, "message-ttl": 3}}, True
    )
    merged = effective_definition(policy, operator)
    assert merged == {"max-length": 5, "expires": 10, "message-ttl": 3}
    assert effective_definition(None, operator) == operator.definition
    assert effective_definition(policy, None) == policy.definition


# -- argument and policy together --------------------------------------------------------


@pytest.mark.parametrize(
    ("merge", "argument", "policy", "result"),
    [
        (qa.SMALLER, 5, 3, 3),
        (qa.SMALLER, 2, 3, 2),
        (qa.SMALLER, None, 3, 3),
        (qa.SMALLER, 0, None, 0),
        (qa.ARGUMENT_WINS, "a", "p", "a"),
        (qa.ARGUMENT_WINS, None, "p", "p"),
        (qa.ARGUMENT_WINS, "", "p", ""),
        (qa.ARGUMENT_ONLY, 4, 9, 4),
        (qa.ARGUMENT_ONLY, None, 9, None),
        (qa.POLICY_ONLY, 4, 9, 9),
        (qa.POLICY_ONLY, 4, None, None),
        (qa.SHORTER, "1D", "2h", "2h"),
        (qa.SHORTER, "1Y", "13M", "1Y"),
        (qa.SHORTER, None, "2h", "2h"),
    ],
)
def test_merge_rules(merge: qa.Merge, argument: Any, policy: Any, result: Any) -> None:
    assert merge.combine(argument, policy) == result


def test_settings_combine_argument_and_policy_by_row() -> None:
    given = parse(
        {
            "x-message-ttl": 100,
            "x-max-length": 2,
            "x-overflow": "reject-publish",
            "x-queue-mode": "default",
        }
    )
    policy = {
        "message-ttl": 50,
        "max-length": 10,
        "overflow": "drop-head",
        "queue-mode": "lazy",
        "dead-letter-exchange": "pdlx",
        "consumer-timeout": 5,
        "delivery-limit": 1,
        "max-age": "1D",
    }
    values = qa.settings(given, policy, "classic")
    assert values == {
        "expires": None,
        "message-ttl": 50,  # smaller wins
        "dead-letter-exchange": "pdlx",  # the policy fills an absent argument
        "dead-letter-routing-key": None,
        "dead-letter-strategy": "at-most-once",  # quorum queues only: the default
        "max-length": 2,
        "max-length-bytes": None,
        "max-priority": 0,
        "overflow": "reject-publish",  # argument wins
        "queue-mode": "default",
        "queue-type": "classic",
        "single-active-consumer": False,
        "delivery-limit": None,  # quorum queues only
        "delayed-retry-type": "disabled",  # quorum queues only: the default
        "delayed-retry-min": None,
        "delayed-retry-max": None,
        "consumer-timeout": 5,
        "max-age": None,  # streams only
        "stream-max-segment-size-bytes": 500_000_000,  # the default (streams read it)
    }
    quorum = qa.settings(parse({"x-queue-type": "quorum", "x-delivery-limit": 4}), policy, "quorum")
    assert quorum["delivery-limit"] == 1 and quorum["queue-type"] == "quorum"
    assert qa.settings(parse({}), {}, "classic")["overflow"] == "drop-head"


def test_every_attr_is_a_queue_slot() -> None:
    for _, attr in qa.QUEUE_ATTRS:
        assert attr in Queue.__slots__


def test_table_invariants() -> None:
    names = [r.name for r in qa.ARGUMENTS]
    assert len(names) == len(set(names))
    for row in qa.ARGUMENTS:
        assert row.types <= set(qa.QUEUE_TYPES)
        assert row.requires is None or row.requires in qa.BY_NAME
        assert (row.argument is None) == (row.merge is qa.POLICY_ONLY)
        assert (row.policy_key is None) == (row.merge is qa.ARGUMENT_ONLY)
        assert not row.operator or row.merge is qa.SMALLER
    assert qa.OVERFLOW.values == qa.OVERFLOW_MODES and qa.QUEUE_MODE.values == qa.QUEUE_MODES
