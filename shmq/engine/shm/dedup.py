"""The dedup table: which dedup ids a queue has seen within its ``dedup_window``.

Strategy: a fixed open-addressing table in the queue's segment (``layout.DEDUP``), read
and written only under the queue's lock, inside the put that checks it: a put with a
known id returns the original message id and enqueues nothing; a new id's entry is
written before the put's commit (the tail store). A process killed between the two
leaves an entry naming a message id that was never committed; the repair after its
death (``housekeeping.repair``) drops every entry at or past the queue's next id, so a
retry of that put enqueues it. Entries lapse at their time (wall clock); a probe
sequence is at most ``DEDUP_PROBES`` long, and when all of it is live the entry that
lapses first makes room (the window then holds for the ``DEDUP_SLOTS`` newest ids).
"""

from . import layout as L

__all__ = ["lookup", "remember", "forget_uncommitted"]

_SLOTS = L.DEDUP_SLOTS
_PROBES = L.DEDUP_PROBES
_WORDS = L.DEDUP.size >> 3  # an entry's words: hash, message id, until


def lookup(mq, off, h, now_wall) -> int:
    """The message id remembered for hash ``h``, or 0. ``mq``: the segment as 64-bit
    words; ``off``: the table's byte offset. Lock held."""
    base = off >> 3
    for i in range(_PROBES):
        w = base + ((h + i) % _SLOTS) * _WORDS
        eh = mq[w]
        if eh == 0:
            return 0
        if eh == h and mq[w + 2] > now_wall:
            return mq[w + 1]
    return 0


def remember(mq, off, h, msg_id, until) -> None:
    """Remember ``h`` as ``msg_id`` until ``until`` (wall ns). Lock held."""
    base = off >> 3
    victim, victim_until = -1, None
    for i in range(_PROBES):
        w = base + ((h + i) % _SLOTS) * _WORDS
        eh = mq[w]
        if eh == 0 or eh == h:
            victim = w
            break
        u = mq[w + 2]
        if victim_until is None or u < victim_until:
            victim, victim_until = w, u
    mq[victim + 1] = msg_id
    mq[victim + 2] = until
    mq[victim] = h  # (all three under the lock; a repair judges an entry by its id)


def forget_uncommitted(mq, off, next_id) -> int:
    """Drop entries for ids at or past ``next_id`` (puts that died before their commit).
    Lock held (the repair). Returns how many."""
    base = off >> 3
    n = 0
    for s in range(_SLOTS):
        w = base + s * _WORDS
        if mq[w] and mq[w + 1] >= next_id:
            mq[w + 2] = 0  # lapsed; the slot stays occupied, so no probe sequence breaks
            n += 1
    return n
