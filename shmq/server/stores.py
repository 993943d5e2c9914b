"""The keyed stores a server serves: their handles, kept open by name, and the line of
GETs waiting for a key in each (``StoreWaiters``).

Strategy: a store is a SQLite file other processes write too, so a line of waiting GETs
looks at the store's ``stamp`` (one ``PRAGMA data_version``) and tries its waiters when
it moved: when a watch of the store's -wal rings (``engine.walwatch``: inotify, read by
the loop as any socket), and on a loop timer, every POLL_MIN_S after a ring or a new
waiter, doubling up to WATCHED_S (POLL_MAX_S where there is no watch). A write this loop
makes serves the line at once (``wrote``). Each look is a few microseconds on the loop;
no thread.
"""

from ..engine import walwatch
from ..engine.store import POLL_MAX_S, POLL_MIN_S, WATCHED_S
from .waiters import NOTHING, Answering

__all__ = ["StoreHandles", "StoreWaiters", "LOCK_TIMEOUT_S"]

LOCK_TIMEOUT_S = 0.25  # the longest the loop waits for another process's write to a store
MAX_OPEN = 256  # stores held open at once (3 descriptors each): past it, the least recently used with no waiter goes


class StoreWaiters(Answering):
    """The GETs waiting on one store (``handle``): every one is tried when it may be served
    (readers of keys do not compete)."""

    def __init__(self, loop, handle):
        self.loop = loop
        self.handle = handle
        self.waiters = set()
        self.timer = None
        self.bell = None  # a watch of the store's -wal while GETs wait (``walwatch``), on the loop as a reader
        self.pause = POLL_MIN_S
        self.seen = None

    @property
    def live(self) -> int:
        return len(self.waiters)

    def add(self, w, deadline):
        """Line ``w`` up until ``deadline`` (loop time); the looks start again from the shortest pause."""
        self.waiters.add(w)
        w.timer = self.loop.call_at(deadline, self.finish, w, NOTHING)
        if self.bell is None:  # (a write after the GET's first try and before the watch rang nothing, and a
            self._watch()  # stamp read now would hold it: the first look tries every waiter whatever it finds)
            self.seen = None
        self._again(POLL_MIN_S)

    def _watch(self):
        self.bell = walwatch.watch(self.handle.path + "-wal")
        if self.bell is not None:
            self.loop.add_reader(self.bell.fd, self._rang)

    def _unwatch(self):
        if self.bell is not None:
            self.loop.remove_reader(self.bell.fd)
            self.bell.close()
            self.bell = None

    def _again(self, pause):
        """The next look in ``pause`` seconds."""
        self.pause = pause
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_later(pause, self._look)

    def _ended(self, w) -> None:
        self.waiters.discard(w)
        if not self.waiters:
            self.retire()
            self.seen = None

    def _stamp(self):
        try:
            return self.handle.stamp()
        except Exception:  # the waiters hear of it when they try
            return None

    def _rang(self):
        """A commit to the store: look now, and soon again (the index may say so a moment later)."""
        self.bell.drain()
        self.pause = POLL_MIN_S / 2
        self._look()

    def _look(self):
        self.timer = None
        stamp = self._stamp()
        if stamp is None or stamp != self.seen:
            if stamp is not None and self.seen is not None and stamp[0] != self.seen[0] and self.bell is not None:
                self._unwatch()  # a store made anew: watch its file
                self._watch()
            self.seen = stamp
            self.serve()
        if self.waiters:
            self._again(min(self.pause * 2, WATCHED_S if self.bell is not None else POLL_MAX_S))

    def serve(self) -> bool:
        """Try every waiter; True if one was answered."""
        served = False
        for w in list(self.waiters):
            if w.done:
                continue
            try:
                result = w.take(w.args)
            except Exception as e:
                result = e
            if result is not None:
                served = True
                self.finish(w, result)
        return served

    def answer_all(self, result):
        for w in list(self.waiters):
            self.finish(w, result)

    def retire(self):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self._unwatch()


class StoreHandles:
    """The stores of ``server``'s namespace it has open, by name, and their lines."""

    def __init__(self, server):
        self.server = server
        self.handles = {}
        self.lines = {}

    def get(self, name):
        """The open handle on store ``name`` (made on first use, as ``Broker.store``)."""
        kv = self.handles.pop(name, None)
        if kv is None:
            if len(self.handles) >= MAX_OPEN:
                self._let_go()
            kv = self.server.broker.store(name)
            kv.lock_timeout = LOCK_TIMEOUT_S
        self.handles[name] = kv  # (the dict's order: least recently used first)
        return kv

    def _let_go(self):
        """Close the least recently used handles that no GET waits on, down to half of MAX_OPEN."""
        for name in list(self.handles):
            if len(self.handles) < MAX_OPEN // 2:
                return
            line = self.lines.get(name)
            if line is None or not line.live:
                self.lines.pop(name, None)
                self.handles.pop(name).close()

    def line_of(self, kv) -> StoreWaiters:
        line = self.lines.get(kv.name)
        if line is None or line.handle is not kv:
            line = self.lines[kv.name] = StoreWaiters(self.server.loop, kv)
        return line

    def wrote(self, name):
        """This loop wrote to store ``name``: its waiters look now."""
        line = self.lines.get(name)
        if line is not None and line.live:
            line.serve()

    def answer_all(self):
        """The stop: every waiter gets what is there now, possibly nothing."""
        for line in list(self.lines.values()):
            line.serve()
            line.answer_all(NOTHING)

    def close(self):
        for line in self.lines.values():
            line.retire()
        for kv in self.handles.values():
            kv.close()
        self.lines.clear()
        self.handles.clear()
