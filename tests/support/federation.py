"""What a federation link has made on its upstream, read through the upstream's management
API (RoarMQ's or RabbitMQ's, the same shape).

A link's bindings follow its downstream exchange's after the link runs (each a call the link
waits for, on RabbitMQ's plugin as on ours), so a test that publishes upstream right after a
link is "running" may publish before the binding that routes to it exists: it waits for
`federation_keys` first.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from typing import Any


def federation_keys(get: Callable[[str], Any], exchange: str, vhost: str = "/") -> set[str]:
    """The routing keys the upstream's `exchange` is bound with to exchanges (a link's own),
    `get(path)` answering the decoded JSON of a GET on the upstream's API."""
    path = (
        f"/api/exchanges/{urllib.parse.quote(vhost, safe='')}/"
        f"{urllib.parse.quote(exchange, safe='')}/bindings/source"
    )
    rows = get(path) or []
    return {row["routing_key"] for row in rows if row["destination_type"] == "exchange"}
