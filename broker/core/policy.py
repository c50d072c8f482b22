"""Policies: RabbitMQ's way to set TTLs, length limits and dead-lettering on many queues at once.

A policy names a regular expression (searched for in object names, as RabbitMQ's `re:run`),
what it applies to, a priority and a definition. Of the policies whose pattern matches, the
one with the highest priority applies (ties: the first name in sort order); operator
policies are matched the same way, separately, and combined with it key by key: for the
numeric limits the smaller value wins. A queue's x-arguments combine with the result as in
RabbitMQ's classic queues: for message-ttl, expires, max-length, max-length-bytes and
delivery-limit the smaller of argument and policy wins; for everything else the argument
wins. Queues and exchanges are re-evaluated whenever a policy changes, and when they are
declared, without restarting anything.

Which keys a policy or an operator policy may set, their checks and how each combines with
an x-argument are rows of broker/core/queue_arguments.py's table; only the exchange keys are here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..routing.delayed import DELAYED_POLICY_KEY
from .queue_arguments import OPERATOR_KEYS, POLICY_KEYS, Bool, Check, Str

#: apply-to values: RabbitMQ 3.10's three, and 3.12's queue-type ones.
APPLY_TO = ("all", "queues", "exchanges", "classic_queues", "quorum_queues")

#: Policy keys of exchanges: (check, what an error calls it). The queue keys are the
#: table's (queue_arguments.POLICY_KEYS).
EXCHANGE_KEYS: dict[str, tuple[Check, str]] = {
    "alternate-exchange": (Str(), "alternate exchange name"),
    # LavinMQ's: true makes the exchange delayed, its type unchanged (broker/core/exchange.py)
    DELAYED_POLICY_KEY: (Bool(), "delayed message setting"),
}
#: Policy keys of exchanges and queues alike: federation's (broker/links/federation.py),
#: as rabbit_federation_parameters checks them; one or the other, never both.
FEDERATION_KEYS: dict[str, tuple[Check, str]] = {
    "federation-upstream-set": (Str(), "federation upstream set name"),
    "federation-upstream": (Str(), "federation upstream name"),
}
_KEYS = frozenset(POLICY_KEYS) | frozenset(EXCHANGE_KEYS) | frozenset(FEDERATION_KEYS)


class PolicyError(ValueError):
    """A policy RabbitMQ would refuse; ``str()`` is RabbitMQ's "Validation failed" reason."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"Validation failed\n\n{detail}\n")


def _erl(value: Any) -> str:
    """A JSON value as RabbitMQ's error texts print it."""
    if isinstance(value, str):
        return f'<<"{value}">>'
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _validate(key: str, value: Any) -> None:
    if key in POLICY_KEYS:
        row = POLICY_KEYS[key]
        check, noun = row.check, row.noun
    else:
        check, noun = EXCHANGE_KEYS.get(key) or FEDERATION_KEYS[key]
    if not check.accepts(value):
        raise PolicyError(f"{_erl(value)} is not a valid {noun}")


@dataclass(frozen=True)
class Policy:
    vhost: str
    name: str
    pattern: str
    apply_to: str
    priority: int
    definition: dict[str, Any]
    operator: bool = False
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_regex", re.compile(self.pattern))

    def applies_to(self, kind: str, name: str, queue_type: str = "classic") -> bool:
        """Whether this policy's apply-to and pattern select the queue or exchange."""
        target = self.apply_to
        if kind == "exchange":
            wanted = target in ("all", "exchanges")
        else:
            wanted = (
                target in ("all", "queues")
                or (target == "classic_queues" and queue_type == "classic")
                or (target == "quorum_queues" and queue_type == "quorum")
            )
        return wanted and self._regex.search(name) is not None

    def row(self) -> dict[str, Any]:
        """As GET /api/policies shows it (and definitions.json holds it)."""
        return {
            "vhost": self.vhost,
            "name": self.name,
            "pattern": self.pattern,
            "apply-to": self.apply_to,
            "definition": dict(self.definition),
            "priority": self.priority,
        }


def make_policy(vhost: str, name: str, body: dict[str, Any], operator: bool = False) -> Policy:
    """A Policy from an API body or a definitions entry, validated as RabbitMQ does."""
    pattern = body.get("pattern")
    if not isinstance(pattern, str):
        raise PolicyError(f"pattern should be a string but is {_erl(pattern)}")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise PolicyError(f"pattern should be regular expression but is invalid: {exc}") from None
    apply_to = body.get("apply-to", "all")
    if apply_to not in APPLY_TO:
        raise PolicyError(
            f"apply-to '{apply_to}' unrecognised; should be 'queues', 'exchanges' or 'all'"
        )
    priority = body.get("priority", 0)
    if type(priority) is not int:
        raise PolicyError(f"priority should be a number, actually was {_erl(priority)}")
    definition = body.get("definition")
    if not isinstance(definition, dict) or not definition:
        raise PolicyError("no policy provided")
    allowed = OPERATOR_KEYS if operator else _KEYS
    unknown = [(k, v) for k, v in definition.items() if k not in allowed]
    if unknown:
        terms = ",".join(f"{{{_erl(k)},{_erl(v)}}}" for k, v in unknown)
        raise PolicyError(f"[{terms}] are not recognised policy settings")
    for key, value in definition.items():
        _validate(key, value)
    if all(key in definition for key in FEDERATION_KEYS):
        raise PolicyError("cannot specify federation-upstream and federation-upstream-set together")
    return Policy(vhost, name, pattern, apply_to, priority, dict(definition), operator)


def best(policies: Any, kind: str, name: str, queue_type: str = "classic") -> Policy | None:
    """The matching policy of highest priority (ties: the first name), or None."""
    found: Policy | None = None
    for p in policies:
        if p.applies_to(kind, name, queue_type) and (
            found is None
            or p.priority > found.priority
            or (p.priority == found.priority and p.name < found.name)
        ):
            found = p
    return found


def effective_definition(policy: Policy | None, operator: Policy | None) -> dict[str, Any]:
    """What a policy and an operator policy set together: operator keys are all limits
    where the smaller number wins (queue_arguments asserts it of its table)."""
    merged = dict(policy.definition) if policy is not None else {}
    if operator is not None:
        for key, value in operator.definition.items():
            merged[key] = OPERATOR_KEYS[key].merge.combine(value, merged.get(key))
    return merged
