"""A queue ring's takes and settles: what makes a record leased, ready again, acked or
dropped, and the counts and cursors a take moves (the Python twins of ``_fast.c``'s
``take_locked``, ``take_many_core``, ``fast_ack`` and ``ack_many_core``), each written once.

Strategy: as ``ring``'s (the other side: placing records, the commit, the head's reclaim,
the recount), these work on the segment as 64-bit words (``mq``), know nothing of locks,
processes or time (every caller holds the queue's lock and passes ``now``), and address a
record by its word index ``w``. A status word's store is a take's or a settle's commit.
"""

from . import layout as L
from .ring import advance_head, records

__all__ = ["leased_word", "make_ready", "unlease", "wake", "lease", "taken", "lease_delayed", "drop", "ack",
           "ack_many", "extend", "next_deadline", "cursors", "level_at", "take_next", "take_batch", "took", "spent",
           "next_ready", "purge"]

_REC = L.REC_SIZE
_LEASED, _READY, _ACKED, _PAD = L.LEASED, L.READY, L.ACKED, L.PAD
R_MSG_ID, R_DEADLINE = L.R_MSG_ID, L.R_DEADLINE
I_TAIL, I_FRONTIER, I_READY_POS = L.I_TAIL, L.I_FRONTIER, L.I_READY_POS
I_READY, I_REQUEUED = L.I_READY, L.I_REQUEUED
I_INFLIGHT, I_NEXT_DEADLINE, I_EXPIRED_TOTAL = L.I_INFLIGHT, L.I_NEXT_DEADLINE, L.I_EXPIRED_TOTAL
_proc_word, _P_ACKED, _P_REDELIVERED = L.proc_word, L.P_ACKED, L.P_REDELIVERED
_UNPACK, _FLAG_TTL = L.REC.unpack_from, L.FLAG_TTL


def leased_word(mq, base, cap, pos, attempt, msg_id, head, tail, now):
    """Word index of a delivery's record while it is still leased to that delivery
    (same attempt and id, lease not lapsed at ``now``), else -1."""
    if pos < head or pos >= tail:
        return -1
    w = (base + pos % cap) >> 3
    s = mq[w]
    if s & 0xFF != _LEASED or s >> 32 != attempt or mq[w + R_MSG_ID] != msg_id or mq[w + R_DEADLINE] <= now:
        return -1
    return w


def make_ready(mq, w, pos, attempt=None):
    """A delivered record becomes ready again, keeping its attempt count (or with
    ``attempt``)."""
    mq[w] = L.status_word(_READY, L.NO_HOLDER, mq[w] >> 32 if attempt is None else attempt)  # commit
    mq[I_READY] += 1
    flags = mq[w + 2] >> 32
    if flags & L.FLAG_TTL:  # it may expire from now on: the next sweep looks
        mq[L.I_NEXT_TTL] = 0
    lv = L.I_LEVEL_POS + min(flags & 0xFF, L.MAX_PRIORITIES - 1)  # its level's first ready record may be it
    if pos < mq[lv]:
        mq[lv] = pos
    if pos >= mq[I_FRONTIER]:  # not behind the frontier (a delayed put never reached): the frontier meets it
        return
    requeued = mq[I_REQUEUED]
    mq[I_REQUEUED] = requeued + 1
    if not requeued or pos < mq[I_READY_POS]:  # ready_pos is only kept while requeued > 0
        mq[I_READY_POS] = pos


def unlease(mq, w, pos, until=0, attempt=None) -> int:
    """A LEASED record gives its lease up (a nack, a lapse, a dead holder's), counted out of
    in-flight: READY again (``make_ready``: its attempt count kept, or ``attempt``), or with
    ``until`` (monotonic ns) DELAYED till then, the next deadline lowered to it. Returns 1
    when it became ready (its post is owed by the caller), else 0. Lock held."""
    mq[I_INFLIGHT] -= 1
    if until:
        mq[w + R_DEADLINE] = until
        mq[w] = L.status_word(L.DELAYED, L.NO_HOLDER, mq[w] >> 32)  # commit
        mq[L.I_DELAYED] += 1
        if until < mq[I_NEXT_DEADLINE]:
            mq[I_NEXT_DEADLINE] = until
        return 0
    make_ready(mq, w, pos, attempt)
    return 1


def wake(mq, w, pos) -> None:
    """A DELAYED record that is due becomes READY (``make_ready``). Lock held."""
    mq[L.I_DELAYED] -= 1
    make_ready(mq, w, pos)


def lease(mq, w, lease_word, until, attempt) -> None:
    """Lease the record at ``w``: its deadline ``until``, then its status word (``lease_word``:
    LEASED and the holder's slot, with ``attempt``), the commit. Lock held."""
    mq[w + R_DEADLINE] = until
    mq[w] = lease_word | (attempt << 32)  # commit


def taken(mq, ready, leased, expired, slot, redelivered, until) -> None:
    """A take's counts: ``ready`` records fewer ready, ``leased`` more in flight (leased to
    ``slot`` till ``until``), ``expired`` of them counted expired, ``redelivered`` counted
    to the slot's row. Lock held."""
    mq[I_READY] -= ready
    mq[I_INFLIGHT] += leased
    if expired:
        mq[I_EXPIRED_TOTAL] += expired
    if redelivered:
        mq[_proc_word(slot, _P_REDELIVERED)] += redelivered
    if leased and until < mq[I_NEXT_DEADLINE]:
        mq[I_NEXT_DEADLINE] = until


def lease_delayed(mq) -> None:
    """A DELAYED record is being leased (``lease``): one delayed fewer, one more in flight."""
    mq[L.I_DELAYED] -= 1
    mq[I_INFLIGHT] += 1


def drop(mq, w) -> None:
    """The record at ``w`` is done with (ACKED: the head's reclaim passes it), uncounted:
    the caller counts it. Lock held."""
    mq[w] = (mq[w] & ~0xFF) | _ACKED


def ack(mq, w, slot) -> None:
    """Ack the leased record at ``w``: the status store is the commit; one fewer in flight,
    one more acked by the process of row ``slot``. Lock held (``_fast.c``'s ``ack`` is its twin)."""
    mq[w] = (mq[w] & ~0xFF) | _ACKED  # commit
    mq[I_INFLIGHT] -= 1
    mq[_proc_word(slot, _P_ACKED)] += 1


def ack_many(mq, words, counter) -> None:
    """Ack the leased records at ``words``; counted acked in word ``counter`` (a process row's
    ``P_ACKED``, or ``I_DEAD_TOTAL`` for those dead-lettered; None: counted already). Lock held."""
    for w in words:
        mq[w] = (mq[w] & ~0xFF) | _ACKED  # commit
    mq[I_INFLIGHT] -= len(words)
    if counter is not None:
        mq[counter] += len(words)


def extend(mq, w, until) -> None:
    """The lease of the record at ``w`` runs till ``until`` now. Lock held."""
    mq[w + R_DEADLINE] = until
    if until < mq[I_NEXT_DEADLINE]:
        mq[I_NEXT_DEADLINE] = until


def next_deadline(mq, until, lower_only=True) -> None:
    """The next lease or delay falls due at ``until`` (``lower_only``: if sooner than the word
    says; else exactly then: housekeeping's walk found every deadline). Lock held."""
    if not lower_only or until < mq[I_NEXT_DEADLINE]:
        mq[I_NEXT_DEADLINE] = until


def cursors(mq, frontier, requeued=None, ready_pos=None, next_ttl=None, special=None) -> None:
    """The plain takes' cursors after a general take's walk: with only ``frontier``, a part of
    the ring was walked (the frontier only rises, to cover the leases); with the rest, the
    whole (each exact). Lock held."""
    if requeued is None:
        if frontier > mq[I_FRONTIER]:
            mq[I_FRONTIER] = frontier
        return
    mq[I_FRONTIER] = frontier
    mq[I_REQUEUED] = requeued
    mq[I_READY_POS] = ready_pos
    mq[L.I_NEXT_TTL] = next_ttl
    mq[L.I_SPECIAL] = special


def level_at(mq, level, pos) -> None:
    """Priority ``level``'s first ready record is at ``pos`` or after (the leveled take's pointer)."""
    mq[L.I_LEVEL_POS + level] = pos


def take_next(mq, w, end, slot, attempt, until, ready, inflight, next_deadline) -> None:
    """The plain take of the record at the frontier (word ``w``, ending at ``end``): leased
    to ``slot`` till ``until`` (0: auto-acked, counted acked at once), the frontier past it.
    ``ready``, ``inflight``, ``next_deadline``: those words as the caller read them in this
    hold of the lock. Lock held (``_fast.c``'s ``take_locked`` is its twin)."""
    if until:
        mq[w + R_DEADLINE] = until
        mq[w] = _LEASED | (slot << 8) | (attempt << 32)  # commit
        mq[I_FRONTIER] = end  # (ready_pos means nothing while requeued == 0)
        mq[I_READY] = ready - 1
        mq[I_INFLIGHT] = inflight + 1
        if until < next_deadline:
            mq[I_NEXT_DEADLINE] = until
    else:
        mq[w] = _ACKED | (slot << 8) | (attempt << 32)  # commit
        mq[I_FRONTIER] = end
        mq[I_READY] = ready - 1
        mq[_proc_word(slot, _P_ACKED)] += 1
    if attempt > 1:
        mq[_proc_word(slot, _P_REDELIVERED)] += 1


def take_batch(mm, mq, cap, base, ready, maxn, slot, until, maxdel, budget, ttl, wall, expiry):
    """The plain batch take (a FIFO ring, no special records; ``ready`` of them): up to
    ``maxn`` records, the requeued ones below the frontier first, then the frontier on, each
    leased to ``slot`` till ``until``; within ``budget`` bytes of bodies and headers (None:
    any, the first always); one past ``maxdel`` deliveries is taken on top (leased only to
    be dead-lettered by the caller); one expired (``expiry(mm, a, flags, enq, ttl)`` at or
    before ``wall``) is leased only to expire. Returns (taken, expired): ``Delivery`` tuples
    (pos, id, attempt, body, header bytes or None, enqueued ns). The cursors and counts are
    ``took``'s. Lock held (``_fast.c``'s ``take_many_core`` is its twin)."""
    lease_word = _LEASED | (slot << 8)
    requeued, frontier, tail, ready_pos = mq[I_REQUEUED], mq[I_FRONTIER], mq[I_TAIL], mq[I_READY_POS]
    out, dead = [], []
    taken = redelivered = nexpired = ndead = 0
    append = out.append
    while ready and len(out) - ndead < maxn:
        if requeued:
            pos = next_ready(mq, cap, base, ready_pos, frontier)
            if pos < 0:  # the count was stale: none left below the frontier
                requeued = 0
                ready_pos = frontier
                continue
            requeued -= 1
            a = base + pos % cap
            status, length, bl, hl, fl, msg_id, enq, _d = _UNPACK(mm, a)
            ready_pos = pos + length if requeued else frontier
        else:
            if frontier >= tail:
                break
            pos = frontier
            off = pos % cap
            if cap - off < _REC:  # implicit pad to the end of the lap
                frontier += cap - off
                continue
            a = base + off
            status, length, bl, hl, fl, msg_id, enq, _d = _UNPACK(mm, a)
            frontier = pos + length
            if status & 0xFF == _PAD:
                continue
        if (fl & _FLAG_TTL or ttl) and 0 < expiry(mm, a, fl, enq, ttl) <= wall:
            attempt = status >> 32  # leased to us only to expire (dead-letter or drop)
            w = a >> 3
            mq[w + R_DEADLINE] = until
            mq[w] = lease_word | (attempt << 32)  # commit
            ready -= 1
            taken += 1
            nexpired += 1
            a += _REC
            dead.append((pos, msg_id, attempt, mm[a + hl:a + hl + bl], mm[a:a + hl] if hl else None, enq))
            continue
        if budget is not None:
            if out and bl + hl > budget:
                if pos < frontier:  # a requeued one: leave it for the next take, as it was
                    requeued += 1
                    ready_pos = pos
                else:
                    frontier = pos
                break
            budget -= bl + hl
        attempt = (status >> 32) + 1
        w = a >> 3
        mq[w + R_DEADLINE] = until
        mq[w] = lease_word | (attempt << 32)  # commit
        ready -= 1
        taken += 1
        if attempt > 1:
            redelivered += 1
            if maxdel is not None and attempt > maxdel:
                ndead += 1  # leased to us only to be dead-lettered by the caller
        a += _REC
        append((pos, msg_id, attempt, mm[a + hl:a + hl + bl], mm[a:a + hl] if hl else None, enq))
    took(mq, frontier, requeued, ready_pos, ready, taken, nexpired, slot, redelivered, until)
    return out, dead


def took(mq, frontier, requeued, ready_pos, ready, leased, expired, slot, redelivered, until) -> None:
    """A plain batch take's cursors and counts (each record ``lease``d by then): the
    frontier, the requeued records left below it from ``ready_pos``, ``ready`` left,
    ``leased`` more in flight till ``until`` (``expired`` of them only to expire), and
    ``redelivered`` counted to row ``slot``. Lock held."""
    mq[I_FRONTIER] = frontier
    mq[I_READY_POS] = ready_pos if requeued else frontier
    mq[I_REQUEUED] = requeued
    taken(mq, mq[I_READY] - ready, leased, expired, slot, redelivered, until)


def spent(mq, w, slot, until, attempt) -> None:
    """A record just taken past ``max_deliveries`` is leased to ``slot`` only to be
    dead-lettered: its attempt as it was (``attempt``), not counted redelivered. Lock held."""
    lease(mq, w, _LEASED | (slot << 8), until, attempt)
    mq[_proc_word(slot, _P_REDELIVERED)] -= 1


def next_ready(mq, cap, base, pos, frontier):
    """Position of the first READY record from ``pos`` below the frontier, or -1."""
    for p, w in records(mq, cap, base, pos, frontier):
        if mq[w] & 0xFF == _READY:
            return p
    return -1


def purge(mq, cap, base, words, tail) -> bool:
    """Drop the READY (and DELAYED) records at ``words`` (their word indices): each ACKED,
    counted purged; nothing is ready up to ``tail`` after. Returns whether a sleeping
    producer is owed a post (counted as posted) for the room freed. Lock held."""
    for w in words:
        if mq[w] & 0xFF == L.DELAYED:
            mq[L.I_DELAYED] -= 1
        mq[w] = (mq[w] & ~0xFF) | _ACKED
    mq[I_READY] = 0
    mq[I_REQUEUED] = 0
    mq[I_FRONTIER] = mq[I_READY_POS] = tail
    mq[L.I_PURGED_TOTAL] += len(words)
    post = advance_head(mq, cap, base) and mq[L.I_PWAIT] > mq[L.I_PPOSTED]
    if post:
        mq[L.I_PPOSTED] += 1
    return post
