"""Generated broker definitions and a generated traffic archive for the pipeline benchmarks
(bench/pipeline.py, bench/pipeline_scale.py): ``make_definitions`` (topic and direct bindings
over 1,000 queues), ``key_pool`` (envelopes that each match one binding, or none) and
``make_archive`` (rows in the broker's own archive schema and file layout).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

SESSION = "20240501T000000-000000"  # the writer session named in generated file names
START_HOUR = 1_714_521_600 // 3600  # 2024-05-01T00Z
QUEUES = 1000


def make_definitions(bindings: int) -> dict[str, Any]:
    """Definitions with ``bindings`` bindings: 60% wildcard patterns on one topic exchange
    (``s{i}.*.x`` / ``s{i}.#``), 40% keys on one direct exchange, over ``QUEUES`` queues."""
    n_topic = bindings * 6 // 10
    out = {
        "vhosts": [{"name": "/"}],
        "exchanges": [
            {"name": "bench.topic", "vhost": "/", "type": "topic", "arguments": {}},
            {"name": "bench.direct", "vhost": "/", "type": "direct", "arguments": {}},
        ],
        "queues": [{"name": f"q{i}", "vhost": "/", "arguments": {}} for i in range(QUEUES)],
        "bindings": [],
    }
    for i in range(bindings):
        if i < n_topic:
            source, key = "bench.topic", f"s{i}.*.x" if i % 2 == 0 else f"s{i}.#"
        else:
            source, key = "bench.direct", f"d{i}"
        out["bindings"].append(
            {
                "source": source,
                "vhost": "/",
                "destination": f"q{i % QUEUES}",
                "destination_type": "queue",
                "routing_key": key,
                "arguments": {},
            }
        )
    return out


def key_pool(bindings: int, keys: int) -> tuple[list[str], list[str], list[list[str]]]:
    """Distinct (exchange, routing key, queues) envelopes: each matches one binding, or none."""
    rng = random.Random(7)
    n_topic = bindings * 6 // 10
    exchanges, routing_keys, queues = [], [], []
    for k in range(keys):
        r = k % 20
        if r == 0:  # 5%: nothing matches
            exchanges.append("bench.topic")
            routing_keys.append(f"nomatch.{k}")
            queues.append([])
        elif r < 13:  # 60%: topic
            i = rng.randrange(n_topic)
            exchanges.append("bench.topic")
            routing_keys.append(f"s{i}.w{k}.x" if i % 2 == 0 else f"s{i}.w{k}.y")
            queues.append([f"q{i % QUEUES}"])
        else:  # 35%: direct
            i = n_topic + rng.randrange(bindings - n_topic)
            exchanges.append("bench.direct")
            routing_keys.append(f"d{i}")
            queues.append([f"q{i % QUEUES}"])
    return exchanges, routing_keys, queues


def make_archive(
    root: Path, rows: int, bindings: int, keys: int, hours: int = 24, zipf: float = 0.0
) -> float:
    """Write ``rows`` archive rows (the broker's schema and layout); returns seconds taken.

    Keys are drawn uniformly from the pool, or with ``zipf`` > 0 by Zipf's law (the key of
    rank r with weight 1 / r**zipf), as real traffic has a few hot keys and a long tail.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from roarmq.broker.archive import FILE_ROWS, PARQUET_OPTIONS, ROW_GROUP_ROWS, SCHEMA, hour_name

    started = time.monotonic()
    exchanges, routing_keys, queues = key_pool(bindings, keys)
    pool_ex = pa.array(exchanges, pa.string())
    pool_key = pa.array(routing_keys, pa.string())
    pool_q = pa.array(queues, pa.list_(pa.string()))
    rng = np.random.default_rng(11)
    weights = None
    if zipf > 0:
        weights = 1.0 / np.arange(1, keys + 1) ** zipf
        weights /= weights.sum()
        rng.shuffle(weights)  # hot keys spread over every kind of envelope
    per_hour = -(-rows // hours)
    written = 0
    seq = 0
    for h in range(hours):
        n = min(per_hour, rows - written)
        if n <= 0:
            break
        drawn = rng.choice(keys, n, p=weights) if weights is not None else rng.integers(0, keys, n)
        idx = pa.array(drawn)
        ts = (START_HOUR + h) * 3_600_000_000 + np.sort(rng.integers(0, 3_600_000_000, n))
        trace = rng.random(n) < 0.10
        # {"trace": int32}: u32 length 11, key length 5, "trace", type 'I', value
        packed = np.zeros(n, dtype="S15")
        values = rng.integers(0, 2**31 - 1, int(trace.sum()), dtype=np.int32)
        packed[trace] = [b"\x00\x00\x00\x0b\x05traceI" + int(v).to_bytes(4, "big") for v in values]
        headers = pa.array(packed.astype(object), pa.binary())
        headers = pa.compute.if_else(pa.array(trace), headers, pa.nulls(n, pa.binary()))
        q = pool_q.take(idx)
        counts = pa.compute.list_value_length(q).cast(pa.int32())
        columns = {
            "ts": pa.array(ts, SCHEMA.field("ts").type),
            "vhost": pa.array(["/"] * n, pa.string()),
            "exchange": pool_ex.take(idx),
            "routing_key": pool_key.take(idx),
            "headers": headers,
            "body_size": pa.array(rng.integers(16, 2048, n)),
            "queue_count": counts,
            "queues": q,
            "unroutable": pa.compute.equal(counts, 0),
        }
        table = pa.Table.from_arrays(
            [columns.get(f.name, pa.nulls(n, f.type)) for f in SCHEMA], schema=SCHEMA
        )
        directory = root / "vhost=%2F" / f"hour={hour_name(START_HOUR + h)}"
        directory.mkdir(parents=True, exist_ok=True)
        for start in range(0, n, FILE_ROWS):  # as the broker writes: files, row groups, encodings
            seq += 1
            pq.write_table(
                table.slice(start, FILE_ROWS),
                directory / f"part-{SESSION}-{seq:08d}.parquet",
                row_group_size=ROW_GROUP_ROWS,
                **PARQUET_OPTIONS,
            )
        written += n
    return time.monotonic() - started
