"""Message headers: validation, msgpack encoding, and the names shmq itself reads
(request/reply's ``x-reply-to`` and ``x-correlation-id``).

Strategy: headers are optional and most messages have none, so an empty or absent
dict encodes to zero bytes and never touches msgpack (packb of a small dict costs
~0.5 us, more than the rest of a put). A dict is the normal form (a msgpack map). A
stream record's headers may also be a list of (key, value) pairs, for what a dict
cannot hold, as Kafka's headers can: a key repeated, or a null value (None). Such a
list is stored as a msgpack array of [key, value] pairs and read back as a list of
tuples; a list that a dict can hold is stored as the dict (``from_pairs``), so a
record's headers read back as a dict whenever they can.
"""

import msgpack

from ..errors import MessageTooLarge

__all__ = ["MAX_HEADERS_BYTES", "REPLY_TO", "CORRELATION_ID", "encode_headers", "encode_record_headers",
           "decode_headers", "from_pairs", "header_pairs", "record_headers", "per_item", "reply_headers"]

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
        if not isinstance(key, str) or not isinstance(value, _VALUE_TYPES) or (
                isinstance(value, int) and not -(2**63) <= value < 2**64):
            _refuse(key, value)  # (the checks inline: this is every put's path with headers)
    raw = msgpack.packb(headers, use_bin_type=True)
    if len(raw) > MAX_HEADERS_BYTES:
        raise MessageTooLarge(f"headers encode to {len(raw)} bytes; the limit is {MAX_HEADERS_BYTES}")
    return raw


def encode_record_headers(headers) -> bytes:
    """A stream record's headers encoded: a dict as ``encode_headers``, or a list (or
    tuple) of (key, value) pairs, where a key may repeat and a value may be None; a list
    that a dict can hold is stored as that dict. TypeError / ValueError / MessageTooLarge."""
    if headers is None or isinstance(headers, dict):
        return encode_headers(headers)
    if not isinstance(headers, (list, tuple)):
        raise TypeError(f"headers must be a dict or a list of (key, value) pairs, not {type(headers).__name__}")
    for pair in headers:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise TypeError(f"a list of headers holds (key, value) pairs, not {pair!r:.60}")
        if not isinstance(pair[0], str) or pair[1] is not None and _bad(pair[1]):
            _refuse(*pair)
    form = from_pairs(headers)
    if isinstance(form, dict):
        return encode_headers(form)
    raw = msgpack.packb([[k, v] for k, v in form], use_bin_type=True)
    if len(raw) > MAX_HEADERS_BYTES:
        raise MessageTooLarge(f"headers encode to {len(raw)} bytes; the limit is {MAX_HEADERS_BYTES}")
    return raw


def _bad(value) -> bool:
    return not isinstance(value, _VALUE_TYPES) or isinstance(value, int) and not -(2**63) <= value < 2**64


def _refuse(key, value):
    """Raise the error a bad header (``key``, ``value``) gets."""
    if not isinstance(key, str):
        raise TypeError(f"header keys must be str, not {type(key).__name__} ({key!r})")
    if not isinstance(value, _VALUE_TYPES):
        raise TypeError(
            f"header {key!r}: values must be str, int, float, bool or bytes, not {type(value).__name__}"
        )
    raise ValueError(f"header {key!r}: integer {value} does not fit in 64 bits")


def decode_headers(raw) -> dict | list:
    """Stored headers: a dict, or (a stream record's) a list of (key, value) pairs."""
    if not raw:
        return {}
    h = msgpack.unpackb(raw, raw=False, use_list=False)
    return h if type(h) is dict else list(h)


def from_pairs(pairs) -> dict | list:
    """(key, value or None) pairs as a record's headers: a dict when the keys are unique
    and no value is None, else the pairs as a list of tuples, in order."""
    pairs = list(pairs)
    form = dict(pairs)
    if len(form) == len(pairs) and None not in form.values():
        return form
    return [tuple(p) for p in pairs]


def header_pairs(headers):
    """A record's headers (a dict or a list of pairs) as (key, value) pairs, in order."""
    return headers.items() if isinstance(headers, dict) else headers


def record_headers(headers) -> dict | list:
    """A record's headers off the wire (msgpack gives a list of lists): a dict, or a list
    of (key, value) tuples; {} for none."""
    if not headers:
        return {}
    return headers if isinstance(headers, dict) else [tuple(p) for p in headers]


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
