"""A virtual host: its exchanges and queues, and how a message finds its queues.

Declarations, deletions and bindings are checked here with RabbitMQ's rules
and reply texts, and routing follows exchange-to-exchange bindings and
alternate exchanges without cycles, delivering once per queue.

A durable change is stored first (broker/core/persistence.py, one SQLite transaction) and
made in memory only once that has committed: if the store raises
DefinitionsWriteFailed, the client's operation fails with nothing of it applied, and
a delete the broker itself decided (auto-delete, x-expires) is logged and left undone.
A client's change may stop at its write (WriteDeferred: the write goes on off the event
loop) and be made again, whole, once it is done; each change begins with
`persistence.settle()`, so that none is decided while another's write is under way.
"""

from __future__ import annotations

import base64
import datetime
import logging
import os
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from roarmq.protocol.errors import (
    ACCESS_REFUSED,
    NOT_FOUND,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
)

from ..cluster_hooks import NOT_REPLICATED, VhostReplication
from ..errors import channel_error
from ..routing.bindings import LAZY_REMOVAL
from ..routing.delayed import DelayedIndex
from ..routing.graph import route_key, route_message
from ..store.definitions import DefinitionsWriteFailed
from . import queue_arguments
from .delayed import Schedule
from .exchange import DefaultExchange, Exchange
from .message import FLAG_HEADERS, Message, copy_properties
from .persistence import WriteDeferred
from .policy import Policy, best
from .queue import Queue, enqueue
from .stream import queue_class
from .trace import TRACE_EXCHANGE

if TYPE_CHECKING:
    from ..ops.clock import Clock
    from ..server import Broker
    from ..store.messages import MessageStore

log = logging.getLogger("roarmq.vhost")

#: The predeclared exchanges of every vhost, as in RabbitMQ.
BUILTIN_EXCHANGES = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
    (TRACE_EXCHANGE, "topic"),  # internal: the firehose's (broker/core/trace.py)
)


_FIELD_TYPE_NAMES = {
    bool: "bool",
    int: "long",
    float: "double",
    str: "longstr",
    bytes: "binary",
    dict: "table",
    list: "array",
}

#: Removed bindings swept out of the routing indexes' tables per loop turn after a large
#: removal (broker/routing/bindings.py): ~2 us each for a topic pattern, ~2 ms a turn.
SWEEP_BUDGET = 1000

REPLY_TO_QUEUE = "amq.rabbitmq.reply-to"
REPLY_TO_PREFIX = "amq.rabbitmq.reply-to."


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _type_name(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return "signedint" if -(2**31) <= value < 2**31 else "long"
    return _FIELD_TYPE_NAMES.get(type(value), type(value).__name__)


def _inequivalent(
    kind: str, name: str, vhost: str, key: str, received: Any, current: Any
) -> Exception:
    return channel_error(
        PRECONDITION_FAILED,
        f"inequivalent arg '{key}' for {kind} '{name}' in vhost '{vhost}': "
        f"received '{_show(received)}' but current is '{_show(current)}'",
    )


def _inequivalent_arg(
    kind: str, name: str, vhost: str, key: str, received: Any, current: Any
) -> Exception:
    """RabbitMQ's words (probed on 3.10.8): two values, whatever their types, by value
    alone ("received '2' but current is '1'"); one missing, each with its type or "none"."""
    if received is not None and current is not None:
        return _inequivalent(kind, name, vhost, key, received, current)
    got = (
        "none"
        if received is None
        else f"the value '{_show(received)}' of type '{_type_name(received)}'"
    )
    cur = (
        "none"
        if current is None
        else f"the value '{_show(current)}' of type '{_type_name(current)}'"
    )
    return channel_error(
        PRECONDITION_FAILED,
        f"inequivalent arg '{key}' for {kind} '{name}' in vhost '{vhost}': "
        f"received {got} but current is {cur}",
    )


def check_not_default(*names: str) -> None:
    """No declare, delete or bind names the default exchange (RabbitMQ's 403)."""
    if "" in names:
        raise channel_error(ACCESS_REFUSED, "operation not permitted on the default exchange")


def check_new_exchange_name(name: str) -> None:
    """`amq.` names are the broker's: a client cannot create one."""
    if name.startswith("amq."):
        raise channel_error(
            ACCESS_REFUSED, f"exchange name '{name}' contains reserved prefix 'amq.*'"
        )


def check_new_queue_name(name: str) -> None:
    """`amq.` names are the broker's, but for the server-named `amq.gen-` ones."""
    if name.startswith("amq.") and not name.startswith("amq.gen-"):
        raise channel_error(ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix 'amq.*'")


def check_deletable_exchange(name: str, vhost: str) -> None:
    check_not_default(name)
    if name.startswith("amq."):
        raise channel_error(
            ACCESS_REFUSED, f"deletion of system exchange '{name}' in vhost '{vhost}' not allowed"
        )


def server_named_queue() -> str:
    """`amq.gen-` and 22 URL-safe base64 characters, as RabbitMQ names them."""
    return "amq.gen-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


class VirtualHost:
    def __init__(self, broker: Broker, name: str) -> None:
        self.broker = broker
        self.name = name
        #: What PUT /api/vhosts stores beside the name (RabbitMQ's vhost metadata).
        self.metadata: dict[str, Any] = {
            "description": "",
            "tags": [],
            "default_queue_type": "classic",
        }
        self.clock: Clock = broker.clock
        self.cache_keys = broker.config.routing.cache_keys
        #: Policies and operator policies by name (broker/core/policy.py); set before any
        #: exchange or queue exists, since each looks its policy up when made.
        self.policies: dict[str, Policy] = {}
        self.operator_policies: dict[str, Policy] = {}
        #: Set once the vhost's definitions are deleted from the store (all in one
        #: transaction), so tearing down its queues and exchanges writes nothing more.
        self.deleted = False
        #: The vhost's ReplicatedVhostStore while this cluster node leads it, else
        #: NOT_REPLICATED: a durable declare's reply waits for its in-sync set there.
        self.replicated: VhostReplication = NOT_REPLICATED
        #: Where its durable queues' messages are stored, and so whom a publish's confirm
        #: waits on: the broker's store, or the vhost's own while a cluster node leads it.
        self.message_store: MessageStore | None = broker.store
        #: message_stats of the vhost's closed channels (metrics.CHANNEL_STATS order).
        self.channel_stats = [0] * 12
        #: The firehose (broker/core/trace.py): publishes and deliveries copied to
        #: amq.rabbitmq.trace; the message path reads only this flag.
        self.tracing = False
        self.trace_pending: list[Message] = []
        self.exchanges: dict[str, Exchange] = {"": DefaultExchange(self)}
        self.queues: dict[str, Queue] = {}
        #: Routing indexes with removed bindings still to sweep, in the order they came.
        self._sweeping: dict[Any, None] = {}
        for xname, xtype in BUILTIN_EXCHANGES:
            self.exchanges[xname] = Exchange(
                self,
                xname,
                xtype,
                durable=True,
                internal=xname == TRACE_EXCHANGE,
                builtin=True,
                cache_keys=self.cache_keys,
            )

    def account_bytes(self, delta: int) -> None:
        self.broker.account_bytes(delta)

    # -- policies -------------------------------------------------------------------

    def policies_for(
        self, kind: str, name: str, queue_type: str = "classic"
    ) -> tuple[Policy | None, Policy | None]:
        """The policy and operator policy that apply to a queue or exchange now."""
        if not self.policies and not self.operator_policies:
            return None, None
        return (
            best(self.policies.values(), kind, name, queue_type),
            best(self.operator_policies.values(), kind, name, queue_type),
        )

    def set_policy(self, policy: Policy) -> None:
        table = self.operator_policies if policy.operator else self.policies
        table[policy.name] = policy
        self.reapply_policies()

    def clear_policy(self, name: str, operator: bool = False) -> bool:
        table = self.operator_policies if operator else self.policies
        if table.pop(name, None) is None:
            return False
        self.reapply_policies()
        return True

    def reapply_policies(self) -> None:
        """Re-evaluate every queue and exchange against the policies (one changed)."""
        for queue in list(self.queues.values()):
            queue.apply_policy(*self.policies_for("queue", queue.name, queue.queue_type))
        for exchange in self.exchanges.values():
            if exchange.name:
                exchange.apply_policy(*self.policies_for("exchange", exchange.name))

    # -- exchanges ------------------------------------------------------------------

    def schedules(self) -> list[Schedule]:
        """The schedules of its delayed exchanges (broker/core/delayed.py)."""
        return [
            x.index.schedule for x in self.exchanges.values() if isinstance(x.index, DelayedIndex)
        ]

    def stored_schedules(self) -> list[Schedule]:
        """The schedules of the durable delayed exchanges: their persistent messages are
        in the message store, as a durable queue's."""
        return [s for s in self.schedules() if s.exchange.durable]

    def get_exchange(self, name: str) -> Exchange:
        exchange = self.exchanges.get(name)
        if exchange is None:
            raise channel_error(NOT_FOUND, f"no exchange '{name}' in vhost '{self.name}'")
        return exchange

    def declare_exchange(
        self,
        name: str,
        type_: str,
        *,
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict | None = None,
    ) -> tuple[Exchange, bool]:
        """Declare (or check) an exchange; returns it and whether it was created."""
        check_not_default(name)
        self.broker.persistence.settle()
        existing = self.exchanges.get(name)
        if passive:
            if existing is None:
                raise channel_error(NOT_FOUND, f"no exchange '{name}' in vhost '{self.name}'")
            return existing, False
        if existing is None:
            check_new_exchange_name(name)
        if existing is not None:
            for key, got, cur in (
                ("type", type_, existing.type),
                ("durable", durable, existing.durable),
                ("auto_delete", auto_delete, existing.auto_delete),
                ("internal", internal, existing.internal),
            ):
                if got != cur:
                    raise _inequivalent("exchange", name, self.name, key, got, cur)
            args = arguments or {}
            for key in set(args) | set(existing.arguments):
                if args.get(key) != existing.arguments.get(key):
                    raise _inequivalent_arg(
                        "exchange", name, self.name, key, args.get(key), existing.arguments.get(key)
                    )
            return existing, False
        exchange = Exchange(
            self,
            name,
            type_,
            durable=durable,
            auto_delete=auto_delete,
            internal=internal,
            arguments=arguments,
            cache_keys=self.cache_keys,
        )
        self.broker.persistence.exchange_created(exchange)
        self.exchanges[name] = exchange
        return exchange, True

    def delete_exchange(self, name: str, if_unused: bool = False) -> None:
        check_deletable_exchange(name, self.name)
        self.broker.persistence.settle()
        exchange = self.exchanges.get(name)
        if exchange is None:
            # RabbitMQ answers delete-ok for an exchange that does not exist.
            return
        if if_unused and exchange.index.has_bindings():
            raise channel_error(
                PRECONDITION_FAILED, f"exchange '{name}' in vhost '{self.name}' in use"
            )
        self._remove_exchange(exchange)

    def _remove_exchange(self, exchange: Exchange) -> None:
        self.broker.persistence.exchange_deleted(exchange)
        exchange.deleted = True
        if isinstance(exchange.index, DelayedIndex):  # what it held goes with it
            exchange.index.schedule.on_deleted()
        self.exchanges.pop(exchange.name, None)
        self.broker.totals.retire_exchange(exchange)
        if len(exchange.index) >= LAZY_REMOVAL:  # its tables go over loop turns, not at once
            exchange.index.remove_all()
            self._sweep_later(exchange.index)
        for other in list(self.exchanges.values()):
            if other.exchange_dests and other.remove_destination(exchange):
                self._sweep_later(other.index)
                self._maybe_auto_delete(other)

    def _maybe_auto_delete(self, exchange: Exchange) -> None:
        """Delete an auto-delete exchange left without bindings; the broker's own decision,
        so a store that cannot write it is logged and the exchange kept (it is tried again
        when its next binding goes)."""
        if exchange.auto_delete and not exchange.deleted and not exchange.index.has_bindings():
            try:
                self._remove_exchange(exchange)
            except DefinitionsWriteFailed as exc:
                exc.log_to(log, "; the auto-delete exchange stays", vhost=self.name)

    def _sweep_later(self, index: Any) -> None:
        """Sweep the bindings a large removal left in ``index``'s tables (gone from routes,
        counts and listings already) over the next loop turns, ``SWEEP_BUDGET`` a turn."""
        if not index.to_sweep() or index in self._sweeping:
            return
        if not self._sweeping:
            self.clock.call_soon(self._sweep)
        self._sweeping[index] = None

    def _sweep(self) -> None:
        budget = SWEEP_BUDGET
        sweeping = self._sweeping
        while sweeping and budget > 0:
            index = next(iter(sweeping))
            budget -= index.sweep(budget)
            if not index.to_sweep():
                del sweeping[index]
        if sweeping:
            self.clock.call_soon(self._sweep)

    # -- queues ---------------------------------------------------------------------

    def get_queue(self, name: str, connection: Any = None) -> Queue:
        queue = self.queues.get(name)
        if queue is None:
            raise channel_error(NOT_FOUND, f"no queue '{name}' in vhost '{self.name}'")
        if connection is not None:
            self.check_exclusive(queue, connection)
        return queue

    def check_exclusive(self, queue: Queue, connection: Any) -> None:
        if queue.exclusive_owner is not None and queue.exclusive_owner is not connection:
            raise self._locked(queue)

    def _locked(self, queue: Queue) -> Exception:
        return channel_error(
            RESOURCE_LOCKED,
            f"cannot obtain exclusive access to locked queue '{queue.name}' in vhost "
            f"'{self.name}'. It could be originally declared on another connection or the "
            "exclusive property value does not match that of the original declaration.",
        )

    def declare_queue(
        self,
        name: str,
        connection: Any,
        *,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict | None = None,
    ) -> tuple[Queue, bool]:
        self.broker.persistence.settle()
        self.broker.totals.queues_declared += 1
        if name == "":
            if passive:
                raise channel_error(NOT_FOUND, f"no queue '' in vhost '{self.name}'")
            queue_arguments.check_server_named(arguments)
            name = server_named_queue()
        existing = self.queues.get(name)
        if passive:
            if existing is None:
                raise channel_error(NOT_FOUND, f"no queue '{name}' in vhost '{self.name}'")
            self.check_exclusive(existing, connection)
            existing.touch()
            return existing, False
        if existing is not None:
            self.check_exclusive(existing, connection)
            if exclusive != (existing.exclusive_owner is not None):
                raise self._locked(existing)  # RabbitMQ's strict check, even for the owner
            for key, got, cur in (
                ("durable", durable, existing.durable),
                ("auto_delete", auto_delete, existing.auto_delete),
            ):
                if got != cur:
                    raise _inequivalent("queue", name, self.name, key, got, cur)
            # The arguments RabbitMQ compares on redeclaration: broker/core/queue_arguments.py.
            differs = queue_arguments.inequivalent(arguments or {}, existing.arguments)
            if differs is not None:
                raise _inequivalent_arg("queue", name, self.name, *differs)
            existing.touch()
            return existing, False
        check_new_queue_name(name)
        most = self.broker.limit("vhost", self.name, "max-queues")
        if most is not None and len(self.queues) >= most:
            raise channel_error(
                PRECONDITION_FAILED,
                f"cannot declare queue '{name}': queue limit in vhost '{self.name}' ({most}) "
                "is reached",
            )
        queue = queue_class(arguments)(
            self,
            name,
            durable=durable,
            exclusive_owner=connection if exclusive else None,
            auto_delete=auto_delete,
            arguments=arguments,
        )
        try:
            self.broker.persistence.queue_created(queue)
        except (DefinitionsWriteFailed, WriteDeferred) as exc:
            queue.on_deleted()  # its x-expires timer, started by the constructor
            if isinstance(exc, WriteDeferred):
                self.broker.totals.queues_declared -= 1  # counted when it is made again
            raise
        self.queues[name] = queue
        if exclusive:
            connection.exclusive_queues.append(queue)
        self.broker.totals.queues_created += 1
        return queue, True

    def delete_queue(
        self,
        queue: Queue,
        *,
        if_unused: bool = False,
        if_empty: bool = False,
        reason: str = "deleted",
        reply: Callable[[int], None] | None = None,
    ) -> int:
        """Delete a queue. Returns the messages dropped.

        `reply(count)` runs once the delete is sure to happen, before the consumers get
        basic.cancel: RabbitMQ answers queue.delete-ok first (py-amqp waiting for the ok
        would take an earlier cancel for its own consumer's and raise).
        """
        self.broker.persistence.settle()
        if queue.deleted:
            if reply is not None:
                reply(0)
            return 0
        if not queue_arguments.QUEUE_TYPES[queue.queue_type].conditional_delete:
            if_unused = if_empty = False  # a stream: deleted whatever it holds (RabbitMQ's)
        if if_unused and queue.consumer_count:
            raise channel_error(
                PRECONDITION_FAILED, f"queue '{queue.name}' in vhost '{self.name}' in use"
            )
        if if_empty and queue.message_count():
            raise channel_error(
                PRECONDITION_FAILED, f"queue '{queue.name}' in vhost '{self.name}' is not empty"
            )
        count = queue.message_count()
        self.broker.persistence.queue_deleted(queue)
        if reply is not None:
            reply(count)
        for consumer in queue.consumers():
            consumer.channel.cancel_by_server(consumer)
        self.queues.pop(queue.name, None)
        self.broker.totals.retire_queue(queue)
        entries = queue.on_deleted()
        for entry in entries:
            queue.settle(entry)
        for exchange in list(self.exchanges.values()):
            if exchange.name and exchange.remove_destination(queue):
                self._sweep_later(exchange.index)
                self._maybe_auto_delete(exchange)
        owner = queue.exclusive_owner
        if owner is not None and queue in owner.exclusive_queues:
            owner.exclusive_queues.remove(queue)
        return count

    def delete_queue_by_server(self, queue: Queue, reason: str) -> None:
        """A delete the broker decided (auto-delete, x-expires): if the store cannot write
        it, log that and keep the queue, whole and stored, with its x-expires countdown
        started again; the delete is tried again when its condition next arises."""
        try:
            self.delete_queue(queue, reason=reason)
        except DefinitionsWriteFailed as exc:
            exc.log_to(log, f"; the queue stays ({reason})", vhost=self.name)
            queue.touch()

    # -- bindings -------------------------------------------------------------------

    def bind_queue(
        self, queue: Queue, exchange: Exchange, key: str, arguments: dict | None
    ) -> None:
        check_not_default(exchange.name)
        self._bind(exchange, queue, key, arguments)

    def unbind_queue(
        self, queue: Queue, exchange: Exchange, key: str, arguments: dict | None
    ) -> None:
        check_not_default(exchange.name)
        self._unbind(exchange, queue, key, arguments)

    def bind_exchange(
        self, destination: Exchange, source: Exchange, key: str, arguments: dict | None
    ) -> None:
        check_not_default(source.name, destination.name)
        self._bind(source, destination, key, arguments)

    def unbind_exchange(
        self, destination: Exchange, source: Exchange, key: str, arguments: dict | None
    ) -> None:
        check_not_default(source.name, destination.name)
        self._unbind(source, destination, key, arguments)

    def _bind(self, source: Exchange, dest: Any, key: str, arguments: dict | None) -> None:
        """Bind in memory, store the binding if it is new, and undo the bind if that fails.

        Why not store first: the index's bind is what validates the arguments (x-match,
        topic patterns) and knows whether the binding is new under its own idea of equal
        arguments; asking beforehand would repeat that. Nothing sees the binding between
        bind and undo: the loop is single-threaded and the SQLite write synchronous, and
        unbind is bind's exact inverse (the routing-key cache may be colder, no more). The
        same undo comes before a deferred write (WriteDeferred): the bind is made again.
        """
        self.broker.persistence.settle()
        try:
            added = source.bind(key, dest, arguments)
        except ValueError as exc:
            raise channel_error(PRECONDITION_FAILED, str(exc)) from None
        if not added:
            return
        try:
            self.broker.persistence.binding_added(source, dest, key, arguments)
        except (DefinitionsWriteFailed, WriteDeferred):
            source.unbind(key, dest, arguments)
            raise
        self._bindings_changed(source)

    def _unbind(self, source: Exchange, dest: Any, key: str, arguments: dict | None) -> None:
        """Delete the stored binding, then the one in memory: deleting a binding that
        is not stored (or not there at all) changes nothing on disk."""
        self.broker.persistence.settle()
        self.broker.persistence.binding_removed(source, dest, key, arguments)
        if source.unbind(key, dest, arguments):
            self._bindings_changed(source)
            self._maybe_auto_delete(source)

    def _bindings_changed(self, source: Exchange) -> None:
        """A federated exchange's links make its bindings on their upstreams too; only an
        exchange a policy applies to can be one, and only while links exist."""
        federation = self.broker.federation
        if source.policy is not None and federation.links:
            federation.bindings_changed(self.name, source.name)

    # -- routing --------------------------------------------------------------------

    def route(self, exchange: Exchange, msg: Message) -> Collection[Queue]:
        """The queues a message published to `exchange` reaches, each once."""
        if msg.flags & FLAG_HEADERS:
            return route_message(exchange, msg.routing_key, msg.headers, self.exchanges.get)
        return route_key(exchange, msg.routing_key, None, self.exchanges.get)

    def _route_key(self, exchange: Exchange, key: str, headers: dict | None) -> Collection[Queue]:
        return route_key(exchange, key, headers, self.exchanges.get)

    #: Hand a routed message to its queues (broker/core/queue.py's `enqueue`, compiled there).
    enqueue = staticmethod(enqueue)

    # -- dead-lettering -------------------------------------------------------------

    def dead_letter(self, queue: Queue, msg: Message, reason: str) -> None:
        """Republish to the queue's DLX with an x-death record, as RabbitMQ writes it
        (at most once: what is not taken, or has no route, is gone)."""
        routed = self.dead_letter_copy(queue, msg, reason)
        if routed is not None and routed[1]:
            self.enqueue(*routed)

    def dead_letter_to(self, dead: Message, targets: Collection[Queue]) -> list[Queue]:
        """Hand a dead-lettered copy to each of `targets` on its own, as a publisher in
        confirm mode would (a failed store refuses it): the ones that did not take it (a
        full queue that rejects publishes, a failed store). At-least-once dead-lettering
        (`Queue`'s dead-letter-strategy) keeps the message until this is empty."""
        refused = []
        for target in targets:
            if target.deleted:
                continue
            # A copy of its own each time: a stored message's record is its Message's
            # (store_id), and a queue that took one keeps it.
            copy = Message(dead.exchange, dead.routing_key, dead.header, dead.body)
            copy.persistent = dead.persistent
            ok, _token = self.enqueue(copy, [target], True)
            if not ok:
                refused.append(target)
        return refused

    def dead_letter_copy(
        self, queue: Queue, msg: Message, reason: str
    ) -> tuple[Message, list[Queue]] | None:
        """The copy a dead-lettering republishes (x-death added, as RabbitMQ writes it) and
        the queues its DLX routes it to (none: no route); None: no such exchange (RabbitMQ
        drops the message then)."""
        if queue.dlx is None:
            return None
        exchange = self.exchanges.get(queue.dlx)
        if exchange is None:
            return None
        if msg.body is None:
            store = queue.store or self.broker.store  # a clustered vhost's store, or the node's
            msg = Message(msg.exchange, msg.routing_key, msg.header, store.body(msg))
        old = msg.properties
        props = copy_properties(old)
        headers = dict(props.headers or {})
        # Whatever a publisher put in x-death (an int, a string, tables of odd values),
        # the message is dead-lettered: entries that are not tables are dropped, as is
        # an x-death that is not an array.
        old_deaths = headers.get("x-death")
        deaths = (
            [dict(d) for d in old_deaths if isinstance(d, dict)]
            if isinstance(old_deaths, list)
            else []
        )
        routing_keys = [msg.routing_key]
        cc = headers.get("CC")
        if isinstance(cc, list):
            routing_keys.extend(k for k in cc if isinstance(k, str))
        now = datetime.datetime.fromtimestamp(int(self.clock.wall()), tz=datetime.UTC)
        now = now.replace(tzinfo=None)
        for i, death in enumerate(deaths):
            if death.get("queue") == queue.name and death.get("reason") == reason:
                count = death.get("count")
                death["count"] = (count if type(count) is int else 0) + 1
                death["time"] = now
                deaths.insert(0, deaths.pop(i))
                break
        else:
            death = {
                "count": 1,
                "reason": reason,
                "queue": queue.name,
                "time": now,
                "exchange": msg.exchange,
                "routing-keys": routing_keys,
            }
            if props.expiration is not None:
                death["original-expiration"] = props.expiration
            deaths.insert(0, death)
        headers["x-death"] = deaths
        if "x-first-death-reason" not in headers:
            headers["x-first-death-reason"] = reason
            headers["x-first-death-queue"] = queue.name
            headers["x-first-death-exchange"] = msg.exchange
        headers["x-last-death-reason"] = reason
        headers["x-last-death-queue"] = queue.name
        headers["x-last-death-exchange"] = msg.exchange
        props.headers = headers
        props.expiration = None
        key = queue.dlrk if queue.dlrk is not None else msg.routing_key
        try:
            dead = msg.with_properties(props, routing_key=key, exchange=queue.dlx)
        except (ValueError, TypeError) as exc:
            # Not expected (the codec re-encodes whatever it decoded), but a message
            # that was accepted is never lost to an exception: it goes on unchanged.
            log.warning(
                "dead-lettered without x-death: headers could not be re-encoded",
                extra={"queue": queue.name, "vhost": self.name, "error": str(exc)},
            )
            dead = Message(queue.dlx, key, msg.header, msg.body)
        dead.persistent = msg.persistent
        if queue.dlrk is not None:
            targets = self._route_key(exchange, key, headers)
        else:
            targets = set()
            for k in routing_keys:
                targets.update(self._route_key(exchange, k, headers))
        rejected_in_path = any(d.get("reason") == "rejected" for d in deaths)
        # A message that would loop through the same queue with no client rejection
        # in the cycle is dropped, as RabbitMQ does.
        targets = [
            t
            for t in targets
            if rejected_in_path or not any(d.get("queue") == t.name for d in deaths)
        ]
        return dead, targets
