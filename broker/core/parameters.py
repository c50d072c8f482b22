"""Runtime parameters: named values of a component in a vhost, as RabbitMQ's
rabbit_runtime_parameters keeps them (`shovel`, `federation-upstream`, ...), set through
PUT /api/parameters/{component}/{vhost}/{name}, `roarmq ctl set_parameter` and
definitions.

Each component registers a `Component`: how a value is checked (every refusal in
RabbitMQ's words: `ParameterError`) and what happens when one is set or cleared. The
broker keeps the values (the definitions store, or etcd on a cluster) and tells the
component; RabbitMQ's `vhost-limits` are kept as limits, apart from these.
"""

from __future__ import annotations

from typing import Any, Protocol


class ParameterError(ValueError):
    """A value RabbitMQ would refuse: `str()` is the API's reason, "Validation failed"
    and then each refusal on a line of its own."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("Validation failed\n\n" + "".join(e + "\n" for e in errors))
        self.errors = errors


class Component(Protocol):
    """What a component of runtime parameters does with its values."""

    name: str

    def check(self, vhost: str, name: str, value: Any, user: str) -> Any:
        """The value read (ParameterError if refused); `user` sets it."""
        ...

    def set(self, vhost: str, name: str, checked: Any) -> None:
        """A value was set (new, or in place of another)."""
        ...

    def clear(self, vhost: str, name: str) -> None:
        """The parameter is gone."""
        ...


class Parameters:
    """The broker's runtime parameters and the components they belong to."""

    def __init__(self) -> None:
        self.components: dict[str, Component] = {}
        self.values: dict[tuple[str, str, str], Any] = {}  # (vhost, component, name)

    def register(self, component: Component) -> None:
        if component.name in self.components:
            raise ValueError(f"component {component.name!r} is already registered")
        self.components[component.name] = component

    def check(self, vhost: str, component: str, name: str, value: Any, user: str) -> Any:
        found = self.components.get(component)
        if found is None:
            raise ParameterError([f"component {component} not found"])
        return found.check(vhost, name, value, user)

    def apply(self, vhost: str, component: str, name: str, value: Any, checked: Any) -> bool:
        """Keep a checked value and tell its component; True if the parameter is new."""
        key = (vhost, component, name)
        new = key not in self.values
        if not new and self.values[key] == value:
            return False  # the same value again: nothing restarts (as RabbitMQ's {old, Term})
        self.values[key] = value
        self.components[component].set(vhost, name, checked)
        return new

    def remove(self, vhost: str, component: str, name: str) -> bool:
        if self.values.pop((vhost, component, name), None) is None:
            return False
        found = self.components.get(component)
        if found is not None:
            found.clear(vhost, name)
        return True

    def vhost_deleted(self, vhost: str) -> None:
        for v, component, name in [k for k in self.values if k[0] == vhost]:
            self.remove(v, component, name)

    def rows(self) -> list[dict[str, Any]]:
        """As GET /api/parameters lists them (and definitions hold them)."""
        return [
            {"value": value, "vhost": vhost, "component": component, "name": name}
            for (vhost, component, name), value in sorted(self.values.items())
        ]
