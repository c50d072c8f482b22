"""RabbitMQ's `rabbit_parameter_validation`: the checks runtime parameters (shovels,
federation upstreams) are made of, each refusal worded as RabbitMQ words it (its format
strings, values printed as Erlang's `~p` prints what RabbitMQ decoded from JSON)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..core.erlang import binaries, format_term

#: A rule: a key, its check (None or a refusal, or a nested check's list of refusals),
#: and whether the key is mandatory.
Rule = tuple[str, Callable[[str, Any], Any], bool]


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def shown(value: Any) -> str:
    return format_term(binaries(value))


def number(key: str, value: Any) -> str | None:
    return None if is_number(value) else f"{key} should be a number, actually was {shown(value)}"


def binary(key: str, value: Any) -> str | None:
    return (
        None if isinstance(value, str) else f"{key} should be binary, actually was {shown(value)}"
    )


def boolean(key: str, value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    return f"{key} should be boolean, actually was {shown(value)}"


def queue_name(key: str, value: Any) -> str | None:
    if not isinstance(value, str):
        return f"{key} should be binary, actually was {shown(value)}"
    size = len(value.encode())
    return None if size <= 255 else f"{key} should be less than 255 bytes, actually was {size}"


def enum(options: tuple[str, ...]) -> Callable[[str, Any], str | None]:
    listed = format_term([o.encode() for o in options])

    def check(key: str, value: Any) -> str | None:
        if not isinstance(value, str):
            return f"{key} should be binary, actually was {shown(value)}"
        if value in options:
            return None
        return f"{key} should be one of {listed}, actually was {shown(value)}"

    return check


def delete_after(key: str, value: Any) -> str | None:
    if value in ("never", "queue-length") or (
        isinstance(value, int) and not isinstance(value, bool) and value >= 0
    ):
        return None
    return (
        f'{key} should be a number greater than or equal to 0, "never" or '
        f'"queue-length", actually was {shown(value)}'
    )


def proplist(name: str, rules: Sequence[Rule], value: Any) -> list[str]:
    """rabbit_parameter_validation:proplist: each rule's refusals (the last rule's first,
    as its fold leaves them), a missing mandatory key, then any key no rule names."""
    if not isinstance(value, dict):
        return [f"{name} not a list {shown(value)}"]
    rest = dict(sorted(value.items()))  # an Erlang map's order: by key
    found: list[str] = []
    for key, check, mandatory in rules:
        if key in rest:
            result = check(key, rest.pop(key))
            if isinstance(result, list):  # a nested check's refusals, in their order
                found[:0] = result
            elif result is not None:
                found.insert(0, result)
        elif mandatory:
            found.insert(0, f'Key "{key}" not found in {name}')
    if rest:
        found.insert(0, f"Unrecognised terms {shown(list(rest.items()))} in {name}")
    return found
