"""A pure-Python reference for the pipeline: read the archive with pyarrow, route naively.

Deliberately independent of broker/routing/: topic patterns become regular expressions, headers
bindings are checked criterion by criterion, and the exchange graph is walked recursively. The
Spark pipeline's tables must equal what this computes over the same files.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from roarmq.protocol.tables import decode_table

BUILTIN = {
    "amq.direct": "direct",
    "amq.fanout": "fanout",
    "amq.topic": "topic",
    "amq.headers": "headers",
    "amq.match": "headers",
}


def read_rows(archive: Path, skip: set[Path] = frozenset()) -> list[dict]:
    """Every row of every ``part-*.parquet`` file (after a clean close there is no overlap)."""
    rows = []
    for path in sorted(archive.glob("vhost=*/hour=*/part-*.parquet")):
        if path in skip:
            continue
        for row in pq.read_table(path).to_pylist():
            row["hour"] = row["ts"].strftime("%Y-%m-%dT%H")
            rows.append(row)
    return rows


def topic_regex(pattern: str) -> re.Pattern:
    """AMQP topic pattern -> regex over the key with a dot before every word."""
    if pattern == "":
        return re.compile("")
    parts = []
    for word in pattern.split("."):
        if word == "#":
            parts.append(r"(?:\.[^.]*)*")
        elif word == "*":
            parts.append(r"\.[^.]*")
        else:
            parts.append(r"\." + re.escape(word))
    return re.compile("".join(parts))


def dotted(key: str) -> str:
    return "" if key == "" else "." + key


def _same(a: Any, b: Any) -> bool:
    """Header value equality for the simple types the tests use."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, bytes):
        a = a.decode()
    if isinstance(b, bytes):
        b = b.decode()
    return a == b


def headers_match(arguments: dict, headers: dict | None) -> bool:
    mode = arguments.get("x-match", "all")
    with_x = mode.endswith("-with-x")
    criteria = {
        k: v for k, v in arguments.items() if k != "x-match" and (with_x or not k.startswith("x-"))
    }
    headers = headers or {}

    def ok(name: str, value: Any) -> bool:
        if name not in headers:
            return False
        return value is None or _same(value, headers[name])

    results = [ok(k, v) for k, v in criteria.items()]
    if mode.startswith("any"):
        return any(results)
    return all(results)


class NaiveRouter:
    def __init__(self, defs_path: Path) -> None:
        doc = json.loads(Path(defs_path).read_text())
        self.queues = {(q.get("vhost", "/"), q["name"]) for q in doc.get("queues", [])}
        vhosts = {v["name"] for v in doc.get("vhosts", [])} | {v for v, _ in self.queues}
        vhosts |= {x.get("vhost", "/") for x in doc.get("exchanges", [])}
        self.exchanges: dict[tuple[str, str], dict] = {}
        for vhost in vhosts:
            self.exchanges[(vhost, "")] = {"type": "default", "arguments": {}}
            for name, type_ in BUILTIN.items():
                self.exchanges[(vhost, name)] = {"type": type_, "arguments": {}}
        for x in doc.get("exchanges", []):
            self.exchanges[(x.get("vhost", "/"), x["name"])] = {
                "type": x["type"],
                "arguments": x.get("arguments") or {},
            }
        self.bindings = []
        seen = set()
        for b in doc.get("bindings", []):
            ident = json.dumps(
                [
                    b.get("vhost", "/"),
                    b["source"],
                    b["destination"],
                    b.get("destination_type", "queue"),
                    b.get("routing_key", ""),
                    b.get("arguments") or {},
                ],
                sort_keys=True,
            )
            if ident in seen:
                continue
            seen.add(ident)
            self.bindings.append(
                dict(
                    b,
                    vhost=b.get("vhost", "/"),
                    routing_key=b.get("routing_key", ""),
                    arguments=b.get("arguments") or {},
                )
            )

    def binding_key(self, b: dict) -> tuple:
        return (
            b["vhost"],
            b["source"],
            b.get("destination_type", "queue"),
            b["destination"],
            b["routing_key"],
            json.dumps(b["arguments"], sort_keys=True),
        )

    def _matches(self, x: dict, b: dict, key: str, headers: dict | None) -> bool:
        kind = x["type"]
        if kind == "fanout":
            return True
        if kind == "direct":
            return b["routing_key"] == key
        if kind == "topic":
            return topic_regex(b["routing_key"]).fullmatch(dotted(key)) is not None
        if kind == "headers":
            return headers_match(b["arguments"], headers)
        raise AssertionError(kind)

    def _walk(
        self, vhost: str, name: str, key: str, headers: dict | None, seen: set, hits: set
    ) -> set:
        seen.add(name)
        x = self.exchanges[(vhost, name)]
        if x["type"] == "default":
            return {key} if (vhost, key) in self.queues else set()
        matched = [
            b
            for b in self.bindings
            if b["vhost"] == vhost and b["source"] == name and self._matches(x, b, key, headers)
        ]
        hits.update(self.binding_key(b) for b in matched)
        alternate = x["arguments"].get("alternate-exchange")
        if not matched and alternate and (vhost, alternate) in self.exchanges:
            return (
                set()
                if alternate in seen
                else self._walk(vhost, alternate, key, headers, seen, hits)
            )
        out = set()
        for b in matched:
            if b.get("destination_type", "queue") == "queue":
                out.add(b["destination"])
            elif b["destination"] not in seen:
                out |= self._walk(vhost, b["destination"], key, headers, seen, hits)
        return out

    def route(self, vhost: str, exchange: str, key: str, headers: dict | None):
        """``(queues, binding keys hit)``, or ``None`` for an undefined exchange."""
        if (vhost, exchange) not in self.exchanges:
            return None
        keys = [key]
        if headers and ("CC" in headers or "BCC" in headers):
            for name in ("CC", "BCC"):
                if isinstance(headers.get(name), list):
                    keys += [k for k in headers[name] if isinstance(k, str)]
        queues, hits = set(), set()
        for k in keys:
            queues |= self._walk(vhost, exchange, k, headers, set(), hits)
        return queues, hits


def headers_of(row: dict) -> dict | None:
    return None if row["headers"] is None else decode_table(row["headers"])[0]


def report(rows: list[dict], router: NaiveRouter) -> dict[str, Any]:
    traffic: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    fanout, queues, hits = Counter(), Counter(), Counter()
    for row in rows:
        t = traffic[(row["vhost"], row["exchange"], row["routing_key"], row["hour"])]
        t[0] += 1
        t[1] += row["body_size"]
        t[2] += row["unroutable"]
        t[3] += row["queue_count"]
        fanout[(row["vhost"], row["queue_count"])] += 1
        for q in row["queues"]:
            queues[(row["vhost"], q)] += 1
        routed = router.route(row["vhost"], row["exchange"], row["routing_key"], headers_of(row))
        if routed is not None:
            for b in routed[1]:
                hits[b] += 1
    bindings = {router.binding_key(b): hits.get(router.binding_key(b), 0) for b in router.bindings}
    return {
        "traffic": {k: tuple(v) for k, v in traffic.items()},
        "fanout": dict(fanout),
        "queues": dict(queues),
        "bindings": bindings,
    }


def whatif(rows: list[dict], current: NaiveRouter, candidate: NaiveRouter) -> dict[str, Any]:
    per_queue: dict[tuple, Counter] = defaultdict(Counter)
    hits = {"current": Counter(), "candidate": Counter()}
    for row in rows:
        actual = set(row["queues"])
        headers = headers_of(row)
        for label, router in (("current", current), ("candidate", candidate)):
            routed = router.route(row["vhost"], row["exchange"], row["routing_key"], headers)
            would, hit = routed if routed is not None else (set(), set())
            for b in hit:
                hits[label][b] += 1
            if label == "current":
                for q in would:
                    per_queue[(row["vhost"], q)]["current"] += 1
                continue
            for q in actual:
                per_queue[(row["vhost"], q)]["actual"] += 1
            for q in would - actual:
                per_queue[(row["vhost"], q)]["added"] += 1
            for q in actual - would:
                per_queue[(row["vhost"], q)]["lost"] += 1
            for q in would & actual:
                per_queue[(row["vhost"], q)]["unchanged"] += 1
    bindings = {}
    for label, router in (("current", current), ("candidate", candidate)):
        for b in router.bindings:
            entry = bindings.setdefault(
                router.binding_key(b),
                {
                    "in_current": False,
                    "in_candidate": False,
                    "hits_current": 0,
                    "hits_candidate": 0,
                },
            )
            entry[f"in_{label}"] = True
            entry[f"hits_{label}"] = hits[label][router.binding_key(b)]
    return {"queues": {k: dict(v) for k, v in per_queue.items()}, "bindings": bindings}
