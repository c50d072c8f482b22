"""The seam between the broker's core and the cluster it may be part of.

The core (connections, channels, streams, persistence, management) never asks whether it
runs in a cluster: it asks `Broker.cluster`, a `ClusterHooks`. On a cluster node that is
`ClusterNode` (broker/cluster/node.py, imported only when `[cluster]` is configured); on a
single node it is `SingleNode`, whose answers are a lone node's: it leads every vhost,
no connection waits or is handed on, its definitions are its own and durable once written.
Per vhost the same shape: `VirtualHost.replicated` is a `VhostReplication` — the vhost's
replicated store while this node leads it in a cluster, `NOT_REPLICATED` otherwise.

Each hook is a question the core has at one place, named for that place's need, so that
a single node answers it with a constant and pays nothing for the cluster."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .amqp.connection import Connection
    from .core.queue import Queue
    from .core.stream import Stream
    from .server import Broker


#: A definitions document's keys that live in each vhost's own log in a cluster (its
#: leader imports them); the rest is operator metadata.
OBJECT_KEYS = ("exchanges", "queues", "bindings")


class ClusterHooks(Protocol):
    """What the core asks of the cluster."""

    @property
    def name(self) -> str:
        """This node's name, as the API and the cluster know it."""
        ...

    # -- lifecycle
    async def start(self) -> None: ...
    async def stop(self) -> None: ...

    # -- what the core tells it (a durable change)
    def vhost_added(self, name: str) -> None: ...
    async def placed(self, name: str) -> None:
        """Once a vhost added here is known where the API may be asked about it."""
        ...

    def definitions_changed(self, vhost: str) -> None: ...
    def queue_created(self, queue: Queue) -> None: ...

    # -- where and how the core keeps a vhost's data
    def stream_home(self, vhost: str) -> Path:
        """The directory the vhost's streams' segment files live under."""
        ...

    @property
    def streams_fsync(self) -> bool:
        """Whether a stream fsyncs its own files (not when a replicated log holds them)."""
        ...

    # -- a client's connection.open
    def vhost_down(self, vhost: str, user: str) -> str | None:
        """541 INTERNAL_ERROR's text when the vhost is down here."""
        ...

    def refusal(self, vhost: str) -> str | None:
        """530 NOT_ALLOWED's text when another node serves the vhost (None: served here)."""
        ...

    def stream_leader(self, vhost: str) -> tuple[str, int] | None:
        """The address and stream-protocol port of the node that serves the vhost, when
        another node does (a stream connection here relays to it); None otherwise."""
        ...

    def must_wait(self, vhost: str) -> bool:
        """The open should be asked again in a moment (a leader recovering, or silent)."""
        ...

    def recovering(self, vhost: str) -> bool:
        """This node leads the vhost but does not serve it yet."""
        ...

    def hand_off(self, conn: Connection, vhost: str, refusal: str) -> bool:
        """Hand the connection to the node that serves the vhost; False: nobody to hand to."""
        ...

    # -- what the management API shows and asks
    def leader_of(self, vhost: str) -> str | None: ...
    def members(self, vhost: str) -> list[str]: ...
    def running(self) -> set[str]:
        """The names of the nodes running now."""
        ...

    def nodes(self) -> list[dict[str, Any]]:
        """Every node known: `name`, `running`, and where the others are reached."""
        ...

    def placements(self) -> dict[str, list[str]]:
        """vhost -> the nodes holding a copy of it."""
        ...

    def node_rows(self, own: dict[str, Any]) -> list[dict[str, Any]]:
        """GET /api/nodes: every node, this one's row (`own`) completed with the cluster's."""
        ...

    def vhost_placement(self, vhost: str) -> dict[str, Any]:
        """The cluster's columns of a vhost's API row."""
        ...

    def quorum_critical(self) -> list[str]:
        """The vhosts that could not go on if this node stopped now."""
        ...

    async def change(self, method: str, *args: Any) -> Any:
        """A change to users, vhosts, permissions, limits, policies or global parameters,
        made where they live; answers as the broker's method of that name does."""
        ...

    def knows_vhost(self, name: str) -> bool:
        """A vhost not on this node yet that is on its way here."""
        ...

    async def barrier(self) -> None:
        """Before a write through the API: this node's copy of operator metadata is as new
        as the place they live in."""
        ...

    async def definitions_durable(self, vhost: str) -> str | None:
        """None once a change to the vhost's definitions made here is durable; else why not."""
        ...

    def operator_refusal(self) -> str | None:
        """Why operations on vhost leaders and members cannot be asked here (None: they can)."""
        ...

    async def import_metadata(
        self, doc: dict[str, Any], import_here: Callable[[dict[str, Any]], None]
    ) -> None:
        """The operator metadata of a definitions document (users, vhosts, permissions,
        limits, policies, parameters), made where they live; `import_here` imports a
        document into this broker."""
        ...


class VhostReplication(Protocol):
    """What a vhost's objects ask of its replicated log (while this node leads it)."""

    #: A durable definition changed and is not yet in the log: replies wait for it.
    definitions_dirty: bool

    def hold_reply(self, conn: Connection) -> None: ...
    def replicate_stream(self, stream: Stream, payload: bytes) -> int:
        """A copy of a stream record in the vhost's log; its offset there (0: none)."""
        ...

    def replicate_offsets(self, stream: Stream, tracked: dict[str, int]) -> None:
        """A stream's stored consumer offsets, all of them, into the vhost's log."""
        ...


class _NotReplicated:
    """A vhost with no replicated log here (a single node, or one this node does not lead):
    nothing to wait for."""

    definitions_dirty = False

    def hold_reply(self, conn: Connection) -> None:
        pass

    def replicate_stream(self, stream: Stream, payload: bytes) -> int:
        return 0

    def replicate_offsets(self, stream: Stream, tracked: dict[str, int]) -> None:
        pass


NOT_REPLICATED: VhostReplication = _NotReplicated()


class SingleNode:
    """`ClusterHooks` of a broker that is not part of a cluster."""

    streams_fsync = True

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    @property
    def name(self) -> str:
        return self.broker.node_name

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def vhost_added(self, name: str) -> None:
        pass

    async def placed(self, name: str) -> None:
        pass

    def definitions_changed(self, vhost: str) -> None:
        pass

    def queue_created(self, queue: Queue) -> None:
        pass

    def stream_home(self, vhost: str) -> Path:
        return Path(self.broker.config.storage.data_dir)

    def vhost_down(self, vhost: str, user: str) -> str | None:
        return None

    def refusal(self, vhost: str) -> str | None:
        return None

    def stream_leader(self, vhost: str) -> tuple[str, int] | None:
        return None

    def must_wait(self, vhost: str) -> bool:
        return False

    def recovering(self, vhost: str) -> bool:
        return False

    def hand_off(self, conn: Connection, vhost: str, refusal: str) -> bool:
        return False

    def leader_of(self, vhost: str) -> str | None:
        return self.name

    def members(self, vhost: str) -> list[str]:
        return [self.name]

    def running(self) -> set[str]:
        return {self.name}

    def nodes(self) -> list[dict[str, Any]]:
        return [{"name": self.name, "running": True}]

    def placements(self) -> dict[str, list[str]]:
        return {name: [self.name] for name in self.broker.vhosts}

    def node_rows(self, own: dict[str, Any]) -> list[dict[str, Any]]:
        return [own]

    def vhost_placement(self, vhost: str) -> dict[str, Any]:
        return {}

    def quorum_critical(self) -> list[str]:
        return []

    async def change(self, method: str, *args: Any) -> Any:
        return getattr(self.broker, method)(*args)

    def knows_vhost(self, name: str) -> bool:
        return False

    async def barrier(self) -> None:
        pass

    async def definitions_durable(self, vhost: str) -> str | None:
        return None  # written to the definitions store before the change was answered

    def operator_refusal(self) -> str | None:
        return "this broker is not a cluster node"

    async def import_metadata(
        self, doc: dict[str, Any], import_here: Callable[[dict[str, Any]], None]
    ) -> None:
        import_here({k: v for k, v in doc.items() if k not in OBJECT_KEYS})
