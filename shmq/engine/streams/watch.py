"""Waiting for a record on any of several streams: a poll of a consumer of several
streams (``multiconsumer``) sleeps here until an append, or a rebalance, on any of them.

Strategy: a POSIX semaphore cannot be waited on together with another, so each stream
gets a ``_Bell``: a thread that, while a wait is armed, sleeps on its stream's semaphore
as a registered reader (``Stream._wait``, on a handle of its own), exactly as the
server's doorbells do (``server.waiters``). An append or a rebalance there posts it as
it posts any reader; the bell then wakes the waiting poll through one condition. What
came between the poll's read and a bell's registration is caught by the bell's own look
once it is registered: some owned partition's end past the poll's position, or the
group's generation moved. A bell sleeps only while a poll waits (then for one
``stream.WAIT_SLICE_S`` more at most), so appends pay for it only then; idle for
``IDLE_S`` its thread ends, and the next wait starts another. With one stream there is
no thread: the poll sleeps on that stream itself.
"""

import threading
import time

from ...errors import ShmqError
from .stream import Stream

__all__ = ["Armed", "StreamsWatch"]

_mono = time.monotonic_ns


class Armed:
    """What a bell looks for on one stream: a record past ``positions`` ({partition:
    offset}, the poll's, paused partitions left out) or a generation of ``group`` other
    than ``generation``."""

    __slots__ = ("group", "generation", "positions")

    def __init__(self, group: str, generation: int, positions: dict):
        self.group, self.generation, self.positions = group, generation, positions

    def ready(self, s: Stream) -> bool:
        return (s.groups_table.generation(self.group) != self.generation
                or any(s.stable(p) > o for p, o in self.positions.items()))


class StreamsWatch:
    """The bells of one consumer's streams (namespace ``namespace``); ``wait`` from one
    thread at a time, ``close`` at the end."""

    IDLE_S = 10.0  # how long a bell's thread with nothing to wait for stays

    def __init__(self, namespace: str):
        self.namespace = namespace
        self._cond = threading.Condition(threading.Lock())
        self._armed = None  # while a wait is on: {stream name: Armed}
        self._round = 0  # the wait's number: a bell of an older one wakes nothing
        self._woken = False
        self._bells = {}  # stream name -> _Bell (its thread may have ended: then it is replaced)
        self._closed = False

    def wait(self, armed: dict, handles: dict, deadline: int) -> bool:
        """Sleep until ``deadline`` (CLOCK_MONOTONIC ns) or until a stream of ``armed``
        ({name: Armed}; ``handles``: {name: the caller's Stream}) may have a record or a
        rebalance; True if woken so."""
        if len(armed) == 1:  # one stream: sleep on it in this thread
            (name, a), = armed.items()
            s = handles[name]
            return s._wait(deadline, lambda: a.ready(s))
        with self._cond:
            self._round += 1
            self._armed, self._woken = armed, False
            for name in armed:
                bell = self._bells.get(name)
                if bell is None or not bell.running:
                    bell = self._bells[name] = _Bell(self, name)
                    bell.start()
            self._cond.notify_all()
            try:
                while not self._woken:
                    left = deadline - _mono()
                    if left <= 0:
                        break
                    self._cond.wait(left / 1e9)
                return self._woken
            finally:
                self._armed = None

    def forget(self, name: str) -> None:
        """The stream ``name`` is no longer watched: its bell ends."""
        with self._cond:
            bell = self._bells.pop(name, None)
            if bell is not None:
                bell.stopped = True
                self._cond.notify_all()

    def close(self) -> None:
        """Every bell ends (after its current sleep: at most ``stream.WAIT_SLICE_S``)."""
        with self._cond:
            self._closed = True
            for bell in self._bells.values():
                bell.stopped = True
            self._bells.clear()
            self._cond.notify_all()


class _Bell(threading.Thread):
    """One stream's bell: sleeps as its registered reader while a wait is armed."""

    def __init__(self, watch: StreamsWatch, name: str):
        super().__init__(name=f"shmq-watch-{name}", daemon=True)
        self.watch, self.stream = watch, name
        self.running = True  # (under the watch's lock) false once the thread will wait no more
        self.stopped = False
        self.rang = 0  # the wait it last woke: it sleeps again only for a later one

    def run(self):
        w, cond = self.watch, self.watch._cond
        try:
            h = Stream(w.namespace, self.stream)
        except ShmqError:  # deleted meanwhile: the poll finds out when it reads
            return self._ring_and_end(None)
        try:
            while True:
                with cond:
                    while not self.stopped and not self._wanted():
                        if not cond.wait(w.IDLE_S) and not self._wanted():
                            self.running = False
                            return
                    if self.stopped:
                        self.running = False
                        return
                    armed, rnd = w._armed[self.stream], w._round
                try:
                    woke = h._wait(_mono() + int(w.IDLE_S * 1e9), lambda: armed.ready(h))  # one slice at most
                except ShmqError:  # deleted, or a lock timeout: the poll looks and finds out
                    return self._ring_and_end(rnd)
                if woke:
                    with cond:
                        if w._round == rnd and w._armed is not None:
                            w._woken = True
                            self.rang = rnd
                            cond.notify_all()
        finally:
            h.close()

    def _wanted(self) -> bool:
        w = self.watch
        return w._armed is not None and self.stream in w._armed and w._round != self.rang

    def _ring_and_end(self, rnd):
        with self.watch._cond:
            self.running = False
            if self.watch._armed is not None and rnd in (None, self.watch._round):
                self.watch._woken = True
                self.watch._cond.notify_all()
