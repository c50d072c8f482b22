"""A small asyncio client for etcd's v3 JSON gateway (etcd 3.4: `/v3/...` over HTTP).

Why the gateway and not gRPC: it needs nothing beyond aiohttp, which the broker already
depends on, and every call we make (kv range/put/deleterange/txn, lease grant/keepalive/
revoke, watch) is one POST with a JSON body. Keys and values travel base64-encoded and
int64 fields come back as strings; both are hidden here, so callers see `bytes`/`str` keys
and `int` revisions.

Endpoints fail over: a call that cannot reach one endpoint (refused, reset, timed out) tries
the next, and the one that answered becomes the first choice. A call that reaches etcd and
gets an error back (bad request, lease not found) is not retried elsewhere.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

#: gRPC metadata through etcd's gateway: serve this call only while the member has a leader.
REQUIRE_LEADER = {"Grpc-Metadata-hasleader": "true"}


class EtcdError(Exception):
    """etcd answered with an error (its gRPC code and message)."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


class EtcdUnavailable(EtcdError):
    """No endpoint answered."""


class WatchCompacted(EtcdError):
    """The watch's start revision was compacted away: reload, then watch from the reload."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"revision compacted (oldest kept: {compact_revision})")
        self.compact_revision = compact_revision


#: etcd's gRPC code for "lease not found" (NotFound).
NOT_FOUND = 5


def _b64(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: bytes | str) -> bytes:
    """The range end that makes [prefix, end) every key starting with prefix."""
    raw = bytearray(prefix.encode() if isinstance(prefix, str) else prefix)
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return bytes(raw)
        raw.pop()
    return b"\0"  # etcd: every key


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def from_json(cls, kv: dict[str, Any]) -> KeyValue:
        return cls(
            key=_unb64(kv.get("key")).decode(),
            value=_unb64(kv.get("value")),
            create_revision=int(kv.get("create_revision", 0)),
            mod_revision=int(kv.get("mod_revision", 0)),
            version=int(kv.get("version", 0)),
            lease=int(kv.get("lease", 0)),
        )


@dataclass(frozen=True, slots=True)
class Event:
    """One watch event: `kind` is "put" or "delete"; a delete's kv has key and mod_revision."""

    kind: str
    kv: KeyValue


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int  # the store's revision after the txn (the txn's own if it wrote)
    responses: list[dict[str, Any]]

    def ranges(self) -> list[list[KeyValue]]:
        """The key-values of each range request in the branch that ran, in order."""
        out = []
        for resp in self.responses:
            if "response_range" in resp:
                kvs = resp["response_range"].get("kvs", [])
                out.append([KeyValue.from_json(kv) for kv in kvs])
        return out


# -- compares and operations for txn() ---------------------------------------------------
# Compare targets as etcd names them; values are ints, except VALUE (bytes).


def compare(key: str, target: str, value: int | bytes | str, result: str = "EQUAL") -> dict:
    """One txn comparison: target is "CREATE" (create revision; 0 = absent), "MOD",
    "VERSION", "VALUE" or "LEASE"; result "EQUAL", "NOT_EQUAL", "GREATER" or "LESS"."""
    field = {
        "CREATE": "create_revision",
        "MOD": "mod_revision",
        "VERSION": "version",
        "VALUE": "value",
        "LEASE": "lease",
    }[target]
    operand = _b64(value) if target == "VALUE" else int(value)  # type: ignore[arg-type]  # a revision or lease target's value is an int
    return {"key": _b64(key), "target": target, "result": result, field: operand}


def put_op(key: str, value: bytes | str, lease: int = 0) -> dict:
    req: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease:
        req["lease"] = lease
    return {"request_put": req}


def range_op(key: str, prefix: bool = False) -> dict:
    req: dict[str, Any] = {"key": _b64(key)}
    if prefix:
        req["range_end"] = _b64(prefix_end(key))
    return {"request_range": req}


def delete_op(key: str, prefix: bool = False) -> dict:
    req: dict[str, Any] = {"key": _b64(key)}
    if prefix:
        req["range_end"] = _b64(prefix_end(key))
    return {"request_delete_range": req}


class EtcdClient:
    """Calls to a list of etcd endpoints ("http://host:2379"), failing over between them."""

    def __init__(self, endpoints: Sequence[str], *, timeout: float = 2.0) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> EtcdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No pooled keep-alive across an etcd restart would help us: a fresh connection per
            # failure is what failover needs, so the connector drops connections on errors.
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _prefer(self, endpoint: str) -> None:
        if self.endpoints[0] != endpoint:
            self.endpoints.remove(endpoint)
            self.endpoints.insert(0, endpoint)

    async def call(self, path: str, body: dict[str, Any], timeout: float | None = None) -> dict:
        """POST body to path on the first endpoint that answers; the decoded JSON reply."""
        limit = aiohttp.ClientTimeout(total=timeout or self.timeout)
        failures = []
        for endpoint in list(self.endpoints):
            # A second try on the same endpoint only when the first found a pooled
            # connection closed (etcd restarted since we last used it): that request never
            # got an answer, and a fresh connection is what the retry gets.
            for attempt in (1, 2):
                try:
                    async with self._http().post(endpoint + path, json=body, timeout=limit) as resp:
                        text = await resp.text()
                except aiohttp.ServerDisconnectedError as exc:
                    failures.append(f"{endpoint}: {exc!r}")
                    if attempt == 1:
                        continue
                    break
                except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                    failures.append(f"{endpoint}: {exc!r}")
                    break
                self._prefer(endpoint)
                return _reply(resp.status, text)
        raise EtcdUnavailable("no etcd endpoint answered: " + "; ".join(failures))

    # -- kv ------------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        kvs, _ = await self.range(key)
        return kvs[0] if kvs else None

    async def range(
        self, key: str, *, prefix: bool = False, revision: int = 0
    ) -> tuple[list[KeyValue], int]:
        """The key (or every key under the prefix) and the store revision of the read."""
        body = range_op(key, prefix)["request_range"]
        if revision:
            body["revision"] = revision
        reply = await self.call("/v3/kv/range", body)
        kvs = [KeyValue.from_json(kv) for kv in reply.get("kvs", [])]
        return kvs, _revision(reply)

    async def put(self, key: str, value: bytes | str, lease: int = 0) -> int:
        """Write; returns the revision of the write."""
        return _revision(await self.call("/v3/kv/put", put_op(key, value, lease)["request_put"]))

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        """Delete the key (or every key under the prefix); returns how many were deleted."""
        body: dict[str, Any] = {"key": _b64(key)}
        if prefix:
            body["range_end"] = _b64(prefix_end(key))
        return int((await self.call("/v3/kv/deleterange", body)).get("deleted", 0))

    async def txn(
        self,
        compares: list[dict],
        success: list[dict],
        failure: list[dict] = (),  # type: ignore[assignment]  # an empty tuple default, never mutated
    ) -> TxnResult:
        reply = await self.call(
            "/v3/kv/txn", {"compare": compares, "success": success, "failure": list(failure)}
        )
        return TxnResult(
            succeeded=bool(reply.get("succeeded", False)),
            revision=_revision(reply),
            responses=reply.get("responses", []),
        )

    async def compact(self, revision: int) -> None:
        await self.call("/v3/kv/compaction", {"revision": revision, "physical": True})

    # -- leases --------------------------------------------------------------------------

    async def lease_grant(self, ttl: int) -> int:
        """A new lease of ttl seconds; its id."""
        return int((await self.call("/v3/lease/grant", {"TTL": ttl}))["ID"])

    async def lease_keepalive(self, lease: int, timeout: float | None = None) -> int:
        """Renew once; the TTL granted, 0 if the lease no longer exists."""
        reply = await self.call("/v3/lease/keepalive", {"ID": lease}, timeout)
        return int(reply.get("result", {}).get("TTL", 0))

    async def lease_revoke(self, lease: int) -> bool:
        """Revoke (its keys are deleted); False if it had already gone."""
        try:
            await self.call("/v3/lease/revoke", {"ID": lease})
        except EtcdError as exc:
            if exc.code == NOT_FOUND:
                return False
            raise
        return True

    # -- watch ---------------------------------------------------------------------------

    async def watch(
        self, key: str, *, prefix: bool = False, start_revision: int = 0
    ) -> AsyncIterator[tuple[int, list[Event]]]:
        """Yield (revision, events) as etcd reports changes, from start_revision (0: now).

        Ends (EtcdUnavailable) when the stream breaks: the caller resumes from the last
        revision it saw + 1. WatchCompacted if start_revision is older than etcd keeps.

        The watch requires a leader (etcd's WithRequireLeader, as gRPC metadata through
        the gateway): a member cut off from its peers cancels it instead of going silent,
        and the caller moves to another endpoint. Progress notifications are asked for,
        so a quiet watch still hears from etcd when the server sends them."""
        req: dict[str, Any] = {"key": _b64(key), "progress_notify": True}
        if prefix:
            req["range_end"] = _b64(prefix_end(key))
        if start_revision:
            req["start_revision"] = start_revision
        resp = await self._open_stream("/v3/watch", {"create_request": req}, headers=REQUIRE_LEADER)
        try:
            async for message in _json_lines(resp):
                if "error" in message:
                    err = message["error"]
                    raise EtcdError(str(err.get("message", err)), int(err.get("code", 0)))
                result = message.get("result", {})
                if int(result.get("compact_revision", 0)):
                    raise WatchCompacted(int(result["compact_revision"]))
                if result.get("canceled"):
                    raise EtcdError(result.get("cancel_reason", "watch canceled"))
                events = [
                    Event(
                        "delete" if e.get("type") == "DELETE" else "put",
                        KeyValue.from_json(e["kv"]),
                    )
                    for e in result.get("events", [])
                ]
                if events:
                    yield _revision(result), events
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise EtcdUnavailable(f"watch stream broke: {exc!r}") from exc
        finally:
            resp.release()
            resp.close()
        raise EtcdUnavailable("watch stream ended")

    async def _open_stream(
        self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> aiohttp.ClientResponse:
        # No total timeout: a watch lives as long as its caller wants it. Connecting is bounded.
        limit = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout)
        failures = []
        for endpoint in list(self.endpoints):
            try:
                resp = await self._http().post(
                    endpoint + path, json=body, timeout=limit, headers=headers
                )
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                failures.append(f"{endpoint}: {exc!r}")
                continue
            if resp.status != 200:
                text = await resp.text()
                resp.release()
                _reply(resp.status, text)
            self._prefer(endpoint)
            return resp
        raise EtcdUnavailable("no etcd endpoint answered: " + "; ".join(failures))


def _revision(reply: dict[str, Any]) -> int:
    return int(reply.get("header", {}).get("revision", 0))


def _reply(status: int, text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError:
        raise EtcdError(f"HTTP {status}: {text.strip()[:200]}") from None
    if status != 200 or "error" in data:
        raise EtcdError(str(data.get("message") or data.get("error")), int(data.get("code", 0)))
    return data


async def _json_lines(resp: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The newline-delimited JSON objects of a streaming reply (lines of any length)."""
    buffer = b""
    async for chunk in resp.content.iter_any():
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)
