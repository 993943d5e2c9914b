"""A segment's header words that no ring operation moves: the deleted flag, a queue's
lifetime (auto-delete, had a consumer, ``expires``) and last use, a laned queue's turn
counters, a stream's live settings — each stored here.

Strategy: each is one word set whole (or a field of one, by one store of its word), so a
reader without the lock sees the old value or the new; the caller holds the owner's lock
where the word's rules ask for it (``queues/lifetime.py``, ``queues/lanes.py``).
"""

from . import layout as L

__all__ = ["set_deleted", "consumer_added", "consumer_removed", "used", "set_expires", "turn", "store_fields"]

_I_LIFE, _I_USED, _HAD, _SHIFT = L.I_LIFETIME, L.I_LAST_USED, L.LIFE_HAD_CONSUMER, L.LIFE_EXPIRES_SHIFT


def set_deleted(mq, word=L.I_DELETED) -> None:
    """The segment's object is deleted (``word``: a queue's ``I_DELETED``, a stream's
    ``SI_DELETED``, a partition's ``PI_DELETED``): whoever takes its lock next finds it gone."""
    mq[word] = 1


def consumer_added(mq, slot, now) -> None:
    """One more consumer in process row ``slot``; the queue has had one, and was used ``now``."""
    mq[L.proc_word(slot, L.P_CONSUMERS)] += 1
    mq[_I_LIFE] |= _HAD
    mq[_I_USED] = now


def consumer_removed(mq, slot, now) -> None:
    """One consumer fewer in process row ``slot`` (it has one); the queue was used ``now``."""
    mq[L.proc_word(slot, L.P_CONSUMERS)] -= 1
    mq[_I_USED] = now


def used(mq, now) -> None:
    """The queue was used at ``now`` (monotonic ns): its expiry counts from then."""
    mq[_I_USED] = now


def set_expires(mq, expires_ms, now) -> None:
    """``expires`` (ms; 0: never) in the lifetime word, its flags kept, counted from ``now``."""
    mq[_I_USED] = now
    mq[_I_LIFE] = (mq[_I_LIFE] & ((1 << _SHIFT) - 1)) | expires_ms << _SHIFT


def turn(mq, word) -> int:
    """The next turn of counter ``word``: its value, moved on by one."""
    n = mq[word]
    mq[word] = n + 1
    return n


def store_fields(mq, fields, values: dict) -> None:
    """Store ``values`` of ``fields`` ({name: (word, shift, mask)}, as
    ``layout.STREAM_LIVE``), each by one store of its word."""
    for name, value in values.items():
        w, shift, mask = fields[name]
        mq[w] = mq[w] & ~(mask << shift) | (value & mask) << shift
