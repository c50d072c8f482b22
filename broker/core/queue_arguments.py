"""Queue arguments: every x-argument and policy key of a queue, one row each.

RabbitMQ keeps its queue arguments in one list (`rabbit_amqqueue:declare_args/0`, one
validator per key) and how each combines with a policy beside it; this is RoarMQ's list.
A row says how a value is checked (and the exact 406 text when it is not valid), which
policy key it pairs with and how the two combine, whether an operator policy may set
it, whether a redeclaration must repeat it, which queue types it takes effect on, and
the Queue attribute that holds the value in force. `parse` (queue.declare),
`inequivalent` (a redeclaration), `settings` (a queue's values under its policies) and
broker/core/policy.py (validation, operator merge) all read ARGUMENTS; nothing here runs per
message: a Queue copies its settings into plain attributes when declared and when its
policy changes.

To add a queue argument, add a row (and, if the value does something, the Queue slot
named by its `attr` and the code that reads it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from roarmq.protocol.errors import PRECONDITION_FAILED

from ..errors import channel_error

OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
QUEUE_MODES = ("default", "lazy")
#: The values of x-delayed-retry-type (RabbitMQ 4.3's quorum queues): which returned
#: messages wait before they are ready again (`Queue.requeue`).
RETRY_TYPES = ("disabled", "all", "failed", "returned")
#: The values of x-dead-letter-strategy (quorum queues): at-least-once keeps a
#: dead-lettered message until its targets took it (`Queue._dead_letter_entry`).
DLX_STRATEGIES = ("at-most-once", "at-least-once")


class Invalid(ValueError):
    """An argument's value is refused; ``str()`` is RabbitMQ's detail after "invalid arg"."""


# -- value checks: an argument's 406 detail, a policy value's validity ------------------


class Check:
    """How one value is checked; ``argument`` returns it or raises Invalid."""

    def argument(self, value: Any) -> Any:
        raise NotImplementedError

    def accepts(self, value: Any) -> bool:
        """Whether a policy may hold the value (its error text is broker/core/policy.py's)."""
        raise NotImplementedError

    def compared(self, value: Any) -> Any:
        """The value a redeclaration is compared by (absent is None)."""
        return value


#: The field type a client sends a decoded value as, by its Python type (an int:
#: `amqp_type_name`), as RabbitMQ names it in its errors.
_AMQP_TYPE_NAMES = {
    str: "longstr",
    bytes: "longstr",
    float: "double",
    bool: "bool",
    dict: "table",
    list: "array",
    type(None): "void",
}


def amqp_type_name(value: Any) -> str:
    """RabbitMQ's name for the field type a value came as: an int as clients send one
    (pika, the .NET and Java clients: `signedint` when it fits 32 bits, else `long`)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return "signedint" if -(2**31) <= value < 2**31 else "long"
    return _AMQP_TYPE_NAMES.get(type(value), type(value).__name__)


def _unacceptable_type(value: Any) -> Invalid:
    return Invalid(f"{{unacceptable_type,{amqp_type_name(value)}}}")


@dataclass(frozen=True)
class Int(Check):
    """An integer from `minimum` (0 or 1) to `maximum`: RabbitMQ's non_neg_int / positive;
    another type reads "expected integer, got longstr" (probed on 3.10.8)."""

    minimum: int = 0
    maximum: int | None = None

    def argument(self, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            raise Invalid(f'"expected integer, got {amqp_type_name(value)}"')
        if value < self.minimum:
            raise Invalid(f"{{value_{'zero' if value == 0 else 'negative'},{value}}}")
        if self.maximum is not None and value > self.maximum:
            raise Invalid(f"{{value_too_large,{value}}}")
        return value

    def accepts(self, value: Any) -> bool:
        return (
            type(value) is int
            and value >= self.minimum
            and (self.maximum is None or value <= self.maximum)
        )


@dataclass(frozen=True)
class Str(Check):
    """A string; a void (None) argument counts as absent."""

    def argument(self, value: Any) -> Any:
        if value is not None and not isinstance(value, str):
            raise _unacceptable_type(value)
        return value

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str)


@dataclass(frozen=True)
class Bool(Check):
    def argument(self, value: Any) -> Any:
        if not isinstance(value, bool):
            raise _unacceptable_type(value)
        return value

    def accepts(self, value: Any) -> bool:
        return isinstance(value, bool)


@dataclass(frozen=True)
class OneOf(Check):
    """One of `values`; `refused` is the detail for another ({} is the value); anything but
    a string (void too) is an unacceptable type."""

    values: tuple[str, ...]
    refused: str

    def argument(self, value: Any) -> Any:
        if not isinstance(value, str):
            raise _unacceptable_type(value)
        if value not in self.values:
            raise Invalid(self.refused.format(value))
        return value

    def accepts(self, value: Any) -> bool:
        return value in self.values


# -- queue types ----------------------------------------------------------------------


@dataclass(frozen=True)
class QueueType:
    """A value of x-queue-type: the properties it refuses, or why it is refused outright."""

    name: str
    refuses: tuple[str, ...] = ()  # of PROPERTIES
    unsupported: str | None = None
    #: What a refusal calls each of PROPERTIES (RabbitMQ's streams say "exclusive-owner").
    property_names: tuple[str, ...] = ()
    #: x-arguments refused outright: "invalid arg ... of queue type {module}".
    invalid_arguments: frozenset[str] = frozenset()
    module: str = ""
    #: basic.consume arguments of this type's own; one that only other types take is
    #: refused ("invalid arg ... of queue type {module}", RabbitMQ's consumer_arguments).
    consumer_arguments: frozenset[str] = frozenset()
    #: Whether queue.declare with an empty name may create one (RabbitMQ's server_named).
    server_named: bool = True
    #: Whether queue.delete's if-unused and if-empty apply: RabbitMQ's stream delete
    #: ignores both (every release, 3.9 to 4.2), so a stream is deleted whatever it holds.
    conditional_delete: bool = True


#: The queue properties a type may refuse, in the order they are checked.
PROPERTIES = ("non-durable", "exclusive", "auto-delete")
_REPLICATED = PROPERTIES
QUEUE_TYPES = {
    t.name: t
    for t in (
        QueueType(
            "classic",
            module="rabbit_classic_queue",
            # rabbit_classic_queue's capabilities (probed on 3.10.8)
            invalid_arguments=frozenset(("x-dead-letter-strategy",)),
            consumer_arguments=frozenset(("x-cancel-on-ha-failover", "x-priority", "x-credit")),
        ),
        QueueType(
            "quorum",
            refuses=_REPLICATED,
            module="rabbit_quorum_queue",
            consumer_arguments=frozenset(("x-priority", "x-credit")),
            server_named=False,
        ),
        QueueType(
            "stream",
            refuses=_REPLICATED,
            property_names=("non-durable", "exclusive-owner", "auto-delete"),
            consumer_arguments=frozenset(("x-stream-offset", "x-credit")),
            server_named=False,
            conditional_delete=False,
            # rabbit_stream_queue's capabilities: invalid_arguments (probed on 3.10.8)
            invalid_arguments=frozenset(
                "x-" + name
                for name in (
                    "expires",
                    "message-ttl",
                    "max-length",
                    "max-in-memory-length",
                    "max-in-memory-bytes",
                    "quorum-initial-group-size",
                    "dead-letter-exchange",
                    "dead-letter-routing-key",
                    "single-active-consumer",
                    "queue-mode",
                    "overflow",
                    "max-priority",
                    "queue-master-locator",
                    "delivery-limit",
                )
            ),
            module="rabbit_stream_queue",
        ),
    )
}
DEFAULT_QUEUE_TYPE = "classic"
#: Every type's consumer arguments (3.10.8's capabilities, probed): a type refuses the
#: ones it does not take itself.
_CONSUMER_ARGUMENTS = frozenset().union(*(t.consumer_arguments for t in QUEUE_TYPES.values()))


def check_server_named(args: Mapping[str, Any] | None) -> None:
    """queue.declare with an empty name: refused for a type whose queues cannot be
    server-named (quorum, stream), before anything else about the declare is checked, with
    RabbitMQ's 406 text."""
    value = (args or {}).get("x-queue-type", DEFAULT_QUEUE_TYPE)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    kind = QUEUE_TYPES.get(value) if isinstance(value, str) else None
    if kind is not None and not kind.server_named:
        raise channel_error(
            PRECONDITION_FAILED, f"Cannot declare a server-named queue for type {kind.module}"
        )


def check_consumer_arguments(queue_type: str, args: Mapping[str, Any], description: str) -> None:
    """basic.consume's arguments that belong to other queue types (x-stream-offset on a
    classic queue, x-cancel-on-ha-failover on a quorum queue): 406, as RabbitMQ refuses
    them. `description` names the queue: "queue 'q' in vhost '/'"."""
    kind = QUEUE_TYPES[queue_type]
    for key in args:
        if key in _CONSUMER_ARGUMENTS and key not in kind.consumer_arguments:
            raise channel_error(
                PRECONDITION_FAILED,
                f"invalid arg '{key}' for {description} of queue type {kind.module}",
            )


@dataclass(frozen=True)
class QueueTypeCheck(Check):
    def argument(self, value: Any) -> Any:
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        kind = QUEUE_TYPES.get(value) if isinstance(value, str) else None
        if kind is None:
            names = ", ".join(QUEUE_TYPES)
            raise Invalid(f'"{value}" is not a valid queue type ({names})')
        if kind.unsupported is not None:
            raise Invalid(kind.unsupported)
        return value

    def accepts(self, value: Any) -> bool:
        return False  # no policy sets a queue's type

    def compared(self, value: Any) -> Any:
        return value or DEFAULT_QUEUE_TYPE


@dataclass(frozen=True)
class MaxAge(Check):
    """A stream's max age: a positive count and one of Y M D h m s ("7D", "12h")."""

    def argument(self, value: Any) -> Any:
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if not isinstance(value, str):
            raise _unacceptable_type(value)
        if age_seconds(value) is None:
            raise Invalid("invalid_max_age")
        return value

    def accepts(self, value: Any) -> bool:
        return age_seconds(value) is not None


# -- how an x-argument and a policy combine ---------------------------------------------


class Merge(Enum):
    """How a row's x-argument and its policy key (of the same name) combine."""

    ARGUMENT_ONLY = "argument only"  # no policy key
    SMALLER = "smaller wins"  # numeric limits: the smaller of argument and policy
    ARGUMENT_WINS = "argument wins"  # the policy applies when the argument is absent
    POLICY_ONLY = "policy only"  # no x-argument (yet)
    SHORTER = "shorter wins"  # ages ("7D", "1h"): the shorter of argument and policy

    def combine(self, argument: Any, policy: Any) -> Any:
        return _COMBINE[self](argument, policy)


def _argument_only(argument: Any, policy: Any) -> Any:
    return argument


def _smaller(argument: Any, policy: Any) -> Any:
    if argument is None:
        return policy
    return argument if policy is None else min(argument, policy)


def _argument_wins(argument: Any, policy: Any) -> Any:
    return policy if argument is None else argument


_AGE = re.compile(r"^([0-9]+)([YMDhms])$")
_AGE_SECONDS = {"Y": 365 * 86400, "M": 30 * 86400, "D": 86400, "h": 3600, "m": 60, "s": 1}


def age_seconds(value: Any) -> int | None:
    """RabbitMQ's max-age / interval syntax ("7D", "1h", "30m"): seconds, None if invalid."""
    if not isinstance(value, str):
        return None
    m = _AGE.match(value)
    if m is None or int(m.group(1)) == 0:
        return None
    return int(m.group(1)) * _AGE_SECONDS[m.group(2)]


def _policy_only(argument: Any, policy: Any) -> Any:
    return policy


def _shorter(argument: Any, policy: Any) -> Any:
    if argument is None:
        return policy
    if policy is None:
        return argument
    return min(argument, policy, key=lambda v: age_seconds(v) or 0)


_COMBINE = {
    Merge.ARGUMENT_ONLY: _argument_only,
    Merge.SMALLER: _smaller,
    Merge.ARGUMENT_WINS: _argument_wins,
    Merge.POLICY_ONLY: _policy_only,
    Merge.SHORTER: _shorter,
}
ARGUMENT_ONLY = Merge.ARGUMENT_ONLY
SMALLER = Merge.SMALLER
ARGUMENT_WINS = Merge.ARGUMENT_WINS
POLICY_ONLY = Merge.POLICY_ONLY
SHORTER = Merge.SHORTER


# -- the table ------------------------------------------------------------------------

CLASSIC_QUORUM = frozenset(("classic", "quorum"))


@dataclass(frozen=True)
class Argument:
    """One queue setting: x-`name` as an argument, `name` as a policy key."""

    name: str
    check: Check
    merge: Merge
    #: What a policy error calls it: "<<"x">> is not a valid {noun}".
    noun: str = ""
    #: An operator policy may set it (always with SMALLER: the operator's cap holds).
    operator: bool = False
    #: A redeclaration must repeat it (RabbitMQ's assert_args_equivalence).
    equivalence: bool = True
    #: The queue types it takes effect on; others accept the argument and ignore it.
    types: frozenset[str] = CLASSIC_QUORUM
    #: The Queue attribute holding the value in force (None: Queue._settle reads it).
    attr: str | None = None
    #: The value in force when neither argument nor policy sets it.
    default: Any = None
    #: Another row (by name) whose argument must be present when this one is.
    requires: str | None = None
    #: "x-" + name, or None for a policy-only key.
    argument: str | None = field(init=False)
    #: name, or None for an argument no policy sets.
    policy_key: str | None = field(init=False)

    def __post_init__(self) -> None:
        argument = None if self.merge is POLICY_ONLY else "x-" + self.name
        object.__setattr__(self, "argument", argument)
        key = None if self.merge is ARGUMENT_ONLY else self.name
        object.__setattr__(self, "policy_key", key)


#: The values of x-overflow and x-queue-mode, and their checks.
OVERFLOW = OneOf(OVERFLOW_MODES, '{{unacceptable_value,<<"{}">>}}')
QUEUE_MODE = OneOf(QUEUE_MODES, "\"unsupported queue mode '{}'\"")
RETRY_TYPE = OneOf(RETRY_TYPES, '{{unacceptable_value,<<"{}">>}}')
DLX_STRATEGY = OneOf(DLX_STRATEGIES, "invalid_dlx_strategy")

_CQ = CLASSIC_QUORUM
_Q = frozenset(("quorum",))
_ALL = frozenset(QUEUE_TYPES)
_S = frozenset(("stream",))
_CQS = frozenset(("classic", "quorum", "stream"))

#: In RabbitMQ's declare_args order, which is the order arguments are checked and
#: compared on redeclaration (x-queue-type is checked first: it selects the others).
#: Columns: name (x-name is the argument), check, how argument and policy combine, what
#: a policy error calls it, operator policy may set it, compared on redeclaration, queue
#: types it takes effect on, Queue attribute holding the value in force, default.
# fmt: off
ARGUMENTS: tuple[Argument, ...] = (
    #        name                       check             with a policy  a policy error calls it      oper.  redecl types Queue attribute   default
    Argument("expires",                 Int(1),           SMALLER,       "queue expiry",              True,  True,  _CQ,  "expires"),
    Argument("message-ttl",             Int(),            SMALLER,       "message TTL",               True,  True,  _CQ,  "message_ttl"),
    Argument("dead-letter-exchange",    Str(),            ARGUMENT_WINS, "dead letter exchange name", False, True,  _CQ,  "dlx"),
    Argument("dead-letter-routing-key", Str(),            ARGUMENT_WINS, "dead letter routing key",   False, True,  _CQ,  "dlrk",
             requires="dead-letter-exchange"),
    Argument("dead-letter-strategy",    DLX_STRATEGY,     ARGUMENT_WINS, "dead letter strategy",      False, True,  _Q,   "dlx_strategy",
             "at-most-once"),
    Argument("max-length",              Int(),            SMALLER,       "maximum length",            True,  True,  _CQ,  "max_length"),
    Argument("max-length-bytes",        Int(),            SMALLER,       "maximum length in bytes",   True,  True,  _CQS, "max_length_bytes"),
    Argument("max-priority",            Int(0, 255),      ARGUMENT_ONLY, "",                          False, True,  _CQ,  "max_priority", 0),
    Argument("overflow",                OVERFLOW,         ARGUMENT_WINS, "overflow value",            False, True,  _CQ,  "overflow", "drop-head"),
    Argument("queue-mode",              QUEUE_MODE,       ARGUMENT_WINS, "queue-mode value",          False, False, _CQ,  None),
    Argument("queue-type",              QueueTypeCheck(), ARGUMENT_ONLY, "",                          False, True,  _ALL, "queue_type", DEFAULT_QUEUE_TYPE),
    Argument("single-active-consumer",  Bool(),           ARGUMENT_ONLY, "",                          False, True,  _CQ,  "single_active", False),
    Argument("delivery-limit",          Int(),            SMALLER,       "delivery limit",            True,  True,  _Q,   "delivery_limit"),
    Argument("delayed-retry-type",      RETRY_TYPE,       ARGUMENT_WINS, "delayed retry type",        False, False, _Q,   "retry_type", "disabled"),
    Argument("delayed-retry-min",       Int(),            ARGUMENT_WINS, "delayed retry minimum",     False, False, _Q,   "retry_min"),
    Argument("delayed-retry-max",       Int(),            ARGUMENT_WINS, "delayed retry maximum",     False, False, _Q,   "retry_max"),
    Argument("consumer-timeout",        Int(),            ARGUMENT_WINS, "consumer timeout",          False, False, _CQ,  None),
    Argument("max-age",                 MaxAge(),         SHORTER,       "max-age value",             False, True,  _S,   None),
    Argument("stream-max-segment-size-bytes", Int(), ARGUMENT_ONLY, "",                       False, True,  _S,   None,
             500_000_000),
)
# fmt: on

BY_NAME = {row.name: row for row in ARGUMENTS}
#: Policy key -> row, for the keys a policy may set on a queue.
POLICY_KEYS = {row.policy_key: row for row in ARGUMENTS if row.policy_key}
#: Policy key -> row, for the keys an operator policy may set.
OPERATOR_KEYS = {row.name: row for row in ARGUMENTS if row.operator}
EQUIVALENCE = tuple(row for row in ARGUMENTS if row.equivalence and row.argument)
_QUEUE_TYPE = BY_NAME["queue-type"]

assert all(row.merge is SMALLER for row in OPERATOR_KEYS.values()), "operator caps are minima"
assert all(row.noun for row in POLICY_KEYS.values()), "a policy error names the key"


# -- declaration, redeclaration, settings ---------------------------------------------


def _invalid(key: str, name: str, vhost: str, detail: str) -> Exception:
    return channel_error(
        PRECONDITION_FAILED, f"invalid arg '{key}' for queue '{name}' in vhost '{vhost}': {detail}"
    )


def _checked(row: Argument, key: str, args: Mapping[str, Any], name: str, vhost: str) -> Any:
    try:
        return row.check.argument(args[key])
    except Invalid as exc:
        raise _invalid(key, name, vhost, str(exc)) from None


#: (row, its argument, the argument it requires) in check order, x-queue-type apart.
_DECLARED = tuple(
    (row, row.argument, row.requires and BY_NAME[row.requires].argument)
    for row in ARGUMENTS
    if row.argument is not None and row is not _QUEUE_TYPE
)


def parse(
    args: Mapping[str, Any],
    name: str,
    vhost: str,
    durable: bool,
    exclusive: Any,
    auto_delete: bool,
) -> dict[str, Any]:
    """queue.declare's x-arguments checked as RabbitMQ checks them (406 on a bad one):
    the given ones by row name, and always "queue-type". Unknown x-arguments are kept
    on the queue and ignored, as in RabbitMQ."""
    qtype = DEFAULT_QUEUE_TYPE
    if "x-queue-type" in args:
        qtype = _checked(_QUEUE_TYPE, "x-queue-type", args, name, vhost)
    kind = QUEUE_TYPES[qtype]
    if kind.refuses:
        names = kind.property_names or PROPERTIES
        for prop, said, bad in zip(
            PROPERTIES, names, (not durable, exclusive, auto_delete), strict=True
        ):
            if bad and prop in kind.refuses:
                raise channel_error(
                    PRECONDITION_FAILED,
                    f"invalid property '{said}' for queue '{name}' in vhost '{vhost}'",
                )
    if kind.invalid_arguments:
        for key in args:
            if key in kind.invalid_arguments:
                raise channel_error(
                    PRECONDITION_FAILED,
                    f"invalid arg '{key}' for queue '{name}' in vhost '{vhost}' of queue type "
                    f"{kind.module}",
                )
    given = {"queue-type": qtype}
    for row, key, needed in _DECLARED:
        if key not in args:
            continue
        value = given[row.name] = _checked(row, key, args, name, vhost)
        if needed and value is not None and args.get(needed) is None:
            raise _invalid(key, name, vhost, f"Key '{needed}' is mandatory if '{key}' is present")
    return given


def inequivalent(new: Mapping[str, Any], current: Mapping[str, Any]) -> tuple[str, Any, Any] | None:
    """The first argument a redeclaration must repeat but does not: (key, new, current)."""
    for row in EQUIVALENCE:
        key = row.argument
        assert key is not None  # (EQUIVALENCE holds rows with an argument only)
        got, cur = row.check.compared(new.get(key)), row.check.compared(current.get(key))
        if got != cur:
            return key, got, cur
    return None


def settings(
    given: Mapping[str, Any], policy: Mapping[str, Any], queue_type: str
) -> dict[str, Any]:
    """Each row's value in force, by row name: its argument (`parse`'s) and its effective
    policy (broker/core/policy.py's effective_definition) combined by the row's rule, or the
    row's default; None on queue types the row does not take effect on."""
    out = {}
    for name, combine, default in _PLANS[queue_type]:
        argument, set_by_policy = given.get(name), policy.get(name)
        value = None
        if combine is not None and (argument is not None or set_by_policy is not None):
            value = combine(argument, set_by_policy)
        out[name] = default if value is None else value
    return out


#: Per queue type, each row's (name, how it combines or None where ignored, default).
_PLANS = {
    qtype: tuple(
        (row.name, _COMBINE[row.merge] if qtype in row.types else None, row.default)
        for row in ARGUMENTS
    )
    for qtype in QUEUE_TYPES
}


#: (row name, Queue attribute) for the rows whose value a Queue holds as it is.
QUEUE_ATTRS = tuple((row.name, row.attr) for row in ARGUMENTS if row.attr)
