"""A dynamic shovel's definition, the value of a runtime parameter of component `shovel`:
checked as RabbitMQ 3.10.8's `rabbit_shovel_parameters` checks it (every refusal listed,
in its words and order), then read into a `ShovelDefinition`.

RabbitMQ's checks, kept here: a source is a queue or an exchange (not both, not neither),
a destination at most one of them; a numerical `src-delete-after` cannot go with `no-ack`;
then each key against its rule (`src-uri` and `dest-uri` are mandatory, one URI or a list
of them, each one RabbitMQ's Erlang client would take; a local one, `amqp://` with no
host, must name a vhost the user may use), and a key no rule names is refused.
Pre-3.7 names (`prefetch-count`, `delete-after`, `add-forward-headers`,
`add-timestamp-header`, `publish-properties`) are taken as RabbitMQ takes them, the newer
name winning. Queue and consumer arguments are refused only for an unknown key (RabbitMQ
checks their values when it declares or consumes: so does the shovel, which then shows
the refusal as its state).

RoarMQ shovels speak AMQP 0-9-1 at both ends: `src-protocol` or `dest-protocol` `amqp10`
is refused, in our words.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.parameters import ParameterError
from . import validation as rule
from .uri import AmqpUri, UriError, parse_uri
from .validation import Rule

ACK_MODES = ("no-ack", "on-publish", "on-confirm")
PROTOCOLS = ("amqp10", "amqp091")
#: rabbit_shovel.hrl's defaults.
DEFAULT_PREFETCH = 1000
DEFAULT_ACK_MODE = "on-confirm"
DEFAULT_RECONNECT_DELAY = 5
#: The queue arguments `src-queue-args` / `dest-queue-args` may name (rabbit_amqqueue's
#: declare_args) and the consumer arguments `src-consumer-args` may (consume_args).
QUEUE_ARGUMENTS = (
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-dead-letter-strategy",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-version",
    "x-single-active-consumer",
    "x-queue-type",
    "x-quorum-initial-group-size",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size",
    "x-queue-leader-locator",
)
CONSUMER_ARGUMENTS = ("x-priority", "x-cancel-on-ha-failover", "x-stream-offset")
#: `dest-publish-properties`: the basic properties a shovel sets on what it publishes,
#: with their kinds ("s": a string, "n": a number).
PUBLISH_PROPERTIES = {
    "content_type": "s",
    "content_encoding": "s",
    "delivery_mode": "n",
    "priority": "n",
    "correlation_id": "s",
    "reply_to": "s",
    "expiration": "s",
    "message_id": "s",
    "timestamp": "n",
    "type": "s",
    "user_id": "s",
    "app_id": "s",
    "cluster_id": "s",
}


class DefinitionError(ParameterError):
    """A definition RabbitMQ would refuse (a runtime parameter's refusal)."""


@dataclass(frozen=True)
class ShovelDefinition:
    """What a shovel does, read from a checked definition."""

    src_uris: tuple[AmqpUri, ...]
    dest_uris: tuple[AmqpUri, ...]
    src_queue: str | None = None
    src_exchange: str | None = None
    src_exchange_key: str = ""
    src_queue_args: dict[str, Any] = field(default_factory=dict)
    src_consumer_args: dict[str, Any] = field(default_factory=dict)
    prefetch_count: int = DEFAULT_PREFETCH
    delete_after: str | int = "never"  # "never", "queue-length" or a count
    dest_queue: str | None = None
    dest_exchange: str | None = None
    dest_exchange_key: str | None = None  # None: the message's own routing key
    dest_queue_args: dict[str, Any] = field(default_factory=dict)
    add_forward_headers: bool = False
    add_timestamp_header: bool = False
    publish_properties: dict[str, Any] = field(default_factory=dict)
    ack_mode: str = DEFAULT_ACK_MODE
    reconnect_delay: float = DEFAULT_RECONNECT_DELAY


def _only(allowed: tuple[str, ...]) -> Callable[[str, Any], list[str]]:
    """Arguments whose keys RabbitMQ knows (their values are checked where used)."""

    def check(key: str, value: Any) -> list[str]:
        if not isinstance(value, dict):
            return [f"{key} not a list {rule.shown(value)}"]
        unknown = [(k, v) for k, v in sorted(value.items()) if k not in allowed]
        return [f"Unrecognised terms {rule.shown(unknown)} in {key}"] if unknown else []

    return check


def _properties(key: str, value: Any) -> list[str]:
    rules = [
        (prop, rule.binary if kind == "s" else rule.number, False)
        for prop, kind in PUBLISH_PROPERTIES.items()
    ]
    return rule.proplist(key, rules, value)


def check_shovel(
    name: str,
    value: Any,
    *,
    user: str = "guest",
    may_use_vhost: Callable[[str], bool] = lambda vhost: True,
) -> ShovelDefinition:
    """The definition `value` of shovel `name`, checked (DefinitionError with every
    refusal) and read. `may_use_vhost`: whether `user` (who sets the parameter) may use a
    vhost of this broker, which a local URI (`amqp://`, no host) reaches without a login."""
    if not isinstance(value, dict):
        raise DefinitionError([f"{name} not a list {rule.shown(value)}"])
    errors: list[str] = []
    for end in ("src", "dest"):
        protocol = value.get(f"{end}-protocol", "amqp091")
        if protocol == "amqp10":
            errors.append(
                f"{end}-protocol amqp10 is not supported: RoarMQ shovels speak AMQP 0-9-1 "
                "at both ends"
            )
    sources = [k for k in ("src-exchange", "src-queue") if k in value]
    if not sources:
        errors.append("Must specify 'src-exchange' or 'src-queue'")
    elif len(sources) == 2:
        errors.append("Cannot specify 'src-exchange' and 'src-queue'")
    deleting = value.get("src-delete-after", value.get("delete-after"))
    if rule.is_number(deleting) and value.get("ack-mode") == "no-ack":
        errors.append("Cannot specify 'no-ack' and numerical 'delete-after'")
    if "dest-exchange" in value and "dest-queue" in value:
        errors.append("Cannot specify 'dest-exchange' and 'dest-queue'")
    uris: dict[str, list[AmqpUri]] = {}

    def uri_rule(key: str, term: Any) -> str | None:
        texts = [term] if isinstance(term, str) else term
        if not isinstance(texts, list):
            return f"{key} should be list, actually was {rule.shown(term)}"
        parsed = []
        for text in texts:
            if not isinstance(text, str):
                return f"{key} should be binary, actually was {rule.shown(text)}"
            try:
                uri = parse_uri(text)
            except UriError as exc:
                return f'"{text}" not a valid URI: {exc}'
            if uri.local and not may_use_vhost(uri.vhost):
                return f'user "{user}" may not connect to vhost "{uri.vhost}"'
            parsed.append(uri)
        uris[key] = parsed
        return None

    rules: list[Rule] = [
        ("reconnect-delay", rule.number, False),
        ("ack-mode", rule.enum(ACK_MODES), False),
        ("src-protocol", rule.enum(PROTOCOLS), False),
        ("dest-protocol", rule.enum(PROTOCOLS), False),
        ("src-uri", uri_rule, True),
        ("src-exchange", rule.binary, False),
        ("src-exchange-key", rule.binary, False),
        ("src-queue", rule.binary, False),
        ("src-queue-args", _only(QUEUE_ARGUMENTS), False),
        ("src-consumer-args", _only(CONSUMER_ARGUMENTS), False),
        ("prefetch-count", rule.number, False),
        ("src-prefetch-count", rule.number, False),
        ("delete-after", rule.delete_after, False),
        ("src-delete-after", rule.delete_after, False),
        ("dest-uri", uri_rule, True),
        ("dest-exchange", rule.binary, False),
        ("dest-exchange-key", rule.binary, False),
        ("dest-queue", rule.queue_name, False),
        ("dest-queue-args", _only(QUEUE_ARGUMENTS), False),
        ("add-forward-headers", rule.boolean, False),
        ("add-timestamp-header", rule.boolean, False),
        ("dest-add-forward-headers", rule.boolean, False),
        ("dest-add-timestamp-header", rule.boolean, False),
        ("publish-properties", _properties, False),
        ("dest-publish-properties", _properties, False),
    ]
    errors += rule.proplist(name, rules, value)
    if errors:
        raise DefinitionError(errors)
    v = value
    prefetch = v.get("src-prefetch-count", v.get("prefetch-count", DEFAULT_PREFETCH))
    return ShovelDefinition(
        src_uris=tuple(uris["src-uri"]),
        dest_uris=tuple(uris["dest-uri"]),
        src_queue=v.get("src-queue"),
        src_exchange=v.get("src-exchange"),
        src_exchange_key=v.get("src-exchange-key", ""),
        src_queue_args=dict(v.get("src-queue-args") or {}),
        src_consumer_args=dict(v.get("src-consumer-args") or {}),
        prefetch_count=int(prefetch if prefetch is not None else DEFAULT_PREFETCH),
        delete_after=deleting if deleting is not None else "never",
        dest_queue=v.get("dest-queue"),
        dest_exchange=v.get("dest-exchange"),
        dest_exchange_key=v.get("dest-exchange-key"),
        dest_queue_args=dict(v.get("dest-queue-args") or {}),
        add_forward_headers=bool(
            v.get("dest-add-forward-headers", v.get("add-forward-headers", False))
        ),
        add_timestamp_header=bool(
            v.get("dest-add-timestamp-header", v.get("add-timestamp-header", False))
        ),
        publish_properties=dict(
            v.get("dest-publish-properties", v.get("publish-properties")) or {}
        ),
        ack_mode=v.get("ack-mode", DEFAULT_ACK_MODE),
        reconnect_delay=v.get("reconnect-delay", DEFAULT_RECONNECT_DELAY),
    )
