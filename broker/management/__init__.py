"""The management HTTP API (a RabbitMQ-shaped subset), the web UI's files and Prometheus
metrics. Statistics are plain integers kept on queues and exchanges and read only when
someone asks (`/api/...` or a `/metrics` scrape), so observability costs the per-message
path nothing but an increment.

- `server.py`: ManagementServer, the route table, login and authorization by user tags.
- `context.py`: what a handler reads from its request (broker, user, vhosts, JSON body)
  and the refusals in RabbitMQ's shapes.
- `rows.py`: the JSON rows of exchanges, queues, bindings, messages, vhosts, connections,
  channels and consumers.
- `definitions.py`: /api/definitions (the document: broker/core/definitions_json.py).
- `objects.py`: exchanges, queues, bindings; publish, get, purge, route explain.
- `access.py`: vhosts, users, permissions, topic permissions, limits, policies.
- `clients.py`: connections, channels, consumers.
- `node.py`: overview, nodes, health checks, aliveness, parameters, /metrics.
"""

from ..core.definitions_json import (
    RABBITMQ_API_VERSION,
    export_definitions,
    import_definitions,
    limit_rows,
    permission_rows,
    topic_permission_rows,
    user_rows,
)
from .server import ManagementServer

__all__ = [
    "RABBITMQ_API_VERSION",
    "ManagementServer",
    "export_definitions",
    "import_definitions",
    "limit_rows",
    "permission_rows",
    "topic_permission_rows",
    "user_rows",
]
