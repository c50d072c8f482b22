"""Runtime parameters (broker/core/parameters.py): values by vhost, component and name;
a component checks a value and hears when one is set or cleared; an unknown component
is refused in RabbitMQ's words."""

from __future__ import annotations

import pytest

from roarmq.broker.core.parameters import ParameterError, Parameters


class Recorder:
    name = "thing"

    def __init__(self) -> None:
        self.heard: list[tuple] = []

    def check(self, vhost, name, value, user):
        if not isinstance(value, dict):
            raise ParameterError([f"{name} not a list", "and another"])
        return {"checked": value, "by": user}

    def set(self, vhost, name, checked):
        self.heard.append(("set", vhost, name, checked))

    def clear(self, vhost, name):
        self.heard.append(("clear", vhost, name))


def test_set_again_clear_and_rows():
    params, thing = Parameters(), Recorder()
    params.register(thing)
    with pytest.raises(ValueError):
        params.register(Recorder())
    checked = params.check("/", "thing", "a", {"x": 1}, "guest")
    assert params.apply("/", "thing", "a", {"x": 1}, checked) is True
    assert params.apply("/", "thing", "a", {"x": 1}, checked) is False  # the same: nothing
    assert params.apply("/", "thing", "a", {"x": 2}, {"checked": {"x": 2}}) is False
    assert thing.heard == [
        ("set", "/", "a", {"checked": {"x": 1}, "by": "guest"}),
        ("set", "/", "a", {"checked": {"x": 2}}),
    ]
    params.apply("v", "thing", "b", {}, {})
    assert params.rows() == [
        {"value": {"x": 2}, "vhost": "/", "component": "thing", "name": "a"},
        {"value": {}, "vhost": "v", "component": "thing", "name": "b"},
    ]
    params.vhost_deleted("v")
    assert params.remove("/", "thing", "a") is True and params.remove("/", "thing", "a") is False
    assert thing.heard[-2:] == [("clear", "v", "b"), ("clear", "/", "a")]
    assert params.rows() == []


def test_refusals():
    params = Parameters()
    params.register(Recorder())
    with pytest.raises(ParameterError) as refused:
        params.check("/", "nope", "a", {}, "guest")
    assert str(refused.value) == "Validation failed\n\ncomponent nope not found\n"
    with pytest.raises(ParameterError) as refused:
        params.check("/", "thing", "a", 5, "guest")
    assert str(refused.value) == "Validation failed\n\na not a list\nand another\n"
