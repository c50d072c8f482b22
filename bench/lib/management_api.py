"""A broker's management HTTP API on loopback, as guest (an administrator on loopback).

One call (``api``) for the scripts and the cluster helpers that ask a RoarMQ node for its
vhosts, its stall log or a stream's counters, and set up vhosts on a cluster; ``metric``
reads the samples of one family of its Prometheus ``/metrics``.
"""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

AUTH = "Basic Z3Vlc3Q6Z3Vlc3Q="  # guest:guest


def api(port: int, method: str, path: str, body: Any = None, timeout: float = 10) -> Any:
    """One management API call; the decoded JSON answer (None if empty). Raises OSError
    (urllib's errors among them) or ValueError as urllib and json do."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=data,
        method=method,
        headers={"Authorization": AUTH, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        raw = resp.read()
    return json.loads(raw) if raw.strip() else None


def metric(port: int, name: str, timeout: float = 10) -> dict[str, float]:
    """The samples of one family of the node's `/metrics`, by their labels as printed
    (`how="sendfile"`; "" for a sample without labels): one scrape."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics", headers={"Authorization": AUTH}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        text = resp.read().decode()
    pattern = rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$"
    return {m.group(1) or "": float(m.group(2)) for m in re.finditer(pattern, text, re.MULTILINE)}
