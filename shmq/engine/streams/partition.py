"""One partition of a stream: an append-only ring of records, read by offset, and for a
"wal" stream its logs on disk, the long tail behind the ring.

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

Durability (docs/DESIGN.md, Persistence): the appender of a "wal" partition appends the
log entries itself, under the lock, before its commit, as a queue's producer does
(``wal.Log``); those logs stay on disk until retention deletes whole files, and a read
below the ring goes to them (``wal.Tail``). A "snapshot" partition keeps a high-water
mark on disk instead (``wal.HighWater``): an append that needs an offset past it writes a
higher one first, so a stream rebuilt after a reboot continues past every offset ever
handed out. Offsets lost that way (or with a damaged file) are a gap: a read there
raises OffsetOutOfRange saying where to read on, never returns other records under them.
"""

import ctypes
import time
from typing import NamedTuple

from ...formats import dmsq
from ...errors import MessageTooLarge, OffsetOutOfRange, ShmqError, StorageError, StreamNotFound
from ..shm import layout as L
from ..shm import header, plog, ring
from .paths import chosen as _chosen_paths
from ..shm.mutex import RobustMutex, acquire
from ..shm.mutex import unlock as _unlock
from ..shm.memory import Memory, arc, pinned_bytes
from ..shm.names import partition_segment
from ..shm.segment import create_segment, open_segment
from ..shm.wal import Log
from ...formats.logfiles import HighWater, Tail, log_files, partition_log_name

__all__ = ["Partition", "Image", "Rows", "create_partition", "record_size",
           "columns_items", "check_timestamps", "chunks_by_time"]

_REC = L.REC_SIZE
_READY, _PAD, _NULL = L.READY, L.PAD, L.FLAG_NULL_VALUE
_HIDDEN = L.FLAG_CONTROL | L.FLAG_ABORTED  # what a reader of records passes over
_PI_STABLE = L.PI_STABLE
_R_LENGTH, _R_MSG_ID, _R_ENQ = L.R_LENGTH, L.R_MSG_ID, L.R_ENQ
_R_FLAGS = L.REC_OFFSETS["flags"]  # (a byte offset in the record: a u32)
_STRIDE = L.INDEX_STRIDE
_index = plog.index
_REC_UNPACK = L.REC.unpack_from
_LOG_GEN_W = L.PART_WALCFG_OFF >> 3  # the generation word of the partition's log config
BLOCK_SLICE_S = 0.005  # how often an appender blocked by retention="block" looks again
HWM_MIN_SPAN = 4096  # a high-water mark is raised by at least this many offsets at a time
GIVE_BACK_PERIOD_NS = 500_000_000  # how often an appender gives memory back (a server does too, every 0.25 s)
INDEX_AHEAD = L.CHUNK // 8  # index words kept ahead of the end: one chunk of them
_NO_LIMIT = 2**64 - 1  # (ring_drop's limit when retention drops whatever it must)
PREPARE_PIECE = 1 << 20  # what ``prepare`` allocates and maps per hold of the lock (about 0.5 ms)
EXPIRE_MAX = 65536  # records retention drops from memory in one round at most
_wall_ns = time.time_ns
_stream_entry = dmsq.stream_entry
_publish_entry = dmsq.publish_entry
_NO_TXN = bytes(16)
_EMPTY = b""


class Rows(list):
    """A reader's records (``Partition.read(visible=True)``), and ``next``: the offset to
    read on from, past the markers and aborted records passed over after the last one."""

    __slots__ = ("next",)


def create_partition(stream_base: str, index: int, max_bytes: int, max_message_bytes: int, created_ns: int,
                     group: int | None = None) -> None:
    """Make partition ``index``'s segment, empty, its header published last (its magic);
    FileExistsError if the name is taken. ``group``: a gid, as ``create_segment`` takes it."""
    size = L.part_data_offset(max_bytes) + max_bytes
    pinned = pinned_bytes(L.PART_INDEX_OFF, size)  # the header: index and ring are taken as written
    seg = create_segment(partition_segment(stream_base, index), size, reserve=pinned, group=group)
    try:
        mm = seg._mmap
        Memory.mark_pinned(mm, L.PART_MEM_OFF, pinned)
        header.init_partition(mm, (L.STREAM_VERSION, 0, max_bytes, max_message_bytes, L.index_slots(max_bytes),
                                   L.part_data_offset(max_bytes), created_ns))
    finally:
        seg.close()


def record_size(key, hraw, value) -> int:
    """The bytes a record (``value`` None: a tombstone) takes in the ring."""
    return L.record_size((len(key) if key is not None else 0) + len(hraw), len(value) if value is not None else 0)


def _binary(n, offsets, data, valid=None):
    """The values of an Arrow binary column (int32 ``offsets`` into ``data``; ``valid``, a
    bitmap or None: all there) as bytes, None where not valid; ValueError if they do not fit."""
    offs = memoryview(offsets).cast("B").cast("i")
    data = bytes(data)
    if len(offs) < n + 1 or offs[0] < 0 or offs[n] > len(data) or any(offs[i] > offs[i + 1] for i in range(n)):
        raise ValueError(f"binary offsets do not fit {n} records")
    bits = bytes(valid) if valid is not None else None
    if bits is not None and len(bits) < (n + 7) // 8:
        raise ValueError(f"a validity bitmap too short for {n} records")
    return [data[offs[i]:offs[i + 1]] if bits is None or bits[i >> 3] >> (i & 7) & 1 else None for i in range(n)]


def columns_items(chunks) -> list:
    """Chunks of Arrow buffers (``Partition.append_columns``) as ``append``'s items:
    (key or None, encoded headers, value or None) — the pure-Python twin of the C path."""
    items = []
    for chunk in chunks:
        n, voffs, vals, koffs, keys, kvalid, hoffs, hdrs = chunk[:8]
        if n < 0:
            raise ValueError("a chunk's record count is negative")
        values = _binary(n, voffs, vals, _value_validity(chunk))
        ks = _binary(n, koffs, keys, kvalid) if koffs is not None else [None] * n
        hs = _binary(n, hoffs, hdrs) if hoffs is not None else [b""] * n
        items += zip(ks, hs, values)
    return items


def _value_validity(chunk):
    """A chunk's value validity bitmap (its ninth field, when it has one), or None: all there."""
    return chunk[8] if len(chunk) > 8 else None


def check_timestamps(timestamps_ns, n: int) -> list:
    """Records' own timestamps (UTC epoch ns) as a list of ``n`` ints; ValueError or
    TypeError for anything else."""
    stamps = list(timestamps_ns)
    if len(stamps) != n:
        raise ValueError(f"timestamps_ns must be as many as the records ({n}), not {len(stamps)}")
    for t in stamps:
        if type(t) is not int:
            raise TypeError(f"a timestamp is an int of ns since the epoch, not {type(t).__name__}")
        if not 0 <= t < 2**63:
            raise ValueError(f"timestamp {t} ns is out of range (0 to 2**63 - 1)")
    return stamps


def chunks_by_time(chunk, stamps) -> tuple[list, list]:
    """One chunk of records (``append_columns``) cut into runs of one timestamp each:
    (chunks, their times), for ``Partition.append_columns(times=...)``. The buffers are
    shared, not copied (offsets index into their data); the validity bitmaps (keys',
    values') are cut into new ones."""
    n, voffs, vals, koffs, keys, kvalid, hoffs, hdrs = chunk[:8]
    vvalid = _value_validity(chunk)
    cuts = [i for i in range(1, n) if stamps[i] != stamps[i - 1]]
    if not cuts:
        return [(*chunk[:8], vvalid)], stamps[:1]
    kbits, vbits = (bytes(v) if v is not None else None for v in (kvalid, vvalid))
    views = [None if b is None else memoryview(b).cast("B") for b in (voffs, koffs, hoffs)]
    chunks = []
    for a, b in zip([0, *cuts], [*cuts, n]):
        vo, ko, ho = (None if v is None else v[4 * a:4 * (b + 1)] for v in views)
        kv, vv = (None if bits is None else _bitmap(bits, a, b) for bits in (kbits, vbits))
        chunks.append((b - a, vo, vals, ko, keys, kv, ho, hdrs, vv))
    return chunks, [stamps[a] for a in [0, *cuts]]


def _bitmap(bits: bytes, a: int, b: int) -> bytes:
    """Bits a..b-1 of an Arrow validity bitmap, as a bitmap of their own."""
    out = bytearray((b - a + 7) // 8)
    for i in range(a, b):
        if bits[i >> 3] >> (i & 7) & 1:
            out[(i - a) >> 3] |= 1 << ((i - a) & 7)
    return bytes(out)


class Image(NamedTuple):
    """What a snapshot takes of a partition (``Partition.export``): its records as
    (offset, timestamp_ns, key, headers, value), the offset the next append gets, the
    first log generation the records do not cover ("wal"; else None), the high-water
    epoch this snapshot begins ("snapshot", once a broker configured it; else None), and
    the publishers' table (``Partition.published``); for a backup of a "wal" partition,
    the bytes its log generation ``wal_from`` held at the copy."""

    rows: list
    next_offset: int
    wal_from: int | None
    hwm_epoch: int | None
    txns: list = []  # the publishers' table: (id, batch, end offset), consistent with rows
    log_size: int | None = None  # (backup) log ``wal_from``'s bytes up to the copy: the rest came after it


class Partition:
    """A handle on partition ``index`` of a stream, attached in this process."""

    lock_timeout = None  # set by its Stream
    make_room = None  # set by its Stream: called (no lock held) before an append fills past half the ring
    compact_word = None  # set by its Stream: (its words, the word, shift and mask) of its setting ``compact``
    def __init__(self, stream_base: str, index: int, name: str, durability: str = "memory", paths=None):
        """``paths``: the bulk paths it runs (``paths.PartitionPaths``: its stream's; None:
        those ``cpaths``' default names now)."""
        self.index = index
        self.name = name  # the stream's, for messages
        self.paths = paths if paths is not None else _chosen_paths()
        try:
            seg = open_segment(partition_segment(stream_base, index))
        except (FileNotFoundError, ValueError):
            raise StreamNotFound(f"stream {name!r} has no partition {index} (deleted?)") from None
        mm = seg._mmap
        magic, version, _pad, cap, maxmsg, slots, data_off, _created = L.PART_STATIC.unpack_from(mm, 0)
        if magic != L.PART_MAGIC or version != L.STREAM_VERSION or seg.size < data_off + cap:
            seg.close()
            raise StreamNotFound(f"stream {name!r}: partition {index} is not ready (being created?)")
        self._seg, self._mm, self._mq = seg, mm, memoryview(mm).cast("Q")
        self._cap, self._base, self._slots, self.max_message_bytes = cap, data_off, slots, maxmsg
        # the memory of its index and ring, taken chunk by chunk before anything is written there
        self._memory = Memory(seg, self._mq, L.PART_MEM_OFF, pinned_bytes(L.PART_INDEX_OFF, seg.size),
                              f"stream {name!r} partition {index}")
        self._round_due = 0  # (monotonic ns) when an append here next gives memory back
        self._index_w = L.PART_INDEX_OFF >> 3
        self._mutex = RobustMutex(ctypes.addressof(ctypes.c_char.from_buffer(mm, L.PART_MUTEX_OFF)))
        self._lockp = self._mutex.ptr
        self.durability = durability
        self._logged = durability == "wal"
        self._marked = durability == "snapshot"
        file_name, what = partition_log_name(name, index), f"stream {name!r} partition {index}"
        # the log config says where the data dir is (and, for "wal", the log itself)
        self.log = Log(self, file_name, what, L.PART_WALCFG_OFF, L.PART_WAL_WORDS_OFF) if durability != "memory" \
            else None
        self._hwm = HighWater(file_name, what) if self._marked else None
        self._tail = Tail(file_name) if self._logged else None

    def __del__(self):
        if getattr(self, "_lockp", None) is not None:
            self.close()

    def close(self) -> None:
        if self._lockp is None:
            return
        self._lockp = None
        if self.log is not None:
            self.log.close()
        if self._hwm is not None:
            self._hwm.close()
        self._mq.release()
        self._seg.close()

    # ------------------------------------------------------------------ locking
    def _acquire(self, deadline=None):
        lp = self._lockp
        if lp is None:
            raise ShmqError(f"stream {self.name!r}: partition handle is closed")
        what = f"stream {self.name!r} partition {self.index}"
        acquire(self._mutex, deadline, self.lock_timeout, what, self._repair)
        if self._mq[L.PI_DELETED]:
            _unlock(lp)
            raise StreamNotFound(f"stream {self.name!r} was deleted")

    def _repair(self):
        """Rebuild head, tail, earliest and next offset from the records, after the
        lock's previous holder died inside an append or a drop, and its publishers' table
        (``plog.recount``); then what only the partition knows: the log entries the dead
        holder wrote and never committed. Lock held."""
        nxt = plog.recount(self._mq, self._cap, self._base)
        if self._logged:  # an entry torn by the death, and those of an append that never committed
            self.log.repair(limit=nxt)

    # ------------------------------------------------------------------ offsets
    def offsets(self) -> tuple[int, int]:
        """(earliest readable offset — in memory or, for "wal", in a log on disk —, the
        offset the next append gets)."""
        self._acquire()
        try:
            return self._low(), self._mq[L.PI_NEXT]
        finally:
            _unlock(self._lockp)

    def stable(self) -> int:
        """The last stable offset: a reader of records reads below it (the first offset of
        the oldest transaction open here; the end when none is)."""
        self._acquire()
        try:
            return self._stable()
        finally:
            _unlock(self._lockp)

    def _stable(self):
        mq = self._mq
        return min(mq[L.PI_STABLE] - 1, mq[L.PI_NEXT]) if mq[L.PI_STABLE] else mq[L.PI_NEXT]

    def set_stable(self, offset: int | None) -> None:
        """The transaction coordinator's: readers read below ``offset`` (None: no
        transaction is open here)."""
        self._acquire()
        try:
            plog.set_stable(self._mq, offset)
        finally:
            _unlock(self._lockp)

    def hide(self, spans, flag: int) -> int:
        """Set ``flag`` (FLAG_ABORTED: an aborted transaction's records; FLAG_CONTROL: its
        marker) on the records of ``[first, end)`` spans still in memory: readers of records
        pass over them. Returns how many it set."""
        mq, cap, base = self._mq, self._cap, self._base
        done = 0
        self._acquire()
        try:
            tail = mq[L.PI_TAIL]
            for first, end in spans:
                if end <= mq[L.PI_EARLIEST] or first >= mq[L.PI_NEXT]:
                    continue
                found = self._find(max(first, mq[L.PI_EARLIEST]))
                if found is None:
                    continue
                for _pos, w in ring.records(mq, cap, base, found[0], tail):
                    if mq[w] & 0xFF == _PAD:
                        continue
                    if mq[w + _R_MSG_ID] >= end:
                        break
                    fw = (w << 3) + _R_FLAGS
                    flags = int.from_bytes(self._mm[fw:fw + 4], "little")
                    if not flags & flag:
                        self._mm[fw:fw + 4] = (flags | flag).to_bytes(4, "little")
                        done += 1
        finally:
            _unlock(self._lockp)
        return done

    def _low(self):
        """The partition's start (Kafka's log start offset): the earliest offset a reader
        may ask for, in memory, on disk ("wal": where its oldest log begins), or in the
        range below ``earliest`` that compaction or a trim (DeleteRecords) left without
        records, in memory and on disk (a read there goes on at ``earliest``). Compaction
        never moves it; retention (of memory, or of the logs on disk) and ``trim`` do.
        Lock held."""
        mq = self._mq
        earliest, disk, compacted = mq[L.PI_EARLIEST], mq[L.PI_DISK_FIRST], mq[L.PI_COMPACT_LOW]
        if disk and disk - 1 <= earliest:  # the logs hold every record from there on
            return disk - 1
        return min(earliest, compacted - 1) if compacted else earliest

    def stats(self) -> dict:
        """Earliest (readable), end, the last stable offset, bytes of records, bytes of /dev/shm held, records
        appended and dropped."""
        mq = self._mq
        self._acquire()
        try:
            return {"partition": self.index, "earliest": self._low(), "end": mq[L.PI_NEXT],
                    "stable": self._stable(), "memory_earliest": mq[L.PI_EARLIEST],
                    "bytes": mq[L.PI_TAIL] - mq[L.PI_HEAD], "max_bytes": self._cap,
                    "bytes_held": self._memory.held(),
                    "appended_total": mq[L.PI_APPENDED], "dropped_total": mq[L.PI_DROPPED],
                    "compactions_total": mq[L.PI_COMPACTIONS], "compacted_bytes_total": mq[L.PI_BYTES_COMPACTED]}
        finally:
            _unlock(self._lockp)

    def _find(self, offset):
        """(position, offset) of the first record at or after ``offset`` (earliest <=
        offset < next), or None: it is past the last record. An index word holds the
        position of its anchor's record, or after a compaction of the first record at or
        after its anchor within its stride. Lock held."""
        mq, cap, base = self._mq, self._cap, self._base
        head, tail = mq[L.PI_HEAD], mq[L.PI_TAIL]
        start = head
        anchor = offset - offset % _STRIDE
        if anchor >= mq[L.PI_EARLIEST]:
            pos = mq[self._index_w + (anchor // _STRIDE) % self._slots]
            if head <= pos < tail and anchor <= mq[((base + pos % cap) >> 3) + _R_MSG_ID] <= offset:
                start = pos
        for pos, w in ring.records(mq, cap, base, start, tail):
            if mq[w] & 0xFF != _PAD and mq[w + _R_MSG_ID] >= offset:
                return pos, mq[w + _R_MSG_ID]
        return None

    def _lost(self, offset, resume, end):
        return OffsetOutOfRange(
            f"stream {self.name!r} partition {self.index}: offsets {offset}..{resume - 1} were lost (a reboot, or "
            f"a damaged or deleted log file); read on from {resume}", resume, end)

    # ------------------------------------------------------------------ append
    def append(self, items, now_ns, floor=None, deadline=None, txn=None, times=None, flags=0) -> int | None:
        """Append ``(key or None, encoded headers, value or None)`` items, all or nothing; returns
        the first one's offset. Each record is stamped ``now_ns``, or with ``times`` (a
        list as long as ``items``) its own time in ns. With ``floor`` (retention="block":
        a function giving the lowest offset a group still needs), only records below it are dropped for room,
        and the append waits (until ``deadline``, monotonic ns, then ShmqError) for more.
        With ``txn`` = (publisher id: 16 bytes, batch: int), the append is a publish of
        that batch, done at most once: None, appending nothing, when the publisher's
        table says this batch (or a later one) is in already. ``flags``: set on each record
        (FLAG_CONTROL: a transaction's marker, which the coordinator appends). StorageError
        (nothing appended) when the log or the high-water file cannot be written."""
        sizes = [record_size(k, h, v) for k, h, v in items]
        stamps = [now_ns] * len(items) if times is None else times

        def entries(first):
            out = [_stream_entry(first + i, t, k, h, v) for i, ((k, h, v), t) in enumerate(zip(items, stamps))]
            if txn is not None:
                out.append(_publish_entry(first + len(items) - 1, now_ns, txn[0], txn[1]))
            return b"".join(out)

        return self._append(len(items), sum(sizes), now_ns, lambda tail: self._placement_end(sizes, tail), entries,
                            lambda start, first: self._fill(items, sizes, stamps, start, first, flags),
                            floor, deadline, txn)

    def append_columns(self, chunks, now_ns, floor=None, deadline=None, txn=None, times=None) -> int | None:
        """``append`` of records given as chunks of Arrow buffers (``_fast.columns_check``
        says what a chunk is: ``read_columns``' first nine fields are one), written and
        logged in C; where the C paths are off, the same records go through ``append``.
        ``times`` (one per chunk, ns): each chunk's records are stamped with its time, not
        ``now_ns``. Returns the first offset, or None when there was nothing to append (or
        ``txn`` was in already)."""
        paths = self.paths
        if paths.write_columns is None:  # the Python paths
            items = columns_items(chunks)
            stamps = None if times is None else [t for c, t in zip(chunks, times) for _ in range(c[0])]
            return self.append(items, now_ns, floor, deadline, txn, stamps) if items else None
        n, total, _biggest = paths.columns_check(chunks)
        if not n:
            return None
        cap = self._cap
        tid, batch = txn if txn is not None else (None, 0)
        # stamped per chunk: one C call per chunk (the chunks of one time each), in one append
        timed = [(chunks, now_ns)] if times is None else [([c], t) for c, t in zip(chunks, times) if c[0]]

        def entries(first):
            out = []
            for i, (cs, t) in enumerate(timed):
                out.append(paths.columns_log(cs, first, t, tid if i == len(timed) - 1 else None, batch))
                first += sum(c[0] for c in cs)
            return b"".join(out)

        def fill(pos, first):
            for cs, t in timed:
                pos = paths.write_columns(self._mm, self._base, cap, L.PART_INDEX_OFF, self._slots, _STRIDE, pos,
                                           first, t, cs)
                first += sum(c[0] for c in cs)
            return pos

        return self._append(n, total, now_ns, lambda tail: paths.columns_end(chunks, tail, cap), entries, fill,
                            floor, deadline, txn)

    def _append(self, n, total, now_ns, end_from, entries, fill, floor, deadline, txn):
        """The append of ``n`` records of ``total`` bytes in the ring, described by three
        functions: ``end_from(tail)``, the ring position after them placed from ``tail``;
        ``entries(first)``, their log entries (and the publish note of ``txn``);
        ``fill(start, first)``, which writes them from ring position ``start`` on."""
        if total > self._cap:
            raise MessageTooLarge(f"{total} bytes of records can never fit in a partition of stream "
                                  f"{self.name!r} (max_bytes={self._cap})")
        cw = self.compact_word  # (read as appends go: a stream made compact later compacts from then on)
        asked = cw is None
        while True:
            limit = None if floor is None else floor()
            self._acquire()
            try:
                if txn is not None and self._txn_batch(txn[0]) >= txn[1]:
                    return None
                room = self._room(end_from, limit)
                if room is not None and (asked or (not room[2] and 2 * (room[4] - room[1]) <= self._cap)
                                         or not cw[0][cw[1]] >> cw[2] & cw[3]):  # past half the ring: compacted?
                    first = self._write(n, now_ns, room, txn, entries, fill)
                    if time.monotonic_ns() >= self._round_due:  # memory back every so often with no server too
                        self.give_back()
                    return first
            finally:
                _unlock(self._lockp)
            if room is not None:  # past half the ring, or records to drop: a compacted stream compacts first
                asked = True
                self.make_room()
                continue
            if deadline is not None and time.monotonic_ns() >= deadline:
                raise ShmqError(f"stream {self.name!r}: partition {self.index} is full and retention='block' "
                                "waits for the slowest group to commit")
            time.sleep(BLOCK_SLICE_S)

    def _placement_end(self, sizes, tail):
        for size in sizes:
            tail = L.place(tail, size, self._cap)[1]
        return tail

    def _room(self, end_from, limit):
        """Where the records go and what is dropped for them: (start position, new head,
        records dropped, the new earliest or None, the position after them), or None when they cannot fit now (only
        records below ``limit`` may go, when it is given). ``end_from(tail)``: the
        position after them placed from ``tail``. Changes nothing. Lock held."""
        mq, cap, base = self._mq, self._cap, self._base
        head, tail = mq[L.PI_HEAD], mq[L.PI_TAIL]
        if head == tail and tail % cap:  # empty: start a lap, so any batch <= capacity fits
            start = tail + cap - tail % cap
            return start, start, 0, None, end_from(start)
        end = end_from(tail)
        if end - head <= cap:
            return tail, head, 0, None, end
        if self.paths.ring_drop is not None:  # (C: the walk below, at 1-2 ns a record, not 1-2 us)
            got = self.paths.ring_drop(self._mm, base, cap, head, tail, end - cap, _NO_LIMIT if limit is None else limit)
            if got is None:
                return None
            new_head, dropped, earliest = got
            if earliest < 0:
                earliest = None
            return self._room_after(tail, new_head, dropped, earliest, end, end_from)
        dropped, new_head, earliest = 0, head, None
        for pos, w in ring.records(mq, cap, base, head, tail):
            if end - new_head <= cap:
                if mq[w] & 0xFF == _PAD:  # a pad is always followed by a record
                    continue
                earliest = mq[w + _R_MSG_ID]
                break
            if mq[w] & 0xFF != _PAD:
                if limit is not None and mq[w + _R_MSG_ID] >= limit:
                    return None
                dropped += 1
            new_head = pos + (mq[w + _R_LENGTH] & 0xFFFFFFFF)
        else:
            new_head = tail
        return self._room_after(tail, new_head, dropped, earliest, end, end_from)

    def _room_after(self, tail, new_head, dropped, earliest, end, end_from):
        """``_room``'s answer once the walk found where the head goes."""
        cap = self._cap
        if new_head == tail:  # everything goes: a new lap, where the batch fits whole
            start = tail + cap - tail % cap if tail % cap else tail
            return start, start, dropped, None, end_from(start)
        return (tail, new_head, dropped, earliest, end) if end - new_head <= cap else None

    def _write(self, n, now_ns, room, txn, entries, fill) -> int:
        """Allocate their memory, log the ``n`` records (``entries(first)``) or raise the high-water mark, drop
        what makes room, write them past the tail (``fill(start, first)``), note the
        publish of ``txn``, publish them with one store. Lock held."""
        mq = self._mq
        start, new_head, dropped, earliest, end = room
        first = mq[L.PI_NEXT]
        self._memory.ensure_arc(self._base, self._cap, start, end)  # StorageError: nothing changed
        self._ensure_index(first, first + n)
        if self._marked and mq[_LOG_GEN_W] and first + n > mq[L.PI_HWM]:
            self._raise_mark(first + n)  # StorageError: nothing changed
        if self._logged:  # logged (and fsynced, by policy) before the commit below
            self.log.append(entries(first))
            if not mq[L.PI_DISK_FIRST]:
                plog.set_disk_first(mq, first)
        head, tail = mq[L.PI_HEAD], mq[L.PI_TAIL]
        if new_head != head:  # (a crash from here on: _repair recomputes earliest)
            plog.drop(mq, new_head, dropped, earliest, min(new_head, tail) - head)
        if start != tail:  # a new lap: head first, so no moment has garbage between head and tail
            plog.lap(mq, start)
        pos = fill(start, first)
        if txn is not None:  # before the commit: a repair takes it back if the commit never came
            self._txn_note(txn[0], txn[1], first + n, now_ns)
        plog.commit(mq, pos, first, n)
        return first

    def _fill(self, items, sizes, stamps, start, offset, flags=0) -> int:
        """Write ``items`` from ring position ``start`` on, offsets from ``offset``, each
        stamped with its time in ``stamps`` (ns), and index them; the position after the
        last. Lock held, room made."""
        mm, mq, cap, base = self._mm, self._mq, self._cap, self._base
        index_w, slots = self._index_w, self._slots
        pos = start
        for (key, hraw, value), size, now_ns in zip(items, sizes, stamps):
            pos, a = ring.place(mm, base, cap, pos, size)
            if key is None:
                ring.write_record(mm, a, _READY, size, _EMPTY if value is None else value, hraw, offset, now_ns,
                                  flags if value is not None else _NULL | flags)
            else:  # the key before the headers, its length + 1 in the deadline's word
                ring.write_record(mm, a, _READY, size, _EMPTY if value is None else value, key + hraw, offset, now_ns,
                                  flags if value is not None else _NULL | flags, len(key) + 1)
            if offset % _STRIDE == 0:
                _index(mq, index_w, slots, offset, pos)
            offset += 1
            pos += size
        return pos

    def _ensure_index(self, first, end) -> None:
        """Allocate the index words of offsets [first, end) (every INDEX_STRIDE-th). Lock held."""
        s0, s1 = -(-first // _STRIDE), -(-end // _STRIDE)
        if s1 > s0:
            self._memory.ensure_arc(L.PART_INDEX_OFF, 8 * self._slots, 8 * s0, 8 * s1)

    def prepare(self, nbytes: int) -> int:
        """Make the next ``nbytes`` of ring past the tail ready for this process's appends:
        allocated (as an append allocates) and mapped into its page tables
        (``Memory.map_in``), a piece at a time under the lock, so that the append that
        comes writes at memory speed instead of taking a page fault a page (on this
        machine most of a large append's time). A writer that knows what comes calls it
        while it waits (the JVM sink's publisher, between Spark's batches). Memory no
        append comes to use goes back at a round, as any room ahead does. Returns the
        bytes it went over."""
        nbytes, done = min(max(0, nbytes), self._cap), 0
        mem, cap, base = self._memory, self._cap, self._base
        while done < nbytes:
            self._acquire()
            try:
                head, tail = self._mq[L.PI_HEAD], self._mq[L.PI_TAIL]
                start = tail + cap - tail % cap if head == tail and tail % cap else tail  # (an empty one's next lap)
                lo, hi = start + done, start + min(nbytes, done + PREPARE_PIECE)
                try:
                    mem.ensure_arc(base, cap, lo, hi)
                except StorageError:  # (/dev/shm is full: the append says so, as it would have)
                    return done
                for a, b in arc(base, cap, lo, hi):
                    mem.map_in(a, b)
            finally:
                _unlock(self._lockp)
            done = hi - start
        return done

    # ------------------------------------------------------------------ memory given back
    def give_back(self, now: int | None = None) -> int:
        """Give back the memory of what retention dropped (``memory.Memory.give_back``):
        everything below the fence, a head this partition had ``GIVE_BACK_GRACE_NS`` ago
        (a reader without the lock may still be there until then), bar the room ahead of
        the tail that the appends since the last round wrote as much of. Returns the bytes
        given back. Lock held."""
        mq, mem, cap, base = self._mq, self._memory, self._cap, self._base
        now = time.monotonic_ns() if now is None else now
        self._round_due = now + GIVE_BACK_PERIOD_NS
        head, tail, low, end = mq[L.PI_HEAD], mq[L.PI_TAIL], mq[L.PI_EARLIEST], mq[L.PI_NEXT]
        seen = mem.word("cand_ns")
        if not seen or now - seen >= L.GIVE_BACK_GRACE_NS:
            if seen:
                mem.set_word("fence", mem.word("cand"))
                mem.set_word("fence_low", mem.word("cand_low"))
            mem.set_word("cand", head)
            mem.set_word("cand_low", low)
            mem.set_word("cand_ns", now)
        fence, fence_low = min(mem.word("fence"), head), min(mem.word("fence_low"), low)
        mark = mem.word("mark")
        mem.set_word("mark", tail)
        ahead = min(cap - (tail - head), tail - mark if tail >= mark else cap)
        start = tail + cap - tail % cap if head == tail and tail % cap else tail  # (an empty one's next lap)
        keep = arc(base, cap, fence, tail) + arc(base, cap, start, start + ahead)
        index = 8 * self._slots
        keep += arc(L.PART_INDEX_OFF, index, 8 * (fence_low // _STRIDE), 8 * (-(-end // _STRIDE) + INDEX_AHEAD))
        return mem.give_back(keep, stamp=None if ahead or fence != head else (head, tail))

    def housekeep(self, retention_ns: int | None = None, retention_bytes: int | None = None, floor=None,
                  now: int | None = None) -> tuple[int, int]:
        """Retention in memory, then its memory back (``give_back``): records whose
        timestamp is more than ``retention_ns`` old, and the oldest while the ring holds
        more than ``retention_bytes`` of them, are dropped (with ``floor``, a function
        giving the lowest offset a group still needs: only those below it, as
        retention="block" drops). Returns (records dropped, bytes given back)."""
        limit = None if floor is None else floor()
        self._acquire()
        try:
            dropped = self._expire(retention_ns, retention_bytes, limit, _wall_ns()) \
                if retention_ns or retention_bytes else 0
            return dropped, self.give_back(now)
        finally:
            _unlock(self._lockp)

    def _expire(self, retention_ns, retention_bytes, limit, wall) -> int:
        """Drop the records retention no longer keeps, at most EXPIRE_MAX a call (the next
        round goes on). Lock held."""
        mq, cap, base = self._mq, self._cap, self._base
        head, tail = mq[L.PI_HEAD], mq[L.PI_TAIL]
        cutoff = wall - retention_ns if retention_ns else -1
        new_head, earliest, n = head, None, 0
        for pos, w in ring.records(mq, cap, base, head, tail):
            if mq[w] & 0xFF != _PAD:
                offset = mq[w + _R_MSG_ID]
                old = mq[w + _R_ENQ] < cutoff or (retention_bytes and tail - pos > retention_bytes)
                if not old or n >= EXPIRE_MAX or (limit is not None and offset >= limit):
                    earliest = offset
                    break
                n += 1
            new_head = pos + (mq[w + _R_LENGTH] & 0xFFFFFFFF)
        else:
            new_head = tail
        if not n:
            return 0
        plog.drop(mq, new_head, n, mq[L.PI_NEXT] if earliest is None else earliest, new_head - head)
        return n

    # ------------------------------------------------------------------ the publishers' table
    def published(self, txn_id: bytes) -> int:
        """The newest batch publisher ``txn_id`` published here (``append(txn=...)``), -1
        if none (or its entry made room for newer publishers')."""
        self._acquire()
        try:
            return self._txn_batch(txn_id)
        finally:
            _unlock(self._lockp)

    def _txn_slot(self, txn_id):
        """(slot of ``txn_id`` or None, the slot to take for a new one). Lock held."""
        free = oldest = None
        oldest_ns = None
        for i in range(L.MAX_TXNS):
            tid, _b, _e, _pb, _pe, ns = L.TXN.unpack_from(self._mm, L.PART_TXN_OFF + i * L.TXN.size)
            if tid == txn_id:
                return i, None
            if tid == _NO_TXN:
                free = i if free is None else free
            elif oldest_ns is None or ns < oldest_ns:
                oldest, oldest_ns = i, ns
        return None, (free if free is not None else oldest)

    def _txn_batch(self, txn_id) -> int:
        i, _new = self._txn_slot(txn_id)
        if i is None:
            return -1
        return L.TXN.unpack_from(self._mm, L.PART_TXN_OFF + i * L.TXN.size)[1] - 1

    def _txn_note(self, txn_id, batch, end, now_ns) -> None:
        """Say that ``txn_id`` published ``batch`` up to offset ``end`` (``plog.txn_note``). Lock held."""
        i, new = self._txn_slot(txn_id)
        plog.txn_note(self._mq, new if i is None else i, i is None, txn_id, batch, end, now_ns)

    def _txn_rows(self) -> list:
        rows = []
        for i in range(L.MAX_TXNS):
            tid, b, end, _pb, _pe, _ns = L.TXN.unpack_from(self._mm, L.PART_TXN_OFF + i * L.TXN.size)
            if tid != _NO_TXN:
                rows.append((tid, b - 1, end))
        return rows

    # ------------------------------------------------------------------ deleting records
    def trim(self, offset: int) -> int:
        """Move the partition's start up to ``offset`` (at most the end), as Kafka's
        deleteRecords moves its log start offset: the records below it dropped from memory
        now, as retention would for room; where no record is at ``offset`` (compaction took
        it), a read there goes on at the next record. Returns how many records were
        dropped. A "wal" partition's logs on disk stay for retention to delete."""
        mq = self._mq
        self._acquire()
        try:
            head, tail, end = mq[L.PI_HEAD], mq[L.PI_TAIL], mq[L.PI_NEXT]
            offset = min(offset, end)
            if offset <= self._low():
                return 0
            n = 0
            if offset > mq[L.PI_EARLIEST] and head != tail:
                found = self._find(offset)
                new_head, earliest = (tail, end) if found is None else found
                n = sum(1 for _pos, w in ring.records(mq, self._cap, self._base, head, new_head)
                        if mq[w] & 0xFF != _PAD)
                plog.drop(mq, new_head, n, earliest, new_head - head)
            plog.start_at(mq, offset)
            return n
        finally:
            _unlock(self._lockp)

    # ------------------------------------------------------------------ the high-water mark
    def _raise_mark(self, need):
        """Say on disk that offsets below a new mark (past ``need``) may be handed out:
        by the span since the last snapshot, at least twice the span of the epoch
        before, so a busy partition writes it about once per snapshot. Lock held."""
        mq = self._mq
        mark = need + max(HWM_MIN_SPAN, 2 * mq[L.PI_HWM_SPAN], need - mq[L.PI_HWM_BASE])
        _gen, mode, _ms, directory = self.log.config()
        writes = mq[L.PI_HWM_WRITES]
        self._hwm.write(directory, writes, mq[L.PI_HWM_EPOCH], mark, mode != L.WAL_NEVER)
        plog.mark_raised(mq, writes, mark)

    def start_marks(self) -> int:
        """After the broker configured the data dir (``log.configure``): begin a high-water
        epoch at the end, so every offset handed out from now on is below a mark on disk
        (the first append past it writes one). Returns the epoch."""
        self._acquire()
        try:
            return plog.new_epoch(self._mq)
        finally:
            _unlock(self._lockp)

    # ------------------------------------------------------------------ snapshots and rebuilds
    def export(self, roll_bytes: int | None = None, roll_ns: int | None = None, backup: bool = False) -> Image:
        """Every record in memory, for a snapshot. The lock is held only to copy the used
        part of the ring and, in the same critical section, to begin a new high-water
        epoch ("snapshot"), or ("wal") to start a new log generation when the current one
        holds ``roll_bytes`` or began ``roll_ns`` ago: older generations hold nothing
        past the copy, and whole files are what retention deletes.

        ``backup``: a copy for elsewhere that changes nothing here (no new epoch, no new
        generation); a "wal" partition's image says how far its current log went at the
        copy (``log_size``), so the log up to there and the copy agree."""
        mm, mq, cap, base = self._mm, self._mq, self._cap, self._base
        wal_from = epoch = log_size = None
        self._acquire()
        try:
            head, tail, end = mq[L.PI_HEAD], mq[L.PI_TAIL], mq[L.PI_NEXT]
            if backup:
                if self._logged and mq[_LOG_GEN_W]:
                    wal_from, log_size = mq[_LOG_GEN_W], self.log.size()
            elif self._logged and mq[_LOG_GEN_W]:
                now, size = time.time_ns(), self.log.size()
                began = mq[L.PI_WAL_ROLLED] or now
                plog.wal_rolled(mq, began)
                if size and ((roll_bytes is not None and size >= roll_bytes)
                             or (roll_ns is not None and now - began >= roll_ns)):
                    self.log.rotate()
                    plog.wal_rolled(mq, now)
                wal_from = mq[_LOG_GEN_W]
            elif self._marked and mq[_LOG_GEN_W]:
                epoch = plog.new_epoch(mq)
            copy = ring.copy_used(mm, base, cap, head, tail)
            txns = self._txn_rows()
        finally:
            _unlock(self._lockp)
        rows = []
        for o, (status, _length, bl, hl, flags, off, ts, klen) in ring.copied_records(copy, cap, head, tail):
            if status & 0xFF != _PAD:
                b = o + _REC
                h = b + (klen - 1 if klen else 0)
                rows.append((off, ts, bytes(copy[b:h]) if klen else None, bytes(copy[h:b + hl]),
                             None if flags & _NULL else bytes(copy[b + hl:b + hl + bl])))
        return Image(rows, end, wal_from, epoch, txns, log_size)

    def restore(self, rows, next_offset: int, hwm_epoch: int = 0, txns=(), compacted: bool = False) -> int:
        """Fill this empty partition of a stream being rebuilt: ``rows`` are (offset,
        timestamp_ns, key, headers, value) in ascending offsets (gaps allowed), the next
        append gets ``next_offset`` (at least past the last row), ``txns`` the publishers'
        table as exported, (id, batch, end), or with the time each was written, (id,
        batch, end, ns), oldest first (when more than the table holds, the newest stay).
        The newest rows that fit are kept, the oldest dropped as retention would.
        ``compacted``: the rows are a compacted stream's, whose gaps compaction made (a
        read there goes on at the next row). Returns how many were kept."""
        rows = list(rows)
        sizes = [record_size(k, h, v) for _o, _t, k, h, v in rows]
        keep, total = len(rows), 0
        while keep and total + sizes[keep - 1] <= self._cap:
            total += sizes[keep - 1]
            keep -= 1
        rows, sizes = rows[keep:], sizes[keep:]
        if rows:
            next_offset = max(next_offset, rows[-1][0] + 1)
        mm, mq, cap, base = self._mm, self._mq, self._cap, self._base
        self._acquire()
        try:
            if mq[L.PI_NEXT] or mq[L.PI_TAIL]:
                raise ShmqError(f"stream {self.name!r}: partition {self.index} is not empty; only a new stream "
                                "is rebuilt")
            self._memory.ensure_arc(base, cap, 0, self._placement_end(sizes, 0))
            if rows:
                self._ensure_index(rows[0][0], rows[-1][0] + 1)
            pos = 0
            for (offset, ts, key, hraw, value), size in zip(rows, sizes):
                pos, a = ring.place(mm, base, cap, pos, size)
                ring.write_record(mm, a, _READY, size, _EMPTY if value is None else value,
                                  hraw if key is None else key + hraw, offset, ts, _NULL if value is None else 0,
                                  0 if key is None else len(key) + 1)
                if offset % _STRIDE == 0:
                    _index(mq, self._index_w, self._slots, offset, pos)
                pos += size
            plog.restored(mq, pos, rows[0][0] if rows else next_offset, next_offset, hwm_epoch, keep,
                          rows[-1][0] + 1 if compacted and rows else None)
            for txn_id, batch, end, *ns in txns:
                self._txn_note(txn_id, batch, end, ns[0] if ns else 0)
        finally:
            _unlock(self._lockp)
        return len(rows)

    # ------------------------------------------------------------------ the disk tail
    def disk_files(self) -> list[tuple[int, int, str]]:
        """(generation, first offset or None when empty, path) of this partition's logs in
        the data dir, oldest first ([] unless "wal" and configured)."""
        directory = self.log.config()[3] if self._logged else ""
        if not directory:
            return []
        return [(gen, self._tail.first_offset(path), path) for gen, path in log_files(directory, self.log.name)]

    def set_disk_first(self, offset: int | None) -> None:
        """Say where the logs on disk begin (the broker, after retention or a rebuild)."""
        self._acquire()
        try:
            plog.set_disk_first(self._mq, offset)
        finally:
            _unlock(self._lockp)

    # ------------------------------------------------------------------ read
    def _in_range(self, offset):
        """(where to read from, earliest in memory, end) when ``offset`` can be read (in
        memory, or on disk; below earliest, in what compaction or a trim left without
        records, from earliest), else OffsetOutOfRange: below the start (``_low``) or
        past the end. Lock held."""
        mq = self._mq
        earliest, end, low = mq[L.PI_EARLIEST], mq[L.PI_NEXT], self._low()
        if offset < low or offset > end:
            raise OffsetOutOfRange(f"stream {self.name!r} partition {self.index}: offset {offset} is outside "
                                   f"[{low}, {end}]", low, end)
        if offset < earliest:
            disk = mq[L.PI_DISK_FIRST]
            if not disk or offset < disk - 1:  # (not on disk: no record there, nor up to earliest)
                return earliest, earliest, end
        return offset, earliest, end

    def read_columns(self, offset: int, max_records: int):
        """A reader's records (``read(visible=True)``'s) from memory as Arrow buffers
        (``_fast.read_columns``: n, then offsets and data of values, keys (with a validity
        bitmap) and encoded headers, the values' validity bitmap (None: no null value), then
        offsets and timestamps in us, and the offset to read on from), or None: no C build,
        or ``offset`` is on disk only (``read`` reads there). The same errors as ``read``."""
        read_columns = self.paths.read_columns
        if read_columns is None:  # the Python paths
            return None
        mq = self._mq
        self._acquire()
        try:
            offset, earliest, end = self._in_range(offset)
            if offset < earliest:
                return None
            clean = mq[L.PI_CLEANED] - 1
            found = self._find(offset) if offset < end else None
            if found is None or found[1] != offset:
                if found is None and (offset == end or end <= clean):  # at the end, or only compacted offsets left
                    return read_columns(self._mm, self._base, self._cap, 0, 0, 0, 0, -1)[:11] + (end,)
                if found is None or found[1] > clean:
                    raise self._lost(offset, end if found is None else found[1], end)
            stop = self._stable()
            cols = read_columns(self._mm, self._base, self._cap, found[0], mq[L.PI_TAIL], max_records, stop, clean)
            return cols if cols[11] else cols[:11] + (max(offset, min(found[1], stop)),)
        finally:
            _unlock(self._lockp)

    def read(self, offset: int, max_records: int, max_bytes: int | None = None, visible: bool = False) -> list:
        """Up to ``max_records`` records from ``offset`` on, as (offset, timestamp, key,
        encoded headers, value or None); [] at the end. Below what memory holds, a "wal"
        partition reads its logs on disk. OffsetOutOfRange below the readable range, past
        the end, or inside a gap (offsets lost with a reboot or a damaged file: its
        ``earliest`` says where to read on). With ``max_bytes``, stops before the values
        would exceed it (the first record is always returned). Every record as stored
        (the Kafka listener's, a copy's), or with ``visible`` a reader's: below the last
        stable offset, transactions' markers and aborted records passed over (they count
        in ``max_records``), as ``Rows`` (``next``: where to read on)."""
        mm, mq, cap, base = self._mm, self._mq, self._cap, self._base
        out = Rows() if visible else []
        self._acquire()
        try:
            offset, earliest, end = self._in_range(offset)
            stop = end
            if visible:
                out.next = offset
                st = mq[_PI_STABLE]
                if st and st - 1 < end:
                    stop = st - 1
            if offset >= stop:
                return out
            if offset < earliest:  # on disk only: read there, without the lock
                directory = self.log.config()[3]
            else:
                clean = mq[L.PI_CLEANED] - 1  # (-1: never compacted) a gap up to it is compaction's
                found = self._find(offset)
                if found is None or found[1] != offset:
                    if found is None and stop <= clean:  # only compacted offsets left below the stop
                        if visible:
                            out.next = stop
                        return out
                    if found is None or found[1] > clean:
                        raise self._lost(offset, end if found is None else found[1], end)
                budget, last, looked = max_bytes, offset - 1, 0
                for _pos, w in ring.records(mq, cap, base, found[0], mq[L.PI_TAIL]):
                    a = w << 3
                    status, _length, bl, hl, flags, off, ts, klen = _REC_UNPACK(mm, a)
                    if status & 0xFF == _PAD:
                        continue
                    if (off != last + 1 and off > clean) or off >= stop:  # a gap (the next read is told of it); a
                        break  # transaction open
                    if visible and flags & _HIDDEN:
                        last, looked = off, looked + 1
                        if looked >= max_records:
                            break
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
                    out.append((off, ts, key, h, None if flags & _NULL else mm[b + hl:b + hl + bl]))
                    last, looked = off, looked + 1
                    if looked >= max_records:
                        break
                if visible:  # (nothing looked at: past a compacted gap, up to the stop)
                    out.next = last + 1 if looked else max(offset, min(found[1], stop))
                return out
        finally:
            _unlock(self._lockp)
        rows, resume = self._tail.read(directory, offset, max_records, earliest, max_bytes)
        if not rows:
            raise self._lost(offset, earliest if resume is None else resume, end)
        if visible:  # (on disk: the records below the last stable offset, as logged)
            out.extend(r for r in rows if r[0] < stop)
            out.next = out[-1][0] + 1 if out else offset
            rows = out
        if len(rows) < max_records and max_bytes is None and rows and rows[-1][0] + 1 == earliest:
            try:  # and on into memory
                more = self.read(earliest, max_records - len(rows), visible=visible)
                rows += more
                if visible:
                    rows.next = max(rows.next, more.next)
            except OffsetOutOfRange:  # retention moved on meanwhile: the next read goes to disk
                pass
        return rows
