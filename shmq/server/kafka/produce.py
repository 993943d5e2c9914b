"""Produce: record batches appended to a stream's partition, and the sequence numbers of
idempotent producers (``Sequences``), so a retried batch is appended once.

Strategy: a partition's batches are appended in one ``append_many`` (all or nothing),
on the loop, or on a thread for a stream with retention="block" (its append may wait for
the slowest group). An idempotent batch (producer id >= 0) is checked against the last
sequence this listener appended for that producer, epoch and partition, as a Kafka
broker does: the next one is appended; one of the last five batches again (a retry after
a lost response) is answered with the offset it got the first time, appending nothing;
a gap is OUT_OF_ORDER_SEQUENCE_NUMBER; an older epoch is INVALID_PRODUCER_EPOCH. The
state lives in the listener's memory: a server restart forgets it (the producer then
hears UNKNOWN_PRODUCER_ID for a batch past its first and starts a new epoch).
"""

import asyncio
import logging
import time
from collections import OrderedDict, deque

from ...errors import ShmqError, StreamNotFound
from ...kafka import ErrorCode, KafkaProtocolError
from ...kafka.codes import code_of
from ...kafka.headers import to_native
from ...kafka.messages import response_class
from ...kafka.records import CONTROL, NO_PRODUCER, TRANSACTIONAL, decode_batches
from ...kafka import build

__all__ = ["produce", "Sequences"]

log = logging.getLogger("shmq.server")

MAX_EPOCH = 32767
RECENT = 5  # batches remembered per producer and partition (Kafka's max.in.flight for idempotence)
MAX_PRODUCER_PARTITIONS = 100_000  # (producer, partition) states kept; the least recently used go first


class _State:
    __slots__ = ("epoch", "last", "recent")

    def __init__(self, epoch):
        self.epoch = epoch
        self.last = -1
        self.recent = deque(maxlen=RECENT)  # (first seq, last seq, base offset, append time ms)


class Sequences:
    """Producer ids handed out, and per (producer id, stream, partition) the sequence
    numbers appended."""

    def __init__(self):
        self._next = int(time.time() * 1000) << 10  # above any id a previous run of this listener gave
        self._parts = OrderedDict()

    def init(self, producer_id: int, epoch: int) -> tuple[int, int]:
        """InitProducerId: a new id at epoch 0, or (KIP-360: the producer names its id and
        epoch) the same id at the next epoch."""
        if producer_id >= 0 and 0 <= epoch < MAX_EPOCH:
            return producer_id, epoch + 1
        self._next += 1
        return self._next, 0

    def check(self, key, epoch: int, first: int, last: int):
        """Before appending a batch of sequences first..last: None (append it), the
        (base offset, append time) of the same batch appended before (a retry), or
        KafkaProtocolError with Kafka's code."""
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
        for f, la, offset, ts in st.recent:
            if f == first and la == last:
                return offset, ts
        if first != (st.last + 1) % 2**31:
            raise KafkaProtocolError(f"sequence {first} where {(st.last + 1) % 2**31} was expected",
                                     ErrorCode.out_of_order_sequence_number)
        return None

    def record(self, key, epoch, first, last, offset, ts_ms):
        """A batch was appended."""
        st = self._parts.get(key)
        if st is None or epoch > st.epoch:
            st = self._parts[key] = _State(epoch)
        self._parts.move_to_end(key)
        st.last = last
        st.recent.append((first, last, offset, ts_ms))
        while len(self._parts) > MAX_PRODUCER_PARTITIONS:
            self._parts.popitem(last=False)


async def produce(ctx, header, request):
    server = ctx.server
    acks = request.acks
    refuse = None
    if acks not in (-1, 0, 1):
        refuse = (ErrorCode.invalid_required_acks, f"acks={acks}: -1, 0 or 1")
    elif request.transactional_id is not None:
        refuse = (ErrorCode.transactional_id_authorization_failed, "transactions are not supported")
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
                await _append(server, s, pd, entry)
            parts.append(entry)
        responses.append({"name": t.name, "partition_responses": parts})
    if acks == 0:
        return None
    return build(response_class(header.request_api_key, header.request_api_version), {"responses": responses})


async def _append(server, s, pd, entry):
    """Append one partition's batches; the outcome into ``entry``."""
    p = pd.index
    try:
        if not 0 <= p < s.partitions:
            raise StreamNotFound(f"topic {s.name!r} has partitions 0..{s.partitions - 1}, not {p}")
        batches = decode_batches(pd.records or b"", server.max_frame_bytes)
        if not batches:
            raise KafkaProtocolError("a Produce without a record batch", ErrorCode.invalid_record)
        if any(b.attributes & (TRANSACTIONAL | CONTROL) for b in batches):
            raise KafkaProtocolError("transactional batches are not supported",
                                     ErrorCode.transactional_id_authorization_failed)
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
                         "%d, appended once", s.name, p, key[0], first, last, seen[0],
                         extra={"event": "kafka_duplicate_batch", "topic": s.name, "partition": p,
                                "producer_id": key[0], "offset": seen[0]})
                entry.update(error_code=ErrorCode.none, base_offset=seen[0], log_append_time=seen[1],
                             log_start_offset=s.offsets(p)[0])
                return
        records = [r for b in batches for r in b.records]
        values = [b"" if r.value is None else r.value for r in records]
        keys = [r.key for r in records]
        headers = [to_native(r.headers) for r in records]
        if s.retention == "block":  # may wait for the slowest group: not on the loop
            metas = await asyncio.to_thread(s.append_many, values, keys, headers, p)
        else:
            metas = s.append_many(values, keys=keys, headers=headers, partition=p)
        server.notify(s.name)
        ts_ms = int(metas[0].timestamp * 1000)
        if idem:
            server.sequences.record(key, epoch, first, last, metas[0].offset, ts_ms)
        entry.update(error_code=ErrorCode.none, base_offset=metas[0].offset, log_append_time=ts_ms,
                     log_start_offset=s.offsets(p)[0])
    except (ShmqError, ValueError, TypeError) as e:
        entry.update(error_code=code_of(e) if isinstance(e, ShmqError) else ErrorCode.invalid_record,
                     error_message=str(e)[:500])
