"""RoarMQ broker: the asyncio daemon (connections, channels, exchanges, queues).

The wire codec lives in `protocol/` (sans-IO); routing data structures in `broker/routing/`.
"""

__version__ = "0.1.0"

import logging as _logging

# Quiet when embedded (tests, libraries); `python -m broker` installs real handlers.
_logging.getLogger("roarmq").addHandler(_logging.NullHandler())
