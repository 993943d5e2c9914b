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

import threading
import time
from collections import deque

from ..engine.shm import doze
from ..engine import maintenance
from ..errors import ShmqError

__all__ = ["Waiter", "Answering", "WaitingLine", "Doorbell", "QueueWaiters", "StreamWaiters", "NOTHING"]

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


class Doorbell:
    """The thread that wakes one ``WaitingLine`` for data made outside this loop.

    Strategy: while the line has waiters, the thread sleeps in ``doze.doze`` as a
    registered consumer of the handle, so a local producer's put, a nack, a lease given
    back or lapsing, an append, posts it as it would post any sleeper. Woken, it takes a
    new stamp first and then makes sure a look follows it: one already scheduled on the
    loop (the loop's own put woke it: nothing to do), else one it schedules
    (``call_soon_threadsafe``); then it dozes from that stamp. Whatever came before the
    stamp, that look sees; whatever comes after, wakes the doze. The first doze starts
    from the stamp the loop took as the first waiter lined up. It never touches the
    waiters nor the loop's handle: it sleeps on a handle of its own (``doze.twin``),
    which it closes as it ends. With no waiter it waits to be armed again; idle for
    ``IDLE_S``, the thread ends, and the next waiter starts another.
    """

    IDLE_S = 10.0  # how long a thread with nothing to wait for stays
    sleep = staticmethod(doze.bell)  # what it sleeps in, and the stamp that goes with it (a
    look = staticmethod(doze.stamp)  # subclass may wait for something else: doze.doze_room)
    SLICE_NS = 500_000_000  # one doze's longest sleep: then the line looks again

    def __init__(self, line):
        self.line = line
        self.cond = threading.Condition(threading.Lock())
        self.seen = None  # the stamp the first doze starts from
        self.armed = False  # dozing while the line has waiters
        self.running = False
        self.stopped = False
        self.woken = 0  # dozes ended by data (or a due deadline), not by the slice: what rang it

    def arm(self, seen):
        """Doze from ``seen`` (the loop's stamp, taken after a try that found nothing),
        unless the thread dozes already: then it needs nothing new. (Always under the lock:
        a thread that found the line empty disarms under it, so a look without it could see
        the thread still armed, return, and leave the new waiter with no doorbell.)"""
        with self.cond:
            if self.stopped or self.armed:
                return
            self.seen, self.armed = seen, True
            if self.running:
                self.cond.notify()
                return
            self.running = True
        threading.Thread(target=self._run, name=f"shmq-doorbell-{self.line.handle.name}", daemon=True).start()

    def stop(self):
        """Stop ringing (the thread ends after its doze)."""
        with self.cond:
            self.stopped = True
            self.cond.notify()

    def _run(self):
        line, loop = self.line, self.line.loop
        try:
            h = doze.twin(line.handle)
        except Exception:  # deleted meanwhile: the waiters find out when they look
            h = None
        try:
            seen = None
            while True:
                if seen is None or not self.armed or not line.live:  # (reads without the lock: taken to look again)
                    with self.cond:
                        if not line.live and self.armed:  # answered (a read of one int: no lock needed)
                            self.armed = False
                        if not self.armed and not self.stopped:
                            self.cond.wait(self.IDLE_S)
                        if self.stopped or not self.armed:  # ends under the lock: ``arm`` starts another
                            self.running = False
                            return
                        seen = self.seen
                try:
                    if h is not None:
                        if self.sleep(h, seen, time.monotonic_ns() + self.SLICE_NS):
                            self.woken += 1
                        seen = self.look(h)
                    else:  # gone as the thread started: one look, then wait to be armed again
                        seen = self._disarm()
                except Exception:  # deleted (the waiters find out), or a lock timeout: likewise
                    seen = self._disarm()
                # woken, or a slice went by: a look after the stamp either way (what a take
                # notices by itself, a dead member's partitions say, is looked for twice a
                # second at least); one already due (the loop's own put woke it) will do
                if not line.scheduled and not self.stopped:
                    try:
                        loop.call_soon_threadsafe(line.rang)
                    except RuntimeError:  # the loop is closed: the server is gone
                        return
        finally:
            if h is not None:
                h.close()

    def _disarm(self):
        with self.cond:
            self.armed = False
        return None


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
