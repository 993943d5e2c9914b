"""The CONSUMEs waiting for messages: one ``Waiter`` per request, one first-come
first-served line (``QueueWaiters``) per queue.

Strategy: a waiting CONSUME is a small record in its queue's line plus one loop timer,
not a coroutine or a thread, so thousands cost little and closing a connection with
many waiters just marks them done. A put serves the first waiter only: one message
wakes one waiter. The line calls only the engine's non-blocking public API
(``get_many(timeout=0)``, ``ready_hint``), so the loop never blocks on a queue.
"""

import asyncio
from collections import deque

from ..errors import QueueEmpty, ShmqError

__all__ = ["Waiter", "QueueWaiters", "NOTHING"]

NOTHING = ()  # the deliveries of a CONSUME that waited in vain


class Waiter:
    """One waiting CONSUME: who asked, for what; ``timer`` answers it empty at its deadline.
    ``conn.answer(waiter, result)`` gets the deliveries or the exception."""

    __slots__ = ("conn", "group", "msg_id", "most", "vis", "max_bytes", "timer", "done")

    def __init__(self, conn, group, msg_id, most, vis, max_bytes):
        self.conn = conn
        self.group = group
        self.msg_id = msg_id
        self.most = most
        self.vis = vis
        self.max_bytes = max_bytes
        self.timer = None
        self.done = False


class QueueWaiters:
    """The CONSUMEs waiting on one queue, first come first served.

    ``serve`` hands ready messages to the waiters in order and stops at the first that
    finds the queue empty: one message wakes one waiter. Puts made by this server's loop
    schedule a ``serve`` (``TcpServer.notify``). Puts by other processes (local producers
    writing to shared memory), leases expiring and delays ending are seen by a poller task
    that reads the queue's ready count — one word, no lock, no syscall — with a short
    backoff while anyone waits, so no thread ever competes with the loop for the GIL.
    Finished or dropped waiters leave the FIFO lazily; it is compacted when they are most
    of it, so dropping n waiters costs O(n).
    """

    POLL_S = (0.0002, 0.002)  # first and longest pause between reads of the ready count

    def __init__(self, loop, q):
        self.loop = loop
        self.q = q
        self.fifo = deque()
        self.live = 0
        self._poller = None
        self._scheduled = False

    def add(self, w, deadline):
        self.fifo.append(w)
        self.live += 1
        w.timer = self.loop.call_at(deadline, self.finish, w, NOTHING)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.ensure_future(self._poll())

    def finish(self, w, result):
        """Answer ``w`` with deliveries or an exception (once)."""
        if self._end(w):
            w.conn.answer(w, result)

    def drop(self, w):
        """Forget ``w`` without an answer: its connection is closing."""
        self._end(w)

    def _end(self, w) -> bool:
        if w.done:
            return False
        w.done = True
        w.timer.cancel()
        self.live -= 1
        if len(self.fifo) > 2 * self.live + 64:
            self.fifo = deque(x for x in self.fifo if not x.done)
        return True

    def schedule(self):
        if self.live and not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._scheduled_serve)

    def _scheduled_serve(self):
        self._scheduled = False
        self.serve()

    def serve(self) -> bool:
        """Hand ready messages to the waiters in order; True if one got messages."""
        served = False
        while self.fifo:
            w = self.fifo[0]
            if w.done:
                self.fifo.popleft()
                continue
            try:
                result = self.q.get_many(w.most, timeout=0, visibility_timeout=w.vis, max_bytes=w.max_bytes)
                served = True
            except QueueEmpty:
                break
            except Exception as e:  # deleted, lock timeout...: the waiter hears of it
                result = e
            self.fifo.popleft()
            self.finish(w, result)
        return served

    def answer_all(self, result):
        """Answer every waiter with ``result`` (stop, queue deleted)."""
        while self.fifo:
            self.finish(self.fifo.popleft(), result)
        if self._poller is not None:
            self._poller.cancel()

    async def _poll(self):
        pause = self.POLL_S[0]
        while self.live:
            try:
                ready = self.q.ready_hint()
            except ShmqError:
                ready = True  # deleted or closed: let the waiters find out
            if ready and self.serve():
                pause = self.POLL_S[0]
            else:
                pause = min(pause * 2, self.POLL_S[1])
            await asyncio.sleep(pause)
