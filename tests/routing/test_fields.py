"""Type inference and canonical forms of AMQP field values."""

from __future__ import annotations

import datetime
from decimal import Decimal

import pytest

from roarmq.broker.routing.fields import arguments_key, infer_type, match_value, typed_table


@pytest.mark.parametrize(
    ("value", "type_char"),
    [
        (True, "t"),
        (0, "I"),
        (2**31 - 1, "I"),
        (-(2**31), "I"),
        (2**31, "l"),
        (1.5, "d"),
        ("s", "S"),
        (b"b", "x"),
        (None, "V"),
        ({}, "F"),
        ([], "A"),
        (Decimal("1.5"), "D"),
        (datetime.datetime(2020, 1, 1), "T"),
    ],
)
def test_infer_type(value: object, type_char: str) -> None:
    assert infer_type(value) == type_char


def test_infer_type_rejects_unknown() -> None:
    with pytest.raises(TypeError):
        infer_type(object())


def test_typed_table_mixes_typed_and_plain() -> None:
    assert typed_table({"a": 1, "b": ("l", 2), "c": None}) == {
        "a": ("I", 1),
        "b": ("l", 2),
        "c": ("V", None),
    }
    assert typed_table(None) == {}


def test_match_values_are_hashable_and_erlang_equal() -> None:
    assert match_value("I", 1) == match_value("d", 1.0)
    assert hash(match_value("I", 1)) == hash(match_value("d", 1.0))
    assert match_value("t", True) != match_value("I", 1)
    assert match_value("S", "é") == match_value("x", "é".encode())
    assert match_value("S", "\udcff") == match_value("x", b"\xff")
    assert match_value("D", Decimal("1.5")) == match_value("D", (1, 15))
    assert match_value("D", Decimal("1.5")) != match_value("D", Decimal("1.50"))
    assert match_value("F", {}) == match_value("A", [])
    assert match_value("F", {"a": [1, {"b": None}]}) == match_value(
        "F", {"a": ("A", [("I", 1), ("F", {"b": ("V", None)})])}
    )
    nan = float("nan")
    assert match_value("d", nan) == match_value("f", nan)  # documented: NaN equals NaN
    with pytest.raises(ValueError):
        match_value("Q", 1)
    with pytest.raises(ValueError):
        match_value("I", "one")


def test_arguments_key_is_typed_identity() -> None:
    assert arguments_key(None) == arguments_key({}) == ()
    assert arguments_key({"a": 1}) == arguments_key({"a": ("I", 1)})
    assert arguments_key({"a": 1}) != arguments_key({"a": ("l", 1)})
    assert arguments_key({"a": 1, "b": 2}) == arguments_key({"b": 2, "a": 1})
    assert arguments_key({"a": ("L", 1)}) == arguments_key({"a": ("l", 1)})
    hash(arguments_key({"a": {"b": [1, 2]}, "c": Decimal("2.5")}))
