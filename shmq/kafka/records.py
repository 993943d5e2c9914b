"""Kafka's record batches, magic 2: decoding what producers send, encoding what
consumers fetch.

Strategy: a batch is a fixed 61-byte header (``_HEAD``), an int32 count, then the
records — each a varint length, then varint/varlong deltas against the batch's base
offset and timestamp, key, value and headers. The CRC-32C covers everything from the
attributes on; the records part may be compressed (``compression``). Decoding checks
every length against what is there and bounds what decompression may produce, so any
bytes give batches or KafkaProtocolError (code CORRUPT_MESSAGE), nothing else.
(kio has a record codec too, but it keeps timestamps to the second and knows no
compression.)
"""

import struct
from dataclasses import dataclass

from crc32c import crc32c

from .codes import ErrorCode, KafkaProtocolError
from .compression import NONE, compress, decompress

__all__ = ["Batch", "Record", "decode_batches", "encode_batch", "NO_PRODUCER", "TRANSACTIONAL", "CONTROL"]

_HEAD = struct.Struct(">qiibIhiqqqhii")  # base offset .. record count
_CRC_FROM = 21  # the attributes' position: the CRC covers the rest
_LENGTH_AFTER = 12  # the batch length counts from after base offset and itself
NO_PRODUCER = -1
TRANSACTIONAL, CONTROL, LOG_APPEND_TIME = 0x10, 0x20, 0x08


@dataclass(frozen=True, slots=True)
class Record:
    """One record: offset and timestamp (ms) resolved from its batch; headers as
    (key, value or None) pairs in their order."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple = ()


@dataclass(frozen=True, slots=True)
class Batch:
    base_offset: int
    attributes: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: list

    @property
    def last_sequence(self) -> int:
        """The sequence number of the batch's last record (sequences wrap at 2**31)."""
        return (self.base_sequence + len(self.records) - 1) % 2**31


def _corrupt(why: str) -> KafkaProtocolError:
    return KafkaProtocolError(f"a record batch {why}", ErrorCode.corrupt_message)


def decode_batches(data, limit: int) -> list[Batch]:
    """The batches in ``data`` (a Produce request's records); ``limit``: the most bytes
    a compressed batch may unfold to. KafkaProtocolError (CORRUPT_MESSAGE) for anything
    that is not a well-formed batch of magic 2, or with a wrong CRC."""
    data = memoryview(data)
    out, pos = [], 0
    while pos < len(data):
        if len(data) - pos < _HEAD.size:
            raise _corrupt(f"cut short: {len(data) - pos} bytes, less than a batch header")
        (base_offset, length, _epoch, magic, crc, attributes, last_delta, base_ts, _max_ts, producer_id,
         producer_epoch, base_sequence, count) = _HEAD.unpack_from(data, pos)
        if magic != 2:
            raise KafkaProtocolError(f"a record batch of magic {magic}: only magic 2 is taken",
                                     ErrorCode.unsupported_for_message_format)
        end = pos + _LENGTH_AFTER + length
        if length < _HEAD.size - _LENGTH_AFTER or end > len(data):
            raise _corrupt(f"of length {length} where {len(data) - pos - _LENGTH_AFTER} bytes are left")
        if crc32c(data[pos + _CRC_FROM:end]) != crc:
            raise _corrupt("with a wrong CRC-32C")
        if count < 0 or last_delta < 0:
            raise _corrupt(f"of {count} records, last offset delta {last_delta}")
        body = data[pos + _HEAD.size:end]
        codec = attributes & 0x07
        if codec != NONE:
            body = memoryview(decompress(codec, body, limit))
        records = _decode_records(body, count, base_offset, base_ts)
        out.append(Batch(base_offset, attributes, producer_id, producer_epoch, base_sequence, records))
        pos = end
    return out


def _varint(buf, pos, end):
    """A zigzag varint (up to 64 bits) at ``pos``: (value, next position)."""
    n = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _corrupt("with a varint cut short or too long")
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return (n >> 1) ^ -(n & 1), pos
        shift += 7


def _bytes(buf, pos, end):
    n, pos = _varint(buf, pos, end)
    if n == -1:
        return None, pos
    if n < 0 or pos + n > end:
        raise _corrupt(f"with a field of {n} bytes where {end - pos} are left")
    return bytes(buf[pos:pos + n]), pos + n


def _decode_records(buf, count, base_offset, base_ts):
    records, pos, n = [], 0, len(buf)
    if count > n:  # each record takes 7 bytes at least: no list sized by a lie
        raise _corrupt(f"that says {count} records in {n} bytes")
    for _ in range(count):
        length, pos = _varint(buf, pos, n)
        end = pos + length
        if length < 6 or end > n:
            raise _corrupt(f"with a record of {length} bytes where {n - pos} are left")
        pos += 1  # attributes (unused)
        ts_delta, pos = _varint(buf, pos, end)
        off_delta, pos = _varint(buf, pos, end)
        key, pos = _bytes(buf, pos, end)
        value, pos = _bytes(buf, pos, end)
        nh, pos = _varint(buf, pos, end)
        if nh < 0 or nh > end - pos:
            raise _corrupt(f"with a record of {nh} headers")
        headers = []
        for _h in range(nh):
            hk, pos = _bytes(buf, pos, end)
            hv, pos = _bytes(buf, pos, end)
            if hk is None:
                raise _corrupt("with a header without a key")
            try:
                headers.append((hk.decode(), hv))
            except UnicodeDecodeError:
                raise _corrupt("with a header key that is not UTF-8") from None
        if pos != end:
            raise _corrupt("with a record longer than its fields")
        records.append(Record(base_offset + off_delta, base_ts + ts_delta, key, value, tuple(headers)))
    if pos != n:
        raise _corrupt(f"with {n - pos} bytes after its {count} records")
    return records


def _zigzag(n: int, out: bytearray) -> None:
    n = (n << 1) ^ (n >> 63)
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _put_bytes(b, out):
    if b is None:
        out.append(1)  # zigzag(-1)
        return
    _zigzag(len(b), out)
    out += b


def encode_batch(records, codec: int = NONE, producer_id: int = NO_PRODUCER, producer_epoch: int = -1,
                 base_sequence: int = -1, attributes: int = 0) -> bytes:
    """One batch of ``records`` (``Record``s, offsets ascending), compressed with ``codec``."""
    first, last = records[0], records[-1]
    base_ts = first.timestamp
    max_ts = max(r.timestamp for r in records)
    body = bytearray()
    rec = bytearray()
    for r in records:
        rec.clear()
        rec.append(0)
        _zigzag(r.timestamp - base_ts, rec)
        _zigzag(r.offset - first.offset, rec)
        _put_bytes(r.key, rec)
        _put_bytes(r.value, rec)
        _zigzag(len(r.headers), rec)
        for hk, hv in r.headers:
            _put_bytes(hk.encode(), rec)
            _put_bytes(hv, rec)
        _zigzag(len(rec), body)
        body += rec
    payload = compress(codec, bytes(body)) if codec != NONE else body
    head = _HEAD.pack(first.offset, _HEAD.size - _LENGTH_AFTER + len(payload), 0, 2, 0,
                      attributes | codec, last.offset - first.offset, base_ts, max_ts, producer_id,
                      producer_epoch, base_sequence, len(records))
    out = bytearray(head)
    out += payload
    struct.pack_into(">I", out, 17, crc32c(memoryview(out)[_CRC_FROM:]))
    return bytes(out)
