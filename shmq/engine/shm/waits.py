"""Waiting for a message or for room: a short spin, then sleeps in slices on a POSIX
semaphore, and the waiter accounting that tells a waker how many posts it owes.

Strategy: semaphores only say "look again"; the control block is the truth. A sleeper
counts itself in the queue's waiter word (and in its process slot, so that its death
can be undone) before it sleeps; a waker posts at most one per waiter not yet posted.
Every sleep is one bounded slice (``WAIT_SLICE_S``, or until the next deadline is due),
after which the sleeper re-reads the control block, so a lost post costs one slice,
never a hang. Consumers count in ``cwait``/``cposted``, producers in ``pwait``/``pposted``.
"""

import os
import threading
import time

from ...model.checks import seconds_ns  # (a timeout checked: the clients check theirs with it too)
from . import cpaths
from . import layout as L
from .mutex import FOREVER

__all__ = ["SPIN_NS", "WAIT_SLICE_S", "CONSUMERS", "BELLS", "PRODUCERS", "READERS", "register", "unregister",
           "lane_sleepers", "owed_posts", "register_reader", "unregister_reader",
           "serving", "spin",
           "sleep_slice", "seconds_ns", "lock_deadline"]

SPIN_NS = 50_000  # how long a consumer polls the control block before sleeping
FILL_SPIN_NS = 1_000_000  # how long it polls on while a fill is under way (``spin``)
WAIT_SLICE_S = 0.5  # longest sleep before a waiter re-reads the control block
# (waiter word, posted word, word of the process slot) of each side
CONSUMERS = (L.I_CWAIT, L.I_CPOSTED, L.P_CWAIT)
BELLS = (L.I_CWAIT, L.I_CPOSTED, L.P_CWAIT)  # consumers that are a server's doorbells: counted in ``bells`` too
PRODUCERS = (L.I_PWAIT, L.I_PPOSTED, L.P_PWAIT)
READERS = (L.SI_CWAIT, L.SI_CPOSTED, None)  # a stream's readers waiting at the end (no process slots)

_sched_yield = os.sched_yield


_slot_word = L.proc_word
_I_BELLS = L.I_BELLS
_BELLS_OF = {L.I_CWAIT: L.I_BELLS, L.SI_CWAIT: L.SI_BELLS}  # a side's sleepers -> how many of them are doorbells


def register(mq, slot, side) -> None:
    """Count this process (``slot``) as sleeping on ``side``. Lock held."""
    i_wait, _i_posted, field = side
    mq[i_wait] += 1
    mq[_slot_word(slot, field)] += 1
    if side is BELLS:
        mq[_I_BELLS] += 1
        mq[_slot_word(slot, L.P_BELLS)] += 1


def unregister(mq, slot, side, waited) -> None:
    """Undo ``register`` after a sleep; ``waited == 2`` consumed a post. Lock held."""
    i_wait, i_posted, field = side
    n = mq[i_wait] - 1
    mq[i_wait] = n
    mq[_slot_word(slot, field)] -= 1
    if side is BELLS:
        mq[_I_BELLS] -= 1
        mq[_slot_word(slot, L.P_BELLS)] -= 1
    posted = mq[i_posted]
    if waited == 2 and posted:
        posted -= 1
    mq[i_posted] = posted if n else 0


def lane_sleepers(mq) -> None:
    """A laned queue's lane 0 says how many gets sleep on it (``I_LANE_SLEEPERS``: a word
    on a quiet line, which a put to another lane reads before it posts), after ``register``
    or ``unregister``. Lock held."""
    mq[L.I_LANE_SLEEPERS] = mq[L.I_CWAIT]


def register_reader(mq, bell=False) -> None:
    """Count a stream's reader as sleeping at the end (``READERS``: no process slot);
    ``bell``: a server's doorbell (``doze.bell``), counted in ``bells`` too. Lock held."""
    mq[L.SI_CWAIT] += 1
    mq[L.SI_BELLS] += bell


def unregister_reader(mq, bell=False) -> None:
    """Undo ``register_reader`` after a sleep: the posts counted owed stay no more than the
    sleepers left. Lock held."""
    mq[L.SI_BELLS] -= bell
    n = mq[L.SI_CWAIT] - 1
    mq[L.SI_CWAIT] = n
    if mq[L.SI_CPOSTED] > n:
        mq[L.SI_CPOSTED] = n

class _Serving(threading.local):
    on = False


_serving = _Serving()


class serving:
    """``with serving():`` this thread serves its own waiters the data it makes in the block
    (a server's loop: its put, then its own look for the waiting requests), so sleepers that
    are all doorbells (``doze.bell``) are owed no post: waking one would only schedule the
    look that follows anyway. Any other sleeper is posted as ever."""

    __slots__ = ("was",)

    def __enter__(self):
        self.was = _serving.on
        _set_serving(True)

    def __exit__(self, *exc):
        _set_serving(self.was)


def _set_serving(on) -> None:
    _serving.on = on
    if cpaths.serve_own is not None:
        cpaths.serve_own(on)


def owed_posts(mq, side, n) -> int:
    """How many of ``n`` new messages (or freed slots) to post to ``side``'s sleepers,
    counted as posted. Lock held."""
    i_wait, i_posted, _field = side
    w = mq[i_wait]
    if not w:
        return 0
    if _serving.on:
        bells = _BELLS_OF.get(i_wait)
        if bells is not None and w <= mq[bells]:
            return 0  # every sleeper is a doorbell of this thread's own loop (``serving``)
    p = mq[i_posted]
    post = min(w - p, n)
    if post <= 0:
        return 0
    mq[i_posted] = p + post
    return post


def spin(mq, deadline, clock) -> None:
    """Poll the control block briefly before sleeping: spin, then yield the core (a
    partner process may be runnable on it), as Aeron's backoff idle strategy; on while a
    fill is under way (``layout.FILL_OFF``), up to ``FILL_SPIN_NS``: its records come in
    microseconds, once its producer has a core again, which the yields give it.
    ``clock``: the engine's monotonic clock (``deadline`` is on it)."""
    now = clock()
    yield_at = now + SPIN_NS // 5
    end = now + SPIN_NS
    fill_end = now + FILL_SPIN_NS
    if deadline is not None:
        end, fill_end = min(end, deadline), min(fill_end, deadline)
    while True:
        if mq[L.I_READY] or mq[L.I_DELETED]:
            return
        if now >= end and (now >= fill_end or mq[L.I_FILL] <= mq[L.I_TAIL]):
            return
        if now > yield_at:
            _sched_yield()
        now = clock()


def sleep_slice(sem, deadline, now, next_due=L.NEVER, slice_s=WAIT_SLICE_S) -> int:
    """Sleep on ``sem`` for at most one slice (less if ``deadline`` or ``next_due``, the
    queue's next deadline, comes sooner; all on the clock of ``now``). Returns 2 if
    woken by a post, 1 if not."""
    slice_ns = int(slice_s * 1e9)
    if deadline is not None:
        slice_ns = min(slice_ns, deadline - now)
    if next_due != L.NEVER:
        slice_ns = min(slice_ns, max(next_due - now, 0) + 1_000_000)
    return 2 if sem.wait(max(slice_ns, 0)) else 1  # (a signal handler's exception raises here)


def lock_deadline(timeout) -> int:
    """The lock deadline (CLOCK_MONOTONIC ns) of a call that may wait ``timeout`` seconds
    (None: for ever)."""
    return FOREVER if timeout is None else time.monotonic_ns() + seconds_ns(timeout, "timeout")
