"""A queue's ring: walking its records, placing and writing one, the commit (a put's, a
delayed put's, a restore's), fills, a new lap, the room, the window's early wraps and
spills, the head's reclaim, and the recount of its control words after a holder of its
lock died — each written once (the takes and settles: ``takes``; a stream partition's
words: ``plog``).

Strategy: these work on a segment seen two ways, as bytes (``mm``) and as 64-bit words
(``mq``), and know nothing of locks, processes or time: every caller holds the queue's
lock and passes ``now``. A record is addressed by its word index ``w`` (records are
8-aligned), so a field is ``mq[w + R_FIELD]``. Priority rings, a timer ring and streams
reuse these as they are.
"""

import os

from . import layout as L
from . import waits

__all__ = ["records", "copy_used", "copied_records", "place", "write_record", "limit_room", "advance_head",
           "freed_at", "append_end", "commit", "commit_delayed", "mark_special", "stamp", "placed_fills", "end_fill",
           "wrap_at", "set_room", "new_lap", "commit_import", "commit_fills", "window", "early_wrap", "spill_start",
           "fits", "write_pad", "bytes_used", "suspect_fill", "void_fill", "recount", "recount_fills"]

_REC = L.REC_SIZE
_PACK = L.REC.pack_into
_LEASED, _READY, _ACKED, _PAD, _FILLING = L.LEASED, L.READY, L.ACKED, L.PAD, L.FILLING
R_LENGTH, R_MSG_ID = L.R_LENGTH, L.R_MSG_ID
I_HEAD, I_TAIL, I_FRONTIER, I_READY_POS = L.I_HEAD, L.I_TAIL, L.I_FRONTIER, L.I_READY_POS
I_READY, I_REQUEUED, I_FILL = L.I_READY, L.I_REQUEUED, L.I_FILL
I_NEXT_ID, I_CWAIT = L.I_NEXT_ID, L.I_CWAIT
I_INFLIGHT, I_NEXT_DEADLINE = L.I_INFLIGHT, L.I_NEXT_DEADLINE
_proc_word = L.proc_word
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


def limit_room(mq, room) -> None:
    """The puts' room ends at ``room`` at most (memory given back past it). Lock held."""
    if room < mq[L.I_ROOM]:
        mq[L.I_ROOM] = room


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
