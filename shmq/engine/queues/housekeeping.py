"""Housekeeping: lapsed leases and due delayed messages made ready, leases (and consumers:
``lifetime``) of dead processes given back, the memory of settled records given back, and
the repair after a process died holding the lock.

Strategy: no daemon is needed. Whichever process takes the lock when a deadline is due
(``next_deadline``) or the liveness check is (``next_liveness``, every
``LIVENESS_PERIOD_NS``) does the work; ``shmq server`` calls ``housekeep`` too, so leases
move even while nobody calls ``get``. A process that dies inside the lock leaves the
robust mutex owner-dead: the next holder gets EOWNERDEAD and ``repair`` rebuilds every
derived control word from head, tail and the records (docs/DESIGN.md, Crash safety).
Each function takes the queue handle (``q``) and says whether it needs the lock held.
"""

import itertools
import os
import time

from ..shm import layout as L
from ..shm.memory import arc
from . import deadletter, lifetime, scheduling
from ..shm import dedup, header, ring, slots, takes, waits
from ..shm.process import is_alive
from ..shm.mutex import unlock as _unlock

__all__ = ["LIVENESS_PERIOD_NS", "expire", "dead_letter_spent", "reap_dead", "end_dead_fills", "housekeep",
           "give_back", "return_memory", "repair"]

_wall = time.time_ns
LIVENESS_PERIOD_NS = 500_000_000  # how often someone checks that lease holders live
MOVE_LEASE_NS = 60 * 10**9  # the lease of a message taken only to be dead-lettered (in the same call)

_READY, _LEASED, _DELAYED, _FILLING = L.READY, L.LEASED, L.DELAYED, L.FILLING
_R_DEADLINE = L.R_DEADLINE


def _spent(q, mq, w, pos, state, now, spent) -> int:
    """Lease the record at ``w`` (LEASED or DELAYED: the message had its last delivery) to
    this process, only to be dead-lettered once the lock is let go: its ``Delivery`` tuple
    goes to ``spent``. Lock held. Returns its lease's deadline."""
    until = now + MOVE_LEASE_NS  # (should this process die first, the reaper moves it)
    if state == _DELAYED:
        takes.lease_delayed(mq)
    spent.append(scheduling.lease_record(mq, q._mm, w, pos, _LEASED | (q._my_slot() << 8), until, mq[w] >> 32))
    return until


def _last(q, mq, w) -> bool:
    """Whether the record at ``w`` was delivered as often as ``max_deliveries`` allows."""
    return q.max_deliveries is not None and mq[w] >> 32 >= q.max_deliveries


def expire(q, now, spent) -> int:
    """Lapsed leases and due delayed messages become ready; those that had their last
    delivery (``max_deliveries``) go to ``spent`` instead (``_spent``: the caller
    dead-letters them once the lock is let go). Lock held. Returns how many became ready."""
    mq = q._mq
    next_deadline = L.NEVER
    woke = 0
    # past the frontier: delayed puts while special records exist, any lease in a leveled queue
    end = mq[L.I_TAIL] if mq[L.I_SPECIAL] or q._general else mq[L.I_FRONTIER]
    for pos, w in ring.records(mq, q._cap, q._base, mq[L.I_HEAD], end):
        state = mq[w] & 0xFF
        if state == _LEASED or state == _DELAYED:
            due = mq[w + _R_DEADLINE]
            if due <= now:
                if _last(q, mq, w):  # not ready again: dead-lettered now, not by the next take
                    next_deadline = min(next_deadline, _spent(q, mq, w, pos, state, now, spent))
                    continue
                if state == _LEASED and q._retry_ns:  # a lapsed lease waits as the retry policy says
                    until = now + q._retry_delay_ns(mq[w] >> 32)
                    takes.unlease(mq, w, pos, until)
                    next_deadline = min(next_deadline, until)
                    continue
                if state == _LEASED:
                    takes.unlease(mq, w, pos)
                else:
                    takes.wake(mq, w, pos)
                woke += 1
            elif due < next_deadline:
                next_deadline = due
    takes.next_deadline(mq, next_deadline, lower_only=False)
    if woke:
        for _ in range(waits.owed_posts(mq, waits.CONSUMERS, woke)):
            q._ne.release()
    return woke


def _release_holder(q, slot, now, spent) -> int:
    """Every lease held by process ``slot`` becomes ready again, or goes to ``spent`` when
    it was the message's last delivery (as ``expire``'s). Lock held. Returns how many
    became ready."""
    mq = q._mq
    n = 0
    end = mq[L.I_TAIL] if mq[L.I_SPECIAL] or q._general else mq[L.I_FRONTIER]
    for pos, w in ring.records(mq, q._cap, q._base, mq[L.I_HEAD], end):
        s = mq[w]
        if s & 0xFF == _LEASED and (s >> 8) & 0xFFFF == slot:
            if _last(q, mq, w):
                takes.next_deadline(mq, _spent(q, mq, w, pos, _LEASED, now, spent))
                continue
            n += takes.unlease(mq, w, pos)
    return n


def reap_dead(q, now) -> int:
    """Give back the leases of processes that died (``now``: the engine's monotonic clock),
    and forget them. Takes the lock."""
    mm, mq = q._mm, q._mq
    me = os.getpid()
    suspects = []
    first = L.PROCS_OFF >> 3  # the slots' pids in one strided look: an idle broker does this 4 times a second
    pids = mq[first:first + q._nslots * (L.PROC_SIZE >> 3):L.PROC_SIZE >> 3].tolist()
    for i in itertools.compress(range(len(pids)), pids):
        pid, start = L.PROC.unpack_from(mm, L.PROCS_OFF + i * L.PROC_SIZE)[:2]
        if pid and pid != me and not is_alive(pid, start):
            suspects.append((i, pid, start))
    if not suspects:
        return 0
    returned = gone = 0
    spent = []
    q._acquire()
    try:
        for i, pid, start in suspects:
            if L.PROC.unpack_from(mm, L.PROCS_OFF + i * L.PROC_SIZE)[:2] != (pid, start):
                continue  # reused meanwhile
            returned += _release_holder(q, i, now, spent) + end_dead_fills(q, i)
            gone += slots.forget(mq, mm, i, pid, start)  # its consumers go with it (``lifetime.py``)
        posts = waits.owed_posts(mq, waits.CONSUMERS, returned) if returned else 0
    finally:
        _unlock(q._lockp)
    for _ in range(posts):
        q._ne.release()
    dead_letter_spent(q, spent)
    if gone and lifetime.unused(q, now) is not None:  # (without the lock: the deleter looks again under it)
        lifetime.delete_unused(q)
    return returned


def end_dead_fills(q, slot=None) -> int:
    """The fills (``layout.FILL_OFF``) of process ``slot``, which died, or with None of every
    holder that does not live, become PADs, and the tail moves over what is done after them
    (``ring.commit_fills``). Lock held. Returns how many became ready (the caller owes their
    posts)."""
    mq = q._mq
    fill, tail = mq[L.I_FILL], mq[L.I_TAIL]
    if fill <= tail:
        return 0
    dead = []
    for pos, w in ring.records(mq, q._cap, q._base, tail, fill):
        s = mq[w]
        if s & 0xFF == _FILLING:
            holder = (s >> 8) & 0xFFFF
            if holder == slot if slot is not None else not _slot_alive(q, holder):
                dead.append((pos, w))
    for pos, w in reversed(dead):  # (the last first: taken back whole when nothing follows it)
        ring.void_fill(mq, w, pos)
    return ring.commit_fills(mq, q._cap, q._base)


def housekeep(q, now) -> int:
    """Do the due work now (``now``: the engine's monotonic clock): expire leases, wake
    delayed messages, return the leases of dead processes. Returns how many messages
    became ready again."""
    mq = q._mq
    dead = None
    spent = []
    q._acquire()
    try:
        if mq[L.I_DELETED]:
            raise q._gone()
        woke = expire(q, now, spent)
        header.liveness_due(mq, now + LIVENESS_PERIOD_NS)
        wall = _wall()
        if ttl_due(q, wall):
            dead = scheduling.sweep(q, now, wall)
        give_back(q)
    finally:
        _unlock(q._lockp)
    dead_letter_spent(q, spent)
    if dead:
        deadletter.dead_letter(q, [q.paths.Delivery(q, *t) for t in dead], "expired")
    return woke + reap_dead(q, now)


def give_back(q) -> int:
    """Give back the ring's memory where no record lives (``memory.Memory.give_back``): all
    but head to tail and the room ahead of the next put that the puts since the last round
    wrote as much of (a busy queue keeps what it keeps using; a drained one keeps nothing).
    Returns the bytes given back. Lock held."""
    mq, mem, cap, base = q._mq, q._memory, q._cap, q._base
    head, tail = mq[L.I_HEAD], ring.append_end(mq)  # (the records still being filled are kept too)
    mark = mem.word("mark")
    mem.set_word("mark", tail)
    ahead = min(cap - (tail - head), tail - mark if tail >= mark else cap)
    start = tail
    if head == tail and (tail % cap >= q._reuse or tail >= L.POS_LIMIT):  # the next put starts a lap
        start = 0 if tail >= L.POS_LIMIT else tail + cap - tail % cap
    # the put's room shrinks to what is kept before anything is given back (``layout.HOT_LINES``)
    ring.limit_room(mq, tail + ahead if start == tail else tail)
    return mem.give_back(arc(base, cap, head, tail) + arc(base, cap, start, start + ahead),
                         stamp=None if ahead else (head, tail), alive=lambda slot: _slot_alive(q, slot))


def _slot_alive(q, slot) -> bool:
    """Whether the process in process-table row ``slot`` lives (a claim's owner). Lock held."""
    pid, start = L.PROC.unpack_from(q._mm, L.PROCS_OFF + slot * L.PROC_SIZE)[:2]
    return bool(pid) and (pid == os.getpid() or is_alive(pid, start))


def return_memory(q) -> int:
    """``give_back`` under the lock (a get's liveness round). Takes the lock."""
    q._acquire()
    try:
        return 0 if q._mq[L.I_DELETED] else give_back(q)
    finally:
        _unlock(q._lockp)


def dead_letter_spent(q, spent) -> None:
    """Dead-letter what ``expire`` (or a dead holder's return) leased to this process
    because it had its last delivery. Not under the lock."""
    if spent:
        deadletter.dead_letter(q, [q.paths.Delivery(q, *t) for t in spent], "max-deliveries")


def ttl_due(q, wall) -> bool:
    """Whether a ready message may have expired (a TTL sweep is due). Lock held."""
    mq = q._mq
    if not mq[L.I_READY]:
        return False
    if mq[L.I_NEXT_TTL] <= wall:
        return True
    if not q._ttl_ns:
        return False
    # the queue's TTL: the oldest ready message expires first (C puts do not lower next_ttl)
    start = mq[L.I_READY_POS] if mq[L.I_REQUEUED] else mq[L.I_FRONTIER]
    for _pos, w in ring.records(mq, q._cap, q._base, start, mq[L.I_TAIL]):
        if mq[w] & 0xFF == _READY:
            return mq[w + L.R_ENQ] + q._ttl_ns <= wall
    return False


def repair(q) -> None:
    """Rebuild every derived control word from head, tail and the records, after the
    lock's previous holder died inside an update (``ring.recount``); then what only the
    queue knows: the dedup entries of ids never committed, the fills of dead holders, the
    log. Lock held."""
    mq, cap = q._mq, q._cap
    tail = ring.recount(mq, q._mm, cap, q._base, q._nslots, q._levels, q._id_step)
    dedup.forget_uncommitted(mq, q._dedup_off, mq[L.I_NEXT_ID])
    if ring.recount_fills(mq, cap, q._base, tail):
        end_dead_fills(q)  # (what it commits counts in ready: the sleepers' slices find it)
    ring.advance_head(mq, cap, q._base)
    if q._logged:
        q.wal.repair()
