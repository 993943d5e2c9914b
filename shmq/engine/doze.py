"""Sleeping for a waiter elsewhere: the server's requests that wait for data sleep in one
thread per queue or stream, as a registered consumer of its shared memory, so that
whoever makes data there — a local producer, a nack, a lapsed lease, a dead holder's
lease given back, an append — wakes them with the post it owes any sleeper.

Strategy: the waiters' owner looks (takes) first and hands over a ``stamp`` of what it
saw (the words that move when data comes, read without the lock: the next id and the
ready count). ``doze`` counts the
caller as a sleeper under the lock, then compares: if the stamp moved meanwhile, the
data came before anyone counted it as a sleeper, so it does not sleep (no post is owed
for it). Otherwise it sleeps on the semaphore until a post, the next deadline of the
queue (a lease lapsing, a delay ending: due exactly then, not a slice later), or the
caller's ``deadline``. A stamp equal to the last look's never wakes at once, so a
message the waiters cannot take (a FIFO group in flight) costs no spin.
"""

import threading
import time

from .shm import layout as L
from .shm import waits
from .queues.lanes import LanedQueue, attach
from .streams.stream import Stream
from .shm.mutex import unlock as _unlock

__all__ = ["twin", "stamp", "doze", "bell", "room_stamp", "doze_room", "Doorbell"]

_mono = time.monotonic_ns


def twin(h):
    """A handle of its own on the queue or stream ``h`` is attached to, for ``doze`` in
    another thread: closing either never pulls memory from under the other."""
    if isinstance(h, Stream):
        return Stream(h.namespace, h.name)
    return attach(h.namespace, h.name)


def stamp(h) -> tuple:
    """What ``doze`` compares with: the words of ``h`` that move when data comes."""
    if isinstance(h, Stream):
        return _stream_stamp(h)
    lanes = h._lanes if isinstance(h, LanedQueue) else (h,)
    return tuple(_queue_stamp(q._mq) for q in lanes)


def doze(h, seen, deadline, bell=False) -> bool:
    """Sleep as a consumer of ``h`` until data may have come since ``seen`` (a ``stamp``),
    or until ``deadline`` (CLOCK_MONOTONIC ns). True when woken by data (or a due
    deadline of the queue's), False at ``deadline``. Raises the handle's error once it is
    deleted or closed. ``bell``: the sleeper is a server's doorbell, counted in the queue's
    ``bells`` too, whom that server's own puts owe no post (``waits.serving``)."""
    if isinstance(h, Stream):
        return h._wait(deadline, lambda: _stream_stamp(h) != seen, bell)
    lanes = h._lanes if isinstance(h, LanedQueue) else (h,)
    return _doze_queue(lanes, seen, deadline, bell)


def bell(h, seen, deadline) -> bool:
    """``doze`` as a server's doorbell."""
    return doze(h, seen, deadline, True)


def _queue_stamp(mq):
    return mq[L.I_NEXT_ID], mq[L.I_READY]


def _moved(seen, now_stamp) -> bool:
    """Data came between the two stamps (an id given out, or more ready than seen). A
    deadline is no data: the doze sleeps until the queue's next one is due."""
    return any(n[0] != s[0] or n[1] > s[1] for s, n in zip(seen, now_stamp))


def _doze_queue(lanes, seen, deadline, bell) -> bool:
    first = lanes[0]  # a laned queue's sleepers count in lane 0 (lanes.py): every lane's put posts there
    mq = first._mq
    laned = len(lanes) > 1
    first._acquire()
    try:
        if mq[L.I_DELETED]:
            raise first._gone()
        side = waits.BELLS if bell else waits.CONSUMERS
        waits.register(mq, first._my_slot(), side)
        if laned:
            waits.lane_sleepers(mq)
    finally:
        _unlock(first._lockp)
    waited = 1
    try:
        now = _mono()
        due = min(q._mq[L.I_NEXT_DEADLINE] for q in lanes)
        if _moved(seen, [_queue_stamp(q._mq) for q in lanes]) or now >= due:
            return True
        waited = waits.sleep_slice(first._ne, min(deadline, due), now)
        return waited == 2 or _mono() >= due
    finally:
        first._acquire_to_unwait(None, side, waited)  # (a lock timeout: uncounted later)
        try:
            waits.unregister(mq, first._slot, side, waited)
            if laned:
                waits.lane_sleepers(mq)
        finally:
            _unlock(first._lockp)


def _stream_stamp(s) -> tuple:
    return tuple(s._part(p)._mq[L.PI_NEXT] for p in range(s.partitions))


def room_stamp(h) -> tuple:
    """What ``doze_room`` compares with: the heads of queue ``h``'s lanes (a head moves
    when room is made)."""
    return tuple(q._mq[L.I_HEAD] for q in (h._lanes if isinstance(h, LanedQueue) else (h,)))


def doze_room(h, seen, deadline) -> bool:
    """``doze`` for room: sleep as a producer waiting for room in queue ``h`` (lane 0's
    not-full semaphore; another lane's room is seen at the end of the slice) until a
    head moved since ``seen`` (a ``room_stamp``) or until ``deadline``. True when woken."""
    first = h._lanes[0] if isinstance(h, LanedQueue) else h
    mq = first._mq
    first._acquire()
    try:
        if mq[L.I_DELETED]:
            raise first._gone()
        waits.register(mq, first._my_slot(), waits.PRODUCERS)
    finally:
        _unlock(first._lockp)
    waited = 1
    try:
        if room_stamp(h) != seen:
            return True
        waited = waits.sleep_slice(first._nf, deadline, _mono())
        return waited == 2
    finally:
        first._acquire_to_unwait(None, waits.PRODUCERS, waited)
        try:
            waits.unregister(mq, first._slot, waits.PRODUCERS, waited)
        finally:
            _unlock(first._lockp)


class Doorbell:
    """The thread that wakes a line of waiters on an event loop for data made outside the
    loop: ``line`` has the ``handle`` waited on, its ``loop``, ``live`` (anyone waits),
    ``scheduled`` (a look is due) and ``rang()`` (the look); the server's ``WaitingLine``,
    local asyncio's bells (``engine.aio``) and kombu's loop are such lines.

    Strategy: while the line has waiters, the thread sleeps in ``doze`` as a
    registered consumer of the handle, so a local producer's put, a nack, a lease given
    back or lapsing, an append, posts it as it would post any sleeper. Woken, it takes a
    new stamp first and then makes sure a look follows it: one already scheduled on the
    loop (the loop's own put woke it: nothing to do), else one it schedules
    (``call_soon_threadsafe``); then it dozes from that stamp. Whatever came before the
    stamp, that look sees; whatever comes after, wakes the doze. The first doze starts
    from the stamp the loop took as the first waiter lined up. It never touches the
    waiters nor the loop's handle: it sleeps on a handle of its own (``twin``),
    which it closes as it ends. With no waiter it waits to be armed again; idle for
    ``IDLE_S``, the thread ends, and the next waiter starts another.
    """

    IDLE_S = 10.0  # how long a thread with nothing to wait for stays
    sleep = staticmethod(bell)  # what it sleeps in, and the stamp that goes with it (a
    look = staticmethod(stamp)  # subclass may wait for something else: doze_room)
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
            h = twin(line.handle)
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
