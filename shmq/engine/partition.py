"""One partition of a stream: an append-only ring of records, read by offset.

Strategy: a partition is a queue's ring without settling. Records are appended past the
tail and published by one store of the tail (the commit), as puts are; each record's
msg_id is its offset, dense from 0 and never reused. Nothing is removed one by one:
retention moves the head over the oldest records when an append needs room (``drop``),
or only over those every group has committed (``block``: the appender waits for the
slowest group). Offsets are found through a sparse index of positions, so a read never
scans from the start. Reads copy records under the partition's lock (microseconds), so
a reader never sees a record being overwritten. A holder killed inside the lock leaves
it owner-dead; the next holder rebuilds the control words from the records
(``_repair``), which carry their offsets.
"""

import ctypes
import time

from ..errors import MessageTooLarge, OffsetOutOfRange, ShmqError, StreamNotFound
from . import layout as L
from . import ring
from .mutex import RobustMutex
from .mutex import lock_slow as _lock_slow
from .mutex import trylock as _trylock
from .mutex import unlock as _unlock
from .segment import open_segment

__all__ = ["Partition", "partition_segment_name", "record_size"]

_REC = L.REC_SIZE
_READY, _PAD = L.READY, L.PAD
_R_LENGTH, _R_MSG_ID, _R_ENQ, _R_KEY = L.R_LENGTH, L.R_MSG_ID, L.R_ENQ, L.R_DEADLINE
_STRIDE = L.INDEX_STRIDE
_REC_UNPACK = L.REC.unpack_from
BLOCK_SLICE_S = 0.005  # how often an appender blocked by retention="block" looks again


def partition_segment_name(stream_base: str, index: int) -> str:
    """``/shmq.NS.s.NAME#P``: ``#`` cannot appear in a name, so no stream's partition
    can be taken for another stream."""
    return f"{stream_base}#{index}"


def record_size(key, hraw, value) -> int:
    return (_REC + 7 + (len(key) if key is not None else 0) + len(hraw) + len(value)) & -8


class Partition:
    """A handle on partition ``index`` of a stream, attached in this process."""

    def __init__(self, stream_base: str, index: int, name: str):
        self.index = index
        self.name = name  # the stream's, for messages
        try:
            seg = open_segment(partition_segment_name(stream_base, index))
        except (FileNotFoundError, ValueError):
            raise StreamNotFound(f"stream {name!r} has no partition {index} (deleted?)") from None
        mm = seg._mmap
        magic, version, _pad, cap, maxmsg, slots, data_off, _created = L.PART_STATIC.unpack_from(mm, 0)
        if magic != L.PART_MAGIC or version != L.STREAM_VERSION or seg.size < data_off + cap:
            seg.close()
            raise StreamNotFound(f"stream {name!r}: partition {index} is not ready (being created?)")
        self._seg, self._mm, self._mq = seg, mm, memoryview(mm).cast("Q")
        self._cap, self._base, self._slots, self.max_message_bytes = cap, data_off, slots, maxmsg
        self._index_w = L.PART_INDEX_OFF >> 3
        self._mutex = RobustMutex(ctypes.addressof(ctypes.c_char.from_buffer(mm, L.PART_MUTEX_OFF)))
        self._lockp = self._mutex.ptr

    def __del__(self):
        if getattr(self, "_lockp", None) is not None:
            self.close()

    def close(self) -> None:
        if self._lockp is None:
            return
        self._lockp = None
        self._mq.release()
        self._seg.close()

    # ------------------------------------------------------------------ locking
    def _acquire(self, deadline=None):
        lp = self._lockp
        if lp is None:
            raise ShmqError(f"stream {self.name!r}: partition handle is closed")
        rc = _trylock(lp)
        if rc and _lock_slow(lp, rc, deadline):
            try:
                self._repair()
            finally:
                self._mutex.mark_consistent()
        if self._mq[L.PI_DELETED]:
            _unlock(lp)
            raise StreamNotFound(f"stream {self.name!r} was deleted")

    def _release(self):
        _unlock(self._lockp)

    def _repair(self):
        """Rebuild head, tail, earliest and next offset from the records, after the
        lock's previous holder died inside an append or a drop. Lock held."""
        mq, cap = self._mq, self._cap
        head, tail = mq[L.PI_HEAD], mq[L.PI_TAIL]
        first = last = None
        for pos, w in ring.records(mq, cap, self._base, head, tail):
            length = mq[w + _R_LENGTH] & 0xFFFFFFFF
            if length < _REC or length % 8 or pos % cap + length > cap or pos + length > tail:
                tail = pos  # a record the dead writer never finished
                break
            if mq[w] & 0xFF == _PAD:
                continue
            last = mq[w + _R_MSG_ID]
            if first is None:
                first = last
        mq[L.PI_TAIL] = tail
        if last is not None:
            mq[L.PI_EARLIEST], mq[L.PI_NEXT] = first, last + 1
        else:
            mq[L.PI_HEAD] = tail
            mq[L.PI_EARLIEST] = mq[L.PI_NEXT]

    # ------------------------------------------------------------------ offsets
    def offsets(self) -> tuple[int, int]:
        """(earliest retained offset, the offset the next append gets)."""
        self._acquire()
        try:
            return self._mq[L.PI_EARLIEST], self._mq[L.PI_NEXT]
        finally:
            self._release()

    def stats(self) -> dict:
        """Earliest, end, bytes held, records appended and dropped."""
        mq = self._mq
        self._acquire()
        try:
            return {"partition": self.index, "earliest": mq[L.PI_EARLIEST], "end": mq[L.PI_NEXT],
                    "bytes": mq[L.PI_TAIL] - mq[L.PI_HEAD], "max_bytes": self._cap,
                    "appended_total": mq[L.PI_APPENDED], "dropped_total": mq[L.PI_DROPPED]}
        finally:
            self._release()

    def _find(self, offset):
        """The position of the record of ``offset`` (earliest <= offset < next). Lock held."""
        mq, cap, base = self._mq, self._cap, self._base
        head, tail = mq[L.PI_HEAD], mq[L.PI_TAIL]
        start = head
        anchor = offset - offset % _STRIDE
        if anchor >= mq[L.PI_EARLIEST]:
            pos = mq[self._index_w + (anchor // _STRIDE) % self._slots]
            if head <= pos < tail and mq[((base + pos % cap) >> 3) + _R_MSG_ID] == anchor:
                start = pos
        for pos, w in ring.records(mq, cap, base, start, tail):
            if mq[w] & 0xFF != _PAD and mq[w + _R_MSG_ID] == offset:
                return pos
        raise AssertionError(f"offset {offset} not found in partition {self.index} of {self.name!r}")

    # ------------------------------------------------------------------ append
    def append(self, items, now_ns, floor=None, deadline=None) -> int:
        """Append ``(key or None, encoded headers, value)`` items, all or nothing; returns
        the first one's offset. With ``floor`` (retention="block": a function giving the
        lowest offset a group still needs), only records below it are dropped for room,
        and the append waits (until ``deadline``, monotonic ns, then ShmqError) for more."""
        sizes = [record_size(k, h, v) for k, h, v in items]
        total = sum(sizes)
        if total > self._cap:
            raise MessageTooLarge(f"{total} bytes of records can never fit in a partition of stream "
                                  f"{self.name!r} (max_bytes={self._cap})")
        while True:
            limit = None if floor is None else floor()
            self._acquire()
            try:
                if self._make_room(sizes, limit):
                    return self._write(items, sizes, now_ns)
            finally:
                self._release()
            if deadline is not None and time.monotonic_ns() >= deadline:
                raise ShmqError(f"stream {self.name!r}: partition {self.index} is full and retention='block' "
                                "waits for the slowest group to commit")
            time.sleep(BLOCK_SLICE_S)

    def _placement_end(self, sizes, tail):
        for size in sizes:
            tail = L.place(tail, size, self._cap)[1]
        return tail

    def _make_room(self, sizes, limit) -> bool:
        """Drop the oldest records until the items fit (only those below ``limit`` when
        it is given). False if they cannot fit now. Lock held."""
        mq, cap, base = self._mq, self._cap, self._base
        head, tail = mq[L.PI_HEAD], mq[L.PI_TAIL]
        if head == tail and tail % cap:  # empty: start a lap, so any batch <= capacity fits
            head = tail = tail + cap - tail % cap
            mq[L.PI_HEAD] = mq[L.PI_TAIL] = tail
        end = self._placement_end(sizes, tail)
        if end - head <= cap:
            return True
        dropped = 0
        earliest = mq[L.PI_EARLIEST]
        new_head = head
        for pos, w in ring.records(mq, cap, base, head, tail):
            if end - new_head <= cap:
                break
            if mq[w] & 0xFF != _PAD:
                offset = mq[w + _R_MSG_ID]
                if limit is not None and offset >= limit:
                    break
                earliest = offset + 1
                dropped += 1
            new_head = pos + (mq[w + _R_LENGTH] & 0xFFFFFFFF)
        else:
            new_head = tail
        if end - new_head > cap:
            return False
        mq[L.PI_BYTES_DROPPED] += new_head - head
        mq[L.PI_HEAD] = new_head  # (a crash from here on: _repair recomputes earliest)
        mq[L.PI_EARLIEST] = earliest if new_head < tail else mq[L.PI_NEXT]
        mq[L.PI_DROPPED] += dropped
        return True

    def _write(self, items, sizes, now_ns) -> int:
        """Write the items past the tail, index them, publish them with one store."""
        mm, mq, cap, base = self._mm, self._mq, self._cap, self._base
        pos = mq[L.PI_TAIL]
        first = offset = mq[L.PI_NEXT]
        index_w, slots = self._index_w, self._slots
        for (key, hraw, value), size in zip(items, sizes):
            pos, a = ring.place(mm, base, cap, pos, size)
            ring.write_record(mm, a, _READY, size, value, hraw if key is None else key + hraw, offset, now_ns)
            if key is not None:
                mq[(a >> 3) + _R_KEY] = len(key) + 1
            if offset % _STRIDE == 0:
                mq[index_w + (offset // _STRIDE) % slots] = pos
            offset += 1
            pos += size
        if mq[L.PI_HEAD] == mq[L.PI_TAIL]:
            mq[L.PI_EARLIEST] = first
        mq[L.PI_TAIL] = pos  # commit
        mq[L.PI_NEXT] = offset
        mq[L.PI_APPENDED] += offset - first
        return first

    # ------------------------------------------------------------------ read
    def read(self, offset: int, max_records: int, max_bytes: int | None = None) -> list:
        """Up to ``max_records`` records from ``offset`` on, as (offset, timestamp_ns, key,
        encoded headers, value); [] at the end. OffsetOutOfRange below the retained range
        or past the end. With ``max_bytes``, stops before the values would exceed it
        (the first record is always returned)."""
        mm, mq, cap, base = self._mm, self._mq, self._cap, self._base
        out = []
        self._acquire()
        try:
            earliest, end = mq[L.PI_EARLIEST], mq[L.PI_NEXT]
            if offset < earliest or offset > end:
                raise OffsetOutOfRange(
                    f"stream {self.name!r} partition {self.index}: offset {offset} is outside "
                    f"[{earliest}, {end}]", earliest, end)
            if offset == end:
                return out
            budget = max_bytes
            for _pos, w in ring.records(mq, cap, base, self._find(offset), mq[L.PI_TAIL]):
                a = w << 3
                status, _length, bl, hl, _f, off, ts, klen = _REC_UNPACK(mm, a)
                if status & 0xFF == _PAD:
                    continue
                if budget is not None:
                    if out and bl > budget:
                        break
                    budget -= bl
                b = a + _REC
                if klen:
                    key, h = mm[b:b + klen - 1], mm[b + klen - 1:b + hl]
                else:
                    key, h = None, mm[b:b + hl]
                out.append((off, ts, key, h, mm[b + hl:b + hl + bl]))
                if len(out) >= max_records:
                    break
            return out
        finally:
            self._release()
