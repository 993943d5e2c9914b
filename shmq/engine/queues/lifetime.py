"""A queue's lifetime: its consumers, counted per process; auto-delete when the last of them
goes; expiry when it is unused (RabbitMQ's auto-delete queues and ``x-expires``).

Strategy: a consumer is a process's, counted in its row of the process table (the word
``P_CONSUMERS``; a laned queue counts in lane 0), so a process that dies takes its count
with it when its row is reaped (``housekeeping.reap_dead``), as it takes its leases. The
queue's two lifetime words (``layout.LIFETIME_OFF``: flags and ``expires``, and
``last_used``) sit in header bytes that older segments hold zero, and zero means "none".
Deleting is the broker's (the registry, the files, the exchange bindings): this module
says *whether* a queue is to go (``unused``) and, under lane 0's lock, condemns it
(``condemn``), so a consumer that registers meanwhile either comes first (and the queue
stays) or finds it deleted. The deleter is handed in from above (``set_deleter``: the
broker registers it as it is imported), and whatever a process could not delete at once
(it died between, or had no broker loaded) is found by the next sweep (``sweep``: the
server's housekeeping rounds, and a local create or declare of a queue, at most once a
second). ``last_used`` is renewed by a declare, a consumer change and takes; a take stores
it only once it is a quarter of ``expires`` old (a second at most: ``layout.life_renew_ns``;
the C takes load one word of a line nothing writes often), and ``unused`` waits that much
longer, so a queue never expires sooner than asked.
"""

import os
import time

from ...errors import ShmqError
from ..shm import header
from ..shm import layout as L
from ..shm.process import is_alive
from ..shm.names import queue_segment
from ..shm.segment import SHM_DIR
from ..shm.mutex import unlock as _unlock

__all__ = ["add_consumer", "remove_consumer", "consumers", "renew", "used", "settings", "set_expires", "unused",
           "condemn", "set_deleter", "delete_unused", "has_lifetime", "sweep"]

_mono = time.monotonic_ns
_AUTO, _HAD, _SHIFT = L.LIFE_AUTO_DELETE, L.LIFE_HAD_CONSUMER, L.LIFE_EXPIRES_SHIFT
_I_LIFE, _I_USED = L.I_LIFETIME, L.I_LAST_USED
_deleter = None  # deleter(namespace, name) -> why it went, or None (``set_deleter``)


def _first(q):
    """Lane 0 of ``q`` (the queue itself when it has no lanes): where the lifetime is kept."""
    lanes = getattr(q, "_lanes", None)
    return q if lanes is None else lanes[0]


def settings(q) -> dict:
    """``auto_delete`` and ``expires`` (seconds, or None), as ``create_queue`` takes them
    (lane 0's copy, read with the other settings: ``Queue._read_settings``)."""
    life = _first(q)._opts[11]
    return {"auto_delete": bool(life & _AUTO), "expires": (life >> _SHIFT) / 1000 if life >> _SHIFT else None}


def consumers(q) -> int:
    """The consumers registered on the queue, by every process (those of a process that died
    count until housekeeping reaps its row). Lock held (lane 0's)."""
    return _first(q)._procs_sum(L.P_CONSUMERS)


def add_consumer(q) -> int:
    """Register this process as one more consumer of ``q``; returns the queue's count."""
    q = _first(q)
    mq = q._mq
    q._acquire()
    try:
        if mq[L.I_DELETED]:
            raise q._gone()
        header.consumer_added(mq, q._my_slot(), _mono())
        return q._procs_sum(L.P_CONSUMERS)
    finally:
        _unlock(q._lockp)


def remove_consumer(q) -> int:
    """Unregister one consumer of this process; returns how many are left, all processes'.
    An auto-delete queue whose count this drops to zero is deleted (with its bindings).
    ValueError if this process registered none."""
    q = _first(q)
    mq = q._mq
    q._acquire()
    try:
        if mq[L.I_DELETED]:
            raise q._gone()
        slot = q._my_slot()
        if not mq[L.proc_word(slot, L.P_CONSUMERS)]:
            raise ValueError(f"queue {q.name!r}: this process has no consumer registered (add_consumer)")
        header.consumer_removed(mq, slot, _mono())
        left = q._procs_sum(L.P_CONSUMERS)
        due = not left and mq[_I_LIFE] & _AUTO
    finally:
        _unlock(q._lockp)
    if due:
        delete_unused(q)
    return left


def renew(q) -> None:
    """The queue was used (a declare): its expiry counts from now. No lock: one store."""
    q = _first(q)
    if q._lockp is not None:
        header.used(q._mq, _mono())


def used(mq, now: int) -> None:
    """A take (``now``: its monotonic clock) on a queue that expires renews it, when its last
    use is ``layout.life_renew_ns`` old (the Python twin of the C takes' store). Lock held."""
    expires_ms = mq[_I_LIFE] >> _SHIFT
    if expires_ms and now - mq[_I_USED] >= L.life_renew_ns(expires_ms):
        header.used(mq, now)


def set_expires(q, expires_ms: int) -> None:
    """Store ``expires`` (ms; 0: never) in lane 0's lifetime word, keeping its flags, and
    renew: a queue given an expiry is not expired by it at once. Lock held."""
    header.set_expires(_first(q)._mq, expires_ms, _mono())


def unused(q, now: int) -> str | None:
    """Why ``q`` is to be deleted now ("auto-delete": its last consumer went; "expired": no
    consumer, and not used for ``expires``), or None. ``now``: the monotonic clock. Lane
    0's lock held for the answer to hold (without it: a hint)."""
    q = _first(q)
    mq = q._mq
    life = mq[_I_LIFE]
    if not life & _AUTO and not life >> _SHIFT:
        return None
    if q._procs_sum(L.P_CONSUMERS):
        return None
    if life & _AUTO and life & _HAD:
        return "auto-delete"
    expires_ms = life >> _SHIFT  # (a take renews it only once it is life_renew_ns old: never sooner than asked)
    if expires_ms and now - mq[_I_USED] >= expires_ms * 1_000_000 + L.life_renew_ns(expires_ms):
        return "expired"
    return None


def condemn(q, then) -> str | None:
    """If ``q`` is to be deleted now (``unused``): call ``then()`` (the broker marks its
    registry entry), flag lane 0 deleted, all under lane 0's lock, and return why; else
    None and nothing changes. The broker deletes the rest after."""
    q = _first(q)
    mq = q._mq
    q._acquire()
    try:
        why = None if mq[L.I_DELETED] else unused(q, _mono())
        if why is not None:
            then()
            header.set_deleted(mq)
        return why
    finally:
        _unlock(q._lockp)


def set_deleter(deleter) -> None:
    """``deleter(namespace, name)``: delete the queue if it is unused (``condemn``), with its
    bindings; returns why, or None. Handed in by the broker's module as it is imported."""
    global _deleter
    _deleter = deleter


def delete_unused(q) -> str | None:
    """Delete ``q`` if it is unused now, through the broker's deleter (none loaded, or it
    failed: a lock held past its timeout, a shared namespace's queue of another user; the
    next sweep looks again). Returns why it went, or None."""
    if _deleter is None:
        return None
    try:
        return _deleter(q.namespace, q.name)
    except ShmqError:
        return None


def has_lifetime(namespace: str, name: str) -> bool:
    """Whether queue ``name`` is auto-delete or expires, read from its segment's file
    without attaching it (a sweep attaches only those)."""
    try:
        fd = os.open(os.path.join(SHM_DIR, queue_segment(namespace, name).lstrip("/")), os.O_RDONLY)
    except OSError:
        return False
    try:
        raw = os.pread(fd, 8, L.LIFETIME_OFF)
    except OSError:
        return False
    finally:
        os.close(fd)
    life = int.from_bytes(raw, "little") if len(raw) == 8 else 0
    return bool(life & _AUTO or life >> _SHIFT)


def _dead_consumer(q) -> bool:
    """Whether a process that registered consumers of ``q`` is dead (not reaped yet)."""
    mq, mm = q._mq, q._mm
    for i in range(q._nslots):
        if mq[L.proc_word(i, L.P_CONSUMERS)]:
            pid, start = L.PROC.unpack_from(mm, L.PROCS_OFF + i * L.PROC_SIZE)[:2]
            if not is_alive(pid, start):
                return True
    return False


def sweep(handles, delete) -> list[tuple[str, str]]:
    """Delete the queues among ``handles`` (attached handles, any lanes) that are unused now:
    those whose last consumer went (a dead process's row is reaped first) and those
    expired. ``delete(name)``: the broker's, which checks again under the locks
    (``condemn``); returns why, or None. Returns (name, why) of each deleted."""
    out = []
    now = _mono()
    for q in handles:
        q0 = _first(q)
        if q0._lockp is None or q0._mq[L.I_DELETED]:
            continue
        life = q0._mq[_I_LIFE]
        if not life & _AUTO and not life >> _SHIFT:
            continue
        try:
            if q0._procs_sum(L.P_CONSUMERS) and _dead_consumer(q0):
                q._housekeep()  # reaps the dead row (and deletes an auto-delete queue it leaves with none)
                if q0._mq[L.I_DELETED]:
                    out.append((q0.name, "auto-delete"))
                    continue
            if unused(q0, now) is not None:
                why = delete(q0.name)
                if why is not None:
                    out.append((q0.name, why))
        except ShmqError:  # (deleted meanwhile, a lock held past its timeout: the next sweep looks again)
            continue
    return out
