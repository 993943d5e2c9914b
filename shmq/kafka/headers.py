"""Record headers between Kafka and shmq: a Kafka header is a str key and bytes (or
null), in order, a key possibly repeated; a native stream record's headers are a dict
of str to str, int, float, bool or bytes, or a list of (key, value or None) pairs where
a dict cannot hold them (``shmq.model.headers``). docs/KAFKA.md, Headers.

Strategy: Kafka -> native keeps every header in order: a dict when the keys are unique
and no value is null, else the list of pairs (``from_pairs``, the one rule). Native ->
Kafka writes every pair in order: bytes as they are, None as null, str as UTF-8, bool as
``true`` / ``false``, int and float in decimal (``repr``). Kafka's headers thus come back
as they went. A Produce's headers become their column in C (``_records.headers_column``)
where it is built, else by ``native_column_py``, its twin; a Fetch's stored headers become
Kafka's in C (``_records.kafka_headers``) where their values are null, bytes or str.
"""

import array
import itertools

from ..model.headers import MAX_HEADERS_BYTES, decode_headers, encode_record_headers, from_pairs, header_pairs
from .records import _c

__all__ = ["to_native", "to_kafka", "native_column", "stored_to_kafka"]


def to_native(headers) -> dict | list | None:
    """Kafka's (key, value or None) pairs as a native record's headers (None for none)."""
    if not headers:
        return None
    return from_pairs(headers)


def _as_bytes(v) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, bool):
        return b"true" if v else b"false"
    return repr(v).encode()


def to_kafka(headers) -> tuple:
    """A native record's headers (a dict, or a list of pairs) as Kafka's (key, bytes or
    None) pairs, in their order."""
    return tuple((k, _as_bytes(v)) for k, v in header_pairs(headers))


def native_column(headers: list) -> tuple[bytes, array.array]:
    """Each record's Kafka headers (``()`` for none) as a binary column of native encoded
    headers (``encode_record_headers(to_native(h))``): (data, int32 offsets). In C where
    it is built; the Python twin for what C leaves to it (headers over MAX_HEADERS_BYTES:
    MessageTooLarge)."""
    got = None if _c is None else _c.headers_column(headers, MAX_HEADERS_BYTES)
    if got is None:
        return native_column_py(headers)
    offsets = array.array("i")
    offsets.frombytes(got[1])
    return got[0], offsets


def native_column_py(headers: list) -> tuple[bytes, array.array]:
    """``native_column`` in Python."""
    items = [encode_record_headers(to_native(h)) if h else b"" for h in headers]
    return b"".join(items), array.array("i", itertools.accumulate(map(len, items), initial=0))


def stored_to_kafka(raw: bytes) -> tuple:
    """A stored record's encoded headers (non-empty) as Kafka's pairs:
    ``to_kafka(decode_headers(raw))``, in C where it is built and every value is null,
    bytes or str."""
    got = None if _c is None or type(raw) is not bytes else _c.kafka_headers(raw)
    return to_kafka(decode_headers(raw)) if got is None else got
