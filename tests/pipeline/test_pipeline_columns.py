"""The archive's columns and the definitions' records are defined once, broker-side."""

from __future__ import annotations

from roarmq.broker import archive
from roarmq.broker.store import definitions as store
from roarmq.pipeline import definitions, jobs, reader
from roarmq.protocol.properties import BASIC_PROPERTIES


def test_the_pipeline_reads_the_archives_own_columns() -> None:
    names = archive.SCHEMA.names
    assert set(archive.ENVELOPE_COLUMNS) | set(archive.TRAFFIC_COLUMNS) <= set(names)
    assert reader.REQUIRED == (
        "ts",
        "vhost",
        "exchange",
        "routing_key",
        "headers",
        "body_size",
        "queue_count",
        "queues",
        "unroutable",
    )
    assert jobs._ENVELOPE == list(archive.ENVELOPE_COLUMNS)
    assert jobs._TRAFFIC_COLUMNS == list(archive.TRAFFIC_COLUMNS)


def test_a_column_per_property_headers_first() -> None:
    properties = [name for name, _ in BASIC_PROPERTIES]
    start = archive.SCHEMA.names.index("headers")
    columns = archive.SCHEMA.names[start : start + len(properties)]
    assert columns == ["headers", *(p for p in properties if p != "headers")]


def test_one_exchange_and_binding_definition() -> None:
    assert definitions.ExchangeDef is store.ExchangeDef
    assert definitions.BindingDef is store.BindingDef
