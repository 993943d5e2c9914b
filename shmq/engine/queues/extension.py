"""A record's extension block: the per-message options that a plain record does not
carry (priority level, due time of a delayed put, expiry, FIFO group, dedup id hash).

Strategy: the block sits at the start of the record's header bytes, before the msgpack
headers, and starts with 0xC1, a byte msgpack never uses, so header bytes say by
themselves whether they carry one: snapshots, logs and dead-letter copies keep header
bytes as they are and lose nothing. A record with a block has ``FLAG_EXT`` in its flags
(and its level in the flags' low byte), which sends it past the C hot paths; one with a
due time or a group also has ``FLAG_WALK``: only the general take's walk (``scheduling``)
takes it; one with an expiry has ``FLAG_TTL``: every take checks it before it leases
the record. Plain records have no block and cost nothing.
"""

import hashlib

from ..shm import layout as L

__all__ = ["Ext", "encode", "decode", "split", "flags_of", "expiry", "dedup_hash", "check_group"]

_EXT = L.EXT
_EXT_SIZE = L.EXT.size
_MAGIC = L.EXT_MAGIC


class Ext(tuple):
    """The decoded block: (priority, due_ns, expires_ns, dedup_hash, group)."""

    __slots__ = ()

    priority = property(lambda self: self[0])
    due_ns = property(lambda self: self[1])
    expires_ns = property(lambda self: self[2])
    dedup_hash = property(lambda self: self[3])
    group = property(lambda self: self[4])


NONE = Ext((0, 0, 0, 0, None))


def encode(priority=0, due_ns=0, expires_ns=0, dedup=0, group=None) -> bytes:
    """The block's bytes (b"" when every option is at its default)."""
    if not (priority or due_ns or expires_ns or dedup or group is not None):
        return b""
    graw = b"" if group is None else group.encode()
    return _EXT.pack(_MAGIC, L.EXT_VERSION, priority, 1 if group is not None else 0, len(graw), 0,
                     due_ns, expires_ns, dedup) + graw


def decode(buf, off=0):
    """(Ext, offset just past the block) of header bytes at ``off`` of ``buf``; (NONE, off)
    when they carry no block."""
    if len(buf) - off < _EXT_SIZE or buf[off] != _MAGIC:
        return NONE, off
    _m, _v, prio, has_group, gl, _p, due, expires, dedup = _EXT.unpack_from(buf, off)
    end = off + _EXT_SIZE + gl
    group = bytes(buf[off + _EXT_SIZE:end]).decode() if has_group else None
    return Ext((prio, due, expires, dedup, group)), end


def split(hraw):
    """(Ext, the msgpack headers or None) of a record's header bytes."""
    if not hraw or hraw[0] != _MAGIC:
        return NONE, hraw or None
    ext, end = decode(hraw)
    return ext, (hraw[end:] or None)


def flags_of(hraw) -> int:
    """The record flags that header bytes call for (0 for plain ones): the level, the
    block, whether only the general take's walk may take it (a due time or a group; a
    level, an expiry or a dedup hash alone does not need the walk), and an expiry."""
    if not hraw or hraw[0] != _MAGIC or len(hraw) < _EXT_SIZE:
        return 0
    _m, _v, prio, has_group, _gl, _p, due, expires, _d = _EXT.unpack_from(hraw)
    return L.FLAG_EXT | prio | (L.FLAG_WALK if (due or has_group) else 0) | (L.FLAG_TTL if expires else 0)


def dedup_hash(dedup_id) -> int:
    """A dedup id's 64-bit hash (never 0: 0 marks a free table slot)."""
    if isinstance(dedup_id, str):
        dedup_id = dedup_id.encode()
    elif not isinstance(dedup_id, (bytes, bytearray)):
        raise TypeError(f"dedup_id must be str or bytes, not {type(dedup_id).__name__}")
    if not dedup_id:
        raise ValueError("dedup_id must not be empty")
    return int.from_bytes(hashlib.blake2b(dedup_id, digest_size=8).digest(), "little") or 1


def check_group(group):
    """``group`` if it is a valid message group name, else TypeError/ValueError."""
    if not isinstance(group, str):
        raise TypeError(f"group must be a str, not {type(group).__name__}")
    if not group or len(group.encode()) > L.MAX_GROUP_BYTES:
        raise ValueError(f"group must be 1 to {L.MAX_GROUP_BYTES} bytes of UTF-8, not {group!r}")
    return group


_EXPIRES_OFF = L.REC_SIZE + 16  # the block's expiry, from a record's start


def expiry(mm, a, flags, enq, queue_ttl_ns) -> int:
    """When the record at byte address ``a`` expires (wall ns; 0: never): its own TTL
    or its queue's, the sooner."""
    exp = int.from_bytes(mm[a + _EXPIRES_OFF:a + _EXPIRES_OFF + 8], "little", signed=True) \
        if flags & L.FLAG_TTL else 0
    if queue_ttl_ns:
        qexp = enq + queue_ttl_ns
        if not exp or qexp < exp:
            exp = qexp
    return exp
