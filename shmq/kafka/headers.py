"""Record headers between Kafka and shmq: a Kafka header is a str key and bytes (or
null); a native stream record's headers are a dict of str to str, int, float, bool or
bytes (``shmq.model.headers``). docs/KAFKA.md, Headers.

Strategy: Kafka -> native keeps every key with its bytes; a key repeated keeps its last
value (what Kafka's ``Headers.lastHeader`` returns), a null value becomes b"". Native ->
Kafka writes bytes as they are, str as UTF-8, bool as ``true`` / ``false``, int and float
in decimal (``repr``).
"""

__all__ = ["to_native", "to_kafka"]


def to_native(headers) -> dict | None:
    """Kafka's (key, value or None) pairs as a native headers dict (None for none)."""
    if not headers:
        return None
    return {k: b"" if v is None else v for k, v in headers}


def _as_bytes(v) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, bool):
        return b"true" if v else b"false"
    return repr(v).encode()


def to_kafka(headers: dict) -> tuple:
    """A native headers dict as Kafka's (key, bytes) pairs, in the dict's order."""
    return tuple((k, _as_bytes(v)) for k, v in headers.items())
