"""Produce: record batches appended to a stream's partition, and the sequence numbers of
idempotent producers (``Sequences``), so a retried batch is appended once.

Strategy: a partition's batches are appended as one chunk of columns (values, keys,
encoded headers: ``Stream.append_columns``, written in C; all or nothing), each record
with the timestamp its producer gave it (CreateTime), or the time of the append (a topic
with message.timestamp.type LogAppendTime, which Produce answers), on the loop, or on a
thread for a stream with retention="block" (its append may wait for the slowest group).
A compacted topic (``Stream.compact``) refuses a record without a key, as Kafka does
(INVALID_RECORD, the batch index of each: ``_keyless``), appending none of the
partition's records.
A batch whose records come back unchanged is kept as it came (``batches.Batches``) for
the fetches of its offsets, where the topic serves it so (``batches.servable``: its
compression.type and timestamp type). An idempotent batch (producer id >= 0) is
checked against the last sequence this listener appended for that producer, epoch and
partition, as a Kafka broker does: the next one is appended; one of the last five
batches again (a retry after a lost response) is answered with the offset it got
the first time, appending nothing; a gap is OUT_OF_ORDER_SEQUENCE_NUMBER; an older epoch
is INVALID_PRODUCER_EPOCH. The state lives in the listener's memory, kept over a clean
restart of a server with a data dir (``state``); otherwise a restart forgets it (the
producer then hears UNKNOWN_PRODUCER_ID for a batch past its first and starts a new
epoch).
"""

import array
import asyncio
import itertools
import logging
import time
from collections import OrderedDict, deque

from ...engine.shm.waits import serving
from ...errors import ShmqError, StreamNotFound
from ...kafka import ErrorCode, KafkaProtocolError
from ...kafka.codes import code_of
from ...kafka.headers import native_column
from ...kafka.messages import response_class
from ...kafka.records import CONTROL, NO_PRODUCER, TRANSACTIONAL, decode_batches
from ...kafka import build
from ..transactions.state import ProducerIds
from .batches import servable

__all__ = ["produce", "Sequences"]

log = logging.getLogger("shmq.server")

MAX_EPOCH = 32767
RECENT = 5  # batches remembered per producer and partition (Kafka's max.in.flight for idempotence)
MAX_PRODUCER_PARTITIONS = 100_000  # (producer, partition) states kept; the least recently used go first
MAX_TIMESTAMP_MS = (2**63 - 1) // 1_000_000  # a record's timestamp, stored in ns


class _State:
    __slots__ = ("epoch", "last", "recent")

    def __init__(self, epoch):
        self.epoch = epoch
        self.last = -1
        self.recent = deque(maxlen=RECENT)  # (first seq, last seq, base offset)


class Sequences:
    """Producer ids handed out, and per (producer id, stream, partition) the sequence
    numbers appended."""

    def __init__(self, ids=None):
        # the server's producer ids, shared with its transaction coordinator (None: ids of its own)
        self.ids = ids if ids is not None else ProducerIds()
        self._parts = OrderedDict()

    def init(self, producer_id: int, epoch: int) -> tuple[int, int]:
        """InitProducerId: a new id at epoch 0, or (KIP-360: the producer names its id and
        epoch) the same id at the next epoch."""
        if producer_id >= 0 and 0 <= epoch < MAX_EPOCH:
            return producer_id, epoch + 1
        return self.ids.next(), 0

    def check(self, key, epoch: int, first: int, last: int):
        """Before appending a batch of sequences first..last: None (append it), the
        base offset of the same batch appended before (a retry), or KafkaProtocolError
        with Kafka's code."""
        st = self._parts.get(key)
        if st is None or epoch > st.epoch:
            if first != 0:
                code = ErrorCode.unknown_producer_id if st is None else ErrorCode.out_of_order_sequence_number
                raise KafkaProtocolError(f"sequence {first} from a producer (epoch {epoch}) this partition has no "
                                         "batch of", code)
            return None
        if epoch < st.epoch:
            raise KafkaProtocolError(f"producer epoch {epoch} is older than {st.epoch}",
                                     ErrorCode.invalid_producer_epoch)
        for f, la, offset in st.recent:
            if f == first and la == last:
                return offset
        if first != (st.last + 1) % 2**31:
            raise KafkaProtocolError(f"sequence {first} where {(st.last + 1) % 2**31} was expected",
                                     ErrorCode.out_of_order_sequence_number)
        return None

    def export(self) -> list:
        """The state as JSON-able rows: [producer id, stream, creation time, partition,
        epoch, last sequence, [[first, last, offset] of the recent batches]]."""
        return [[*key, st.epoch, st.last, [list(r) for r in st.recent]] for key, st in self._parts.items()]

    def restore(self, rows, created_at) -> int:
        """Take back ``export``'s rows whose stream has the same creation time now
        (``created_at(name)``); returns how many. ValueError or TypeError for rows not
        of that shape."""
        n = 0
        for pid, name, created, p, epoch, last, recent in rows:
            if not all(type(x) is int for x in (pid, p, epoch, last)) or not isinstance(name, str):
                raise ValueError(f"a producer state row {[pid, name, p, epoch, last]!r}")
            if created_at(name) != created:
                continue
            st = self._parts[(pid, name, created, p)] = _State(epoch)
            st.last = last
            st.recent.extend((int(f), int(la), int(o)) for f, la, o in recent)
            self.ids.above(pid)
            n += 1
        return n

    def record(self, key, epoch, first, last, offset):
        """A batch was appended."""
        st = self._parts.get(key)
        if st is None or epoch > st.epoch:
            st = self._parts[key] = _State(epoch)
        self._parts.move_to_end(key)
        st.last = last
        st.recent.append((first, last, offset))
        while len(self._parts) > MAX_PRODUCER_PARTITIONS:
            self._parts.popitem(last=False)


async def produce(ctx, header, request):
    server = ctx.server
    acks = request.acks
    refuse = None
    if acks not in (-1, 0, 1):
        refuse = (ErrorCode.invalid_required_acks, f"acks={acks}: -1, 0 or 1")
    responses = []
    for t in request.topic_data:
        s, code = (None, refuse[0]) if refuse else server.topic(t.name, create=True)
        parts = []
        for pd in t.partition_data:
            entry = {"index": pd.index, "error_code": code, "base_offset": -1, "log_append_time": -1,
                     "log_start_offset": -1}
            if refuse:
                entry["error_message"] = refuse[1]
            elif s is not None:
                await _append(server, s, pd, entry, request.transactional_id)
            parts.append(entry)
        responses.append({"name": t.name, "partition_responses": parts})
    if acks == 0:
        return None
    return build(response_class(header.request_api_key, header.request_api_version), {"responses": responses})


async def _append(server, s, pd, entry, tid):
    """Append one partition's batches (``tid``: the Produce's transactional id, or None);
    the outcome into ``entry``."""
    p = pd.index
    try:
        if not 0 <= p < s.partitions:
            raise StreamNotFound(f"topic {s.name!r} has partitions 0..{s.partitions - 1}, not {p}")
        batches = decode_batches(pd.records or b"", server.max_frame_bytes)
        if not batches:
            raise KafkaProtocolError("a Produce without a record batch", ErrorCode.invalid_record)
        if not all(b.count for b in batches):
            raise KafkaProtocolError("a record batch without records", ErrorCode.invalid_record)
        if any(b.attributes & CONTROL for b in batches):
            raise KafkaProtocolError("a control batch from a producer (only a transaction coordinator writes "
                                     "markers)", ErrorCode.invalid_record)
        txn = bool(batches[0].attributes & TRANSACTIONAL)
        if any(bool(b.attributes & TRANSACTIONAL) != txn for b in batches):
            raise KafkaProtocolError("transactional and plain batches in one partition's records",
                                     ErrorCode.invalid_record)
        if s.compact and _keyless(s, p, batches, entry):
            return
        if txn:
            server.txns.producing(tid, batches[0].producer_id, batches[0].producer_epoch, s, p)
        idem = batches[0].producer_id != NO_PRODUCER
        key = first = last = epoch = None
        if idem:
            if len(batches) != 1:
                raise KafkaProtocolError("an idempotent Produce carries one batch per partition",
                                         ErrorCode.invalid_record)
            b = batches[0]
            key, epoch, first, last = (b.producer_id, s.name, s.created_at, p), b.producer_epoch, b.base_sequence, \
                b.last_sequence
            seen = server.sequences.check(key, epoch, first, last)
            if seen is not None:  # a retry of a batch appended before
                log.info("topic %s partition %d: producer %d's batch %d..%d again (a retry): answered with offset "
                         "%d, appended once", s.name, p, key[0], first, last, seen,
                         extra={"event": "kafka_duplicate_batch", "topic": s.name, "partition": p,
                                "producer_id": key[0], "offset": seen})
                entry.update(error_code=ErrorCode.none, base_offset=seen, log_start_offset=s.offsets(p)[0])
                return
        chunk, stamps = columns(batches)
        now = None
        if s.timestamp_type == "log_append_time":  # (message.timestamp.type) the records take the time of the append
            now = time.time_ns()
            stamps = [now] * len(stamps)
        intent = None
        if txn:  # (journaled first: a server killed before its note finds these records again)
            intent = server.txns.appending(batches[0].producer_id, batches[0].producer_epoch, s, p,
                                           [v for b in batches for v in b.values])
        try:
            if s.retention == "block":  # may wait for the slowest group: not on the loop
                offset = await asyncio.to_thread(s.append_columns, chunk, p, stamps)
            else:
                with serving():  # (this loop serves the fetches: ``notify``, no post to its doorbells)
                    offset = s.append_columns(chunk, p, timestamps_ns=stamps)
        except BaseException:
            if intent is not None:
                server.txns.not_appended(intent)
            raise
        server.notify(s.name)
        if idem:
            server.sequences.record(key, epoch, first, last, offset)
        if txn:
            server.txns.produced(batches[0].producer_id, batches[0].producer_epoch, s, p, offset,
                                 sum(b.count for b in batches), intent)
        entry.update(error_code=ErrorCode.none, base_offset=offset, log_start_offset=s.offsets(p)[0],
                     log_append_time=-1 if now is None else now // 1_000_000)
        at = offset
        for b in batches:
            if b.raw is not None and servable(s, b.attributes & 0x07):
                server.batches.put(s, p, at, b.raw, b.count)
            at += b.count
    except (ShmqError, ValueError, TypeError, OverflowError) as e:
        entry.update(error_code=code_of(e) if isinstance(e, ShmqError) else ErrorCode.invalid_record,
                     error_message=str(e)[:500])


def _keyless(s, p, batches, entry) -> bool:
    """Whether a compacted topic refuses ``batches``, as Kafka's broker does: the first
    batch with a record without a key answers INVALID_RECORD, with the index in that
    batch of each such record (``record_errors``, Produce v8+), into ``entry``; nothing
    is appended."""
    for b in batches:
        missing = [i for i, k in enumerate(b.keys) if k is None]
        if missing:
            why = f"Compacted topic cannot accept message without key in topic partition {s.name}-{p}."
            entry.update(error_code=ErrorCode.invalid_record,
                         error_message=f"{why} ({len(missing)} of a batch's {b.count} records have none: none of "
                                       "this partition's records was appended)",
                         record_errors=[{"batch_index": i, "batch_index_error_message": why} for i in missing])
            return True
    return False


def columns(batches) -> tuple[tuple, list]:
    """The records of ``batches`` as one chunk of ``Stream.append_columns`` (a null value
    a tombstone, in the values' validity bitmap; Kafka headers the native encoded ones,
    every one in order), and their timestamps in ns (a record without one, -1, takes the
    time of the append). KafkaProtocolError (INVALID_TIMESTAMP) for a timestamp past what
    ns since the epoch hold in 63 bits."""
    if len(batches) == 1:
        b = batches[0]
        values, keys, headers, ms = b.values, b.keys, b.headers, b.timestamps
    else:
        values, keys, headers, ms = ([x for b in batches for x in getattr(b, f)]
                                     for f in ("values", "keys", "headers", "timestamps"))
    n = len(values)
    vdata, voffs, vvalid = _binary(values)
    koffs = kdata = kvalid = None
    if keys.count(None) < n:
        kdata, koffs, kvalid = _binary(keys)
    hoffs = hdata = None
    if headers.count(()) < n:
        hdata, hoffs = native_column(headers)
    if min(ms) < 0:
        now = time.time_ns() // 1_000_000
        ms = [now if t < 0 else t for t in ms]
    if max(ms) > MAX_TIMESTAMP_MS:
        raise KafkaProtocolError(f"a record timestamp of {max(ms)} ms: at most {MAX_TIMESTAMP_MS}",
                                 ErrorCode.invalid_timestamp)
    return (n, voffs, vdata, koffs, kdata, kvalid, hoffs, hdata, vvalid), [t * 1_000_000 for t in ms]


def _binary(items) -> tuple[bytes, array.array, bytes | None]:
    """An Arrow binary column of ``items`` (None: null): (data, int32 offsets, validity
    bitmap, None when no item is null)."""
    valid = None
    if None in items:
        bits = bytearray((len(items) + 7) // 8)
        for i, x in enumerate(items):
            if x is not None:
                bits[i >> 3] |= 1 << (i & 7)
        valid = bytes(bits)
        items = [b"" if x is None else x for x in items]
    return b"".join(items), array.array("i", itertools.accumulate(map(len, items), initial=0)), valid
