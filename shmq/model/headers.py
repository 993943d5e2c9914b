"""Message headers: validation, msgpack encoding, and the names shmq itself reads
(request/reply's ``x-reply-to`` and ``x-correlation-id``).

Strategy: headers are optional and most messages have none, so an empty or absent
dict encodes to zero bytes and never touches msgpack (packb of a small dict costs
~0.5 us, more than the rest of a put).
"""

import msgpack

from ..errors import MessageTooLarge

__all__ = ["MAX_HEADERS_BYTES", "REPLY_TO", "CORRELATION_ID", "encode_headers", "decode_headers", "per_item",
           "reply_headers"]

MAX_HEADERS_BYTES = 64 * 1024
REPLY_TO = "x-reply-to"  # a request's reply queue (engine/queues/rpc.py)
CORRELATION_ID = "x-correlation-id"  # a request's id, which its reply carries back
_VALUE_TYPES = (str, int, float, bool, bytes)
_EMPTY = b""


def encode_headers(headers) -> bytes:
    """Validate and encode a headers dict; raises TypeError / MessageTooLarge."""
    if not headers:
        if headers is None or isinstance(headers, dict):
            return _EMPTY
        raise TypeError(f"headers must be a dict, not {type(headers).__name__}")
    if not isinstance(headers, dict):
        raise TypeError(f"headers must be a dict, not {type(headers).__name__}")
    for key, value in headers.items():
        if not isinstance(key, str):
            raise TypeError(f"header keys must be str, not {type(key).__name__} ({key!r})")
        if not isinstance(value, _VALUE_TYPES):
            raise TypeError(
                f"header {key!r}: values must be str, int, float, bool or bytes, not {type(value).__name__}"
            )
        if isinstance(value, int) and not -(2**63) <= value < 2**64:
            raise ValueError(f"header {key!r}: integer {value} does not fit in 64 bits")
    raw = msgpack.packb(headers, use_bin_type=True)
    if len(raw) > MAX_HEADERS_BYTES:
        raise MessageTooLarge(f"headers encode to {len(raw)} bytes; the limit is {MAX_HEADERS_BYTES}")
    return raw


def decode_headers(raw) -> dict:
    if not raw:
        return {}
    return msgpack.unpackb(raw, raw=False)


def per_item(headers, n: int) -> list:
    """put_many's ``headers`` as a list of ``n`` (a map for all, or a map or None item by
    item); TypeError / ValueError in the words both transports use."""
    if isinstance(headers, dict):
        return [headers] * n
    if isinstance(headers, (list, tuple)):
        if len(headers) != n:
            raise ValueError(f"put_many got {n} bodies and {len(headers)} headers: give one map per body, "
                             f"or one map for all")
        return list(headers)
    raise TypeError(f"headers must be a map or a list of maps, not {type(headers).__name__}")


def reply_headers(delivery) -> tuple[str, str]:
    """(reply queue, correlation id) of a request ``delivery`` carries (any transport's);
    ValueError when it asked for no reply."""
    h = delivery.headers
    reply_to, corr = h.get(REPLY_TO), h.get(CORRELATION_ID)
    if not isinstance(reply_to, str) or not isinstance(corr, str):
        raise ValueError(f"message {delivery.id} of queue {delivery.queue!r} asked for no reply "
                         f"(it has no {REPLY_TO} and {CORRELATION_ID} headers)")
    return reply_to, corr
