"""``Batches``: the record batches Kafka producers sent, kept as they came (their base
offset set to where they were appended), so a Fetch of those offsets sends them again
instead of encoding the records anew.

Strategy: a batch whose offsets run in order (``Batch.raw``; its records map to native
records and back unchanged: null values, null and repeated headers included) is the
very bytes a Kafka broker stores and serves: its CRC covers neither the base offset nor the
leader epoch, the two fields set here, and its timestamps are the records' own (a
CreateTime topic's; ``servable`` says which topics serve kept batches). So a Fetch
walks the partition from its offset: a kept batch that holds it goes out as it is;
records without one are read from the stream and encoded (``fetch``). As a broker does, a kept batch goes out whole, starting before the
fetch offset if the batch does: clients skip the records below it. The records stay
the stream's (retention, trims and offsets are checked on the stream first); this only
saves the encoding. Memory is bounded (``max_bytes``, the oldest batches go first); a
partition's batches are told apart by its stream's creation time, so a stream deleted
and made again under the same name never serves the old one's.
"""

import bisect
import struct
from collections import deque

from ...kafka.compression import CODECS

__all__ = ["Batches", "served_codec", "servable"]

MAX_BYTES = 64 * 2**20  # the listener's kept batches at most
_BASE, _EPOCH = struct.Struct(">q"), struct.Struct(">i")  # a batch's base offset (at 0), leader epoch (at 12)


def served_codec(s) -> int | None:
    """The codec ``s``'s batches go out in (its ``compression``, Kafka's compression.type):
    None for "producer" (a kept batch as it came, records encoded anew uncompressed)."""
    name = s.compression
    return None if name == "producer" else CODECS["none" if name == "uncompressed" else name]


def servable(s, codec: int) -> bool:
    """Whether a batch of ``codec`` goes out to ``s``'s consumers as its producer sent it:
    not for a topic with LogAppendTime (its batches say the append time, stamped anew),
    nor for a compacted one (a kept batch may hold records compaction took: the stream's
    reads skip them), nor in another codec than the topic's compression.type. Storage is
    codec-agnostic (records are stored decompressed): the others are encoded anew at each
    Fetch."""
    if s.timestamp_type == "log_append_time" or s.compact:
        return False
    want = served_codec(s)
    return want is None or want == codec


class _Kept:
    __slots__ = ("firsts", "ends", "datas", "head")

    def __init__(self):
        self.firsts, self.ends, self.datas, self.head = [], [], [], 0


class Batches:
    """The kept batches of every (stream, creation time, partition)."""

    def __init__(self, max_bytes: int = MAX_BYTES):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._parts = {}
        self._order = deque()  # the keys of the batches kept, oldest first

    def put(self, s, p: int, first: int, raw: bytes, count: int) -> None:
        """Keep ``raw`` (a batch of ``count`` records as a producer sent it) as offsets
        ``first``..``first + count - 1`` of ``s``'s partition ``p``."""
        if len(raw) > self.max_bytes // 4:
            return
        data = bytearray(raw)
        _BASE.pack_into(data, 0, first)
        _EPOCH.pack_into(data, 12, 0)
        key = (s.name, s.created_at, p)
        kept = self._parts.get(key)
        if kept is None:
            kept = self._parts[key] = _Kept()
        if kept.head < len(kept.ends) and kept.ends[-1] > first:  # offsets never go back: a guard, never kept stale
            self.bytes -= sum(len(d) for d in kept.datas[kept.head:])
            kept = self._parts[key] = _Kept()  # (its keys left in _order may evict new batches early: an encode)
        kept.firsts.append(first)
        kept.ends.append(first + count)
        kept.datas.append(bytes(data))
        self.bytes += len(data)
        self._order.append(key)
        while self.bytes > self.max_bytes and self._order:
            self._evict(self._order.popleft())

    def find(self, s, p: int, offset: int) -> tuple[bytes | None, int | None]:
        """(the kept batch holding ``offset``, the offset after it), or (None, the first
        offset of the next kept batch, or None if there is none)."""
        kept = self._parts.get((s.name, s.created_at, p))
        if kept is None:
            return None, None
        i = bisect.bisect_right(kept.firsts, offset, kept.head) - 1
        if i >= kept.head and offset < kept.ends[i]:
            return kept.datas[i], kept.ends[i]
        i = max(i + 1, kept.head)
        return None, kept.firsts[i] if i < len(kept.firsts) else None

    def _evict(self, key) -> None:
        kept = self._parts.get(key)
        if kept is None or kept.head >= len(kept.datas):
            return
        self.bytes -= len(kept.datas[kept.head])
        kept.datas[kept.head] = b""
        kept.head += 1
        if kept.head == len(kept.datas):
            del self._parts[key]
        elif kept.head > 1024 and kept.head * 2 > len(kept.datas):
            for lst in (kept.firsts, kept.ends, kept.datas):
                del lst[:kept.head]
            kept.head = 0
