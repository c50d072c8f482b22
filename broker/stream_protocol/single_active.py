"""Single active consumer (RabbitMQ 3.11+): subscriptions to one stream that share a name
(`single-active-consumer: true` and `name` in the subscribe's properties) form a group of
which one reads at a time. On a plain stream the oldest member is active; on a partition of
a super stream (`super-stream` given) the active member is the one at the partition's
index modulo the group's size, so a super stream's partitions spread over its consumers.

A member that becomes active is sent consumer-update (active) and starts reading where
its answer says (the offset specification it sends back: where the previous one left
off, typically from a stored offset); one that stops being active is sent consumer-update
(inactive) and stops at once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .connection import Subscription

#: (stream, group name) -> members, oldest first.
_GROUPS: dict[tuple[Any, str | None], list[Subscription]] = {}


def join(sub: Subscription) -> None:
    assert sub.group is not None
    _GROUPS.setdefault((sub.stream, sub.group), []).append(sub)
    _rebalance(sub)


def leave(sub: Subscription) -> None:
    """A member unsubscribed, closed its connection, or lost its stream."""
    key = (sub.stream, sub.group)
    members = _GROUPS.get(key)
    if members is None or sub not in members:
        return
    members.remove(sub)
    was_active = sub.active
    sub.active = False
    if not members:
        del _GROUPS[key]
    elif was_active:
        _rebalance(members[0])


def members(stream: Any, group: str) -> list[Subscription]:
    return list(_GROUPS.get((stream, group), ()))


def _rebalance(any_member: Subscription) -> None:
    group = _GROUPS.get((any_member.stream, any_member.group), [])
    if not group:
        return
    index = any_member.partition_index % len(group) if any_member.super_stream else 0
    chosen = group[index]
    for member in group:
        if member is not chosen and member.active:
            member.deactivate()
    if not chosen.active:
        chosen.activate()
