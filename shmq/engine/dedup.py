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

__all__ = ["lookup", "remember", "forget_uncommitted", "live_entries"]

_ENTRY = L.DEDUP
_SIZE = L.DEDUP.size
_SLOTS = L.DEDUP_SLOTS
_PROBES = L.DEDUP_PROBES


def _slots(h):
    for i in range(_PROBES):
        yield (h + i) % _SLOTS


def lookup(mm, off, h, now_wall) -> int:
    """The message id remembered for hash ``h``, or 0. Lock held."""
    for s in _slots(h):
        eh, msg_id, until = _ENTRY.unpack_from(mm, off + s * _SIZE)
        if eh == 0:
            return 0
        if eh == h and until > now_wall:
            return msg_id
    return 0


def remember(mm, off, h, msg_id, until) -> None:
    """Remember ``h`` as ``msg_id`` until ``until`` (wall ns). Lock held."""
    victim, victim_until = -1, None
    for s in _slots(h):
        eh, _id, u = _ENTRY.unpack_from(mm, off + s * _SIZE)
        if eh == 0 or eh == h:
            victim = s
            break
        if victim_until is None or u < victim_until:
            victim, victim_until = s, u
    _ENTRY.pack_into(mm, off + victim * _SIZE, h, msg_id, until)


def forget_uncommitted(mm, off, next_id) -> int:
    """Drop entries for ids at or past ``next_id`` (puts that died before their commit).
    Lock held (the repair). Returns how many."""
    n = 0
    for s in range(_SLOTS):
        eh, msg_id, _u = _ENTRY.unpack_from(mm, off + s * _SIZE)
        if eh and msg_id >= next_id:
            # keep the slot occupied (a probe sequence must not break): make it lapse
            _ENTRY.pack_into(mm, off + s * _SIZE, eh, msg_id, 0)
            n += 1
    return n


def live_entries(mm, off, now_wall) -> list[tuple[int, int, int]]:
    """Every (hash, message id, until) that has not lapsed (for snapshots). Lock held."""
    out = []
    for s in range(_SLOTS):
        eh, msg_id, until = _ENTRY.unpack_from(mm, off + s * _SIZE)
        if eh and until > now_wall:
            out.append((eh, msg_id, until))
    return out
