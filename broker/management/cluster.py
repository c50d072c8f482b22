"""The management API of a cluster node: every node answers for the whole cluster.

* Lists (`GET /api/queues`, `/api/exchanges`, `/api/connections`, `/api/channels`,
  `/api/consumers`, with or without a vhost) merge what every live node has: this node's
  own rows and, fetched in parallel with a short timeout, each other node's (the request
  carries `X-RoarMQ-Node-Local`, so a node asked that way answers with its own rows only and
  never asks further). Vhost-scoped rows come from the vhost's leader only (a follower holds
  the vhost but not its declarations); connections and channels from the node holding them.
  Sorting, `name=`, `columns=` and paging are applied after the merge. A node that does not
  answer is skipped and named in `X-RoarMQ-Nodes-Skipped`.
* One vhost's objects (`/api/queues/{vhost}/{name}...`, `/api/exchanges/{vhost}/{name}...`,
  `/api/bindings/{vhost}...`, `/api/definitions/{vhost}`, `/api/route/...`,
  `/api/aliveness-test/{vhost}`), any method, asked of a node that does not lead the vhost:
  forwarded as they are to its leader, which holds them (`at_the_leader`); the answer comes
  back unchanged, marked `X-RoarMQ-Served-By`. At the leader, a change is answered once
  the vhost's in-sync set holds it (503 saying why otherwise); a vhost with no leader
  answers 503, never from a node's stale copy.
* `POST /api/definitions` anywhere: its operator metadata goes to etcd, and each vhost's
  exchanges, queues and bindings to that vhost's leader (`import_at_the_leaders`).
* `POST /api/vhosts/{vhost}/leader` `{"node": NAME}` (administrator): move the vhost's
  leadership (`ClusterNode.move_leader`), forwarded to the current leader when asked
  elsewhere.
* `DELETE /api/nodes/{name}` (administrator): forget a node: its leaderships are moved to
  another in-sync member, then it is removed from every vhost's members, so it can be
  decommissioned.

On a single node (no `[cluster]`) the same code asks `SingleNode` (broker/cluster_hooks.py):
no peers to merge from, every vhost led here and durable once written, so every response
is the handler's own.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from typing import Any

import aiohttp
from aiohttp import web

from ..core.definitions_json import import_definitions
from .api_query import QUERY_KEYS, shape
from .context import USER, bad_request, broker_of, read_json

#: Marks a request from another node: answer with this node's own rows, ask nobody.
NODE_LOCAL = "X-RoarMQ-Node-Local"
#: On a merged list: the nodes that did not answer in time (comma-separated).
SKIPPED = "X-RoarMQ-Nodes-Skipped"
#: Seconds a node waits for another's rows.
PEER_TIMEOUT = 2.0
#: Seconds a request for a vhost this node was just elected to lead waits for its recovery.
RECOVERY_WAIT = 10.0

#: On a forwarded answer: the node that served it.
SERVED_BY = "X-RoarMQ-Served-By"
#: Routes of one vhost's objects (as registered; lists merged above are not among them):
#: only the vhost's leader holds these, so another node forwards them there.
AT_THE_LEADER = (
    "/api/queues/{vhost}/{name}",
    "/api/exchanges/{vhost}/{name}",
    "/api/bindings/{vhost}",
    "/api/aliveness-test/{vhost}",
    "/api/route/{vhost}/{exchange}",
)

#: Route -> whether its rows belong to a vhost (kept from its leader only).
MERGED = {
    "/api/queues": True,
    "/api/queues/{vhost}": True,
    "/api/exchanges": True,
    "/api/exchanges/{vhost}": True,
    "/api/consumers": True,
    "/api/consumers/{vhost}": True,
    "/api/connections": False,
    "/api/channels": False,
}


def _route_of(request: web.Request) -> str | None:
    route = request.match_info.route
    resource = route.resource if route is not None else None
    return resource.canonical.rstrip("/") if resource is not None else None


def _vhost_of_row(row: dict[str, Any]) -> Any:
    if "vhost" in row:
        return row["vhost"]
    queue = row.get("queue")
    return queue.get("vhost") if isinstance(queue, dict) else None


async def _local_rows(request: web.Request, handler: Any, scoped: bool) -> list[Any]:
    """This node's own rows for the request, without the list parameters."""
    query = {k: v for k, v in request.query.items() if k not in QUERY_KEYS}
    local = request.clone(rel_url=request.rel_url.with_query(query))
    try:
        response = await handler(local)
    except web.HTTPNotFound:
        return []  # a vhost this node does not hold: another node answers for it
    if not isinstance(response, web.Response) or response.status != 200 or not response.body:
        return []
    rows = json.loads(response.body)  # type: ignore[arg-type]
    if not scoped:
        return rows
    cluster = broker_of(request).cluster
    me = cluster.name
    return [r for r in rows if _leads(cluster, me, _vhost_of_row(r))]


def _leads(cluster: Any, me: str, vhost: Any) -> bool:
    leader = cluster.leader_of(vhost)
    if leader is not None:
        return bool(leader == me)
    # Leaderless (an election): the rows of the node that has them, if it is a member.
    return me in cluster.members(vhost) and cluster.members(vhost)[:1] == [me]


def _peers(request: web.Request) -> list[dict[str, Any]]:
    cluster = broker_of(request).cluster
    return [
        n
        for n in cluster.nodes()
        if n["name"] != cluster.name and n.get("running") and n.get("management_port")
    ]


def _base_url(request: web.Request, node: dict[str, Any]) -> str:
    scheme = "https" if broker_of(request).config.management.tls.enabled else "http"
    host = node.get("address") or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{node['management_port']}"


async def _call_node(
    request: web.Request,
    node: dict[str, Any],
    method: str,
    path: str,
    body: Any = None,
    timeout: float = PEER_TIMEOUT,
) -> tuple[int, Any]:
    """One request to another node's management API, as the same user, node-local."""
    headers = {NODE_LOCAL: "1", "Authorization": request.headers.get("Authorization", "")}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
        session.request(
            method, _base_url(request, node) + path, json=body, headers=headers, ssl=False
        ) as resp,
    ):
        text = await resp.read()
        return resp.status, json.loads(text) if text else None


#: Where writes change operator metadata (etcd's, broker/cluster/metadata.py).
METADATA_PATHS = (
    "/api/users",
    "/api/permissions",
    "/api/topic-permissions",
    "/api/vhost-limits",
    "/api/user-limits",
    "/api/policies",
    "/api/operator-policies",
    "/api/definitions",
    "/api/cluster-name",
)


@web.middleware
async def metadata_barrier(request: web.Request, handler: Any) -> web.StreamResponse:
    """A write to users, permissions, policies... on a cluster node is checked against this
    node's copy made as new as etcd's first (one read of etcd's revision), so what another
    node wrote a moment ago is known; 503 when etcd cannot be reached."""
    broker = broker_of(request)
    if request.method not in ("PUT", "POST", "DELETE"):
        return await handler(request)
    path = request.path
    vhost = path.startswith("/api/vhosts/") and request.method != "POST"
    if vhost or any(path == p or path.startswith(p + "/") for p in METADATA_PATHS):
        await broker.cluster.barrier()
    return await handler(request)


@web.middleware
async def merged_lists(request: web.Request, handler: Any) -> web.StreamResponse:
    broker = broker_of(request)
    if request.method != "GET" or not _peers(request):
        return await handler(request)
    scoped = MERGED.get(_route_of(request) or "")
    vhost = request.match_info.get("vhost")
    if scoped is None or (
        vhost is not None
        and vhost not in broker.vhosts
        and vhost not in broker.cluster.placements()
    ):
        return await handler(request)  # not a list, or a vhost nobody has: its own 404
    own = await _local_rows(request, handler, scoped)
    if request.headers.get(NODE_LOCAL):
        return web.json_response(own)
    query = {k: v for k, v in request.query.items() if k not in QUERY_KEYS}
    path = request.rel_url.with_query(query).raw_path_qs if query else request.rel_url.raw_path
    peers = _peers(request)
    answers = await asyncio.gather(
        *(_call_node(request, node, "GET", path) for node in peers), return_exceptions=True
    )
    rows, skipped = list(own), []
    for node, answer in zip(peers, answers, strict=True):
        if isinstance(answer, BaseException) or answer[0] not in (200, 404):
            skipped.append(node["name"])  # (a 404: that node does not hold the vhost)
        elif isinstance(answer[1], list):
            rows.extend(answer[1])
    rows.sort(key=_default_order)
    headers = {SKIPPED: ",".join(skipped)} if skipped else None
    return web.json_response(shape(rows, request.query), headers=headers)


def _held_by_the_leader(route: str, method: str) -> bool:
    if route == "/api/definitions/{vhost}":
        return True  # an import's objects are the leader's; its metadata goes to etcd there
    return any(route == r or route.startswith(r + "/") for r in AT_THE_LEADER)


def _unavailable(text: str) -> web.Response:
    return web.json_response({"error": "unavailable", "reason": text}, status=503)


async def _here_once_durable(
    request: web.Request, handler: Any, cluster: Any, vhost: str
) -> web.StreamResponse:
    """Serve a request for a vhost this node leads; a change to its definitions is
    answered once the in-sync set holds it (as an AMQP declare's reply waits), or with
    503 saying why it may not survive a failover."""
    user = request.get(USER)
    waited = 0.0
    while cluster.recovering(vhost) and waited < RECOVERY_WAIT:
        # Just elected, recovering its copy: answer once it serves, as connection.open
        # does (a client asking right after a failover sees a pause, not 503).
        await asyncio.sleep(0.05)
        waited += 0.05
    down = cluster.vhost_down(vhost, getattr(user, "name", "")) or cluster.refusal(vhost)
    if down is not None:
        return _unavailable(down)
    response = await handler(request)
    if request.method in ("GET", "HEAD") or response.status >= 300:
        return response
    problem = await cluster.definitions_durable(vhost)
    return response if problem is None else _unavailable(problem)


@web.middleware
async def at_the_leader(request: web.Request, handler: Any) -> web.StreamResponse:
    """Forward a request about one vhost's objects to the vhost's leader (module doc)."""
    broker = broker_of(request)
    cluster = broker.cluster
    if request.headers.get(NODE_LOCAL):
        return await handler(request)
    vhost = request.match_info.get("vhost")
    route = _route_of(request)
    if vhost is None or route is None or not _held_by_the_leader(route, request.method):
        return await handler(request)
    leader = cluster.leader_of(vhost)
    if leader is None:
        if vhost in broker.vhosts or vhost in cluster.placements():
            # No stale copy: only a leader's answer is the vhost's.
            return _unavailable(
                f"vhost '{vhost}' has no leader at the moment (an election is under way)"
            )
        return await handler(request)  # unknown here: the handler's 404
    if leader == cluster.name:
        return await _here_once_durable(request, handler, cluster, vhost)
    peer = next((n for n in _peers(request) if n["name"] == leader), None)
    if peer is None:
        return web.json_response(
            _reason(f"the leader of vhost '{vhost}', node '{leader}', is not reachable"),
            status=503,
        )
    headers = {
        NODE_LOCAL: "1",
        "Authorization": request.headers.get("Authorization", ""),
        "Content-Type": request.headers.get("Content-Type", "application/json"),
    }
    body = await request.read()
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30.0)) as session,
        session.request(
            request.method,
            _base_url(request, peer) + request.rel_url.raw_path_qs,
            data=body,
            headers=headers,
            ssl=False,
        ) as resp,
    ):
        data = await resp.read()
        answer = {SERVED_BY: leader}
        if "Content-Type" in resp.headers and data:
            answer["Content-Type"] = resp.headers["Content-Type"]
        return web.Response(status=resp.status, body=data or None, headers=answer)


def _default_order(row: Any) -> tuple[str, str]:
    if not isinstance(row, dict):
        return ("", "")
    return (str(_vhost_of_row(row) or ""), str(row.get("name") or row.get("consumer_tag") or ""))


# -- leadership and membership --------------------------------------------------------------


async def import_at_the_leaders(request: web.Request, objects: dict[str, list]) -> None:
    """The exchanges, queues and bindings of a definitions import, each vhost's through
    its leader (POST /api/definitions/{vhost} there, or here when this node leads it),
    answered once each leader's in-sync set holds them: on another node they would never
    reach the vhost's log. Raises HTTPServiceUnavailable naming the vhost that could
    not take its part."""
    broker = broker_of(request)
    cluster = broker.cluster
    parts: dict[str, dict[str, list]] = {}
    for key, rows in objects.items():
        for row in rows:
            parts.setdefault(row.get("vhost", "/"), {}).setdefault(key, []).append(row)
    for vhost, part in parts.items():
        leader = cluster.leader_of(vhost)
        if leader is None:
            problem = f"vhost '{vhost}' has no leader at the moment (an election is under way)"
        elif leader == cluster.name:
            problem = cluster.refusal(vhost)
            if problem is None:
                import_definitions(broker, part)
                problem = await cluster.definitions_durable(vhost)
        elif request.headers.get(NODE_LOCAL):
            problem = f"node '{cluster.name}' does not lead vhost '{vhost}'"
        else:
            peer = next((n for n in _peers(request) if n["name"] == leader), None)
            if peer is None:
                problem = f"the leader of vhost '{vhost}', node '{leader}', is not reachable"
            else:
                path = f"/api/definitions/{urllib.parse.quote(vhost, safe='')}"
                status, answer = await _call_node(request, peer, "POST", path, part, 30.0)
                problem = None if status < 300 else f"node '{leader}' answered {status}: {answer}"
        if problem is not None:
            raise web.HTTPServiceUnavailable(
                text=json.dumps({"error": "unavailable", "reason": problem}),
                content_type="application/json",
            )


async def _at_leader(
    request: web.Request, vhost: str, method: str, path: str, body: Any, here: Any
) -> tuple[int, Any]:
    """Run `here()` if this node leads the vhost, else the same request on its leader."""
    from ..cluster.node import MoveRefused

    cluster = broker_of(request).cluster
    leader = cluster.leader_of(vhost)
    if leader is None:
        return 400, _reason(f"vhost '{vhost}' has no leader at the moment; try again")
    if leader == cluster.name:
        try:
            return 200, await here()
        except MoveRefused as exc:
            return 400, _reason(str(exc))
    if request.headers.get(NODE_LOCAL):
        return 400, _reason(f"node '{cluster.name}' does not lead vhost '{vhost}'")
    peer = next((n for n in _peers(request) if n["name"] == leader), None)
    if peer is None:
        return 400, _reason(f"the leader of vhost '{vhost}', node '{leader}', is not reachable")
    return await _call_node(request, peer, method, path, body, timeout=30.0)


def _reason(text: str) -> dict[str, str]:
    return {"error": "bad_request", "reason": text}


def _cluster_of(request: web.Request) -> Any:
    cluster = broker_of(request).cluster
    refusal = cluster.operator_refusal()
    if refusal is not None:
        raise bad_request(refusal)
    return cluster


async def _move(request: web.Request, vhost: str, target: str) -> tuple[int, Any]:
    cluster = _cluster_of(request)
    path = f"/api/vhosts/{urllib.parse.quote(vhost, safe='')}/leader"
    previous = cluster.leader_of(vhost)
    if previous == target:
        return 200, {"vhost": vhost, "leader": target, "previous": target}

    async def here() -> dict[str, Any]:
        await cluster.move_leader(vhost, target)
        return {"vhost": vhost, "leader": target, "previous": cluster.name}

    return await _at_leader(request, vhost, "POST", path, {"node": target}, here)


async def _remove(request: web.Request, vhost: str, node: str) -> tuple[int, Any]:
    cluster = _cluster_of(request)
    if cluster.leader_of(vhost) == node:
        return 400, _reason(f"node '{node}' leads vhost '{vhost}': move its leadership first")
    path = (
        f"/api/vhosts/{urllib.parse.quote(vhost, safe='')}/members/"
        f"{urllib.parse.quote(node, safe='')}"
    )

    async def here() -> dict[str, Any]:
        await cluster.delete_vhost_member(vhost, node)
        return {"vhost": vhost, "members": [n for n in cluster.members(vhost) if n != node]}

    return await _at_leader(request, vhost, "DELETE", path, None, here)


async def add_member(request: web.Request) -> web.Response:
    """POST /api/vhosts/{vhost}/members {"node": NAME}: a copy of the vhost on NAME, on
    (or forwarded to) the vhost's leader."""
    cluster = _cluster_of(request)
    vhost = request.match_info["vhost"]
    node = (await read_json(request)).get("node")
    if not isinstance(node, str) or not node:
        raise bad_request('the body must name the node: {"node": NAME}')
    path = f"/api/vhosts/{urllib.parse.quote(vhost, safe='')}/members"

    async def here() -> dict[str, Any]:
        await cluster.add_vhost_member(vhost, node)
        return {"vhost": vhost, "members": cluster.members(vhost)}

    status, body = await _at_leader(request, vhost, "POST", path, {"node": node}, here)
    return web.json_response(body, status=status)


async def set_replicas(request: web.Request) -> web.Response:
    """PUT /api/vhosts/{vhost}/replicas {"replicas": N}: the vhost's own replica count
    (1 to 9); its leader adds or removes members to match."""
    broker, cluster = broker_of(request), _cluster_of(request)
    vhost = request.match_info["vhost"]
    replicas = (await read_json(request)).get("replicas")
    if not isinstance(replicas, int) or isinstance(replicas, bool) or not 1 <= replicas <= 9:
        raise bad_request('the body must give the count, 1 to 9: {"replicas": N}')
    if vhost not in broker.vhosts and vhost not in cluster.placements():
        raise bad_request(f"no vhost '{vhost}'")
    await cluster.coordinator.set_vhost_replicas(vhost, replicas)  # its watch: the leader acts
    return web.json_response({"vhost": vhost, "replicas": replicas})


async def move_leader(request: web.Request) -> web.Response:
    """POST /api/vhosts/{vhost}/leader {"node": NAME}: a clean hand-over to NAME."""
    broker, cluster = broker_of(request), _cluster_of(request)
    vhost = request.match_info["vhost"]
    target = (await read_json(request)).get("node")
    if not isinstance(target, str) or not target:
        raise bad_request('the body must name the new leader: {"node": NAME}')
    if vhost not in broker.vhosts and vhost not in cluster.placements():
        raise bad_request(f"no vhost '{vhost}'")
    status, body = await _move(request, vhost, target)
    return web.json_response(body, status=status)


async def remove_member(request: web.Request) -> web.Response:
    """DELETE /api/vhosts/{vhost}/members/{node}: on (or forwarded to) the vhost's leader."""
    status, body = await _remove(request, request.match_info["vhost"], request.match_info["node"])
    return web.json_response(body, status=status)


async def forget_node(request: web.Request) -> web.Response:
    """DELETE /api/nodes/{name}: move every leadership off the node, then remove it from
    every vhost's members; leaders add it back only when it is started again."""
    cluster = _cluster_of(request)
    node = request.match_info["name"]
    if node == cluster.name:
        raise bad_request(f"node '{node}' cannot forget itself; ask another node")
    coordinator = cluster.coordinator
    if coordinator is None:
        raise bad_request(f"node '{cluster.name}' has not joined the cluster")
    await coordinator.forget(node)  # first: no leader adds it back meanwhile
    done: list[str] = []
    for vhost, members in sorted(cluster.placements().items()):
        if node not in members:
            continue
        if cluster.leader_of(vhost) == node:
            running = {n["name"] for n in cluster.nodes() if n.get("running")}
            others = [n for n in cluster.in_sync(vhost) if n != node and n in running]
            if not others:
                raise bad_request(
                    f"vhost '{vhost}' has no other running in-sync member to lead it; "
                    f"stopped there (done: {', '.join(done) or 'none'})"
                )
            status, body = await _move(request, vhost, others[0])
            if status != 200:
                raise bad_request(f"vhost '{vhost}': {(body or {}).get('reason', status)}")
            await _until(lambda v=vhost: cluster.leader_of(v) not in (None, node), 20.0)
        for _ in range(100):  # the new leader may still be recovering the vhost
            status, body = await _remove(request, vhost, node)
            if status == 200:
                break
            await asyncio.sleep(0.2)
        else:
            raise bad_request(f"vhost '{vhost}': {(body or {}).get('reason', status)}")
        done.append(vhost)
    return web.json_response({"node": node, "vhosts": done})


async def _until(predicate: Any, timeout: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise bad_request("the new leader did not take over in time")
        await asyncio.sleep(0.05)
