"""Flow control: why a connection's socket is not being read, kept in one place.

Each connection owns one `FlowControl`. Reading stops while any *reason* holds
and resumes when the last one is released; nothing else pauses or resumes the
transport. The reasons (see docs/architecture.md, "Flow control"):

* `ALARM`   -- the broker's memory or disk alarm is set and this connection
  publishes (consumers that only ack keep being read, so queues drain);
* a `Queue` -- a queue this connection published to is in flow state: it has
  consumers, all of them at their prefetch limit, and a backlog over
  `queue.FLOW_HIGH` (over `FLOW_HIGH_UNREAD` when a consumer takes nothing: a
  full socket); it releases its publishers under `FLOW_LOW`;
* `WRITES`  -- our own output to this client is over `WRITE_HIGH` bytes (the
  transport called `pause_writing`): a client that does not read what it asked
  for (gets, recovers, confirms) is not read either, until it drains;
* `BACKLOG` -- frames already read but not yet handled, because one turn of the
  loop handles at most `READ_BUDGET` of them before yielding to other
  connections (fair service under a flood).

Write state is kept here too (`writable`), since deliveries stop on the same
signal that holds `WRITES`.
"""

from __future__ import annotations

import asyncio
from typing import Any

#: Frames handled per connection per loop turn. A flooding publisher's 256 KiB
#: read holds ~3,300 small publishes (~30 ms of parsing and routing); handling 128
#: at a time lets every other connection's acks and deliveries in between: with
#: 4 publishers and 4 consumers flat out the longest loop stall fell from 50 ms
#: (256 frames, 4 ms turns) to ~15-20 ms (bench/overload.py 4p4c).
READ_BUDGET = 128
#: ...and at most this long a turn, for frames that are expensive one by one
#: (routing-cache misses on 121-word keys cost ~150 us each). The clock is read
#: every STEP frames: a read is 45 ns, but valgrind emulates it as a syscall, and
#: every 16 frames showed as +1,300 instructions a message in callgrind.
TURN_SECONDS = 0.002
STEP = 32
#: Bytes of a read parsed at a time (~850 small publishes, ~3.4 ms).
PARSE_CHUNK = 64 * 1024

#: Transport write-buffer limits: over HIGH, deliveries stop and the client is
#: not read until the buffer is under LOW.
WRITE_HIGH = 1024 * 1024
WRITE_LOW = 256 * 1024


class _Reason:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


ALARM = _Reason("alarm")
WRITES = _Reason("writes")
BACKLOG = _Reason("backlog")
#: connection.open waits for a just-elected leader to recover its vhost (cluster only).
AWAIT_RECOVERY = _Reason("vhost recovering")
#: A durable declare, bind or delete waits for its definitions write, off the event loop
#: (broker/core/persistence.py): the connection's next frames wait with it.
STORE_WRITE = _Reason("definitions write")


class FlowControl:
    """The reasons a connection is not read; `hold` / `release` are the only way in or out."""

    __slots__ = ("_transport", "reasons", "queues", "reading_paused", "writable", "_on_resume")

    def __init__(self, on_resume: Any) -> None:
        self._transport: asyncio.Transport | None = None
        self.reasons: set[Any] = set()
        #: The queues among the reasons: their backlog holds this publisher (flow state).
        self.queues: set[Any] = set()
        self.reading_paused = False
        self.writable = True
        self._on_resume = on_resume  # called (soon) when the last reason is released

    def attach(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        try:
            transport.set_write_buffer_limits(high=WRITE_HIGH, low=WRITE_LOW)
        except (AttributeError, NotImplementedError):
            pass

    def hold(self, reason: Any) -> None:
        """Stop reading for `reason` (idempotent)."""
        reasons = self.reasons
        if reason in reasons:
            return
        reasons.add(reason)
        if not self.reading_paused:
            self.reading_paused = True
            transport = self._transport
            if transport is not None and not transport.is_closing():
                transport.pause_reading()

    def release(self, reason: Any) -> None:
        """Drop `reason`; when none is left the connection finishes its backlog, then reads."""
        reasons = self.reasons
        if reason not in reasons:
            return
        reasons.discard(reason)
        if not reasons:
            # Never re-enter the connection from inside another one's handler (a consumer's
            # ack releasing a publisher): let the loop run it as its own turn.
            asyncio.get_running_loop().call_soon(self._on_resume)

    def hold_for_queue(self, queue: Any) -> None:
        """A queue this connection publishes to is in flow state (Queue.hold_publisher)."""
        self.queues.add(queue)
        self.hold(queue)

    def release_for_queue(self, queue: Any) -> None:
        self.queues.discard(queue)
        self.release(queue)

    def resume_reading(self) -> None:
        """The connection has nothing left to do: read its socket again."""
        if self.reading_paused and not self.reasons:
            self.reading_paused = False
            transport = self._transport
            if transport is not None and not transport.is_closing():
                transport.resume_reading()

    def clear(self) -> None:
        """The connection is gone: forget every reason without touching the transport."""
        self.reasons.clear()
        self.queues.clear()
        self._transport = None


__all__ = [
    "ALARM",
    "AWAIT_RECOVERY",
    "BACKLOG",
    "PARSE_CHUNK",
    "READ_BUDGET",
    "STEP",
    "STORE_WRITE",
    "TURN_SECONDS",
    "WRITES",
    "WRITE_HIGH",
    "WRITE_LOW",
    "FlowControl",
]
