"""Records in the ring: walking them, placing and writing one, the lease check, the head's
reclaim, the commit, and the recount of a queue ring's control words after a holder of its
lock died — each written once (a stream partition's words: ``plog``).

Strategy: these work on a segment seen two ways, as bytes (``mm``) and as 64-bit words
(``mq``), and know nothing of locks, processes or time: every caller holds the queue's
lock and passes ``now``. A record is addressed by its word index ``w`` (records are
8-aligned), so a field is ``mq[w + R_FIELD]``. Priority rings, a timer ring and streams
reuse these as they are.
"""

import os

from . import layout as L
from . import waits

__all__ = ["records", "copy_used", "copied_records", "place", "write_record", "leased_word", "make_ready", "unlease",
           "wake", "lease", "taken", "lease_delayed", "drop", "ack", "ack_many", "extend", "next_deadline", "cursors",
           "level_at", "limit_room", "take_next", "take_batch", "took", "spent", "advance_head", "freed_at",
           "next_ready", "append_end", "commit", "commit_delayed", "mark_special", "stamp", "placed_fills",
           "end_fill", "wrap_at", "set_room", "new_lap", "commit_import", "purge", "commit_fills", "window",
           "early_wrap", "spill_start", "fits", "write_pad", "bytes_used", "suspect_fill", "void_fill", "recount",
           "recount_fills"]

_REC = L.REC_SIZE
_PACK = L.REC.pack_into
_LEASED, _READY, _ACKED, _PAD, _FILLING = L.LEASED, L.READY, L.ACKED, L.PAD, L.FILLING
R_LENGTH, R_MSG_ID, R_DEADLINE = L.R_LENGTH, L.R_MSG_ID, L.R_DEADLINE
I_HEAD, I_TAIL, I_FRONTIER, I_READY_POS = L.I_HEAD, L.I_TAIL, L.I_FRONTIER, L.I_READY_POS
I_READY, I_REQUEUED, I_FILL = L.I_READY, L.I_REQUEUED, L.I_FILL
I_NEXT_ID, I_CWAIT = L.I_NEXT_ID, L.I_CWAIT
I_INFLIGHT, I_NEXT_DEADLINE, I_EXPIRED_TOTAL = L.I_INFLIGHT, L.I_NEXT_DEADLINE, L.I_EXPIRED_TOTAL
_proc_word, _P_ACKED, _P_REDELIVERED = L.proc_word, L.P_ACKED, L.P_REDELIVERED
_UNPACK, _FLAG_TTL = L.REC.unpack_from, L.FLAG_TTL
_GROW_DUE = L.mem_words(L.MEM_OFF)["grow_due"]
_CONSUMERS = waits.CONSUMERS
_owed_posts = waits.owed_posts


def records(mq, cap, base, pos, end):
    """Yield (position, word index) of every record from ``pos`` up to ``end``, PAD
    records included, stepping over the implicit pads at lap ends. The caller may stop
    before the next one is read (a record it finds unfinished)."""
    while pos < end:
        rem = cap - pos % cap
        if rem < _REC:  # too little of the lap left for a record: the next lap
            pos += rem
            if pos >= end:
                return
        w = (base + pos % cap) >> 3
        yield pos, w
        pos += mq[w + R_LENGTH] & 0xFFFFFFFF


def copy_used(mm, base, cap, head, tail):
    """The bytes from ``head`` to ``tail`` as one run, head first across the end of the
    ring (for a snapshot: the caller holds the lock for this copy only); the record at
    position ``pos`` is at ``pos - head`` of the copy."""
    start = head % cap
    if start + (tail - head) <= cap:
        return mm[base + start:base + start + (tail - head)]
    return mm[base + start:base + cap] + mm[base:base + (tail - head) - (cap - start)]


def copied_records(copy, cap, head, tail):
    """Yield (offset in the copy, the record's header fields) of every record of a
    ``copy_used`` copy, PAD records included, stepping over the implicit pads."""
    pos = head
    while pos < tail:
        pos = L.skip_gap(pos, cap)
        if pos >= tail:
            return
        fields = L.REC.unpack_from(copy, pos - head)
        yield pos - head, fields
        pos += fields[1]


def place(mm, base, cap, pos, size):
    """Where a record of ``size`` bytes appended at ``pos`` goes: (its position, its
    byte address). A record never straddles the end of the ring: when it would, a PAD
    record fills the rest of the lap (or nothing, when less than a header remains)."""
    off = pos % cap
    rem = cap - off
    if size > rem:
        if rem >= _REC:
            _PACK(mm, base + off, _PAD, rem, 0, 0, 0, 0, 0, 0)
        return pos + rem, base
    return pos, base + off


def write_record(mm, a, status, size, body, hraw, msg_id, enq_ns, flags=0, deadline=0):
    """Write a whole record at byte address ``a``; it is published by the caller's commit."""
    hl = len(hraw)
    bl = len(body)
    _PACK(mm, a, status, size, bl, hl, flags, msg_id, enq_ns, deadline)
    a += _REC
    if hl:
        mm[a:a + hl] = hraw
        a += hl
    mm[a:a + bl] = body


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


def limit_room(mq, room) -> None:
    """The puts' room ends at ``room`` at most (memory given back past it). Lock held."""
    if room < mq[L.I_ROOM]:
        mq[L.I_ROOM] = room


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


def advance_head(mq, cap, base):
    """Reclaim settled records and pads at the head. Returns True if it moved."""
    start = head = mq[I_HEAD]
    tail = mq[I_TAIL]
    for pos, w in records(mq, cap, base, head, tail):
        state = mq[w] & 0xFF
        if state != _ACKED and state != _PAD:
            break
        head = pos + (mq[w + R_LENGTH] & 0xFFFFFFFF)
    else:
        head = tail
    if head == start:
        return False
    mq[I_HEAD] = head
    # only settled records and pads lay behind the new head: cursors follow it
    if mq[I_FRONTIER] < head:
        mq[I_FRONTIER] = head
    if mq[I_READY_POS] < head:
        mq[I_READY_POS] = head
    return True


def freed_at(mq, cap, base, pos, head) -> bool:
    """After the record at ``pos`` was settled (``head`` read before): reclaim space when
    it was the first after the head (or after a pad at the head); True when a sleeping
    producer is owed a post (counted as posted)."""
    if (pos == head or (pos % cap == 0 and pos - head < cap)) and advance_head(mq, cap, base):
        pw = mq[L.I_PWAIT]
        if pw and pw > mq[L.I_PPOSTED]:
            mq[L.I_PPOSTED] += 1
            return True
    return False


def next_ready(mq, cap, base, pos, frontier):
    """Position of the first READY record from ``pos`` below the frontier, or -1."""
    for p, w in records(mq, cap, base, pos, frontier):
        if mq[w] & 0xFF == _READY:
            return p
    return -1


def append_end(mq) -> int:
    """Where the next record goes: past the records still being filled (``layout.FILL_OFF``),
    else at the tail. Lock held."""
    fill, tail = mq[I_FILL], mq[I_TAIL]
    return fill if fill > tail else tail


def commit(mq, end, next_id, ready) -> int:
    """Publish the records written from the tail up to ``end``: the tail is stored first
    (the commit: a record before it is whole), then the next message id and the count of
    ``ready`` ones (a delayed put's are counted by its caller). Returns how many sleeping
    consumers are owed a post (counted as posted). Lock held. The one commit of new
    records in Python (``commit_fills`` moves the tail over records already counted
    placed); _fast.c's ``commit`` is its twin."""
    mq[I_TAIL] = end  # commit
    mq[I_NEXT_ID] = next_id
    if not ready:
        return 0
    mq[I_READY] += ready
    return _owed_posts(mq, _CONSUMERS, ready) if mq[I_CWAIT] else 0


def commit_delayed(mq, end, next_id, n, due) -> None:
    """``commit`` of ``n`` records DELAYED till ``due`` (monotonic ns): not ready, counted
    delayed, the next deadline lowered to theirs. Lock held."""
    commit(mq, end, next_id, 0)
    mq[L.I_DELAYED] += n
    if due < mq[I_NEXT_DEADLINE]:
        mq[I_NEXT_DEADLINE] = due


def mark_special(mq, bits, expires) -> None:
    """Records about to be committed need the general take (``I_SPECIAL``'s ``bits``: 1, a
    walk; 2, a due time), and the first of them expires at ``expires`` (wall ns; 0: none).
    Lock held."""
    if bits:
        mq[L.I_SPECIAL] |= bits
    if expires and expires < mq[L.I_NEXT_TTL]:
        mq[L.I_NEXT_TTL] = expires


def stamp(mq, w, enq_ns) -> None:
    """The put time of the record at ``w`` (placed, not committed yet)."""
    mq[w + L.R_ENQ] = enq_ns


def placed_fills(mq, next_id, end) -> None:
    """Records were placed past the tail up to ``end`` (a fill begun, or items after fills
    not done yet), ids handed out up to ``next_id``: the tail moves over them as the fills
    before them end (``commit_fills``). Lock held."""
    mq[L.I_NEXT_ID] = next_id
    mq[I_FILL] = end


def end_fill(mq, w, enq_ns) -> None:
    """The fill at ``w`` is done: READY, put at ``enq_ns``; ``commit_fills`` follows. Lock held."""
    mq[w + L.R_ENQ] = enq_ns
    mq[w] = _READY


def wrap_at(mq, tail) -> None:
    """The puts wrapped early at ``tail`` (``early_wrap``): a stale word is harmless, ``fits``
    and ``spill_start`` check it. Lock held."""
    mq[L.I_WRAP] = tail


def set_room(mq, room, grow_due=False) -> None:
    """The puts' room (the fast paths' one compare) ends at ``room``; ``grow_due``: an append
    allocates the next chunks ahead, outside the lock. Lock held."""
    if grow_due:
        mq[_GROW_DUE] = 1
    mq[L.I_ROOM] = room


def new_lap(mq, tail, cap) -> int:
    """Move an empty ring's cursors from ``tail`` to the start of the next lap, or to 0 past
    ``POS_LIMIT``; returns the new tail. A death midway leaves head above tail, which the
    repair settles (``recount``: the tail goes to the head). Lock held."""
    mq[I_FILL] = 0  # (none under way: an empty queue; a word a death left stale goes)
    if tail >= L.POS_LIMIT:
        mq[L.I_ROOM] = 0  # (nothing known allocated from there yet)
        mq[I_TAIL] = 0  # the tail first: a repair then takes the tail back to the head
        mq[I_HEAD] = mq[I_FRONTIER] = mq[I_READY_POS] = 0
        for lv in range(L.MAX_PRIORITIES):
            mq[L.I_LEVEL_POS + lv] = 0
        return 0
    new = tail + (cap - tail % cap) % cap
    mq[I_HEAD] = new  # the head first: a repair then takes the tail to it
    mq[I_FRONTIER] = mq[I_READY_POS] = mq[I_TAIL] = new
    return new


def commit_import(mq, end, next_id, ready, delayed, special, first_due) -> int:
    """``commit`` for restored records (a snapshot's import): ``delayed`` of them not due
    yet (the first at ``first_due``, monotonic ns), ``special`` the kinds of extension
    they carry (``I_SPECIAL``'s bits: the general take recomputes the cursors, and a sweep
    looks for expired ones soon). Returns the posts owed. Lock held."""
    if special:
        mq[L.I_SPECIAL] |= special
        mq[L.I_NEXT_TTL] = 0
    if first_due < mq[I_NEXT_DEADLINE]:
        mq[I_NEXT_DEADLINE] = first_due
    if delayed and mq[I_FRONTIER] < end:
        mq[I_FRONTIER] = end
    post = commit(mq, end, next_id, ready)
    mq[L.I_DELAYED] += delayed
    return post


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


def commit_fills(mq, cap, base) -> int:
    """Move the tail over the records past it that are done (READY, or PAD: abandoned), up to
    the first one still FILLING; the fill word goes back to 0 once none is left. Returns how
    many became ready (counted in ``ready``: the caller owes their posts). Lock held; a death
    midway leaves a tail that a later commit or the repair moves on."""
    fill = mq[I_FILL]
    tail = start = mq[I_TAIL]
    n = 0
    if fill > tail:
        for pos, w in records(mq, cap, base, tail, fill):
            state = mq[w] & 0xFF
            if state == _FILLING:
                break
            tail = pos + (mq[w + R_LENGTH] & 0xFFFFFFFF)
            n += state == _READY
        else:
            tail = fill
    if tail != start:
        mq[I_TAIL] = tail  # commit
        mq[I_READY] += n
        if mq[I_HEAD] == start:  # (the queue was empty: a PAD first, an abandoned fill's, is reclaimed now)
            advance_head(mq, cap, base)
    if fill and tail >= fill:
        mq[I_FILL] = 0
    return n


def window(size, cap) -> int:
    """The window of a ring of ``cap`` bytes for a record of ``size`` bytes (``layout.LARGE``):
    0 when there is none (the record is small, or the ring is small already)."""
    if size < L.LARGE:
        return 0
    w = max(L.WINDOW_MIN, L.WINDOW_RECORDS * size)
    return w if 2 * w <= cap else 0


def early_wrap(head, end, size, cap) -> bool:
    """Whether a record of ``size`` bytes appended at ``end`` starts the next lap now (an
    early wrap): ``end`` is past its window, in the head's lap, and the lap's start has a
    whole window free before the head. (Room for one record only would have the producers
    chase the head through the ring a record at a time, each waiting on the consumers'
    acks: with several consumers acking out of order, 4 -> 4 ran at a third of its speed.)"""
    w = window(size, cap)
    return bool(w) and end != head and end % cap >= w and head // cap == end // cap and w <= head % cap


def spill_start(head, end, cap, wrap) -> int:
    """Where records appended at ``end`` go past the early wrap whose pad is at ``wrap`` (a
    spill: ``layout.SPILL_WAIT_NS``), or 0 when they cannot: the head has passed the pad,
    ``end`` is not in the head's next lap, or a pad from ``end`` would not fit before the
    head."""
    lap = head // cap
    if not wrap or wrap < head or wrap // cap != lap or end // cap != lap + 1:
        return 0
    start = end - end % cap + ((wrap % cap + L.UNWRAP_GAP + 7) & -8)
    if end >= start:
        return end  # (spilt already)
    return start if end % cap + _REC <= head % cap else 0


def fits(head, start, after, cap, wrap) -> bool:
    """Whether records placed from ``start`` to ``after`` fit with the head at ``head``: a
    lap's bytes at most (a header's less while an early wrap's pad at ``wrap`` is ahead of
    the head, so that a spill's pad fits), or all past that pad in the head's next lap (a
    spill), where the ring is free though their positions are more than a lap ahead."""
    lap = head // cap
    wrapped = 0 < wrap and head <= wrap and wrap // cap == lap
    if after - head <= cap - (_REC if wrapped else 0):  # (a spill's pad needs a header's room before the head)
        return True
    return (wrapped and start // cap == lap + 1 and (after - 1) // cap == lap + 1 and
            start % cap >= wrap % cap + L.UNWRAP_GAP)


def write_pad(mm, base, cap, pos, to) -> None:
    """A PAD record at ``pos`` over the positions up to ``to`` (an early wrap's, to the lap's
    end; a spill's); nothing where less than a header remains before the lap's end."""
    if cap - pos % cap >= _REC:
        _PACK(mm, base + pos % cap, _PAD, to - pos, 0, 0, 0, 0, 0, 0)


def bytes_used(head, tail, cap, wrap) -> int:
    """The ring's bytes in use from ``head`` to ``tail``, less the stretch an early wrap's pad
    ahead of the head skips (``layout.WRAP_OFF``; a spill's own pad, at most a window, is
    counted)."""
    used = tail - head
    if 0 < wrap and head <= wrap < tail and wrap // cap == head // cap:
        used -= cap - wrap % cap
    return min(used, cap)


def suspect_fill(mq, mm, cap, base, tail, now) -> bool:
    """Whether the first record past ``tail`` is a fill whose holder may be dead: its process
    is gone, or it was put longer than ``FILL_STALE_NS`` before ``now`` (wall ns). Lock held."""
    rem = cap - tail % cap
    if rem < _REC:
        tail += rem
    w = (base + tail % cap) >> 3
    s = mq[w]
    if s & 0xFF != _FILLING:
        return False
    if now - mq[w + L.R_ENQ] > L.FILL_STALE_NS:
        return True
    pid = mq[_proc_word((s >> 8) & 0xFFFF, 0)]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError, ValueError):
        pass
    return False


def void_fill(mq, w, pos) -> None:
    """The fill at ``pos`` (word ``w``) never becomes a message (abandoned, or its holder
    died): taken back when nothing was placed after it (the fill word and the next id go
    back), else a PAD whose id is counted voided. Lock held; ``commit_fills`` follows."""
    mq[w] = _PAD
    if pos + (mq[w + R_LENGTH] & 0xFFFFFFFF) == mq[I_FILL]:
        mq[I_FILL] = pos
        mq[L.I_NEXT_ID] = mq[w + R_MSG_ID]
    else:
        mq[L.I_VOIDED] += 1


def recount(mq, mm, cap, base, nslots, levels, id_step) -> int:
    """Rebuild every derived control word of a queue's ring from its head, its tail, its
    records and its process rows, after the lock's previous holder died inside an update:
    a record the dead writer never finished is dropped (the tail goes back to it), the
    counts, the cursors, the next deadline and the sleepers' counts are found again, the
    next id passes every id in the ring (``id_step`` apart: a lane's own), and the repair
    is counted. Returns the tail. Lock held (``housekeeping.repair`` does the rest)."""
    head, tail = mq[I_HEAD], mq[I_TAIL]
    if head > tail:  # a death inside a move to a new lap (``Producing._new_lap``): the tail goes to the head
        tail = head
    ready = inflight = delayed = requeued = ready_run = special = 0
    first_ready = None
    frontier = head
    next_deadline = L.NEVER
    max_id = 0
    for pos, w in records(mq, cap, base, head, tail):
        status, length, _b, _h, flags, msg_id, _e, deadline = L.REC.unpack_from(mm, w << 3)
        state = status & 0xFF
        if length < _REC or length % 8 or pos % cap + length > cap or pos + length > tail:
            tail = pos  # a record the dead writer never finished: drop it
            break
        if state == _PAD:
            continue
        max_id = max(max_id, msg_id)
        if flags & L.FLAG_WALK and state != _ACKED:
            special += 1
        if state == _READY:
            ready += 1
            ready_run += 1
            if first_ready is None:
                first_ready = pos
        else:
            requeued += ready_run
            ready_run = 0
            frontier = pos + length
            if state == _LEASED:
                inflight += 1
                next_deadline = min(next_deadline, deadline)
            elif state == L.DELAYED:
                delayed += 1
                next_deadline = min(next_deadline, deadline)
    cwait = pwait = bells = 0
    for i in range(nslots):
        pid, _s, cw, pw, _a, _r, b, _c = L.PROC.unpack_from(mm, L.PROCS_OFF + i * L.PROC_SIZE)
        if pid:
            cwait += cw
            pwait += pw
            bells += b
    mq[I_TAIL] = tail
    mq[L.I_ROOM] = tail  # (the next put's allocation finds it again)
    if max_id:  # (a lane's ids stay its own: lane + 1, + lanes, ...)
        mq[I_NEXT_ID] = max(mq[I_NEXT_ID], max_id + id_step)
    mq[I_FRONTIER] = frontier
    mq[I_READY_POS] = first_ready if requeued else frontier
    mq[I_REQUEUED] = requeued
    mq[I_READY] = ready
    mq[I_INFLIGHT] = inflight
    mq[L.I_DELAYED] = delayed
    mq[I_NEXT_DEADLINE] = next_deadline
    mq[L.I_NEXT_LIVENESS] = 0
    mq[I_CWAIT] = mq[L.I_LANE_SLEEPERS] = cwait
    mq[L.I_BELLS] = bells
    mq[L.I_CPOSTED] = 0
    mq[L.I_PWAIT] = pwait
    mq[L.I_PPOSTED] = 0
    mq[L.I_REPAIRS] += 1
    mq[L.I_SPECIAL] = 3 if special else 0  # (due times or not: the next whole walk says)
    for lv in range(levels):
        mq[L.I_LEVEL_POS + lv] = head  # lower bounds, found again by the next takes
    mq[L.I_NEXT_TTL] = 0  # the next take or housekeeping looks for expired messages
    return tail


def recount_fills(mq, cap, base, tail) -> bool:
    """``recount``'s part past the ``tail``: the records placed there before a death (each
    whole before the fill word covered it: a bad one says the word is stale) kept in the
    fill word, or the word cleared. True when some are left: their dead holders' fills are
    then ended (``housekeeping.end_dead_fills``). Lock held."""
    fill = mq[I_FILL]
    if fill <= tail:
        mq[I_FILL] = 0
        return False
    end = tail
    for pos, w in records(mq, cap, base, tail, fill):
        length = mq[w + R_LENGTH] & 0xFFFFFFFF
        if length < _REC or length % 8 or pos % cap + length > cap or pos + length > fill or \
                mq[w] & 0xFF not in (_READY, _PAD, _FILLING):
            break
        end = pos + length
    else:
        end = fill
    mq[I_FILL] = end if end > tail else 0
    return True
