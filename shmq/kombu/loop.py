"""Celery's event loop fed from shmq's queues (``shmq.kombu``'s transport): the worker
runs ``asynloop`` and the prefork pool's non-blocking AsynPool, as it does on Redis or
RabbitMQ, instead of kombu's synchronous fallback; on a local attach and over TCP.

Strategy: each turn of kombu's Hub takes what the consumed queues have ready, as far as
each channel's prefetch allows; a queue that stays empty a moment gets a line that wakes
the loop, through a pipe it polls, when data comes. On a local attach the line is a
doorbell thread (``engine.doze.Doorbell``, asleep as a plain consumer); over TCP it is a
thread that waits at the server with a blocking get on the channel's own connection, and
hands what it takes to the loop (``RemoteLine``).
"""

import logging
import os
import threading
import time
from collections import deque
from functools import partial
from queue import Empty

from ..engine.maintenance import ready_hint
from ..engine import doze
from ..errors import BrokerUnavailable, QueueEmpty, QueueNotFound, ShmqError

__all__ = ["EventLoop", "RemoteLine", "WatchedQueue"]

log = logging.getLogger("shmq.kombu")


class _Bell(doze.Doorbell):
    """A doorbell asleep as a plain consumer (``doze.doze``), not as a server's doorbell
    (``doze.bell``): a server's own puts owe those no post (``waits.serving``), and this
    worker's loop is not that server's."""

    sleep = staticmethod(doze.doze)


class WatchedQueue:
    """One queue a channel consumes on a local attach, as a doorbell of shmq's
    (``server/waiters.py``) rings it: ``live`` while the event loop found it empty and
    wants to hear of data. It is the doorbell's loop too: a ring goes to ``wake`` (the
    event loop's pipe)."""

    def __init__(self, wake, handle):
        self.handle = handle
        self.loop = self  # (what the doorbell rings through: ``call_soon_threadsafe``)
        self.live = False
        self.scheduled = False  # a ring on its way to the loop
        self.quiet = None  # the loop's timer that arms the line if the queue stays empty
        self._wake = wake
        self.bell = _Bell(self)

    def stamp(self):
        """What the doorbell compares with, taken before the loop's last try."""
        return doze.stamp(self.handle)

    def hint(self) -> bool:
        """Whether a take could find something (one word, no lock)."""
        return ready_hint(self.handle)

    def wait_from(self, seen) -> None:
        """The queue was empty at a try after ``seen`` (a ``stamp``): ring when data may
        have come since."""
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


class RemoteLine:
    """One queue a channel consumes over TCP: ``live`` while a thread of its own waits at
    the server for the queue's next message, with a blocking get on the channel's
    connection (which other threads' calls share: a long get holds none back). What it
    takes is leased as any take of the channel's, and goes to ``deliver`` on the loop;
    an error of the get goes there too (the loop raises a connection's: kombu's
    connection_errors, so Celery connects again). Then the loop takes the next ones
    itself, until the queue stays empty again. A line stopped while its get was out
    gives back what that get took (a nack: it counts as a delivery). Idle for ``IDLE_S``,
    the thread ends, and the next arming starts another. A lost connection is ridden out
    by the line's thread (``_take``): the loop hears nothing of a server's restart, and
    the connection error only once the outage has lasted the client's ``max_outage``."""

    WAIT_S = 1.0  # one get's longest wait: a stopped line's thread ends within it
    IDLE_S = 10.0

    def __init__(self, wake, handle, deliver):
        self.handle = handle
        self.live = False
        self.quiet = None
        self._wake = wake
        self._deliver = deliver  # (on the loop) deliver(this line, what its get took or the get's error)
        self._cond = threading.Condition(threading.Lock())
        self._armed = self._running = self._stopped = False

    def stamp(self):
        return None  # (the server's wait sees whatever comes after the arming)

    def hint(self) -> bool:
        # (a take is a round trip: nothing to know without it), but while the connection is
        # lost the line's thread rides the outage out, and the loop takes nothing
        return not self.handle._broker._lost()

    def wait_from(self, _seen) -> None:
        """(The loop.) The queue was empty: take its next message as it comes."""
        with self._cond:
            if self._stopped or self._armed:
                return
            self.live = self._armed = True
            if self._running:
                self._cond.notify()
                return
            self._running = True
        threading.Thread(target=self._run, name=f"shmq-watch-{self.handle.name}", daemon=True).start()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._armed and not self._stopped:
                    self._cond.wait(self.IDLE_S)
                if self._stopped or not self._armed:  # ends under the lock: ``wait_from`` starts another
                    self._running = False
                    return
            try:
                got = self._take()
            except QueueEmpty:
                continue
            except Exception as exc:  # noqa: BLE001 - the loop's to judge (a queue deleted, a connection lost)
                got = exc
            if got is None:
                continue  # (a slice of an outage ridden out)
            with self._cond:
                self._armed = False
                stopped = self._stopped
            if stopped:
                self._give_back(got)
                continue  # (ends at the top, under the lock)
            self._wake(partial(self._rang, got))

    def _take(self):
        """The line's get: the queue's next message (QueueEmpty after WAIT_S); None while
        the connection is lost: the outage is ridden out here, a WAIT_S slice at a time
        (``RemoteBroker._outlast``), and its error raised only once it has lasted the
        client's ``max_outage`` (then the loop raises it, and Celery connects again)."""
        broker = self.handle._broker
        if not broker._lost():
            try:
                return self.handle.get(timeout=self.WAIT_S)
            except BrokerUnavailable:
                if not broker._lost():
                    raise
        broker._outlast(time.monotonic() + self.WAIT_S)
        return None

    def _rang(self, got) -> None:  # (the event loop)
        self.live = False
        if self._stopped:
            self._give_back(got)
        else:
            self._deliver(self, got)

    @staticmethod
    def _give_back(got) -> None:
        if isinstance(got, BaseException):
            return
        try:
            got.nack()
        except ShmqError:  # the connection's closed: the server gives it back
            pass

    def stop(self) -> None:
        if self.quiet is not None:
            self.quiet.cancel()
        with self._cond:
            self._stopped = True
            self.live = False
            self._cond.notify()


class EventLoop:
    """Celery's event loop (kombu's Hub) fed from shmq's queues: the worker runs
    ``asynloop`` and the prefork pool's non-blocking AsynPool, as on Redis, instead of
    kombu's synchronous fallback and a pool that blocks each hand-over.

    Strategy: each turn of the loop (``on_tick``) takes from every consumed queue not
    known to be empty, without waiting, as far as its channel's prefetch allows. A queue
    that stays empty for ``QUIET_S`` gets its line armed: locally (``WatchedQueue``) from a
    stamp taken before its last try, so its doorbell thread rings — a byte down a pipe the
    loop polls — for whatever came after; over TCP (``RemoteLine``) its thread's blocking
    get takes the next message and hands it over the same way. While the worker is busy
    its own turns (a task's result, an ack) find the next messages, and a producer's puts
    post nobody: a queue emptied by each take would otherwise cost a thread's wake-up and
    a ring per message, in the worker and in the producer. A settle, a new consumer or a
    new prefetch needs no ring: the next turn looks. A turn that delivered wakes the loop
    for the next at once: the hub's other tick callbacks may have run before this one in
    the turn (a set's order), and the prefork pool hands a delivered job to a child only
    at a turn's start (``AsynPool.on_poll_start``); else the job waits out the poll, up to
    the pool's next timer (5 s). A line is armed only while its
    channel can take one more message (over TCP each armed line brings one: a channel
    that consumes N queues may so hold up to N - 1 past its prefetch)."""

    BUDGET = 64  # deliveries per turn; with more ready the loop turns again at once
    QUIET_S = 0.002  # how long a queue stays empty before its line listens

    def __init__(self, transport, hub, remote: bool = False):
        self.transport = transport
        self.hub = hub
        self.remote = remote  # over TCP: ``RemoteLine``s
        self.watched = {}  # (channel, kombu queue name) -> its line
        self.rung = deque()  # the lines' callbacks, run on the loop
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
        attached again, or declared again once deleted); None while there is no such queue."""
        line = self.watched.get((ch, queue))
        try:
            h = ch.consumed_handle(queue, had=line is not None)
        except QueueNotFound:
            h = None
        if line is not None and line.handle is not h:
            self.watched.pop((ch, queue)).stop()
            line = None
        if line is None and h is not None:
            line = RemoteLine(self.wake, h, partial(self._taken, ch, queue)) if self.remote else WatchedQueue(self.wake, h)
            self.watched[(ch, queue)] = line
        return line

    @staticmethod
    def _take(ch, queue, line):
        """A message of ``queue`` taken without waiting, or None."""
        try:
            if not line.hint():
                return None
        except QueueNotFound:
            pass  # (the take finds out, and declares it again)
        try:
            return ch._get(queue)
        except Empty:
            return None
        except BrokerUnavailable:
            if line.hint():
                raise
            return None  # the connection is lost: its line, armed, rides the outage out

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
                    message = self._take(ch, queue, line)
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
        if budget < self.BUDGET:
            self.wake()  # (the deliveries' jobs are the next turn's to hand over: no wait before it)

    def _quiet(self, ch, queue, line) -> None:
        """(A timer on the loop.) ``queue`` was empty ``QUIET_S`` ago: one more try, and if
        it finds nothing, the line listens from a stamp taken before it."""
        line.quiet = None
        if line.live or self.watched.get((ch, queue)) is not line or not ch.qos.can_consume():
            return  # (a full prefetch: the settle that frees it turns the loop)
        seen = line.stamp()
        message = self._take(ch, queue, line)
        if message is None:
            line.wait_from(seen)
        else:
            self.transport._deliver(message, queue)

    def _taken(self, ch, queue, line, got) -> None:
        """(The loop.) What ``line``'s get took from ``queue``: a delivery, delivered if ``ch``
        still consumes there (else given back), or the get's error: a deleted queue's is
        the next turn's to mend, a connection's is raised (Celery connects again)."""
        if isinstance(got, BaseException):
            if isinstance(got, QueueNotFound):
                return
            if isinstance(got, tuple(self.transport.connection_errors)):
                raise got
            log.warning("waiting for messages of queue %r: %s", queue, got)
            return
        if self.watched.get((ch, queue)) is not line or queue not in ch._active_queues:
            line._give_back(got)
            return
        try:
            message = ch.received(queue, got)
        except Empty:  # (not a kombu message: dead-lettered)
            return
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
