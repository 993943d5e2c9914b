"""The TCP front of ``shmq server`` (``TcpServer``): listening, the registry of
connections and of cached queue handles with their lines of waiting CONSUMEs, the
sweeper of deadlines, and a stop that answers what is in flight.

Strategy: one asyncio event loop, one protocol object per connection
(``connection.Connection``), no thread and no task per client; the loop only moves
bytes and calls handlers (``handlers.HANDLERS``), which call the engine's public,
non-blocking API. The modules beside this one hold the rest, by concern: ``limits``
(what clients may cost: Limits, the buffer budget, deadlines), ``waiters`` (the
per-queue lines of waiting CONSUMEs), ``leases`` (the deliveries a connection holds),
``handlers`` (one function per request type), ``connection`` (bytes in, frames out).
"""

import asyncio
import logging

from ..engine.broker import Broker
from ..errors import QueueNotFound
from ..protocol import DEFAULT_MAX_FRAME_BYTES, HEADER_SIZE
from .connection import READ_CHUNK, Connection
from .limits import PRE_AUTH_MAX_FRAME_BYTES, SMALL_FRAME_BYTES, Budget, Limits
from .waiters import NOTHING, QueueWaiters

__all__ = ["TcpServer", "Limits", "SMALL_FRAME_BYTES", "PRE_AUTH_MAX_FRAME_BYTES", "LOCK_TIMEOUT_S"]

log = logging.getLogger("shmq.server")

LOCK_TIMEOUT_S = 0.25  # the longest the loop waits for a queue's lock (then LOCK_TIMEOUT)


class TcpServer:
    """Serves one namespace over TCP until ``stop``, within ``limits``."""

    def __init__(self, broker: Broker, host="127.0.0.1", port=7878, token=None,
                 max_frame_bytes=DEFAULT_MAX_FRAME_BYTES, on_create=None, limits: Limits | None = None):
        self.limits = limits if limits is not None else Limits()
        if self.limits.max_buffered_bytes < max_frame_bytes + HEADER_SIZE:
            raise ValueError(f"max_buffered_bytes ({self.limits.max_buffered_bytes}) must hold one whole frame: "
                             f"at least max_frame_bytes + {HEADER_SIZE} = {max_frame_bytes + HEADER_SIZE}")
        self.broker = broker
        self.on_create = on_create  # called with each queue this server creates
        self.host = host
        self.port = port
        self.token = token
        self.max_frame_bytes = max_frame_bytes
        self.connections = set()
        self.lingering = 0  # refused connections not yet closed
        self.stopping = False
        self.budget = Budget(self.limits.max_buffered_bytes)
        self.rview = memoryview(bytearray(READ_CHUNK))  # every connection reads into it, in turn
        self.loop = None
        self._queues = {}
        self._waiters = {}  # queue name -> QueueWaiters
        self._refused = 0  # connections refused since the cap was last reached
        self._server = None
        self._sweeper = None
        self._all_gone = None

    def queue(self, name):
        """A cached handle on queue ``name`` (re-attached after a delete + create)."""
        q = self._queues.get(name)
        if q is not None:
            if not q.deleted:
                return q
            self.forget(name)
        q = self._queues[name] = self.broker.queue(name)
        q.lock_timeout = LOCK_TIMEOUT_S  # a stopped local lock holder stalls the loop this long at most
        return q

    def forget(self, name):
        """Drop the handle on ``name``; whoever waits on it hears that it was deleted."""
        q = self._queues.pop(name, None)
        group = self._waiters.pop(name, None)
        if group is not None:
            group.answer_all(QueueNotFound(f"queue {name!r} was deleted"))
        if q is not None:
            q.close()

    def notify(self, name):
        """Messages were just made ready by this loop: serve that queue's waiting CONSUMEs
        once the current request is answered (the poller is for other processes)."""
        group = self._waiters.get(name)
        if group is not None:
            group.schedule()

    def waiters_of(self, q):
        group = self._waiters.get(q.name)
        if group is None or group.q is not q:
            group = self._waiters[q.name] = QueueWaiters(self.loop, q)
        return group

    # ------------------------------------------------------------------ connections
    def admit(self, conn) -> bool:
        if self.stopping or len(self.connections) >= self.limits.max_connections:
            return False
        self.connections.add(conn)
        return True

    def note_refused(self):
        self._refused += 1
        if self._refused == 1:
            log.info("%d connections open, the limit (--max-connections): refusing new ones",
                     len(self.connections))

    def connection_gone(self, conn):
        self.connections.discard(conn)
        if self._refused and len(self.connections) < self.limits.max_connections:
            log.info("accepting connections again; %d refused meanwhile", self._refused)
            self._refused = 0
        if not self.connections and self._all_gone is not None and not self._all_gone.done():
            self._all_gone.set_result(None)

    async def _sweep(self):
        """Every so often, close the connections past a deadline (frame or idle)."""
        while True:
            await asyncio.sleep(self.limits.sweep_interval)
            now = self.loop.time()
            for conn in list(self.connections):
                conn.check_clocks(now)

    async def start(self):
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(lambda: Connection(self), self.host, self.port, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        self._sweeper = self.loop.create_task(self._sweep())
        return self

    async def stop(self):
        """Stop accepting, answer what is in flight (waiting CONSUMEs get what is
        there, possibly nothing), then close every connection."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for group in list(self._waiters.values()):
            group.serve()
            group.answer_all(NOTHING)
        if self.connections:
            self._all_gone = self.loop.create_future()
            for conn in list(self.connections):
                conn.shut(linger=False)
            try:
                await asyncio.wait_for(asyncio.shield(self._all_gone), 5)
            except asyncio.TimeoutError:
                for conn in list(self.connections):
                    conn.transport.abort()
        if self._server is not None:
            await self._server.wait_closed()
        for name in list(self._queues):
            self.forget(name)
