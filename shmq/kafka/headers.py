"""Record headers between Kafka and shmq: a Kafka header is a str key and bytes (or
null), in order, a key possibly repeated; a native stream record's headers are a dict
of str to str, int, float, bool or bytes, or a list of (key, value or None) pairs where
a dict cannot hold them (``shmq.model.headers``). docs/KAFKA.md, Headers.

Strategy: Kafka -> native keeps every header in order: a dict when the keys are unique
and no value is null, else the list of pairs (``from_pairs``, the one rule). Native ->
Kafka writes every pair in order: bytes as they are, None as null, str as UTF-8, bool as
``true`` / ``false``, int and float in decimal (``repr``). Kafka's headers thus come back
as they went.
"""

from ..model.headers import from_pairs, header_pairs

__all__ = ["to_native", "to_kafka"]


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
