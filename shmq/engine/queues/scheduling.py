"""Which ready message goes next when a queue is not a plain FIFO: priority levels, due
order, FIFO message groups and expiry (TTL) — the general take, and peek.

Strategy: one walk over the records from head to tail, under the queue's lock, sees
everything these need: the ready records (with level, ready time and group), the groups
that have a message leased or delayed (busy), and the expired ones. The walk picks the
best candidates by (effective level, ready time, position): the level is the record's
priority raised one step for every ``priority_aging`` it has waited (so a low level is
delayed, never starved); the ready time is when a delayed put came due, else when it
was put (so delayed messages are delivered in due order, and a message nacked back
keeps its place); position breaks ties (put order). Only the first ready message of a
group is a candidate, and none of a busy group, so a group moves one message at a time,
in put order. Expired ready messages are dead-lettered (reason "expired") or dropped and
counted. The same walk recomputes the cursors the plain paths use (frontier, requeued,
ready_pos: as ``housekeeping.repair`` does) and clears ``special`` when no record needs
this path any more, so a queue goes back to the C hot paths by itself.

The walk costs O(records in the ring) per take with priority levels, and with one level
O(records up to the first ready ones without a due time): the price of a due time, an
expiry or a group, paid only while a queue holds such records (docs/DESIGN.md, "Work-queue
options"). Priority levels alone take the leveled way (``take_leveled``): a pointer per
level, O(levels) per message.
"""

import heapq

from . import extension
from ..shm import ring, takes
from ..shm import layout as L

__all__ = ["take", "take_leveled", "peek", "sweep", "ttl_of", "lease_record"]

_REC = L.REC_SIZE
_READY, _LEASED, _ACKED, _PAD, _DELAYED = L.READY, L.LEASED, L.ACKED, L.PAD, L.DELAYED
_FLAG_EXT, _FLAG_WALK, _FLAG_TTL = L.FLAG_EXT, L.FLAG_WALK, L.FLAG_TTL
_I_LEVEL_POS = L.I_LEVEL_POS
_SPECIAL_DUE = 2  # a bit of ``special``: a record with a due time (order by due, not position)
_R_ENQ, _R_DEADLINE, _R_LENGTH = L.R_ENQ, L.R_DEADLINE, L.R_LENGTH
_R_FLAGS = 2  # the word whose high half is the record's flags
_NEVER = L.NEVER
_decode = extension.decode
_lease = takes.lease
_NONE = extension.NONE


def ttl_of(q, ext, enq) -> int:
    """When a record expires (wall ns; 0: never): its own TTL or the queue's, the sooner."""
    exp = ext.expires_ns
    if q._ttl_ns:
        qexp = enq + q._ttl_ns
        if not exp or qexp < exp:
            exp = qexp
    return exp


def _walk(q, wall, enough=None):
    """One walk. Returns (ready, expired, busy groups, end of the last non-ready record,
    ``special`` bits of the records met, whether it went to the tail). ``ready``: (pos,
    w, level, ready time, group, expires). With ``enough`` (one level only), it stops
    once it has met that many candidates without a due time: every record after them
    was put later, so its ready time (its put time, or a due time after it) is no
    earlier than theirs, and the best ``enough`` are among those met (put times follow
    positions: each is stamped under the lock, up to the clock's jitter between
    processes). A group's leased and delayed messages come before its ready ones, so
    the groups met so far are known."""
    mq, mm = q._mq, q._mm
    head = mq[L.I_HEAD]
    last_end = head
    ready, expired = [], []
    busy = set()  # groups whose next message waits: one is leased, or the oldest is delayed
    seen = set()
    special = 0
    candidates = 0
    qttl = q._ttl_ns
    for pos, w in ring.records(mq, q._cap, q._base, head, mq[L.I_TAIL]):
        if enough is not None and candidates >= enough:
            return ready, expired, busy, last_end, special, False
        st = mq[w] & 0xFF
        if st == _PAD:
            continue
        if st == _ACKED:
            last_end = pos + (mq[w + _R_LENGTH] & 0xFFFFFFFF)
            continue
        fl = mq[w + _R_FLAGS] >> 32
        ext = _NONE
        if fl & _FLAG_EXT:
            ext = _decode(mm, (w << 3) + _REC)[0]
            if fl & _FLAG_WALK:
                special |= _SPECIAL_DUE | 1 if ext[1] else 1
        g = ext[4]
        if st != _READY:  # leased or delayed
            last_end = pos + (mq[w + _R_LENGTH] & 0xFFFFFFFF)
            if g is not None:
                if st == _LEASED or g not in seen:
                    busy.add(g)
                seen.add(g)
            continue
        enq = mq[w + _R_ENQ]
        exp = ext[2]
        if qttl:
            qexp = enq + qttl
            if not exp or qexp < exp:
                exp = qexp
        if exp and exp <= wall:
            expired.append((pos, w))
            continue
        due = ext[1]
        if g is None:
            candidates += not due
        elif g not in seen:
            seen.add(g)
            if g not in busy:
                candidates += not due
        ready.append((pos, w, fl & 0xFF, due or enq, g, exp))
    return ready, expired, busy, last_end, special, True


def _order(q, ready, busy, wall, maxn):
    """The best ``maxn`` candidates of ``ready``, best first."""
    top = q._levels - 1
    aging = q._aging_ns
    cands = []
    seen = set()
    for rec in ready:
        g = rec[4]
        if g is not None:
            if g in busy or g in seen:
                continue
            seen.add(g)
        level = rec[2]
        if aging and level < top and wall > rec[3]:
            level = min(top, level + (wall - rec[3]) // aging)
        cands.append((-level, rec[3], rec[0], rec))
    if maxn == 1:
        return [min(cands)[3]] if cands else []
    return [c[3] for c in heapq.nsmallest(maxn, cands)]


def lease_record(mq, mm, w, pos, lease, until, attempt):
    """Lease the record at word ``w`` as ``lease`` with ``attempt``; its ``Delivery``
    tuple (pos, id, attempt, body, header bytes or None, enqueued ns). Lock held."""
    _lease(mq, w, lease, until, attempt)
    bl = mq[w + 1] >> 32
    hl = mq[w + _R_FLAGS] & 0xFFFFFFFF
    b = (w << 3) + _REC
    return pos, mq[w + L.R_MSG_ID], attempt, mm[b + hl:b + hl + bl], mm[b:b + hl] if hl else None, mq[w + _R_ENQ]


def _size(mq, w):
    """Bytes of a record's body and header bytes (what ``max_bytes`` counts)."""
    return (mq[w + 1] >> 32) + (mq[w + _R_FLAGS] & 0xFFFFFFFF)


def take(q, maxn, slot, until, now, wall, max_bytes=None):
    """Lease up to ``maxn`` of the best ready messages. Lock held. Returns (taken, expired):
    tuples (pos, id, attempt, body, header bytes or None, enqueued ns) for ``Delivery``;
    ``expired`` were leased to us only to be dead-lettered (empty when the queue has no
    dead-letter queue: then they are dropped and counted here)."""
    mq, mm = q._mq, q._mm
    early = maxn if maxn and q._levels == 1 else None
    ready, expired, busy, last_end, special, complete = _walk(q, wall, early)
    chosen = _order(q, ready, busy, wall, maxn) if maxn else []
    lease = _LEASED | (slot << 8)
    out = []
    budget = max_bytes
    redelivered = 0
    frontier = last_end
    taken = set()
    for pos, w, _lvl, _rt, _g, _exp in chosen:
        if budget is not None:
            size = _size(mq, w)
            if out and size > budget:
                break
            budget -= size
        attempt = (mq[w] >> 32) + 1
        if attempt > 1:
            redelivered += 1
        taken.add(pos)
        end = pos + (mq[w + _R_LENGTH] & 0xFFFFFFFF)
        if end > frontier:
            frontier = end
        out.append(lease_record(mq, mm, w, pos, lease, until, attempt))
    dead = []
    if expired:
        to_dlq = bool(q.dead_letter_queue)
        for pos, w in expired:
            end = pos + (mq[w + _R_LENGTH] & 0xFFFFFFFF)
            if end > frontier:
                frontier = end
            if to_dlq:  # leased to us, to be dead-lettered
                dead.append(lease_record(mq, mm, w, pos, lease, until, mq[w] >> 32))
            else:
                if q._logged:
                    from ...formats import dmsq

                    q.wal.append(dmsq.encode_ack_entry(mq[w + L.R_MSG_ID], 0), grows=False)
                takes.drop(mq, w)
    n = len(out)
    takes.taken(mq, n + len(expired), n + len(dead), len(expired), slot, redelivered, until)
    if not complete:  # a part of the ring: the cursors stay lower bounds; the frontier covers the leases
        takes.cursors(mq, frontier)
        return out, dead
    # the plain paths' cursors, from this walk
    requeued = 0
    first = None
    next_ttl = _NEVER
    for rec in ready:
        pos = rec[0]
        if pos in taken:
            continue
        if rec[5] and rec[5] < next_ttl:
            next_ttl = rec[5]
        if pos < frontier:
            requeued += 1
            if first is None:
                first = pos
    takes.cursors(mq, frontier, requeued, first if requeued else frontier, next_ttl, special)
    if q._levels > 1:  # the leveled take's pointers, exact: each level's first ready record
        firsts = {}
        for rec in ready:
            if rec[0] not in taken:
                firsts.setdefault(min(rec[2], q._levels - 1), rec[0])
        tail = mq[L.I_TAIL]
        for lv in range(q._levels):
            takes.level_at(mq, lv, firsts.get(lv, tail))
    if expired and not dead:
        ring.advance_head(mq, q._cap, q._base)
    return out, dead


def _first_ready(q, level, start, head, tail):
    """(pos, w) of the first ready record of ``level`` from ``start``, or None; moves the
    level's pointer there (or to the tail). Lock held."""
    mq = q._mq
    top = q._levels - 1
    for pos, w in ring.records(mq, q._cap, q._base, max(start, head), tail):
        if mq[w] & 0xFF == _READY and min((mq[w + _R_FLAGS] >> 32) & 0xFF, top) == level:
            takes.level_at(mq, level, pos)
            return pos, w
    takes.level_at(mq, level, tail)
    return None


def take_leveled(q, maxn, slot, until, now, wall, max_bytes=None):
    """The take of a queue with priority levels and no record that needs the walk: each
    level's first ready record, from the level's pointer (a lower bound, lowered by
    every record made ready again), and the best of those by (effective level, put
    time). Each pointer passes a record once between requeues: O(levels) per message,
    amortized, whatever the depth. Lock held; returns ``take``'s tuples."""
    mq, mm = q._mq, q._mm
    head, tail = mq[L.I_HEAD], mq[L.I_TAIL]
    levels = q._levels
    top = levels - 1
    aging = q._aging_ns
    cur = [_first_ready(q, lv, mq[_I_LEVEL_POS + lv], head, tail) for lv in range(levels)]
    lease = _LEASED | (slot << 8)
    out = []
    dead = []
    qttl = q._ttl_ns
    budget = max_bytes
    redelivered = 0
    while len(out) < maxn:
        best = None
        for lv in range(top, -1, -1):
            c = cur[lv]
            if c is None:
                continue
            enq = mq[c[1] + _R_ENQ]
            eff = lv
            if aging and lv < top and wall > enq:
                eff = min(top, lv + (wall - enq) // aging)
            key = (-eff, enq, c[0])
            if best is None or key < best[0]:
                best = (key, lv)
        if best is None:
            break
        lv = best[1]
        pos, w = cur[lv]
        fl = mq[w + _R_FLAGS] >> 32
        if (fl & _FLAG_TTL or qttl) and 0 < extension.expiry(mm, w << 3, fl, mq[w + _R_ENQ], qttl) <= wall:
            dead.append(lease_record(mq, mm, w, pos, lease, until, mq[w] >> 32))  # only to expire (dead-letter or drop)
            cur[lv] = _first_ready(q, lv, pos + (mq[w + _R_LENGTH] & 0xFFFFFFFF), head, tail)
            continue
        if budget is not None:
            size = _size(mq, w)
            if out and size > budget:
                break
            budget -= size
        attempt = (mq[w] >> 32) + 1
        if attempt > 1:
            redelivered += 1
        out.append(lease_record(mq, mm, w, pos, lease, until, attempt))
        cur[lv] = _first_ready(q, lv, pos + (mq[w + _R_LENGTH] & 0xFFFFFFFF), head, tail)
    n = len(out) + len(dead)
    if n:
        takes.taken(mq, n, n, len(dead), slot, redelivered, until)
    return out, dead


def sweep(q, now, wall):
    """Expire what is due (housekeeping's TTL sweep). Lock held. Returns expired tuples
    leased to us for the dead-letter queue (see ``take``)."""
    return take(q, 0, q._my_slot(), now + q._vis_ns, now, wall)[1]


def peek(q, maxn, wall):
    """Up to ``maxn`` ready messages in delivery order, without leasing them. Lock held.
    Returns (id, attempt, body, header bytes or None, enqueued ns) tuples."""
    mq, mm = q._mq, q._mm
    if q._general or mq[L.I_SPECIAL]:
        ready, _expired, busy, _end, _s, _c = _walk(q, wall)
        # a peek shows what a get would take next, and what comes after it: groups in order
        chosen = _order(q, ready, busy, wall, maxn)
        seen = {c[0] for c in chosen}
        rest = [r for r in ready if r[0] not in seen]  # behind their group's first, in put order
        recs = [(r[0], r[1]) for r in chosen + rest][:maxn]
    else:
        start = mq[L.I_READY_POS] if mq[L.I_REQUEUED] else mq[L.I_FRONTIER]
        recs = []
        for pos, w in ring.records(mq, q._cap, q._base, start, mq[L.I_TAIL]):
            if mq[w] & 0xFF == _READY:
                fl = mq[w + _R_FLAGS] >> 32
                if fl & _FLAG_TTL and 0 < extension.expiry(mm, w << 3, fl, 0, 0) <= wall:
                    continue  # expired: the next take or sweep drops it
                recs.append((pos, w))
                if len(recs) >= maxn:
                    break
    out = []
    for _pos, w in recs:
        bl = mq[w + 1] >> 32
        hl = mq[w + _R_FLAGS] & 0xFFFFFFFF
        b = (w << 3) + _REC
        out.append((mq[w + L.R_MSG_ID], mq[w] >> 32, mm[b + hl:b + hl + bl], mm[b:b + hl] if hl else None,
                    mq[w + _R_ENQ]))
    return out
