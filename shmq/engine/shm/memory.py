"""What a queue's or a stream partition's segment holds of /dev/shm: allocated a chunk at a
time before anything is written there, and given back where nothing lives.

Strategy: the segment is created sparse (``ftruncate``) with only its header allocated.
/dev/shm is a tmpfs: a page is taken when it is first touched, and a write through a
mapping to a page the tmpfs cannot take is a SIGBUS, not an error (and so is a read of a
hole on a full one). So nothing is ever written where the memory block's bitmap
(``layout.MEM_FIELDS``) does not say "allocated": a writer, holding the object's lock, asks
``ensure`` for the chunks its records will take, which ``posix_fallocate``s those not yet
allocated (ENOSPC: StorageError, nothing written) and only then sets their bits. A
give-back round (housekeeping) clears the bits of the chunks outside what must be kept,
then punches them (``MADV_REMOVE``), and the kernel has their pages back. A bit is set
after its allocation and cleared before its punch, under the lock: a set bit always
means allocated, whichever process is killed when; a clear bit over allocated pages (a
kill in between) costs memory only, and a later round's sweep punches it. A queue that
fills allocates the chunks ahead of it outside the lock (so that no other process waits on
the kernel's page allocation): ``claim_ahead`` names them in the memory block under the
lock, ``fill_claim`` allocates them without it, ``settle_claim`` marks them under it; no
round gives back a live claimer's chunks.

What is kept is the caller's to say (``arc``: positions of a ring as segment byte
ranges): a queue keeps its records, head to tail, and the room ahead of its tail that the
last round's puts wrote as much of; a partition, whose lock-free readers (the JVM Spark
source) may read below its head for a moment after it moved, keeps everything from its
fence on, a head it had ``GIVE_BACK_GRACE_NS`` before.
"""

import errno
import mmap
import os

from ...errors import ShmFull
from ...model.units import size_text
from . import layout as L
from .segment import free_bytes

__all__ = ["Memory", "arc", "pinned_bytes"]

_SHIFT = L.CHUNK_SHIFT
CHUNK = L.CHUNK
_PAGE = mmap.PAGESIZE
_fallocate = os.posix_fallocate  # (a test makes /dev/shm look full by replacing it)
GROW_STEP_MAX = 4 << 20  # the most a growing ring allocates ahead of what it needs
_ONES = (1 << 64) - 1
_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14 (Python 3.11's mmap does not name it)


def arc(off: int, size: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """Positions [lo, hi) of a ring of ``size`` bytes at segment offset ``off`` (a position
    is at ``off + pos % size``), as at most two segment byte ranges; the whole ring when
    they span a lap or more."""
    if hi <= lo:
        return []
    if hi - lo >= size:
        return [(off, off + size)]
    a, b = lo % size, hi % size
    if a < b or b == 0:
        return [(off + a, off + (b or size))]
    return [(off + a, off + size), (off, off + b)]


def _mark(mq, bw: int, c0: int, c1: int, on: bool = True) -> None:
    """Set (or clear) the bits of chunks [c0, c1) in the bitmap at word ``bw`` of ``mq``."""
    for c in range(c0, c1):
        if on:
            mq[bw + (c >> 6)] |= 1 << (c & 63)
        else:
            mq[bw + (c >> 6)] &= ~(1 << (c & 63)) & 0xFFFFFFFFFFFFFFFF


def _first(mq, bw: int, c: int, stop: int, bit: int) -> int:
    """The first chunk in [c, stop) whose bit in the bitmap at word ``bw`` is ``bit`` (0 or
    1), else ``stop``: a word (64 chunks, 4 MiB) at a time."""
    flip = 0 if bit else _ONES
    while c < stop:
        rest = (mq[bw + (c >> 6)] ^ flip) >> (c & 63)
        if rest:
            return min(stop, c + (rest & -rest).bit_length() - 1)
        c = (c | 63) + 1
    return stop


def pinned_bytes(header: int, size: int) -> int:
    """What a new segment of ``size`` bytes whose header takes ``header`` reserves at
    create: the header's chunks, whole (a chunk is marked allocated only whole)."""
    return min(-(-header // CHUNK) * CHUNK, size)


class Memory:
    """The allocation of one segment: ``seg`` (its descriptor and mapping), its memory block
    at ``mem_off`` (words as ``mq``, the segment as 64-bit words), its first ``pinned``
    bytes (the header) always allocated. ``what`` names the object in errors. Every call
    but ``held`` needs the object's lock."""

    __slots__ = ("_fd", "_mm", "_mq", "_w", "_bw", "_size", "_chunks", "_pinned", "what")

    def __init__(self, seg, mq, mem_off: int, pinned: int, what: str):
        self._fd, self._mm, self._mq = seg._fd, seg._mmap, mq
        self._w = L.mem_words(mem_off)
        self._bw = self._w["bitmap"]
        self._size = seg.size
        self._chunks = -(-seg.size // CHUNK)
        self._pinned = -(-pinned // CHUNK)
        self.what = what

    @staticmethod
    def mark_pinned(mm, mem_off: int, pinned: int) -> None:
        """In a new segment's mapping ``mm``: mark its first ``pinned`` bytes (whole chunks,
        which the create reserved: ``pinned_bytes``) allocated."""
        mq = memoryview(mm).cast("Q")
        try:
            _mark(mq, L.mem_words(mem_off)["bitmap"], 0, -(-pinned // CHUNK))
        finally:
            mq.release()

    # ------------------------------------------------------------------ growing
    def ensure(self, lo: int, hi: int) -> None:
        """Allocate every chunk of segment bytes [lo, hi) not allocated yet. StorageError,
        naming /dev/shm and how to enlarge it, when it cannot grow (what it did allocate
        stays unmarked: a later round gives it back)."""
        if hi <= lo:
            return
        mq, bw = self._mq, self._bw
        c, stop = lo >> _SHIFT, ((hi - 1) >> _SHIFT) + 1
        while (c := _first(mq, bw, c, stop, 0)) < stop:
            end = _first(mq, bw, c, stop, 1)
            self._grow(c, end)
            c = end

    def ensure_arc(self, off: int, size: int, lo: int, hi: int) -> None:
        """``ensure`` for positions [lo, hi) of a ring (``arc``)."""
        for a, b in arc(off, size, lo, hi):
            self.ensure(a, b)

    def map_in(self, lo: int, hi: int) -> None:
        """Map segment bytes [lo, hi), allocated already (``ensure``), into this process's
        page tables in one call (``MADV_POPULATE_WRITE``), not a fault a page as they are
        first written. Only where the bitmap says allocated: on a hole it would allocate
        behind the bitmap's back. A kernel without it (before 5.14) leaves the faults."""
        lo -= lo % _PAGE
        if hi > lo:
            try:
                self._mm.madvise(_POPULATE_WRITE, lo, hi - lo)
            except OSError:  # (EINVAL: an older kernel; ENOMEM: the faults say so later, as without it)
                pass

    # ------------------------------------------------------------------ growing ahead, outside the lock
    def claim_ahead(self, off: int, size: int, pos: int, limit: int, slot: int):
        """The chunks a growing ring allocates next, outside the lock: from the first one not
        allocated at or after ring position ``pos`` (up to ``limit`` and the lap's end), a
        ``step()`` of them, claimed for process slot ``slot`` so that no round gives them
        back until ``settle_claim``; (first chunk, end chunk), or None when there is
        nothing to allocate there or another claim stands. Lock held."""
        mq, w = self._mq, self._w
        mq[w["grow_due"]] = 0
        if mq[w["claim_owner"]]:
            return None
        lap = pos - pos % size
        limit = min(limit, lap + size)
        hole = self.allocated_to(off, size, pos, limit)  # (the first position of a chunk not allocated)
        if hole >= limit:
            return None
        c, end = (off + hole - lap) >> _SHIFT, off + limit - lap
        c1 = min(c + self.step() // CHUNK, -(-end // CHUNK))
        mq[w["claim_lo"]], mq[w["claim_hi"]], mq[w["claim_owner"]] = c, c1, slot + 1
        return c, c1

    def fill_claim(self, c0: int, c1: int) -> bool:
        """Allocate claimed chunks (without the lock: the claim keeps them); False when
        /dev/shm cannot (nothing is marked: the put that needs them allocates or refuses)."""
        start = c0 << _SHIFT
        try:
            _fallocate(self._fd, start, min(c1 << _SHIFT, self._size) - start)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.ENOMEM, errno.EDQUOT):
                return False
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
        return True

    def settle_claim(self, slot: int, filled: bool) -> None:
        """End this slot's claim: its chunks marked allocated when ``filled``. Lock held."""
        mq, bw, w = self._mq, self._bw, self._w
        if mq[w["claim_owner"]] != slot + 1:
            return  # (taken for dead's and dropped by a round: its chunks are not marked)
        if filled:
            c0, c1 = mq[w["claim_lo"]], mq[w["claim_hi"]]
            _mark(mq, bw, c0, c1)
            mq[w["grown_total"]] += min(c1 << _SHIFT, self._size) - (c0 << _SHIFT)
            mq[w["quiet_a"]] = 0
        mq[w["claim_owner"]] = 0

    def step(self) -> int:
        """How far ahead a growing ring allocates: a quarter of what it holds (one chunk at
        first, GROW_STEP_MAX at most), so a ring that fills grows a few times, not once a chunk."""
        return min(GROW_STEP_MAX, max(CHUNK, (self.marked() >> 2) & -CHUNK))

    def allocated_to(self, off: int, size: int, pos: int, limit: int) -> int:
        """How far from position ``pos`` of a ring (``arc``) its chunks are allocated without a
        gap, up to ``limit`` and the end of ``pos``'s lap (a queue's ``room``)."""
        lap = pos - pos % size
        a, end = off + pos - lap, off + min(limit, lap + size) - lap
        c = _first(self._mq, self._bw, a >> _SHIFT, -(-end >> _SHIFT), 0)
        return pos + max(0, min(c << _SHIFT, end) - a)

    def _grow(self, c0: int, c1: int) -> None:
        start = c0 << _SHIFT
        n = min(c1 << _SHIFT, self._size) - start
        try:
            _fallocate(self._fd, start, n)
        except OSError as e:
            if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # cannot reserve here (not a tmpfs): taken as written
                pass
            elif e.errno not in (errno.ENOSPC, errno.ENOMEM, errno.EDQUOT):
                raise
            else:
                self._refused(n)
        mq = self._mq
        _mark(mq, self._bw, c0, c1)
        mq[self._w["grown_total"]] += n
        mq[self._w["quiet_a"]] = 0  # (the next round looks again)

    def _refused(self, n: int):
        self._mq[self._w["refused_total"]] += 1
        raise ShmFull(
            f"/dev/shm is full: {self.what} could not take {size_text(n)} more for its records (it holds "
            f"{size_text(self.held())}; {size_text(free_bytes())} free): nothing was written, and what it holds "
            "is intact; free room there (consume, purge or delete messages) or enlarge /dev/shm (Docker: "
            "--shm-size; Kubernetes: an emptyDir with medium: Memory and a sizeLimit)") from None

    # ------------------------------------------------------------------ giving back
    def give_back(self, keep, budget: int = L.GIVE_BACK_BUDGET, stamp=None, alive=None) -> int:
        """Give back the allocated chunks that no range of ``keep`` (segment byte ranges)
        touches, at most ``budget`` bytes of them (the next round goes on); then, when the
        file holds more than its bits say (a kill between a clear and its punch), punch
        what is not kept and not marked too. Returns the bytes given back. ``stamp``: two
        words that decide ``keep`` (the caller's head and tail, say), or None: a round that
        finds the stamp of one that left nothing to do does nothing (an idle queue's round
        costs two word reads). The chunks a producer claimed are kept while ``alive(its
        slot)`` says it lives (without ``alive``, always); a dead one's claim is dropped."""
        mq, bw, w = self._mq, self._bw, self._w
        owner = mq[w["claim_owner"]]
        if owner and alive is not None and not alive(owner - 1):
            mq[w["claim_owner"]] = owner = 0  # (it died allocating: what it took is unmarked, swept below)
        if owner:
            keep = [*keep, (mq[w["claim_lo"]] << _SHIFT, mq[w["claim_hi"]] << _SHIFT)]
            stamp = None
        if stamp is not None and mq[w["quiet_a"]] == stamp[0] + 1 and mq[w["quiet_b"]] == stamp[1]:
            return 0
        kept = sorted((a >> _SHIFT, ((b - 1) >> _SHIFT) + 1) for a, b in keep if b > a)
        mq[self._w["rounds"]] += 1
        runs = []
        marked = given = 0
        for wi in range((self._chunks + 63) >> 6):
            word = mq[bw + wi]
            while word:
                low = word & -word
                word ^= low
                c = (wi << 6) + low.bit_length() - 1
                marked += 1
                if c < self._pinned or given >= budget or any(a <= c < b for a, b in kept):
                    continue
                if runs and runs[-1][1] == c:
                    runs[-1][1] = c + 1
                else:
                    runs.append([c, c + 1])
                given += CHUNK
        for c0, c1 in runs:  # cleared first: from here on nothing writes there
            _mark(mq, bw, c0, c1, on=False)
        freed = sum(self._punch(c0, c1) for c0, c1 in runs)
        if given < budget and self.held() > (marked - sum(b - a for a, b in runs)) * CHUNK:
            self._sweep(kept)
        mq[w["given_total"]] += freed
        quiet = stamp is not None and given < budget
        mq[w["quiet_a"]], mq[w["quiet_b"]] = (stamp[0] + 1, stamp[1]) if quiet else (0, 0)
        return freed

    def _sweep(self, kept) -> None:
        """Punch every chunk that is neither kept nor marked (pages left by a kill)."""
        mq, bw = self._mq, self._bw
        run = None
        for c in range(self._pinned, self._chunks + 1):
            free = c < self._chunks and not (mq[bw + (c >> 6)] >> (c & 63) & 1) and not any(
                a <= c < b for a, b in kept)
            if free and run is None:
                run = c
            elif not free and run is not None:
                self._punch(run, c)
                run = None

    def _punch(self, c0: int, c1: int) -> int:
        start = c0 << _SHIFT
        end = min(c1 << _SHIFT, -(-self._size // _PAGE) * _PAGE)
        self._mm.madvise(mmap.MADV_REMOVE, start, end - start)
        return end - start

    # ------------------------------------------------------------------ what it holds
    def held(self) -> int:
        """Bytes of /dev/shm the segment holds now (what the kernel counts: st_blocks)."""
        return os.fstat(self._fd).st_blocks * 512

    def marked(self) -> int:
        """Bytes the bitmap says are allocated (with no kill in between, exactly ``held()``:
        nothing is written, or read, outside them)."""
        mq, bw, n = self._mq, self._bw, 0
        for wi in range((self._chunks + 63) >> 6):
            n += mq[bw + wi].bit_count()
        last = self._chunks - 1  # (the segment's last chunk may be cut short)
        if mq[bw + (last >> 6)] >> (last & 63) & 1:
            n -= 1
            return n * CHUNK + -(-self._size // _PAGE) * _PAGE - last * CHUNK
        return n * CHUNK

    def word(self, name: str) -> int:
        return self._mq[self._w[name]]

    def set_word(self, name: str, value: int) -> None:
        self._mq[self._w[name]] = value
