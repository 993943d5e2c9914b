"""Wire forms both sides share: a queue's settings in CREATE, its stats in a STATS
reply, a message in PRODUCE, a get in CONSUME — each written once, in both directions.

Strategy: the client builds its fields with the same checks the local engine makes
(so bad input fails the same way on both transports, before a byte is sent), and the
server reads them back into the engine's arguments with the functions beside them.
"""

from ..engine.delivery import QueueStats
from ..engine.headers import encode_headers

__all__ = ["create_fields", "create_args", "stats_fields", "stats_from_fields", "message_fields",
           "consume_fields", "consume_args", "delivery_fields", "ms"]

DEFAULT_MAX_BYTES = 64 * 2**20
DEFAULT_VISIBILITY_S = 30.0
_STATS_MS = {"oldest_ready_age_s": "oldest_ready_age_ms"}  # seconds on the Python side, ms on the wire
_STATS_ADDED = {"consumers_waiting", "producers_waiting", "delayed", "purged_total"}  # 0 from older servers


def ms(seconds, what) -> int:
    """A duration in seconds, checked as the engine checks it, in whole milliseconds."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(seconds).__name__}")
    if seconds != seconds or seconds < 0:
        raise ValueError(f"{what} must be >= 0, not {seconds!r}")
    return round(seconds * 1000)


def create_fields(name, max_bytes, max_message_bytes, visibility_timeout, max_deliveries, dead_letter_queue,
                  exist_ok, durability=None) -> dict:
    """CREATE's fields for ``create_queue``'s arguments (None: the server's default)."""
    fields = {"queue": name, "max_bytes": max_bytes, "visibility_timeout_ms": round(visibility_timeout * 1000),
              "exist_ok": exist_ok}
    for key, value in (("max_message_bytes", max_message_bytes), ("max_deliveries", max_deliveries),
                       ("dead_letter_queue", dead_letter_queue), ("durability", durability)):
        if value is not None:
            fields[key] = value
    return fields


def create_args(f) -> dict:
    """``Broker.create_queue``'s keyword arguments from CREATE's checked fields."""
    vis = f.get("visibility_timeout_ms")
    args = {
        "max_bytes": f.get("max_bytes", DEFAULT_MAX_BYTES), "max_message_bytes": f.get("max_message_bytes"),
        "visibility_timeout": DEFAULT_VISIBILITY_S if vis is None else vis / 1000,
        "max_deliveries": f.get("max_deliveries"), "dead_letter_queue": f.get("dead_letter_queue"),
        "exist_ok": bool(f.get("exist_ok", False)),
    }
    if "durability" in f:
        args["durability"] = f["durability"]
    return args


def stats_fields(s: QueueStats) -> dict:
    """A STATS reply's payload."""
    out = {}
    for name in QueueStats.__dataclass_fields__:
        value = getattr(s, name)
        if name in _STATS_MS:
            name, value = _STATS_MS[name], int(value * 1000)
        out[name] = value
    return out


def stats_from_fields(p: dict) -> QueueStats:
    """QueueStats from a STATS reply (fields a server of an older version lacks read as 0)."""
    values = {}
    for name in QueueStats.__dataclass_fields__:
        wire = _STATS_MS.get(name, name)
        value = p.get(wire, 0) if name in _STATS_ADDED else p[wire]
        values[name] = value / 1000 if name in _STATS_MS else value
    return QueueStats(**values)


def message_fields(body, headers) -> dict:
    """The wire form of one message (PRODUCE, or an item of PRODUCE_BATCH), checked as
    the local engine checks it."""
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise TypeError(f"message body must be bytes-like, not {type(body).__name__}")
    m = {"body": bytes(body)}
    if headers is not None and encode_headers(headers):  # same TypeError / MessageTooLarge as local
        m["headers"] = headers
    return m


def consume_fields(max_messages, visibility_timeout) -> dict:
    """The CONSUME fields of a get_many, checked as the local engine checks them."""
    if type(max_messages) is not int or max_messages < 1:
        raise ValueError(f"max_messages must be a positive int, not {max_messages!r}")
    fields = {"max": max_messages}
    if visibility_timeout is not None:
        fields["visibility_ms"] = ms(visibility_timeout, "visibility_timeout")
    return fields


def consume_args(f) -> tuple:
    """(max_messages, visibility_timeout in seconds or None) from CONSUME's checked fields."""
    vis = f.get("visibility_ms")
    return f["max"], None if vis is None else vis / 1000


def delivery_fields(d, tag: int) -> dict:
    """The wire form of one leased message in a CONSUME reply; ``tag`` names the lease."""
    return {"id": d.id, "delivery": tag, "body": d.body, "headers": d.headers, "attempt": d.attempt}
