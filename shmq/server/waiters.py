"""The requests waiting for data: one ``Waiter`` per request (a CONSUME, a READ or a
POLL), one ``WaitingLine`` of them per queue or stream.

Strategy: a waiting request is a small record in its line plus one loop timer, not a
coroutine or a thread, so thousands cost little and closing a connection with many
waiters just marks them done. A waiter carries ``take``: the handler's own attempt,
made again with the engine's non-blocking public API, which returns what to answer or
None for "nothing yet". One algorithm (``WaitingLine``: timers, the doorbell, answering once)
with two ways to serve: a queue's line is first come first served and one message
wakes one waiter (``QueueWaiters``); a stream's readers do not compete, so every one
of its waiters is tried (``StreamWaiters``).
"""

from collections import deque

from ..engine import doze
from ..engine.doze import Doorbell
from ..engine import maintenance
from ..errors import ShmqError

__all__ = ["Waiter", "Answering", "WaitingLine", "QueueWaiters", "StreamWaiters", "NOTHING"]

NOTHING = ()  # what a request that waited in vain is answered with


class Waiter:
    """One waiting request: who asked (``conn``, ``msg_id``, ``msg_type``), ``take(args)``
    to try again, ``reply(conn, args, what it got)`` for the reply's payload; ``timer``
    answers it with NOTHING at its deadline. ``conn.answer(waiter, result)`` gets the
    result or the exception."""

    __slots__ = ("conn", "line", "msg_id", "msg_type", "take", "reply", "args", "timer", "done")

    def __init__(self, conn, line, msg_id, msg_type, take, reply, args):
        self.conn = conn
        self.line = line
        self.msg_id = msg_id
        self.msg_type = msg_type
        self.take = take
        self.reply = reply
        self.args = args
        self.timer = None
        self.done = False


class Answering:
    """Where waiters stand until answered, once: ``finish`` (a result or an exception)
    or ``drop`` (no answer); ``_ended(w)`` is the holder's own tidying as one leaves."""

    __slots__ = ()

    def finish(self, w, result):
        """Answer ``w`` with a result or an exception (once)."""
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
        self._ended(w)
        return True

    def _ended(self, w) -> None:
        raise NotImplementedError


class WaitingLine(Answering):
    """The waiters on one queue or stream (``handle``), in arrival order.

    Data made by this server's loop schedules a ``serve`` (``TcpServer.notify``). Data
    made by other processes (local producers and appenders writing to shared memory),
    nacks, leases lapsing or given back, delays ending are heard by the line's
    ``Doorbell``: a thread that sleeps on the handle's semaphore while anyone waits and
    schedules a ``serve`` on the loop when it is woken. Finished or dropped waiters leave
    the FIFO lazily; it is compacted when they are most of it, so dropping n waiters costs
    O(n).
    """

    def __init__(self, loop, handle):
        self.loop = loop
        self.handle = handle
        self.fifo = deque()
        self.live = 0
        self.bell = Doorbell(self)
        self.scheduled = False  # a serve is due at the loop's next turn

    def add(self, w, deadline):
        """Line ``w`` up until ``deadline`` (loop time). Its request was just tried and
        found nothing: data that came since is looked for now."""
        self.fifo.append(w)
        self.live += 1
        w.timer = self.loop.call_at(deadline, self.finish, w, NOTHING)
        self._arm()

    def _ended(self, w) -> None:
        self.live -= 1
        if len(self.fifo) > 2 * self.live + 64:
            self.fifo = deque(x for x in self.fifo if not x.done)

    def schedule(self):
        if self.live and not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self._serve_scheduled)

    def _serve_scheduled(self):
        self.scheduled = False
        self.serve()

    def rang(self):
        """The doorbell rang: data may have come from outside this loop."""
        if self.live:
            self.serve()

    def _arm(self):
        """The doorbell waits from now on (if it is not already); what came between the
        request's own try and now is looked for (a hint: one word read, no lock)."""
        try:
            self.bell.arm(doze.stamp(self.handle))
            if self.hint():
                self.schedule()
        except ShmqError:
            self.schedule()  # deleted or closed: let the waiters find out

    def _try(self, w):
        """``w.take(w.args)``: a result, an exception (deleted, lock timeout...: the waiter hears
        of it), or None."""
        try:
            return w.take(w.args)
        except Exception as e:
            return e

    def serve(self) -> bool:
        """Answer the waiters that can be answered now; True if one was."""
        raise NotImplementedError

    def hint(self) -> bool:
        """Whether a serve may find something (a cheap look, or always True)."""
        return True

    def answer_all(self, result):
        """Answer every waiter with ``result`` (stop, queue or stream deleted)."""
        while self.fifo:
            self.finish(self.fifo.popleft(), result)

    def retire(self):
        """The handle goes (deleted, forgotten, the server stops): the doorbell stops."""
        self.bell.stop()


class QueueWaiters(WaitingLine):
    """The CONSUMEs waiting on one queue, first come first served: ``serve`` hands ready
    messages to the waiters in order and stops at the first that finds the queue empty.
    The hint looks at the queue's ready count — one word, no lock, no syscall."""

    def hint(self) -> bool:
        return maintenance.ready_hint(self.handle)

    def serve(self) -> bool:
        served = False
        while self.fifo:
            w = self.fifo[0]
            if w.done:
                self.fifo.popleft()
                continue
            result = self._try(w)
            if result is None:
                break
            served = True
            self.fifo.popleft()
            self.finish(w, result)
        return served


class StreamWaiters(WaitingLine):
    """The READs and POLLs waiting at the end of one stream's partitions. Readers do not
    compete (a record is there for all of them), so ``serve`` tries every waiter; each
    try is one look under a partition's lock."""

    def serve(self) -> bool:
        served = False
        for w in list(self.fifo):
            if w.done:
                continue
            result = self._try(w)
            if result is not None:
                served = True
                self.finish(w, result)
        if self.live == 0:
            self.fifo.clear()
        return served
