"""Compaction of a stream partition (Kafka's cleanup.policy=compact): the latest record of
each key stays, the older ones and expired tombstones go, offsets never change.

Strategy: copy to the tail. A run copies the partition's records from the head up to the
last stable offset under the lock, a chunk at a time (the head unmoved between them);
without it, finds each key's latest offset and lays out what stays back to back (the
image); then, holding the lock again, writes the image past the tail, where no reader
looks, and after it the records appended meanwhile, and publishes the new run of records
with two stores: the tail past the copies, then the head onto the image. Nothing a
reader can see is ever written over: a reader without the lock (the JVM source) copies
either the old records or the new ones, and finds the head past its copy when it checks,
as after retention, so it copies again. A run killed before the tail's store leaves the
partition as it was; one killed between the two stores leaves offsets that go down again
where the image begins, which the lock's repair takes for the new head. The old run's
memory goes back as retention's does.

The price: the image needs room in the ring past the tail, so a partition compacts while
what stays and what was appended since fit in what its ring has free (``compact`` returns
None when they do not: keep a compacted stream's live records under half its
``max_bytes``), and the lock is held while the image is copied in (what stays, not what
goes: bench.compaction measures what appends see) and its index words are written.
"""

import bisect
import struct
import time
from typing import NamedTuple

from ..shm import layout as L
from ..shm import plog, ring
from ..shm.mutex import unlock as _unlock

__all__ = ["compact", "dirty", "due", "Compacted", "MIN_INTERVAL_NS"]

MIN_INTERVAL_NS = 1_000_000_000  # a partition is compacted at most this often (Kafka's cleaner backs off 15 s)
COPY_CHUNK = 1 << 20  # a run copies what it reads this much at a time under the lock (~0.1-0.2 ms here)
CATCH_UP = 64 << 10  # records appended during a run: copied out of the lock while more than this is there
CATCH_UP_ROUNDS = 8

_REC = L.REC_SIZE
_PAD, _NULL, _CONTROL, _ABORTED = L.PAD, L.FLAG_NULL_VALUE, L.FLAG_CONTROL, L.FLAG_ABORTED
_STRIDE = L.INDEX_STRIDE


class Compacted(NamedTuple):
    """A run that took records back: how many, and the ring bytes."""

    records: int
    bytes: int


def dirty(part) -> tuple[int, int]:
    """(bytes of records past what compaction has cleaned, bytes of records): Kafka's dirty
    ratio is their quotient."""
    mq = part._mq
    part._acquire()
    try:
        head, tail = mq[L.PI_HEAD], mq[L.PI_TAIL]
        clean = mq[L.PI_CLEANED] - 1
        if clean < 0 or clean <= mq[L.PI_EARLIEST]:
            return tail - head, tail - head
        found = part._find(clean) if clean < mq[L.PI_NEXT] else None
        return tail - (tail if found is None else found[0]), tail - head
    finally:
        _unlock(part._lockp)


def _oldest_dirty_ns(part) -> int | None:
    """The timestamp of the first record compaction has not cleaned (None: none)."""
    mq = part._mq
    part._acquire()
    try:
        clean = max(mq[L.PI_CLEANED] - 1, mq[L.PI_EARLIEST])
        if clean >= mq[L.PI_NEXT]:
            return None
        found = part._find(clean)
        if found is None:
            return None
        return mq[((part._base + found[0] % part._cap) >> 3) + L.R_ENQ]
    finally:
        _unlock(part._lockp)


def due(part, now_ns: int, ratio: float, max_lag_ns: int) -> bool:
    """Whether ``part`` wants a run: it holds a quarter of its ring of which an eighth is
    dirty (so that housekeeping compacts before an append must: ``Stream._make_room``),
    or, at most every MIN_INTERVAL_NS, its dirty ratio reached ``ratio`` or a record it
    has not cleaned is older than ``max_lag_ns`` (0: no bound)."""
    d, total = dirty(part)
    if not d:
        return False
    if 4 * total >= part._cap and 8 * d >= part._cap:
        return True
    if now_ns - getattr(part, "_compacted_ns", 0) < MIN_INTERVAL_NS:
        return False
    if d / total >= ratio:
        return True
    if max_lag_ns:
        oldest = _oldest_dirty_ns(part)
        return oldest is not None and time.time_ns() - oldest > max_lag_ns
    return False


def compact(part, delete_retention_ns: int, now_ns: int | None = None) -> Compacted | None:
    """One run over partition ``part`` (a ``Partition``): below its last stable offset, each
    key's latest record stays (a tombstone only while it is younger than
    ``delete_retention_ns``), with every record without a key and every transaction marker;
    an older record of a key, an expired tombstone and an aborted transaction's record go.
    Returns what it took back, or None: nothing to take, no room past the tail for the
    image, or retention moved the head meanwhile (the next run tries again)."""
    mq = part._mq
    wall = time.time_ns() if now_ns is None else now_ns
    part._compacted_ns = time.monotonic_ns()
    part._acquire()
    try:
        head, tail = mq[L.PI_HEAD], mq[L.PI_TAIL]
        upto = part._stable()  # nothing at or past an open transaction's first offset is touched
        if head == tail or upto <= mq[L.PI_EARLIEST]:
            return None
        found = part._find(upto) if upto < mq[L.PI_NEXT] else None
        stop = tail if found is None else found[0]
    finally:
        _unlock(part._lockp)
    copy = _copy(part, head, head, stop)
    if copy is None:
        return None
    try:
        plan = _plan(part, copy, head, stop, wall, delete_retention_ns)
    except (ValueError, struct.error):  # torn: the head moved while it was copied (the run is void)
        return None
    if plan is None:
        part._acquire()
        try:
            if mq[L.PI_HEAD] == head:
                plog.cleaned(mq, upto)
        finally:
            _unlock(part._lockp)
        return None
    return _publish(part, head, stop, upto, *plan)


def _copy(part, head, start, stop) -> bytearray | None:
    """The bytes of ``[start, stop)`` (``ring.copy_used``'s run), copied COPY_CHUNK at a
    time under the lock, so appends wait for a chunk's copy at most; None if the head
    moved from ``head`` meanwhile (retention, or another run: what is there may be
    written over)."""
    mq, cap, base = part._mq, part._cap, part._base
    out = bytearray(stop - start)
    src = memoryview(part._mm)
    try:
        at = start
        while at < stop:
            n = min(COPY_CHUNK, stop - at, cap - at % cap)  # (a chunk ends at the ring's end)
            part._acquire()
            try:
                if mq[L.PI_HEAD] != head:
                    return None
                a = base + at % cap
                out[at - start:at - start + n] = src[a:a + n]
            finally:
                _unlock(part._lockp)
            at += n
    finally:
        src.release()
    return out


def _plan(part, copy, head, stop, wall, delete_retention_ns):
    """What stays of the records ``copy`` holds (``ring.copy_used`` of [head, stop)): a
    ``_Run`` of them, and how many go; None when all stay."""
    kept, removed = _scan(part, copy, head, stop, wall, delete_retention_ns, True)
    if not removed:
        return None
    run = _Run()
    run.add_all(copy, kept)
    return run, removed


def _scan(part, copy, start, end, wall, delete_retention_ns, compact):
    """(kept, removed): the (place in ``copy``, length, offset) of each record of
    ``copy`` (``ring.copy_used`` of [start, end)) that stays, as a flat sequence, and how
    many go (``_fast.compact_scan``, or its twin here): every record but the pads, or
    with ``compact``, a key's latest record (a tombstone while younger than
    ``delete_retention_ns``), every record without a key and every marker; an aborted
    record goes."""
    scan = part.paths.compact_scan
    if scan is not None:
        kept, removed = scan(copy, part._cap, start, end, wall, delete_retention_ns, compact)
        return memoryview(kept).cast("q"), removed
    latest, recs = {}, []
    for o, (status, length, _bl, _hl, flags, off, ts, klen) in ring.copied_records(copy, part._cap, start, end):
        if length < _REC or o + length > len(copy):
            raise ValueError("a torn record (the copy moved under it)")
        if status & 0xFF == _PAD:
            continue
        key = bytes(copy[o + _REC:o + _REC + klen - 1]) if compact and klen and not flags & _CONTROL else None
        recs.append((o, length, flags, off, ts, key))
        if key is not None and not flags & _ABORTED:  # (an aborted record is no key's latest: it goes)
            latest[key] = off
    kept, removed = [], 0
    for o, length, flags, off, ts, key in recs:
        if compact and (flags & _ABORTED or (key is not None and (latest.get(key) != off or (
                flags & _NULL and wall - ts > delete_retention_ns)))):
            removed += 1
        else:
            kept += (o, length, off)
    return kept, removed


class _Run:
    """Records laid back to back (``blob``), as a run writes them past the tail: their
    offsets, where each begins in the blob (``starts``, one more: the blob's end), and the
    first of each index stride (``anchors``: (anchor, its record's index))."""

    __slots__ = ("blob", "offsets", "starts", "anchors")

    def __init__(self):
        self.blob, self.offsets, self.starts, self.anchors = bytearray(), [], [0], []

    def add(self, src, o, length, off) -> None:
        anchor = off - off % _STRIDE
        if not self.anchors or self.anchors[-1][0] != anchor:
            self.anchors.append((anchor, len(self.offsets)))
        self.blob += src[o:o + length]
        self.offsets.append(off)
        self.starts.append(len(self.blob))

    def add_all(self, copy, kept) -> None:
        """The records of ``copy`` that ``_scan`` kept."""
        for i in range(0, len(kept), 3):
            self.add(copy, kept[i], kept[i + 1], kept[i + 2])

    def add_copied(self, part, copy, start, end) -> None:
        """Every record of ``copy`` (``ring.copy_used`` of [start, end)) but the pads."""
        self.add_all(copy, _scan(part, copy, start, end, 0, 0, False)[0])


def _publish(part, head, stop, upto, run, removed) -> Compacted | None:
    """Write what stays past the tail, the records from ``stop`` on after it, and publish
    them (the tail's store, then the head's); None if the head moved since the copy or the
    ring has no room for them. The records appended meanwhile are copied out of the lock
    while there are more than CATCH_UP bytes of them below the stable offset (at most
    CATCH_UP_ROUNDS times), so the lock is held for the copy into place of what stays and
    of the last few appended (and of an open transaction's: ``hide`` may flag them)."""
    mq = part._mq
    at, rounds = stop, 0  # the run holds the records of [head, at)'s that stay, and all of [stop, at)
    while True:
        part._acquire()
        try:
            if mq[L.PI_HEAD] != head:  # retention dropped records meanwhile: another run will see
                return None
            if len(run.offsets) == 0 and at == stop:  # nothing stays: the head moves to ``stop``, as a trim's
                return _drop_to(part, head, stop, upto, removed)
            tail, end = mq[L.PI_TAIL], mq[L.PI_TAIL]
            stable = part._stable()
            if stable < mq[L.PI_NEXT]:  # records past it are copied with the lock held
                found = part._find(stable)
                end = min(tail, found[0]) if found is not None else tail
            if end - at <= CATCH_UP or rounds >= CATCH_UP_ROUNDS:
                return _place(part, head, upto, run, at, tail, removed)
        finally:
            _unlock(part._lockp)
        copy = _copy(part, head, at, end)
        if copy is None:
            return None
        try:
            run.add_copied(part, copy, at, end)
        except (ValueError, struct.error):  # torn: the head moved meanwhile
            return None
        at, rounds = end, rounds + 1


def _place(part, head, upto, run, at, tail, removed) -> Compacted | None:
    """The last step, lock held: the records of [at, tail) joined to ``run``, which goes
    past the tail as appends would place it (it crosses the ring's end at most once: a
    PAD record over the rest of that lap), then published."""
    mm, mq, cap, base = part._mm, part._mq, part._cap, part._base
    if tail > at:
        run.add_copied(part, ring.copy_used(mm, base, cap, at, tail), at, tail)
    starts, n = run.starts, len(run.offsets)
    start = L.skip_gap(tail, cap)
    rem = cap - start % cap  # what the lap has left
    k = bisect.bisect_right(starts, rem, 0, n + 1) - 1  # the records [0, k) fit there; record k on, the next lap
    second = start + rem  # where the next lap begins
    new_tail = start + starts[n] if k == n else second + starts[n] - starts[k]
    if new_tail - head > cap:  # it would write over what readers may still read
        return None
    part._memory.ensure_arc(base, cap, tail, new_tail)  # StorageError: nothing changed
    mv = memoryview(run.blob)
    try:
        a = base + start % cap
        mm[a:a + starts[k]] = mv[:starts[k]]
        if k < n:
            if rem - starts[k] >= _REC:  # (less: an implicit pad)
                L.REC.pack_into(mm, a + starts[k], _PAD, rem - starts[k], 0, 0, 0, 0, 0, 0)
            mm[base:base + starts[n] - starts[k]] = mv[starts[k]:]
    finally:
        mv.release()

    def place(i):
        return start + starts[i] if i < k else second + starts[i] - starts[k]

    new_head = place(0)
    taken = (tail - head) - (new_tail - new_head)
    plog.compacted(mq, upto, new_head, run.offsets[0], taken, new_tail)
    index_w, slots = part._index_w, part._slots
    for anchor, i in run.anchors:  # the first record of each stride: what a read of any offset there starts from
        plog.index(mq, index_w, slots, anchor, place(i))
    return Compacted(removed, taken)


def _drop_to(part, head, stop, upto, removed) -> Compacted:
    """Every record in [head, stop) went: the head moves to ``stop``. Lock held."""
    mq = part._mq
    found = part._find(upto) if upto < mq[L.PI_NEXT] else None
    plog.compacted(mq, upto, stop, mq[L.PI_NEXT] if found is None else found[1], stop - head)
    return Compacted(removed, stop - head)
