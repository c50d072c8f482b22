"""RabbitMQ-format definitions files (``GET /api/definitions``): exchanges, queues, bindings.

Only what routing needs is kept, validated with messages that name the file and the place: JSON
syntax errors give json's line and column, structural ones the key path
(``bindings[3].destination``). Every vhost also has the broker's predeclared exchanges (the
default exchange and ``amq.*``), which exports leave out, exactly as ``broker/core/vhost.py`` declares
them. Whether each binding's arguments are acceptable to its index is checked when a
:class:`pipeline.router.Router` is built from the result.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from json.decoder import scanstring
from pathlib import Path
from typing import Any

from roarmq.broker.core.exchange import EXCHANGE_TYPES
from roarmq.broker.core.vhost import BUILTIN_EXCHANGES
from roarmq.broker.routing.fields import arguments_key
from roarmq.broker.store.definitions import BindingDef, ExchangeDef

from .errors import PipelineError

DEFAULT_VHOST = "/"


@dataclass(slots=True)
class Definitions:
    """What a definitions file says about routing, with the predeclared exchanges added."""

    path: str
    fingerprint: str  # of the file's bytes: executors cache one router per fingerprint
    exchanges: dict[tuple[str, str], ExchangeDef] = field(default_factory=dict)
    queues: set[tuple[str, str]] = field(default_factory=set)
    bindings: list[BindingDef] = field(default_factory=list)
    vhosts: set[str] = field(default_factory=set)

    def fail(self, where: str, message: str) -> PipelineError:
        """An error about key path ``where`` of this file, with its line when it can be read."""
        try:
            text = Path(self.path).read_bytes().decode("utf-8", "replace")
        except OSError:
            text = ""
        return _Checker(self.path, text).fail(where, message)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
    }.get(type(value), type(value).__name__)


_WS = " \t\n\r"
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


def locate(text: str, where: str) -> tuple[int, int] | None:
    """``(line, column)`` where the value at key path ``where`` starts in a JSON document.

    Walks the text (json only reports positions for syntax errors), skipping sibling values with
    ``raw_decode``; ``None`` if the path is not there (a missing key).
    """
    decoder = json.JSONDecoder()
    steps = [
        m.group(1) if m.group(1) is not None else int(m.group(2))
        for m in _STEP.finditer("." + where if not where.startswith("[") else where)
    ]

    def skip(pos: int) -> int:
        while pos < len(text) and text[pos] in _WS:
            pos += 1
        return pos

    pos = skip(0)
    try:
        for step in steps:
            opener = text[pos]
            pos = skip(pos + 1)
            if opener == "{" and isinstance(step, str):
                while text[pos] != "}":
                    key, pos = scanstring(text, pos + 1)
                    pos = skip(skip(pos) + 1)  # past the colon
                    if key == step:
                        break
                    pos = skip(decoder.raw_decode(text, pos)[1])
                    if text[pos] == ",":
                        pos = skip(pos + 1)
                else:
                    return None
            elif opener == "[" and isinstance(step, int):
                for _ in range(step):
                    if text[pos] == "]":
                        return None
                    pos = skip(decoder.raw_decode(text, pos)[1])
                    if text[pos] == ",":
                        pos = skip(pos + 1)
                if text[pos] == "]":
                    return None
            else:
                return None
    except (IndexError, ValueError):
        return None
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


class _Checker:
    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.text = text

    def fail(self, where: str, message: str) -> PipelineError:
        """``file:line:col: key.path: message``; the position of the nearest present key."""
        probe = where
        while probe:
            found = locate(self.text, probe)
            if found is not None:
                return PipelineError(f"{self.path}:{found[0]}:{found[1]}: {where}: {message}")
            probe = re.sub(r"(\.[^.\[]+|\[\d+\])$", "", probe)
        return PipelineError(f"{self.path}: {where}: {message}")

    def get(self, obj: dict, where: str, key: str, kind: type, default: Any = ...) -> Any:
        if key not in obj or (obj[key] is None and default is not ...):
            if default is ...:
                raise self.fail(f"{where}.{key}" if where else key, "missing")
            return default
        value = obj[key]
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            expected = {str: "a string", dict: "an object", list: "an array", bool: "a boolean"}
            raise self.fail(
                f"{where}.{key}" if where else key,
                f"expected {expected[kind]}, got {_type_name(value)}",
            )
        return value


def parse_definitions(text: str | bytes, path: str) -> Definitions:
    """Validate a definitions document; ``PipelineError`` naming the file and the place."""
    raw = text.encode() if isinstance(text, str) else text
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise PipelineError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise PipelineError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    check = _Checker(path, raw.decode("utf-8", "replace"))
    if not isinstance(doc, dict):
        raise PipelineError(
            f"{path}: expected a JSON object at the top level, got {_type_name(doc)}"
        )
    defs = Definitions(path=path, fingerprint=hashlib.sha256(raw).hexdigest())

    for i, item in enumerate(check.get(doc, "", "vhosts", list, [])):
        where = f"vhosts[{i}]"
        if not isinstance(item, dict):
            raise check.fail(where, f"expected an object, got {_type_name(item)}")
        defs.vhosts.add(check.get(item, where, "name", str))

    declared: list[tuple[dict, str]] = []
    for i, item in enumerate(check.get(doc, "", "exchanges", list, [])):
        where = f"exchanges[{i}]"
        if not isinstance(item, dict):
            raise check.fail(where, f"expected an object, got {_type_name(item)}")
        declared.append((item, where))
        defs.vhosts.add(check.get(item, where, "vhost", str, DEFAULT_VHOST))
    queues = check.get(doc, "", "queues", list, [])
    for i, item in enumerate(queues):
        where = f"queues[{i}]"
        if not isinstance(item, dict):
            raise check.fail(where, f"expected an object, got {_type_name(item)}")
        vhost = check.get(item, where, "vhost", str, DEFAULT_VHOST)
        defs.vhosts.add(vhost)
        defs.queues.add((vhost, check.get(item, where, "name", str)))

    for vhost in sorted(defs.vhosts):
        defs.exchanges[(vhost, "")] = ExchangeDef(vhost, "", "direct", builtin=True)
        for name, type_ in BUILTIN_EXCHANGES:
            defs.exchanges[(vhost, name)] = ExchangeDef(vhost, name, type_, builtin=True)
    for item, where in declared:
        vhost = check.get(item, where, "vhost", str, DEFAULT_VHOST)
        name = check.get(item, where, "name", str)
        if name == "":
            continue  # the default exchange: nothing to declare
        type_ = check.get(item, where, "type", str, "direct")
        if type_ not in EXCHANGE_TYPES:
            raise check.fail(
                f"{where}.type",
                f"unsupported exchange type {type_!r} "
                f"(expected one of {', '.join(EXCHANGE_TYPES)})",
            )
        previous = defs.exchanges.get((vhost, name))
        if previous is not None and not previous.builtin:
            raise check.fail(
                f"{where}.name",
                f"exchange {name!r} in vhost {vhost!r} is already declared at {previous.where}",
            )
        arguments = check.get(item, where, "arguments", dict, {})
        defs.exchanges[(vhost, name)] = ExchangeDef(
            vhost, name, type_, arguments=arguments, where=where
        )

    seen: set[tuple] = set()
    for i, item in enumerate(check.get(doc, "", "bindings", list, [])):
        where = f"bindings[{i}]"
        if not isinstance(item, dict):
            raise check.fail(where, f"expected an object, got {_type_name(item)}")
        vhost = check.get(item, where, "vhost", str, DEFAULT_VHOST)
        source = check.get(item, where, "source", str)
        destination = check.get(item, where, "destination", str)
        dtype = check.get(item, where, "destination_type", str, "queue")
        key = check.get(item, where, "routing_key", str, "")
        arguments = check.get(item, where, "arguments", dict, {})
        if source == "":
            raise check.fail(f"{where}.source", "the default exchange cannot have bindings")
        if (vhost, source) not in defs.exchanges:
            raise check.fail(f"{where}.source", f"unknown exchange {source!r} in vhost {vhost!r}")
        if dtype == "queue":
            if (vhost, destination) not in defs.queues:
                raise check.fail(
                    f"{where}.destination", f"unknown queue {destination!r} in vhost {vhost!r}"
                )
        elif dtype == "exchange":
            if destination == "" or (vhost, destination) not in defs.exchanges:
                raise check.fail(
                    f"{where}.destination", f"unknown exchange {destination!r} in vhost {vhost!r}"
                )
        else:
            raise check.fail(
                f"{where}.destination_type", f'expected "queue" or "exchange", got {dtype!r}'
            )
        try:
            identity = (vhost, source, dtype, destination, key, arguments_key(arguments))
        except (TypeError, ValueError) as exc:
            raise check.fail(f"{where}.arguments", str(exc)) from None
        if identity in seen:
            continue  # the broker keeps one binding per identity, as RabbitMQ does
        seen.add(identity)
        defs.bindings.append(
            BindingDef(
                vhost,
                source,
                destination,
                dtype,
                key,
                arguments,
                id=len(defs.bindings),
                where=where,
            )
        )
    return defs


def load_definitions(path: str | Path) -> Definitions:
    """Read and validate a definitions file (see :func:`parse_definitions`)."""
    name = str(path)
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise PipelineError(f"{name}: definitions file not found") from None
    except IsADirectoryError:
        raise PipelineError(f"{name}: is a directory, expected a definitions JSON file") from None
    except OSError as exc:
        raise PipelineError(f"{name}: cannot read definitions: {exc.strerror}") from None
    return parse_definitions(raw, name)
