"""Raising AMQP exceptions with RabbitMQ's reply texts.

RabbitMQ prefixes every reply text with the code's name ("NOT_FOUND - no queue
'q' in vhost '/'"); `ProtocolError.close_text` adds that prefix when the close
is sent, so the messages built here carry only what went wrong.
"""

from __future__ import annotations

from roarmq.protocol.errors import HardError, SoftError


def channel_error(code: int, message: str, class_id: int = 0, method_id: int = 0) -> SoftError:
    """A channel exception: the channel closes, the connection lives on."""
    return SoftError(code, message, class_id=class_id, method_id=method_id)


def connection_error(code: int, message: str, class_id: int = 0, method_id: int = 0) -> HardError:
    """A connection exception: the whole connection closes."""
    return HardError(code, message, class_id=class_id, method_id=method_id)


class MetadataUnavailable(Exception):
    """A cluster node could not write operator metadata (users, permissions, policies...)
    to etcd, their one home (broker/cluster/metadata.py): nothing was changed. The
    management API answers 503; the node keeps serving with its cached copy."""


class StartupError(Exception):
    """A reason the broker cannot start, told in one line (no traceback)."""
