"""The property flags and BasicProperties are generated from the spec, in one place."""

from __future__ import annotations

from roarmq.broker.core import message
from roarmq.protocol import properties, spec


def test_one_flag_per_property_bit_15_first() -> None:
    for position, (name, _) in enumerate(spec.BASIC_PROPERTIES):
        flag = 0x8000 >> position
        assert getattr(spec, f"FLAG_{name.upper()}") == flag
        assert getattr(properties, f"FLAG_{name.upper()}") == flag


def test_properties_and_the_broker_take_them_from_the_generated_spec() -> None:
    assert properties.BasicProperties is spec.BasicProperties
    for name in ("HEADERS", "DELIVERY_MODE", "PRIORITY", "REPLY_TO", "EXPIRATION", "USER_ID"):
        assert getattr(message, f"FLAG_{name}") is getattr(spec, f"FLAG_{name}")
