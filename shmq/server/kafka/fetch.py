"""Fetch: records read from streams' partitions as record batches, and the long poll
(``max_wait_ms``, ``min_bytes``) on the lines of the streams asked for.

Strategy: one read of every partition asked, within the partition's and the response's
byte budgets (the first record of the response always comes, as Kafka's KIP-74); if it
holds fewer than ``min_bytes`` bytes and the client will wait, the fetch lines up on the
line (``waiters.StreamWaiters``) of each stream it reads, whose doorbell rings for an
append from anyone; each ring reads again, and the first read that holds enough, or the
deadline, answers. A partition's records go out as the batches their Kafka producers
sent, where the listener kept them and the topic's configs allow (``batches.servable``),
else encoded from the stream, in the topic's compression.type (uncompressed for
"producer"); a record's timestamp is its stored one in ms (a Kafka producer's, or the
time a native append made it); a tombstone's value is null, and headers go out as stored,
every one in order (``kafka.headers.stored_to_kafka``).
"""

import asyncio

from ...errors import OffsetOutOfRange, ShmqError
from ...kafka import ErrorCode
from ...kafka.codes import code_of
from ...kafka.headers import stored_to_kafka
from ...kafka.messages import response_class
from ...kafka.compression import NONE
from ...kafka.records import CONTROL, LOG_APPEND_TIME, TRANSACTIONAL, Record, encode_batch, last_offset
from ...kafka import build
from ..waiters import Waiter
from .batches import served_codec, servable
from ..transactions.index import DATA

__all__ = ["fetch"]

CHUNK = 500  # records read at a time while a budget lasts
READ_COMMITTED = 1  # a Fetch's isolation level: records of committed transactions only
FETCH_MSG_TYPE = 1  # what the waiters' lines call a Kafka Fetch (for their logs only)


_record = tuple.__new__  # a Record made without its __new__'s Python frame (a third of the cost)


def _read(s, p, offset, stop, budget, first):
    """(records, bytes) of partition ``p`` from ``offset`` up to ``stop`` within
    ``budget`` bytes of values, keys and headers (the first record of the response
    whatever its size)."""
    out, used = [], 0
    while offset < stop:
        # (a byte bound too: a fetch of big records copies what it sends, not CHUNK of them)
        rows = s.read_raw(p, offset, min(CHUNK, stop - offset), max(budget - used, 1))
        if not rows:
            return out, used
        for off, ts, key, hraw, value in rows:
            if off >= stop:
                return out, used
            size = (len(value) if value is not None else 0) + len(hraw) + (len(key) if key is not None else 0) + 16
            if used + size > budget and not (first and not out):
                return out, used
            used += size
            headers = stored_to_kafka(hraw) if hraw else ()
            out.append(_record(Record, (off, ts // 1_000_000, key, value, headers)))  # (rows hold bytes)
        offset = rows[-1][0] + 1
        if len(rows) < CHUNK:
            return out, used
    return out, used


def _encode(records, codec, log_append, txns, out) -> None:
    """``records`` as batches into ``out``: one per transactional span (``txns``' spans:
    a producer's records, marked transactional with its id and epoch, or a marker, as a
    control batch), the rest in batches of their own; a LogAppendTime topic's one per
    append time."""
    if txns is None:
        _plain(records, codec, log_append, out)
        return
    spans = txns.spans_in(records[0].offset, records[-1].offset + 1)
    i = 0
    for first, end, pid, epoch, kind in spans:
        j = i
        while j < len(records) and records[j].offset < first:
            j += 1
        if j > i:
            _plain(records[i:j], codec, log_append, out)
        i = j
        while j < len(records) and records[j].offset < end:
            j += 1
        if j > i:
            if kind == DATA:
                _plain(records[i:j], codec, log_append, out, TRANSACTIONAL, pid, epoch)
            else:
                out.append(encode_batch(records[i:j], NONE, pid, epoch, attributes=TRANSACTIONAL | CONTROL))
        i = j
    if i < len(records):
        _plain(records[i:], codec, log_append, out)


def _plain(records, codec, log_append, out, attributes=0, pid=-1, epoch=-1) -> None:
    """``records`` as one batch (a LogAppendTime topic's: one per append time) into ``out``."""
    if log_append:  # a batch's records share its time (its max timestamp, as clients read it)
        start = 0
        for i in range(1, len(records) + 1):
            if i == len(records) or records[i].timestamp != records[start].timestamp:
                out.append(encode_batch(records[start:i], codec, pid, epoch,
                                        attributes=attributes | LOG_APPEND_TIME))
                start = i
    else:
        out.append(encode_batch(records, codec, pid, epoch, attributes=attributes))


def _batches(server, s, p, offset, end, budget, first, txns=None) -> tuple[list, int]:
    """The record batches of partition ``p`` from ``offset`` to ``end`` within
    ``budget``: kept ones as the producer sent them (``batches.servable``), the others
    encoded from the stream (``_encode``), in the topic's codec; (the batches' bytes,
    their size). ``txns``: the partition's transactions (``TxnIndex``), or None."""
    out, used = [], 0
    codec, log_append = served_codec(s) or 0, s.timestamp_type == "log_append_time"
    while offset < end and used < budget:
        raw, after = server.batches.find(s, p, offset)
        if raw is not None and not servable(s, raw[22] & 0x07):  # (the attributes' low byte: the codec)
            raw = None  # read and encoded anew, up to the kept batch's end
        if raw is not None:
            if used + len(raw) > budget and not (first and not out):
                break
            out.append(raw)
            used += len(raw)
            offset = after
            continue
        records, n = _read(s, p, offset, end if after is None else min(after, end), budget - used, first and not out)
        if not records:
            if after is not None and after < end:  # a kept batch's records all compacted away: on past it
                offset = after
                continue
            break
        _encode(records, codec, log_append, txns, out)
        used += n
        offset = records[-1].offset + 1
    return out, used


def _read_all(server, request):
    """(the response's topics, the bytes of records in them). A read_committed fetch
    (isolation level 1) reads up to the last stable offset, and is told of the aborted
    transactions in what it got."""
    total, budget, topics = 0, request.max_bytes if request.max_bytes > 0 else 2**31, []
    committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
    index = server.txns.index
    for t in request.topics:
        s, code = server.topic(t.topic)
        parts = []
        for rp in t.partitions:
            entry = {"partition_index": rp.partition, "error_code": code, "high_watermark": -1,
                     "last_stable_offset": -1, "log_start_offset": -1, "records": b"", "preferred_read_replica": -1}
            parts.append(entry)
            if s is None:
                continue
            try:
                if not 0 <= rp.partition < s.partitions:
                    entry["error_code"] = ErrorCode.unknown_topic_or_partition
                    continue
                earliest, end = s.offsets(rp.partition)
                txns = index.get(s, rp.partition)
                stable = end if txns is None else txns.stable(end)
                entry.update(high_watermark=end, last_stable_offset=stable, log_start_offset=earliest)
                if committed:
                    entry["aborted_transactions"] = []
                if rp.fetch_offset < earliest or rp.fetch_offset > end:
                    entry["error_code"] = ErrorCode.offset_out_of_range
                    continue
                upto = stable if committed else end
                if rp.fetch_offset >= upto:
                    continue
                batches, used = _batches(server, s, rp.partition, rp.fetch_offset, upto,
                                         min(rp.partition_max_bytes, budget), first=total == 0, txns=txns)
                if batches and committed and txns is not None:
                    entry["aborted_transactions"] = [
                        {"producer_id": pid, "first_offset": first} for pid, first in
                        txns.aborted_between(rp.fetch_offset, last_offset(batches[-1]) + 1)]
                if batches:
                    entry["records"] = batches[0] if len(batches) == 1 else b"".join(batches)
                    total += used
                    budget -= used
            except OffsetOutOfRange:
                entry["error_code"] = ErrorCode.offset_out_of_range
            except ShmqError as e:
                entry["error_code"] = code_of(e)
        topics.append({"topic": t.topic, "partitions": parts})
    return topics, total


class _Poll:
    """One waiting fetch, lined up on every stream it reads: the first answer wins."""

    def __init__(self, server, request, lines):
        self.server = server
        self.request = request
        self.lines = lines
        self.future = server.loop.create_future()
        self.waiters = []

    def take(self, _args):
        topics, total = _read_all(self.server, self.request)
        return (topics, total) if total >= self.request.min_bytes else None

    def answer(self, w, result):  # the ``conn`` of its waiters
        for other in self.waiters:
            if other is not w:
                other.line.drop(other)
        if not self.future.done():
            self.future.set_result(result)


async def fetch(ctx, header, request):
    server = ctx.server
    topics, total = _read_all(server, request)
    wait_s = request.max_wait.total_seconds()
    if request.min_bytes > 0 and total < request.min_bytes and wait_s > 0 and not (ctx.closing or ctx.gone):
        lines = []
        for t in request.topics:
            s, _code = server.topic(t.topic)
            if s is not None:
                lines.append(server.streams.line_of(s))
        if lines:
            poll = _Poll(server, request, lines)
            deadline = server.loop.time() + wait_s
            for line in lines:
                w = Waiter(poll, line, 0, FETCH_MSG_TYPE, poll.take, None, None)
                poll.waiters.append(w)
                line.add(w, deadline)
            try:
                result = await poll.future
            except asyncio.CancelledError:  # the connection went
                poll.answer(None, None)
                raise
            if isinstance(result, tuple) and len(result) == 2:
                topics, total = result
            else:  # the deadline (NOTHING), or an error: what is there now
                topics, total = _read_all(server, request)
    return build(response_class(header.request_api_key, header.request_api_version),
                 {"error_code": ErrorCode.none, "session_id": 0, "responses": topics})
