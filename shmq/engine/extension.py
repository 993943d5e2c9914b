"""A record's extension block: the per-message options that a plain record does not
carry (priority level, due time of a delayed put, expiry, FIFO group, dedup id hash).

Strategy: the block sits at the start of the record's header bytes, before the msgpack
headers, and starts with 0xC1, a byte msgpack never uses, so header bytes say by
themselves whether they carry one: snapshots, logs and dead-letter copies keep header
bytes as they are and lose nothing. A record with a block has ``FLAG_EXT`` in its flags
(and its level in the flags' low byte), which sends it past the C hot paths to the
general take (``scheduling``). Plain records have no block and cost nothing.
"""

import hashlib

from . import layout as L

__all__ = ["Ext", "encode", "decode", "split", "flags_of", "dedup_hash", "check_group"]

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
    if hraw is None or hraw[0] != _MAGIC:
        return NONE, hraw
    ext, end = decode(hraw)
    return ext, (hraw[end:] or None)


def flags_of(hraw) -> int:
    """The record flags that header bytes call for (0 for plain ones)."""
    if not hraw or hraw[0] != _MAGIC:
        return 0
    return L.FLAG_EXT | hraw[2]


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
