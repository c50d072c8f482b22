"""pipeline.router (the broker's index) against the naive reference, on random topologies."""

from __future__ import annotations

import json
import random

import pytest
from support import pipeline_reference as ref

from roarmq.pipeline.definitions import parse_definitions
from roarmq.pipeline.router import Router
from roarmq.protocol.tables import encode_table

WORDS = ["a", "b", "c", ""]
PATTERN_WORDS = ["a", "b", "*", "#", ""]


def random_definitions(rng: random.Random) -> dict:
    types = ["direct", "fanout", "topic", "headers"]
    exchanges = []
    for i in range(rng.randint(2, 6)):
        arguments = {}
        if rng.random() < 0.3:
            arguments["alternate-exchange"] = f"x{rng.randrange(6)}"
        exchanges.append(
            {"name": f"x{i}", "vhost": "/", "type": rng.choice(types), "arguments": arguments}
        )
    queues = [{"name": f"q{i}", "vhost": "/"} for i in range(5)]
    kinds = {x["name"]: x["type"] for x in exchanges}
    bindings = []
    for _ in range(rng.randint(0, 25)):
        source = rng.choice(exchanges)["name"]
        to_exchange = rng.random() < 0.25
        destination = rng.choice(exchanges if to_exchange else queues)["name"]
        if kinds[source] == "topic":
            key = ".".join(rng.choice(PATTERN_WORDS) for _ in range(rng.randint(0, 3)))
        else:
            key = ".".join(rng.choice(WORDS[:3]) for _ in range(rng.randint(0, 2)))
        arguments = {}
        if kinds[source] == "headers":
            arguments["x-match"] = rng.choice(["all", "any"])
            for name in rng.sample(["h1", "h2", "h3"], rng.randint(0, 2)):
                arguments[name] = rng.choice([1, 2, "v", None])
        bindings.append(
            {
                "source": source,
                "vhost": "/",
                "destination": destination,
                "destination_type": "exchange" if to_exchange else "queue",
                "routing_key": key,
                "arguments": arguments,
            }
        )
    return {"exchanges": exchanges, "queues": queues, "bindings": bindings}


def random_headers(rng: random.Random) -> dict | None:
    if rng.random() < 0.3:
        return None
    headers = {
        name: rng.choice([1, 2, "v", "w"])
        for name in rng.sample(["h1", "h2", "h3"], rng.randint(0, 3))
    }
    if rng.random() < 0.2:
        headers["CC"] = [".".join(rng.choice(WORDS) for _ in range(rng.randint(0, 2)))]
    if rng.random() < 0.1:
        headers["BCC"] = ["a", "b.c"]
    return headers


@pytest.mark.parametrize("seed", range(40))
def test_router_agrees_with_the_naive_reference(seed, tmp_path):
    rng = random.Random(seed)
    doc = random_definitions(rng)
    path = tmp_path / "defs.json"
    path.write_text(json.dumps(doc))
    defs = parse_definitions(path.read_bytes(), str(path))
    router = Router(defs)
    naive = ref.NaiveRouter(path)
    by_id = {b.id: b for b in defs.bindings}
    for _ in range(150):
        exchange = rng.choice(["", "amq.topic", "nope"] + [x["name"] for x in doc["exchanges"]])
        key = ".".join(rng.choice(WORDS) for _ in range(rng.randint(0, 3)))
        if exchange == "" and rng.random() < 0.5:
            key = f"q{rng.randrange(7)}"
        headers = random_headers(rng)
        raw = None if headers is None else encode_table(headers)
        got = router.route("/", exchange, key, raw)
        want = naive.route("/", exchange, key, headers)
        if want is None:
            assert got is None
            continue
        assert set(got.queues) == want[0], (exchange, key, headers)
        hits = {
            (
                b.vhost,
                b.source,
                b.destination_type,
                b.destination,
                b.routing_key,
                b.arguments_json(),
            )
            for b in map(by_id.__getitem__, got.hits)
        }
        assert hits == want[1], (exchange, key, headers)


def test_headers_sensitivity_follows_exchange_bindings_and_alternates():
    doc = {
        "exchanges": [
            {"name": "t", "type": "topic", "arguments": {"alternate-exchange": "f"}},
            {"name": "f", "type": "fanout"},
            {"name": "h", "type": "headers"},
            {"name": "d", "type": "direct"},
        ],
        "queues": [{"name": "q"}],
        "bindings": [
            {"source": "f", "destination": "h", "destination_type": "exchange"},
            {"source": "d", "destination": "q"},
        ],
    }
    router = Router(parse_definitions(json.dumps(doc), "defs.json"))
    sensitive = {x for v, x in router.headers_sensitive() if v == "/"}
    assert sensitive == {"t", "f", "h", "amq.headers", "amq.match"}
