"""A stream partition's control words: where its log is in the ring (head, tail, the
earliest and the next offset), what moved it (appended, dropped, compacted), the index of
offsets, the high-water mark, the publishers' table and the recount after a death, each
written once. ``ring.py`` is the same for a queue's ring.

Strategy: like ``ring``, these work on the segment as 64-bit words (``mq``) and know
nothing of locks, logs or time: every caller holds the partition's lock and passes what
it found. The order of the stores is the crash contract (``recount`` finds a consistent
partition from any prefix of them), so each sequence lives here and nowhere else.
"""

from . import layout as L
from .ring import records

__all__ = ["drop", "lap", "commit", "index", "start_at", "cleaned", "compacted", "restored", "mark_raised",
           "new_epoch", "set_stable", "set_disk_first", "wal_rolled", "txn_note", "txn_repair", "recount"]

_REC, _PAD = L.REC_SIZE, L.PAD
R_LENGTH, R_MSG_ID = L.R_LENGTH, L.R_MSG_ID
PI_HEAD, PI_TAIL, PI_EARLIEST, PI_NEXT = L.PI_HEAD, L.PI_TAIL, L.PI_EARLIEST, L.PI_NEXT
PI_COMPACT_LOW, PI_CLEANED = L.PI_COMPACT_LOW, L.PI_CLEANED
PI_DROPPED, PI_BYTES_DROPPED, PI_APPENDED = L.PI_DROPPED, L.PI_BYTES_DROPPED, L.PI_APPENDED
STRIDE = L.INDEX_STRIDE


def drop(mq, new_head, dropped, earliest, freed) -> None:
    """The head moves to ``new_head`` past ``dropped`` records (``freed`` bytes): retention,
    room for an append, a trim. ``earliest``: the first offset left (None: unchanged, the
    append that follows says it). A drop ends what compaction said of the start."""
    if dropped:
        mq[PI_COMPACT_LOW] = 0
    mq[PI_BYTES_DROPPED] += freed
    mq[PI_HEAD] = new_head
    mq[PI_DROPPED] += dropped
    if earliest is not None:
        mq[PI_EARLIEST] = earliest


def lap(mq, start) -> None:
    """An append begins a new lap at ``start``: the tail moves there first (after the head),
    so no moment has garbage between head and tail."""
    mq[PI_TAIL] = start


def commit(mq, end, first, n) -> None:
    """Publish ``n`` records written up to ring position ``end``, offsets from ``first``:
    the tail's store is the commit."""
    if mq[PI_HEAD] == mq[PI_TAIL]:
        mq[PI_EARLIEST] = first
    mq[PI_TAIL] = end
    mq[PI_NEXT] = first + n
    mq[PI_APPENDED] += n


def index(mq, index_w, slots, offset, pos) -> None:
    """Say that the record of ``offset`` (a multiple of the stride) is at ring position ``pos``."""
    mq[index_w + (offset // STRIDE) % slots] = pos


def start_at(mq, offset) -> None:
    """Kafka's log start moves to ``offset`` (a trim): below the earliest record left, it is
    kept as the compacted start; at or past it, the earliest record says it."""
    mq[PI_COMPACT_LOW] = offset + 1 if offset < mq[PI_EARLIEST] else 0


def cleaned(mq, upto) -> None:
    """Compaction looked at every offset below ``upto``."""
    mq[PI_CLEANED] = max(mq[PI_CLEANED], upto + 1)


def compacted(mq, upto, head, earliest, freed, tail=None) -> None:
    """A compaction's result is published: its image from ``head`` (to ``tail``, where it
    wrote one past the old tail; None: the old records from ``head`` on stay), the first
    offset left ``earliest``, ``freed`` bytes taken. The start offset the log had before is
    kept (Kafka's log start does not move for a compaction). The image's index is the
    caller's before this, or after, by ``index``."""
    if not mq[PI_COMPACT_LOW]:
        mq[PI_COMPACT_LOW] = mq[PI_EARLIEST] + 1
    cleaned(mq, upto)
    if tail is not None:
        mq[PI_TAIL] = tail  # (a recount from here on finds the image by its offsets going down)
    mq[PI_HEAD] = head
    mq[PI_EARLIEST] = earliest
    mq[L.PI_COMPACTIONS] += 1
    mq[L.PI_BYTES_COMPACTED] += max(freed, 0)


def restored(mq, end, earliest, next_offset, hwm_epoch, dropped, cleaned_to=None) -> None:
    """An empty partition holds the records a rebuild wrote from position 0 up to ``end``:
    published with the tail's store. ``cleaned_to``: they were compacted below it."""
    mq[PI_EARLIEST] = earliest
    mq[PI_HEAD] = 0
    mq[PI_TAIL] = end
    mq[PI_NEXT] = next_offset
    mq[L.PI_HWM_EPOCH] = hwm_epoch
    mq[L.PI_HWM_BASE] = next_offset
    mq[PI_DROPPED] = dropped
    if cleaned_to is not None:  # (below the first record: compacted, as far as a reader can tell)
        mq[PI_CLEANED] = cleaned_to
        mq[PI_COMPACT_LOW] = 1


# --- the high-water mark -------------------------------------------------------------
def mark_raised(mq, writes, mark) -> None:
    """The high-water file now says ``mark`` (its ``writes``-th write)."""
    mq[L.PI_HWM_WRITES] = writes + 1
    mq[L.PI_HWM] = mark


def new_epoch(mq) -> int:
    """A snapshot of the records up to the end is being taken: nothing past the end is
    handed out until the high-water file says so again. Returns the epoch."""
    end = mq[PI_NEXT]
    mq[L.PI_HWM_EPOCH] += 1
    mq[L.PI_HWM_SPAN] = end - mq[L.PI_HWM_BASE]
    mq[L.PI_HWM_BASE] = mq[L.PI_HWM] = end
    return mq[L.PI_HWM_EPOCH]


# --- words set whole -----------------------------------------------------------------
def set_stable(mq, offset) -> None:
    """Readers read below ``offset`` (None: no transaction is open)."""
    mq[L.PI_STABLE] = 0 if offset is None else offset + 1


def set_disk_first(mq, offset) -> None:
    """The logs on disk begin at ``offset`` (None: none)."""
    mq[L.PI_DISK_FIRST] = 0 if offset is None else offset + 1


def wal_rolled(mq, ns) -> None:
    """The current log began at wall time ``ns``."""
    mq[L.PI_WAL_ROLLED] = ns


# --- the publishers' table -------------------------------------------------------------
def _txn_w(slot) -> int:
    return (L.PART_TXN_OFF + slot * L.TXN.size) >> 3


def txn_note(mq, slot, new, txn_id, batch, end, now_ns) -> None:
    """Say in ``slot`` that publisher ``txn_id`` published ``batch`` up to offset ``end``,
    keeping what it said before for a repair (``new``: the slot was free or another's).
    Word by word, in an order where a kill between any two stores leaves an entry that
    ``txn_repair`` makes right (``struct.pack_into`` zeroes the whole entry before it
    writes the fields: a kill there lost the publisher's batch)."""
    w = _txn_w(slot)
    if new:  # no id first, then the fields, the id last
        mq[w] = mq[w + 1] = 0
        mq[w + 5] = mq[w + 4] = mq[w + 3] = 0
    else:  # the previous note kept, then the end (past the end until the commit), then the batch
        mq[w + 4], mq[w + 5] = mq[w + 2], mq[w + 3]
    mq[w + 3] = end
    mq[w + 2] = batch + 1
    mq[w + 6] = now_ns
    if new:
        mq[w], mq[w + 1] = int.from_bytes(txn_id[:8], "little"), int.from_bytes(txn_id[8:], "little")


def txn_repair(mq, next_offset) -> None:
    """Take back what a dead appender noted of a publish whose records it never committed
    (its end is past ``next_offset``): the entry goes back to its previous note, or is
    freed when it had none. Each store leaves an entry this repair makes right again."""
    for i in range(L.MAX_TXNS):
        w = _txn_w(i)
        if (mq[w] or mq[w + 1]) and mq[w + 3] > next_offset:
            if mq[w + 4]:
                mq[w + 2] = mq[w + 4]
                mq[w + 3] = mq[w + 5]
                mq[w + 4] = mq[w + 5] = 0
            else:
                mq[w] = mq[w + 1] = 0


# --- the recount after a death ------------------------------------------------------
def recount(mq, cap, base) -> int:
    """The head, tail and earliest offset found again from the records after the lock's
    previous holder died inside an append, a drop or a compaction (whose image, published
    up to its head's store, restarts the offsets: the head moves to it); the next offset is
    never lowered (offsets past a gap stay handed out), and a publish never committed is
    taken back from the publishers' table. Returns the next offset (``Partition._repair``
    does the rest)."""
    head, tail = mq[PI_HEAD], mq[PI_TAIL]
    first = last = None
    for pos, w in records(mq, cap, base, head, tail):
        length = mq[w + R_LENGTH] & 0xFFFFFFFF
        if length < _REC or length % 8 or pos % cap + length > cap or pos + length > tail:
            tail = pos  # a record the dead writer never finished
            break
        if mq[w] & 0xFF == _PAD:
            continue
        off = mq[w + R_MSG_ID]
        if last is not None and off <= last:  # a compaction's image, published up to its head's store
            head, first = pos, None
        last = off
        if first is None:
            first = last
    mq[PI_HEAD] = head
    mq[PI_TAIL] = tail
    nxt = mq[PI_NEXT]
    if last is not None:
        nxt = mq[PI_NEXT] = max(nxt, last + 1)
        mq[PI_EARLIEST] = first
    else:
        mq[PI_HEAD] = tail
        mq[PI_EARLIEST] = nxt
    txn_repair(mq, nxt)
    return nxt
