"""The management API's list query parameters, as RabbitMQ's: columns, sort, name, pages.

One middleware, so every list endpoint answers them the same way (RabbitMQ 3.10.8's
behaviour, checked against it):

- `columns=a,b.c` keeps those (dotted) fields of each item; missing ones are left out.
- `sort=field` (dotted) and `sort_reverse=true`; strings compare by their bytes.
- `page=N` (with `page_size`, default 100, at most 500) answers
  `{"filtered_count", "item_count", "items", "page", "page_count", "page_size",
  "total_count"}`; only then does `name=` filter, case-insensitively, as a substring or,
  with `use_regex=true`, a regular expression. A page past the end is 400
  `page_out_of_range`.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

from aiohttp import web

QUERY_KEYS = frozenset(
    {"columns", "sort", "sort_reverse", "page", "page_size", "name", "use_regex"}
)
MAX_PAGE_SIZE = 500


def _get(item: Any, path: list[str]) -> Any:
    for part in path:
        if not isinstance(item, dict) or part not in item:
            return _MISSING
        item = item[part]
    return item


_MISSING = object()


def _project(item: Any, columns: list[list[str]]) -> Any:
    if not isinstance(item, dict):
        return item
    out: dict[str, Any] = {}
    for path in columns:
        value = _get(item, path)
        if value is _MISSING:
            continue
        target = out
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = value
    return out


def _sort_key(value: Any) -> tuple:
    if value is _MISSING or value is None:
        return (0, b"")
    if isinstance(value, bool | int | float):
        return (1, value)
    if isinstance(value, str):
        return (2, value.encode("utf-8", "surrogateescape"))
    return (3, json.dumps(value, sort_keys=True).encode())


def _bad(error: str, reason: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(
        text=json.dumps({"error": error, "reason": reason}), content_type="application/json"
    )


def shape(data: Any, query: Any) -> Any:
    """Apply RabbitMQ's list parameters to a decoded response body."""
    columns = [c.split(".") for c in query.get("columns", "").split(",") if c]
    if not isinstance(data, list):
        return _project(data, columns) if columns else data
    items = data
    total = len(items)
    paged = "page" in query
    if paged:
        items = _by_name(items, query, lambda i: str(i.get("name", "")))
    if "sort" in query:
        path = query["sort"].split(".")
        items = sorted(items, key=lambda i: _sort_key(_get(i, path)))
        if query.get("sort_reverse") == "true":
            items.reverse()
    if columns:
        items = [_project(i, columns) for i in items]
    if not paged:
        return items
    page, size = _page_params(query)
    return _envelope(items, page, size, total)


#: Set on a request whose handler answered the list parameters itself (paged_objects).
SHAPED: Any = web.RequestKey("shaped", bool) if hasattr(web, "RequestKey") else "roarmq.shaped"


def paged_objects(
    request: web.Request,
    objects: list[Any],
    name_of: Any,
    row: Any,
    sort_keys: dict[str, Any],
) -> Any:
    """Answer `page=` requests filtering and sorting the objects themselves and building
    rows for one page only: 100,000 queues cost a sort of names, not 100,000 rows and two
    JSON passes (3.9 s of a stalled event loop before this). None when the request needs the
    general path (no page, or a sort on a field without a cheap key)."""
    query = request.query
    sort = query.get("sort")
    if "page" not in query or (sort is not None and sort not in sort_keys):
        return None
    items = _by_name(objects, query, name_of)
    if sort is not None:
        key = sort_keys[sort]
        items = sorted(items, key=lambda o: _sort_key(key(o)))
        if query.get("sort_reverse") == "true":
            items.reverse()
    page, size = _page_params(query)
    envelope = _envelope(items, page, size, len(objects))
    columns = [c.split(".") for c in query.get("columns", "").split(",") if c]
    rows = [row(o) for o in envelope["items"]]
    envelope["items"] = [_project(r, columns) for r in rows] if columns else rows
    request[SHAPED] = True
    return envelope


def paged_stream(request: web.Request, count: int, objects: Any, row: Any) -> dict[str, Any]:
    """A `page=` request without `sort=` or `name=` over `count` objects in their own order
    (an iterable, walked only up to the page's end): rows are built for that page only."""
    page, size = _page_params(request.query)
    envelope = _envelope_counts(count, page, size, count)
    start = (page - 1) * size
    rows = [row(o) for o in itertools.islice(objects, start, start + envelope["item_count"])]
    columns = [c.split(".") for c in request.query.get("columns", "").split(",") if c]
    envelope["items"] = [_project(r, columns) for r in rows] if columns else rows
    request[SHAPED] = True
    return envelope


def _by_name(items: list[Any], query: Any, name_of: Any) -> list[Any]:
    """RabbitMQ's `name=` filter: a case-insensitive substring, or with `use_regex=true` a
    case-insensitive regular expression."""
    text = query.get("name")
    if not text:
        return items
    if query.get("use_regex") == "true":
        try:
            pattern = re.compile(text, re.IGNORECASE)
        except re.error as exc:
            raise _bad("bad_request", f"invalid regular expression: {exc}") from None
        return [i for i in items if pattern.search(name_of(i))]
    text = text.lower()
    return [i for i in items if text in name_of(i).lower()]


def _page_params(query: Any) -> tuple[int, int]:
    try:
        page = int(query["page"])
        size = min(int(query.get("page_size", 100)), MAX_PAGE_SIZE)
    except ValueError:
        raise _bad("bad_request", "page and page_size must be integers") from None
    if page < 1 or size < 1:
        raise _bad("bad_request", "page and page_size must be positive")
    return page, size


def _envelope_counts(filtered: int, page: int, size: int, total: int) -> dict[str, Any]:
    """The envelope of page `page` of `filtered` items, without them (400 past the end)."""
    page_count = max((filtered + size - 1) // size, 1)
    if page > page_count:
        raise _bad(
            "page_out_of_range",
            f"Page out of range, page: {page} page size: {size}, len: {filtered}",
        )
    return {
        "filtered_count": filtered,
        "item_count": max(min(size, filtered - (page - 1) * size), 0),
        "items": [],
        "page": page,
        "page_count": page_count,
        "page_size": size,
        "total_count": total,
    }


def _envelope(items: list[Any], page: int, size: int, total: int) -> dict[str, Any]:
    envelope = _envelope_counts(len(items), page, size, total)
    envelope["items"] = items[(page - 1) * size : page * size]
    return envelope


@web.middleware
async def list_query(request: web.Request, handler: Any) -> web.StreamResponse:
    response = await handler(request)
    if (
        request.get(SHAPED)
        or request.method != "GET"
        or not QUERY_KEYS.intersection(request.query)
        or not isinstance(response, web.Response)
        or response.content_type != "application/json"
        or response.status != 200
        or response.body is None
    ):
        return response
    data = json.loads(response.body)  # type: ignore[arg-type]
    return web.json_response(shape(data, request.query))
