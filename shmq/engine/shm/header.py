"""A segment's header words that no ring operation moves: the deleted flag, a queue's
lifetime (auto-delete, had a consumer, ``expires``) and last use, a queue's changeable
settings, a laned queue's turn counters, a stream's live settings — each stored here.

Strategy: each is one word set whole (or a field of one, by one store of its word), so a
reader without the lock sees the old value or the new; the caller holds the owner's lock
where the word's rules ask for it (``queues/lifetime.py``, ``queues/lanes.py``).
"""

import ctypes
import struct

from . import layout as L
from .mutex import init_mutex

__all__ = ["init_queue", "init_stream", "init_partition", "set_created", "set_deleted", "consumer_added",
           "consumer_removed", "used", "set_expires", "store_settings", "settings_moved", "dead_letter_queue",
           "liveness_due", "turn", "store_fields", "W_VIS", "W_MAXDEL", "W_SETTINGS_GEN"]

# where a queue's changeable settings are in the header (``layout``'s structs): words, and the
# dead-letter queue's name (a u16 length, then the bytes)
_STATIC_AT = L.field_offsets(L.STATIC, ("magic", "version", "flags", "capacity", "max_message_bytes", "visibility_ns",
                                         "max_deliveries", "slots", "created_ns", "data_offset", "name_len", "name",
                                         "dlq_len", "dlq"))
_OPTS_AT = {k: L.OPTS_OFF + v for k, v in L.field_offsets(L.OPTS, L.OPTS_FIELDS).items()}
W_VIS, W_MAXDEL = _STATIC_AT["visibility_ns"] >> 3, _STATIC_AT["max_deliveries"] >> 3
_DLQ_LEN_OFF, _DLQ_OFF = _STATIC_AT["dlq_len"], _STATIC_AT["dlq"]
_DLQ_BYTES = L.STATIC.size - _DLQ_OFF
_W_LEVELS_AGING = _OPTS_AT["levels"] >> 3  # (levels: the low half, aging ms: the high half)
_W_TTL, _W_WINDOW, _W_RETRY, _W_BACKOFF, _W_RETRY_MAX = (
    _OPTS_AT[k] >> 3 for k in ("message_ttl_ns", "dedup_window_ns", "retry_delay_ns", "retry_backoff",
                               "retry_delay_max_ns"))
assert _STATIC_AT["visibility_ns"] % 8 == 0 and _OPTS_AT["levels"] % 8 == 0 and _OPTS_AT["priority_aging_ms"] == (
    _OPTS_AT["levels"] + 4) and all(_OPTS_AT[k] % 8 == 0 for k in ("message_ttl_ns", "retry_backoff"))
# a free word of the producers' line of the control block (``layout.HOT_LINES``): bumped by each
# change of the settings, so a handle's slow paths see that its copies are stale by one word read
W_SETTINGS_GEN = (L.HOT_OFF >> 3) + L.HOT_FIELDS.index("settings_gen")
_U16 = struct.Struct("<H")
_F64, _F64_AS_U64 = struct.Struct("<d"), struct.Struct("<Q")

_I_LIFE, _I_USED, _HAD, _SHIFT = L.I_LIFETIME, L.I_LAST_USED, L.LIFE_HAD_CONSUMER, L.LIFE_EXPIRES_SHIFT


def _init_lock(mm, offset) -> None:
    anchor = ctypes.c_char.from_buffer(mm, offset)
    init_mutex(ctypes.addressof(anchor))
    del anchor


def init_queue(mm, static, opts, life, lane, clock_offset, now_mono) -> None:
    """Write a new queue segment's header (``static``: ``layout.STATIC``'s fields after the
    magic; ``opts``: ``OPTS``'s; ``life``: the lifetime word; ``lane``: which lane it is),
    its lock, and publish it with its magic, last."""
    L.STATIC.pack_into(mm, L.STATIC_OFF, b"\0\0\0\0", *static)
    L.WORD.pack_into(mm, L.TIMENS_OFF, clock_offset)
    L.OPTS.pack_into(mm, L.OPTS_OFF, *opts)
    L.WORD.pack_into(mm, L.I_NEXT_TTL << 3, -1)  # NEVER (a signed word: -1)
    L.WORD.pack_into(mm, L.LIFETIME_OFF, life)  # (lane 0's: auto_delete, expires)
    L.WORD.pack_into(mm, L.I_LAST_USED << 3, now_mono)
    hot = dict.fromkeys(L.HOT_FIELDS, 0)
    hot.update(next_id=lane + 1, next_deadline=L.NEVER)  # lane j's ids: j + 1, j + 1 + lanes, ...
    L.HOT.pack_into(mm, L.HOT_OFF, *hot.values())
    _init_lock(mm, L.MUTEX_OFF)
    mm[0:4] = L.MAGIC  # published


def init_stream(mm, static, live: dict) -> None:
    """Write a new stream's meta segment (``static``: ``STREAM_STATIC``'s fields after the
    magic; ``live``: its live settings by name), its lock, and publish it."""
    L.STREAM_STATIC.pack_into(mm, 0, b"\0\0\0\0", *static)
    mq = memoryview(mm).cast("Q")
    try:
        store_fields(mq, L.STREAM_LIVE, live)
    finally:
        mq.release()
    _init_lock(mm, L.STREAM_MUTEX_OFF)
    mm[0:4] = L.STREAM_MAGIC  # published


def init_partition(mm, static) -> None:
    """Write a new partition segment's header (``static``: ``PART_STATIC``'s fields after
    the magic), its lock, and publish it."""
    L.PART_STATIC.pack_into(mm, 0, b"\0\0\0\0", *static)
    _init_lock(mm, L.PART_MUTEX_OFF)
    mm[0:4] = L.PART_MAGIC


def set_created(mm, created_ns) -> None:
    """A stream's creation time (a rebuild keeps the one its files carry)."""
    L.WORD.pack_into(mm, L.STREAM_CREATED_OFF, created_ns)


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


def store_settings(mm, mq, vis_ns, maxdel, dlq, aging_ms, ttl_ns, window_ns, retry_ns, backoff,
                   retry_max_ns) -> None:
    """Store a queue's changed settings (``Queue._write_settings``): each word one aligned
    store, the dead-letter queue's name (``dlq``, or None) under the lock as every reader of
    it. A message TTL that changes has the next take or housekeeping look for expired
    messages. ``settings_moved`` then tells the handles. Lock held."""
    raw = (dlq or "").encode()
    mq[W_VIS] = vis_ns
    mq[W_MAXDEL] = maxdel or 0
    mm[_DLQ_OFF:_DLQ_OFF + _DLQ_BYTES] = raw.ljust(_DLQ_BYTES, b"\0")
    _U16.pack_into(mm, _DLQ_LEN_OFF, len(raw))
    levels = L.OPTS.unpack_from(mm, L.OPTS_OFF)[0]
    mq[_W_LEVELS_AGING] = levels | aging_ms << 32
    old_ttl = mq[_W_TTL]
    mq[_W_TTL], mq[_W_WINDOW], mq[_W_RETRY], mq[_W_RETRY_MAX] = ttl_ns, window_ns, retry_ns, retry_max_ns
    mq[_W_BACKOFF] = _F64_AS_U64.unpack(_F64.pack(backoff))[0]
    if ttl_ns and ttl_ns != old_ttl:
        mq[L.I_NEXT_TTL] = 0


def settings_moved(mq) -> None:
    """The settings changed: a handle's slow paths read them again (one word read)."""
    mq[W_SETTINGS_GEN] += 1


def dead_letter_queue(mm) -> str | None:
    """The dead-letter queue's name in a queue's header, or None."""
    n = _U16.unpack_from(mm, _DLQ_LEN_OFF)[0]
    return bytes(mm[_DLQ_OFF:_DLQ_OFF + min(n, _DLQ_BYTES)]).decode(errors="replace") or None


def liveness_due(mq, when) -> None:
    """The next check that lease holders live is due at ``when`` (monotonic ns)."""
    mq[L.I_NEXT_LIVENESS] = when


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
