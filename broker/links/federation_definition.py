"""Federation's runtime parameters, checked as RabbitMQ 3.10.8's
`rabbit_federation_parameters` checks them and read into `Upstream`s:

* `federation-upstream`: one upstream, its `uri` (one or a list, mandatory) and the
  settings every link to it takes (below);
* `federation-upstream-set`: a list of `{"upstream": name, ...}`, each naming an upstream
  and any of the same settings for its links from this set.

The settings: `exchange` and `queue` (the upstream's, if not named as the downstream
one), `consumer-tag`, `prefetch-count` (1000), `reconnect-delay` (5 s), `max-hops` (1),
`expires` and `message-ttl` (of the upstream's internal queue, ms; none by default),
`trust-user-id` (false), `ack-mode` (`on-confirm`), `resource-cleanup-mode`, `ha-policy`,
`bind-nowait`, `channel-use-mode`: all of RabbitMQ's, refused in its words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.parameters import ParameterError
from . import validation as rule
from .uri import AmqpUri, UriError, parse_uri
from .validation import Rule

ACK_MODES = ("no-ack", "on-publish", "on-confirm")
#: rabbit_federation_upstream's defaults.
DEFAULT_PREFETCH = 1000
DEFAULT_RECONNECT_DELAY = 5
DEFAULT_MAX_HOPS = 1


class UpstreamError(ParameterError):
    """A federation parameter RabbitMQ would refuse."""


def _shared() -> list[Rule]:
    return [
        ("exchange", rule.binary, False),
        ("queue", rule.binary, False),
        ("consumer-tag", rule.binary, False),
        ("prefetch-count", rule.number, False),
        ("reconnect-delay", rule.number, False),
        ("max-hops", rule.number, False),
        ("expires", rule.number, False),
        ("message-ttl", rule.number, False),
        ("trust-user-id", rule.boolean, False),
        ("ack-mode", rule.enum(ACK_MODES), False),
        ("resource-cleanup-mode", rule.enum(("default", "never")), False),
        ("ha-policy", rule.binary, False),
        ("bind-nowait", rule.boolean, False),
        ("channel-use-mode", rule.enum(("multiple", "single")), False),
    ]


@dataclass(frozen=True)
class Upstream:
    """One upstream as a link uses it: its URIs and settings (a set's override those of
    the upstream parameter)."""

    name: str
    uris: tuple[AmqpUri, ...]
    exchange: str | None = None
    queue: str | None = None
    consumer_tag: str | None = None
    prefetch_count: int = DEFAULT_PREFETCH
    reconnect_delay: float = DEFAULT_RECONNECT_DELAY
    max_hops: int = DEFAULT_MAX_HOPS
    expires: int | None = None
    message_ttl: int | None = None
    trust_user_id: bool = False
    ack_mode: str = "on-confirm"
    #: "never": a link that goes leaves its queue and exchanges on the upstream
    resource_cleanup_mode: str = "default"

    @classmethod
    def read(cls, name: str, uris: tuple[AmqpUri, ...], settings: dict[str, Any]) -> Upstream:
        s = settings
        return cls(
            name=name,
            uris=uris,
            exchange=s.get("exchange"),
            queue=s.get("queue"),
            consumer_tag=s.get("consumer-tag"),
            prefetch_count=int(s.get("prefetch-count", DEFAULT_PREFETCH)),
            reconnect_delay=s.get("reconnect-delay", DEFAULT_RECONNECT_DELAY),
            max_hops=int(s.get("max-hops", DEFAULT_MAX_HOPS)),
            expires=int(s["expires"]) if "expires" in s else None,
            message_ttl=int(s["message-ttl"]) if "message-ttl" in s else None,
            trust_user_id=bool(s.get("trust-user-id", False)),
            ack_mode=s.get("ack-mode", "on-confirm"),
            resource_cleanup_mode=s.get("resource-cleanup-mode", "default"),
        )


def check_upstream(name: str, value: Any) -> tuple[tuple[AmqpUri, ...], dict[str, Any]]:
    """A `federation-upstream` value: its URIs and settings (UpstreamError if refused)."""
    uris: list[AmqpUri] = []

    def uri_rule(key: str, term: Any) -> str | None:
        texts = [term] if isinstance(term, str) else term
        if not isinstance(texts, list):
            return f"{key} should be list, actually was {rule.shown(term)}"
        for text in texts:
            if not isinstance(text, str):
                return f"{key} should be binary, actually was {rule.shown(text)}"
            try:
                uris.append(parse_uri(text))
            except UriError as exc:
                return f'"{text}" not a valid URI: {exc}'
        return None

    errors = rule.proplist(name, [("uri", uri_rule, True), *_shared()], value)
    if errors:
        raise UpstreamError(errors)
    return tuple(uris), {k: v for k, v in value.items() if k != "uri"}


def check_upstream_set(name: str, value: Any) -> list[tuple[str, dict[str, Any]]]:
    """A `federation-upstream-set` value: (upstream name, its settings here) each."""
    if not isinstance(value, list):
        raise UpstreamError([f"{name} not a list {rule.shown(value)}"])
    errors: list[str] = []
    for member in value:
        errors += rule.proplist(name, [("upstream", rule.binary, True), *_shared()], member)
    if errors:
        raise UpstreamError(errors)
    return [(m["upstream"], {k: v for k, v in m.items() if k != "upstream"}) for m in value]
