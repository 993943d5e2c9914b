"""Celery's event loop fed from shmq's queues (``shmq.kombu``'s transport on a local
attach): the worker runs ``asynloop`` and the prefork pool's non-blocking AsynPool, as it
does on Redis or RabbitMQ, instead of kombu's synchronous fallback.

Strategy: each turn of kombu's Hub takes what the consumed queues have ready, as far as
each channel's prefetch allows; a queue that stays empty a moment gets a doorbell thread
(the server's ``Doorbell``, asleep as a plain consumer) that writes a byte down a pipe the
loop polls when data comes.
"""

import os
import threading
from collections import deque
from functools import lru_cache
from queue import Empty

from .engine.shm import doze
from .engine.maintenance import ready_hint
from .errors import QueueNotFound

__all__ = ["EventLoop"]


@lru_cache(maxsize=None)
def _bell_class():
    """The server's ``Doorbell``, asleep as a plain consumer (``doze.doze``), not as a
    server's doorbell (``doze.bell``): a server's own puts owe those no post
    (``waits.serving``), and this worker's loop is not that server's."""
    from .server.waiters import Doorbell

    return type("Bell", (Doorbell,), {"sleep": staticmethod(doze.doze), "__doc__": _bell_class.__doc__})


class WatchedQueue:
    """One queue a channel consumes, as a doorbell of shmq's (``server/waiters.py``) rings
    it: ``live`` while the event loop found it empty and wants to hear of data. It is
    the doorbell's loop too: a ring goes to ``wake`` (the event loop's pipe)."""

    def __init__(self, wake, handle):

        self.handle = handle
        self.loop = self  # (what the doorbell rings through: ``call_soon_threadsafe``)
        self.live = False
        self.scheduled = False  # a ring on its way to the loop
        self.quiet = None  # the loop's timer that arms the line if the queue stays empty
        self._wake = wake
        self.bell = _bell_class()(self)

    def wait_from(self, seen) -> None:
        """The queue was empty at a try after ``seen`` (a ``doze.stamp``): ring when data
        may have come since."""
        self.live = True
        self.bell.arm(seen)

    def call_soon_threadsafe(self, callback) -> None:  # (the doorbell's thread)
        self.scheduled = True
        self._wake(callback)

    def rang(self) -> None:  # (the event loop)
        self.scheduled = self.live = False

    def stop(self) -> None:
        if self.quiet is not None:
            self.quiet.cancel()
        self.live = False  # (the doorbell looks at it after each doze: it ends then)
        self.bell.stop()


class EventLoop:
    """Celery's event loop (kombu's Hub) fed from shmq's queues, for a local attach: the
    worker runs ``asynloop`` and the prefork pool's non-blocking AsynPool, as on Redis,
    instead of kombu's synchronous fallback and a pool that blocks each hand-over.

    Strategy: each turn of the loop (``on_tick``) takes from every consumed queue not
    known to be empty, without waiting, as far as its channel's prefetch allows. A queue
    that stays empty for ``QUIET_S`` is armed (its ``WatchedQueue``) from a stamp taken
    before its last try, so its doorbell thread rings — a byte down a pipe the loop polls — for
    whatever came after. While the worker is busy its own turns (a task's result, an
    ack) find the next messages, and a producer's puts post nobody: a queue emptied by
    each take would otherwise cost a thread's wake-up and a ring per message, in the
    worker and in the producer. A settle, a new consumer or a new prefetch needs no ring:
    the next turn looks."""

    BUDGET = 64  # deliveries per turn; with more ready the loop turns again at once
    QUIET_S = 0.002  # how long a queue stays empty before its doorbell listens

    def __init__(self, transport, hub):
        self.transport = transport
        self.hub = hub
        self.watched = {}  # (channel, kombu queue name) -> WatchedQueue
        self.rung = deque()  # the lines' ``rang``, run on the loop
        self._lock = threading.Lock()  # the pipe's write end against its close
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._turn = 0
        hub.add_reader(self._r, self._on_readable)
        hub.on_tick.add(self.on_tick)

    def wake(self, callback=None) -> None:
        """Turn the loop (from any thread), running ``callback`` on it first."""
        if callback is not None:
            self.rung.append(callback)
        with self._lock:
            if self._w is not None:
                try:
                    os.write(self._w, b"\0")
                except BlockingIOError:  # a full pipe: the loop is woken already
                    pass

    def _on_readable(self) -> None:
        try:
            os.read(self._r, 4096)
        except BlockingIOError:
            pass
        while self.rung:
            self.rung.popleft()()

    def _line(self, ch, queue):
        """The line of ``queue`` consumed by ``ch`` (made, or made again for a queue
        attached again); None while there is no such queue."""
        line = self.watched.get((ch, queue))
        try:
            h = ch._handle(queue)
        except QueueNotFound:
            h = None
        if line is not None and line.handle is not h:
            self.watched.pop((ch, queue)).stop()
            line = None
        if line is None and h is not None:
            line = self.watched[(ch, queue)] = WatchedQueue(self.wake, h)
        return line

    @staticmethod
    def _take(ch, queue, h):
        """A message of ``queue`` taken without waiting, or None."""
        if not ready_hint(h):  # (one word, no lock)
            return None
        try:
            return ch._get(queue)
        except Empty:
            return None

    def on_tick(self) -> None:
        budget = self.BUDGET
        self._turn += 1
        deliver = self.transport._deliver
        for ch in self.transport.channels:
            queues = ch._active_queues
            n = len(queues) if ch._consumers else 0
            for i in range(n):
                queue = queues[(self._turn + i) % n]
                line = self._line(ch, queue)
                if line is None or line.live:
                    continue  # no such queue, or empty a while: its line rings
                while ch.qos.can_consume():
                    if not budget:
                        self.wake()
                        return
                    message = self._take(ch, queue, line.handle)
                    if message is None:
                        if line.quiet is None:
                            line.quiet = self.hub.call_later(self.QUIET_S, self._quiet, ch, queue, line)
                            self.wake()  # (the loop's next wait was set before this timer)
                        break
                    if line.quiet is not None:
                        line.quiet.cancel()
                        line.quiet = None
                    budget -= 1
                    deliver(message, queue)

    def _quiet(self, ch, queue, line) -> None:
        """(A timer on the loop.) ``queue`` was empty ``QUIET_S`` ago: one more try, and if
        it finds nothing, the line listens from a stamp taken before it."""
        line.quiet = None
        if line.live or self.watched.get((ch, queue)) is not line or not ch.qos.can_consume():
            return  # (a full prefetch: the settle that frees it turns the loop)
        seen = doze.stamp(line.handle)
        message = self._take(ch, queue, line.handle)
        if message is None:
            line.wait_from(seen)
        else:
            self.transport._deliver(message, queue)

    def forget(self, ch, queue=None) -> None:
        """Stop the lines of ``ch`` (of its ``queue`` only, if given)."""
        for key in [k for k in self.watched if k[0] is ch and queue in (None, k[1])]:
            self.watched.pop(key).stop()

    def close(self) -> None:
        for line in self.watched.values():
            line.stop()
        self.watched.clear()
        self.hub.on_tick.discard(self.on_tick)
        if self._r in self.hub.readers:  # (not once the hub is closed: that would make it a new poller)
            self.hub.remove_reader(self._r)
        with self._lock:
            os.close(self._w)
            self._w = None
        os.close(self._r)
