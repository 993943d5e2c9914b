"""Keepalive: a delivery's lease renewed in the background while its job runs
(``d.keepalive()``, ``d.process(renew=True)``), for the local, blocking TCP and asyncio
deliveries alike.

Strategy: a renewal is the delivery's own ``extend``, so this module knows no transport.
The local and blocking deliveries are renewed by one daemon thread per process
(``_Renewer``, started on the first keepalive, gone after a minute with none; a child of
fork() starts its own and never sees the parent's), which sleeps until the earliest
renewal is due; the asyncio client's by a task of their own on the running loop. Each
renewal sets the lease to ``3 * every`` seconds from now, so two renewals can be late
before it lapses; ``every`` defaults to a third of the queue's visibility timeout.

Settling stops the renewal at no cost to deliveries without one: a kept delivery's class
is swapped for a subclass (same layout, no new slots) whose ack / nack / reject stop its
keepalive first, and swapped back when it stops; the batch settles (``ack_many`` and
friends) look their deliveries up only while some keepalive lives (``settling``). A
renewal that finds the lease gone (DeliveryExpired, or any other error) ends quietly
with ``error`` set: the later settle raises as it would have.
"""

import functools
import logging
import math
import os
import sys
import threading
import time

from ..errors import DeliveryExpired, QueueNotFound

__all__ = ["Keepalive", "settling", "live"]

_log = logging.getLogger("shmq")
_mono = time.monotonic
IDLE_TICK_S = 1.0  # an idle renewer wakes this often (a registration due later need not wake it)
IDLE_EXIT_S = 60.0  # ... and ends after this long with nothing to renew
MAX_EVERY_S = 10**8

_lock = threading.Lock()  # guards _live and the renewer
_live = {}  # id(delivery) -> its Keepalive (the Keepalive holds the delivery: the id stays unique)
_renewer = None  # this process's _Renewer, once started
_kept_classes = {}  # a delivery class -> its subclass whose settles stop the keepalive


def live() -> dict:
    """The deliveries kept alive in this process now (by id; empty: none): a settle of one must
    stop its keepalive, so the server's plain acks in C leave them to the Python path."""
    return _live


class Keepalive:
    """A delivery's lease renewed in the background until ``stop()`` or until the delivery
    is settled (``ack`` / ``nack`` / ``reject``, also through ``ack_many`` and friends).
    ``with d.keepalive(): ...`` (``async with`` as well on the asyncio client) stops it at
    the end of the block. ``renewals`` counts the renewals done; ``error`` is what ended
    it when a renewal failed (DeliveryExpired: the lease was lost), else None."""

    __slots__ = ("delivery", "every", "renewals", "error", "_due", "_task", "_done", "__weakref__")

    def __init__(self, delivery, every):
        self.delivery = delivery
        self.every = every  # None until the queue's visibility timeout is known (the asyncio form)
        self.renewals = 0
        self.error = None
        self._due = math.inf
        self._task = None  # the asyncio form's task
        self._done = False

    @property
    def active(self) -> bool:
        """Whether it still renews."""
        return not self._done

    def stop(self) -> None:
        """Renew no more (the lease runs out as it stands, unless the delivery is settled)."""
        with _lock:
            self._end_locked()

    def __repr__(self):
        state = "active" if not self._done else f"stopped ({self.error!r})" if self.error else "stopped"
        return f"<Keepalive {self.delivery!r} every={self.every} renewals={self.renewals} {state}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.stop()
        return False

    # ------------------------------------------------------------ the renewal's steps
    def _end_locked(self, error=None) -> None:
        if self._done:
            return
        self._done = True
        self.error = error
        d = self.delivery
        if _live.get(id(d)) is self:
            del _live[id(d)]
            plain = getattr(type(d), "_plain_class", None)
            if plain is not None:
                d.__class__ = plain
        task = self._task
        if task is not None and task is not _current_task():
            task.cancel()

    def _failed(self, error: Exception) -> None:
        if isinstance(error, (DeliveryExpired, QueueNotFound)):
            _log.debug("keepalive of %r ends: %s", self.delivery, error)
        else:
            _log.warning("keepalive of %r ends: a renewal failed: %s", self.delivery, error)
        with _lock:
            self._end_locked(error)

    def _renew(self) -> None:
        """One renewal, in the renewer's thread."""
        try:
            self.delivery.extend(3 * self.every)
        except Exception as e:  # never raised in the background: the settle will say it
            self._failed(e)
        else:
            self.renewals += 1

    async def _run_task(self, visibility):
        """The asyncio form: renew every ``every`` seconds on the running loop."""
        import asyncio  # here, not at the top: a process without asyncio never loads it

        try:
            if self.every is None:
                self.every = _checked_every(None, await visibility())
            while True:
                await asyncio.sleep(self.every)
                if self._done:
                    return
                await self.delivery.extend(3 * self.every)
                self.renewals += 1
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._failed(e)


def _current_task():
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:  # never loaded: no task runs
        return None
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop in this thread
        return None


def _checked_every(every, visibility_timeout):
    """``every`` checked, or a third of ``visibility_timeout`` when it is None."""
    if every is None:
        every = visibility_timeout / 3
    if isinstance(every, bool) or not isinstance(every, (int, float)) or every != every:
        raise TypeError(f"every must be a number of seconds, not {every!r}")
    if not 0 < every <= MAX_EVERY_S:
        raise ValueError(f"every must be > 0 seconds (at most {MAX_EVERY_S}), not {every!r}")
    return float(every)


def _kept_class(cls):
    """``cls`` with settles that stop the delivery's keepalive first (same layout)."""
    kept = _kept_classes.get(cls)
    if kept is None:
        methods = {"__slots__": (), "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                   "_plain_class": cls}
        for name in ("ack", "nack", "reject"):
            methods[name] = _stopping(getattr(cls, name))
        kept = _kept_classes[cls] = type(cls.__name__, (cls,), methods)
    return kept


def _stopping(settle):
    @functools.wraps(settle)
    def method(self, *args, **kwargs):
        ka = _live.get(id(self))
        if ka is not None:
            ka.stop()
        return settle(self, *args, **kwargs)

    return method


def _register(ka) -> None:
    """Make ``ka`` the delivery's keepalive (stopping one it had). ``_lock`` held."""
    d = ka.delivery
    old = _live.get(id(d))
    if old is not None:
        old._end_locked()
    _live[id(d)] = ka
    cls = type(d)
    if getattr(cls, "_plain_class", None) is None:
        d.__class__ = _kept_class(cls)


def in_thread(delivery, every=None, visibility=None) -> Keepalive:
    """Renew a local or blocking TCP ``delivery`` on this process's renewer thread, every
    ``every`` seconds (None: a third of the visibility timeout that ``visibility()``
    returns)."""
    global _renewer
    ka = Keepalive(delivery, _checked_every(every, visibility() if every is None else None))
    with _lock:
        ka._due = _mono() + ka.every
        _register(ka)
        if _renewer is None:
            _renewer = _Renewer()
        _renewer.added(ka)
    return ka


def in_task(delivery, every=None, visibility=None) -> Keepalive:
    """Renew an asyncio client's ``delivery`` by a task on the running loop, every
    ``every`` seconds (None: a third of the visibility timeout that the coroutine
    function ``visibility`` returns, asked in the task)."""
    import asyncio

    ka = Keepalive(delivery, None if every is None else _checked_every(every, None))
    loop = asyncio.get_running_loop()
    with _lock:
        _register(ka)
        ka._task = loop.create_task(ka._run_task(visibility))
    return ka


def settling(deliveries) -> None:
    """Stop the keepalives of those of ``deliveries`` that have one (a batch settle of
    them is under way). Free while no keepalive lives."""
    if _live:
        for d in deliveries:
            ka = _live.get(id(d))
            if ka is not None:
                ka.stop()


class _Renewer:
    """The daemon thread that renews this process's thread-form keepalives as they fall due."""

    def __init__(self):
        self.cond = threading.Condition(_lock)
        self.wake_at = math.inf  # when the thread wakes by itself next
        self.thread = None

    def added(self, ka) -> None:
        """``ka`` was registered. ``_lock`` held."""
        if self.thread is None:
            self.wake_at = ka._due
            self.thread = threading.Thread(target=self._run, name="shmq-keepalive", daemon=True)
            self.thread.start()
        elif ka._due < self.wake_at:
            self.wake_at = ka._due
            self.cond.notify()

    def _run(self):
        idle_since = None
        with self.cond:
            while True:
                now = _mono()
                due, nxt = [], math.inf
                for ka in _live.values():
                    if ka._task is not None:
                        continue
                    if ka._due <= now:
                        ka._due = now + ka.every
                        due.append(ka)
                    nxt = min(nxt, ka._due)
                if due:
                    idle_since = None
                    self.cond.release()
                    try:
                        for ka in due:
                            if not ka._done:
                                ka._renew()
                    finally:
                        self.cond.acquire()
                    continue
                if nxt == math.inf:
                    if idle_since is None:
                        idle_since = now
                    elif now - idle_since >= IDLE_EXIT_S:
                        self.thread = None  # the next keepalive starts another
                        return
                    nxt = now + IDLE_TICK_S
                else:
                    idle_since = None
                self.wake_at = nxt
                self.cond.wait(max(0.0, nxt - now))


def _after_fork_in_child():
    """The child renews nothing of the parent's, and starts its own thread on need."""
    global _lock, _renewer
    _lock = threading.Lock()
    _live.clear()
    _renewer = None


os.register_at_fork(after_in_child=_after_fork_in_child)
