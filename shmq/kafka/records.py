"""Kafka's record batches, magic 2: decoding what producers send, encoding what
consumers fetch.

Strategy: a batch is a fixed 61-byte header (``_HEAD``), an int32 count, then the
records — each a varint length, then varint/varlong deltas against the batch's base
offset and timestamp, key, value and headers. The CRC-32C covers everything from the
attributes on; the records part may be compressed (``compression``). Decoding checks
every length against what is there and bounds what decompression may produce, so any
bytes give batches or KafkaProtocolError (code CORRUPT_MESSAGE), nothing else.
(kio has a record codec too, but it keeps timestamps to the second and knows no
compression.) The records of a batch are read and written in C (``_records.c``) where it
is built and the C paths are wanted (``SHMQ_PURE_PYTHON``, as the engine's ``cpaths``
reads it), else by ``_decode_records_py`` and ``_encode_records_py``, their twins: each
pair agrees on every input (tests/kafka/test_codec.py).
"""

import os
import struct
from dataclasses import dataclass
from typing import NamedTuple

from crc32c import crc32c

from .codes import ErrorCode, KafkaProtocolError
from .compression import NONE, compress, decompress
from .control import ABORT, COMMIT, CONTROL, TRANSACTIONAL, marker

__all__ = ["Batch", "Record", "decode_batches", "encode_batch", "NO_PRODUCER", "TRANSACTIONAL", "CONTROL",
           "LOG_APPEND_TIME", "ABORT", "COMMIT", "marker", "last_offset"]

try:
    from . import _records as _c
except ImportError:  # pragma: no cover - depends on the build
    _c = None
if os.environ.get("SHMQ_PURE_PYTHON", "") not in ("", "0"):
    _c = None

_HEAD = struct.Struct(">qiibIhiqqqhii")  # base offset .. record count
_CRC_FROM = 21  # the attributes' position: the CRC covers the rest
_LENGTH_AFTER = 12  # the batch length counts from after base offset and itself
NO_PRODUCER = -1
LOG_APPEND_TIME = 0x08


class Record(NamedTuple):
    """One record: offset and timestamp (ms) resolved from its batch; headers as
    (key, value or None) pairs in their order. (A named tuple: a Fetch makes one per
    record it encodes, at half a frozen dataclass's cost.)"""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple = ()


@dataclass(frozen=True, slots=True)
class Batch:
    """A decoded batch, by columns (one entry per record): ``timestamps`` (ms),
    ``offset_deltas``, ``keys`` and ``values`` (bytes or None), ``headers`` (tuples of
    (key, value or None)). ``raw``: the batch's bytes as sent, where they can be served
    to a consumer as they are (``servable``), else None."""

    base_offset: int
    attributes: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    timestamps: list
    offset_deltas: list
    keys: list
    values: list
    headers: list
    raw: bytes | None = None

    @property
    def count(self) -> int:
        return len(self.values)

    @property
    def last_sequence(self) -> int:
        """The sequence number of the batch's last record (sequences wrap at 2**31)."""
        return (self.base_sequence + self.count - 1) % 2**31

    @property
    def records(self) -> list:
        """The records as ``Record`` values."""
        b = self.base_offset
        return [Record(b + d, t, k, v, h) for d, t, k, v, h in
                zip(self.offset_deltas, self.timestamps, self.keys, self.values, self.headers)]


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
        body = decompress(codec, body, limit) if codec != NONE else bytes(body)
        ts, deltas, keys, values, headers = _decode_records(body, count, base_ts)
        servable = not attributes & LOG_APPEND_TIME and last_delta == count - 1 and deltas == list(range(count))
        out.append(Batch(base_offset, attributes, producer_id, producer_epoch, base_sequence, ts, deltas, keys, values,
                         headers, bytes(data[pos:end]) if servable else None))
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
    return buf[pos:pos + n], pos + n


def _decode_records(buf: bytes, count, base_ts):
    """The columns of ``count`` records in ``buf`` (timestamps, offset deltas, keys,
    values, headers), read in C where it is built, else by ``_decode_records_py``."""
    if _c is None:
        return _decode_records_py(buf, count, base_ts)
    try:
        return _c.decode_records(buf, count, base_ts)
    except ValueError as e:
        raise _corrupt(str(e)) from None


def _decode_records_py(buf: bytes, count, base_ts):
    """``_decode_records`` in Python. The varints that are mostly one or two bytes
    (lengths, deltas) are read inline, longer ones by ``_varint`` (a call per field
    costs a third of the decode)."""
    n = len(buf)
    if count > n:  # each record takes 7 bytes at least: no list sized by a lie
        raise _corrupt(f"that says {count} records in {n} bytes")
    ts, deltas, keys, values, headers = [], [], [], [], []
    pos, none = 0, ()
    for i in range(count):
        if pos >= n:
            raise _corrupt("with a varint cut short or too long")
        b = buf[pos]
        if b < 0x80:
            length, pos = (b >> 1) ^ -(b & 1), pos + 1
        elif pos + 1 < n and buf[pos + 1] < 0x80:  # 64..8191 bytes: two
            b = (b & 0x7F) | buf[pos + 1] << 7
            length, pos = (b >> 1) ^ -(b & 1), pos + 2
        else:
            length, pos = _varint(buf, pos, n)
        end = pos + length
        if length < 6 or end > n:
            raise _corrupt(f"with a record of {length} bytes where {n - pos} are left")
        # attributes (unused), then the timestamp and offset deltas
        b = buf[pos + 1]
        if b < 0x80:
            t, pos = (b >> 1) ^ -(b & 1), pos + 2
        else:
            t, pos = _varint(buf, pos + 1, end)
        b = buf[pos] if pos < end else 0x80
        if b < 0x80:
            d, pos = (b >> 1) ^ -(b & 1), pos + 1
        elif pos + 1 < end and buf[pos + 1] < 0x80:
            b = (b & 0x7F) | buf[pos + 1] << 7
            d, pos = (b >> 1) ^ -(b & 1), pos + 2
        else:
            d, pos = _varint(buf, pos, end)
        ts.append(base_ts + t)
        deltas.append(d)
        b = buf[pos] if pos < end else 0x80  # the key: mostly null (1) or short
        if b == 1:
            keys.append(None)
            pos += 1
        else:
            k, pos = _bytes(buf, pos, end)
            keys.append(k)
        b = buf[pos] if pos < end else 0x80  # the value's length: mostly one or two bytes
        if b < 0x80:
            vn, pos = (b >> 1) ^ -(b & 1), pos + 1
        elif pos + 1 < end and buf[pos + 1] < 0x80:
            b = (b & 0x7F) | buf[pos + 1] << 7
            vn, pos = (b >> 1) ^ -(b & 1), pos + 2
        else:
            vn, pos = _varint(buf, pos, end)
        if vn == -1:
            v = None
        elif 0 <= vn <= end - pos:
            v, pos = buf[pos:pos + vn], pos + vn
        else:
            raise _corrupt(f"with a field of {vn} bytes where {end - pos} are left")
        values.append(v)
        if pos < end and buf[pos] == 0:
            headers.append(none)
            pos += 1
        else:
            pairs, pos = _headers(buf, pos, end)
            headers.append(pairs)
        if pos != end:
            raise _corrupt("with a record longer than its fields")
    if pos != n:
        raise _corrupt(f"with {n - pos} bytes after its {count} records")
    return ts, deltas, keys, values, headers


def _headers(buf, pos, end):
    nh, pos = _varint(buf, pos, end)
    if nh < 0 or nh > end - pos:
        raise _corrupt(f"with a record of {nh} headers")
    pairs = []
    for _h in range(nh):
        hk, pos = _bytes(buf, pos, end)
        hv, pos = _bytes(buf, pos, end)
        if hk is None:
            raise _corrupt("with a header without a key")
        try:
            pairs.append((hk.decode(), hv))
        except UnicodeDecodeError:
            raise _corrupt("with a header key that is not UTF-8") from None
    return tuple(pairs), pos


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


def _encode_records_py(records, base_offset, base_ts) -> bytearray:
    """The records part of a batch of ``records`` (uncompressed): in C where it is built
    (``_records.encode_records``, its twin), else here."""
    body = bytearray()
    rec = bytearray()
    for r in records:
        rec.clear()
        rec.append(0)
        _zigzag(r.timestamp - base_ts, rec)
        _zigzag(r.offset - base_offset, rec)
        _put_bytes(r.key, rec)
        _put_bytes(r.value, rec)
        _zigzag(len(r.headers), rec)
        for hk, hv in r.headers:
            _put_bytes(hk.encode(), rec)
            _put_bytes(hv, rec)
        _zigzag(len(rec), body)
        body += rec
    return body


def encode_batch(records, codec: int = NONE, producer_id: int = NO_PRODUCER, producer_epoch: int = -1,
                 base_sequence: int = -1, attributes: int = 0) -> bytes:
    """One batch of ``records`` (``Record``s, offsets ascending), compressed with ``codec``."""
    first, last = records[0], records[-1]
    base_ts = first.timestamp
    max_ts = max(r.timestamp for r in records)
    body = (_encode_records_py if _c is None else _c.encode_records)(records, first.offset, base_ts)
    payload = compress(codec, bytes(body)) if codec != NONE else body
    head = _HEAD.pack(first.offset, _HEAD.size - _LENGTH_AFTER + len(payload), 0, 2, 0,
                      attributes | codec, last.offset - first.offset, base_ts, max_ts, producer_id,
                      producer_epoch, base_sequence, len(records))
    out = bytearray(head)
    out += payload
    struct.pack_into(">I", out, 17, crc32c(memoryview(out)[_CRC_FROM:]))
    return bytes(out)


def last_offset(raw) -> int:
    """The offset of the last record of an encoded batch (its base offset plus its last
    offset delta)."""
    base, _length, _epoch, _magic, _crc, _attributes, last_delta = _HEAD.unpack_from(raw, 0)[:7]
    return base + last_delta
