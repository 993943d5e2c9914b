"""The payloads both sides share, as values on the wire: a queue's settings in CREATE,
its stats in a STATS reply, a message in PRODUCE, a get in CONSUME; a stream's settings,
a record to append, a record read, where an append went, offsets by partition — each
written once, in both directions.

Strategy: the client builds its fields with the same checks the local engine makes
(so bad input fails the same way on both transports, before a byte is sent), and the
server reads them back into the engine's arguments with the functions beside them.
"""

from operator import itemgetter

from ..model.headers import encode_headers, encode_record_headers, per_item, record_headers
from ..model.messages import Message, QueueStats, as_body
from ..model.records import Record, RecordMetadata
from ..model.settings import QUEUE, QUEUE_SECONDS, QUEUE_TABLE, STREAM_INFO
from .compression import check_codec, compress, decompress
from .requests import MAX_RECORDS, check_records, normalize_records

__all__ = ["create_fields", "create_args", "QUEUE_OPTIONS", "stats_fields", "stats_from_fields", "message_fields",
           "put_fields", "put_args", "messages_fields", "messages_args", "consume_fields", "consume_args",
           "delivery_fields", "delivery_row", "ROW_ITEMS", "peeked_fields", "message_from_fields", "ms", "STREAM_INFO",
           "stream_create_fields", "stream_create_args", "stream_info_fields", "record_fields", "batch_fields",
           "batch_args", "read_fields", "record_reply", "record_from_fields", "metadata_fields", "metadata_from_fields",
           "pairs", "from_pairs", "commit_pairs", "stream_stats_fields", "stream_stats_from_fields"]

_STATS_MS = {"oldest_ready_age_s": "oldest_ready_age_ms"}  # seconds on the Python side, ms on the wire
# fields an older server's STATS reply lacks, and what they read as
_STATS_ADDED = {"consumers_waiting": 0, "producers_waiting": 0, "delayed": 0, "purged_total": 0, "expired_total": 0,
                "groups_in_flight": 0, "dead_letter_depth": None, "bytes_held": 0, "consumers": 0}
# the work-queue options of ``create_queue`` (CREATE carries them as they are: the engine checks them)
# the work-queue options: the settings that are not create_fields' own parameters
QUEUE_OPTIONS = tuple(s.name for s in QUEUE_TABLE if s.name not in (
    "max_bytes", "max_message_bytes", "visibility_timeout", "max_deliveries", "dead_letter_queue", "durability"))
_SECONDS_OPTIONS = frozenset(QUEUE_OPTIONS) & QUEUE_SECONDS


def ms(seconds, what) -> int:
    """A duration in seconds, checked as the engine checks it, in whole milliseconds."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(seconds).__name__}")
    if seconds != seconds or seconds < 0:
        raise ValueError(f"{what} must be >= 0, not {seconds!r}")
    return round(seconds * 1000)


def create_fields(name, max_bytes, max_message_bytes, visibility_timeout, max_deliveries, dead_letter_queue,
                  exist_ok, durability=None, **options) -> dict:
    """CREATE's fields for ``create_queue``'s arguments (None: the server's default);
    ``options`` are QUEUE_OPTIONS, sent as given (None too: it means something, as
    ``priority_aging=None``), checked by the engine on the server, in its words; a
    duration that is not a number is the local engine's TypeError, here."""
    fields = {"queue": name, "max_bytes": max_bytes, "visibility_timeout_ms": round(visibility_timeout * 1000),
              "exist_ok": exist_ok}
    for key, value in (("max_message_bytes", max_message_bytes), ("max_deliveries", max_deliveries),
                       ("dead_letter_queue", dead_letter_queue), ("durability", durability)):
        if value is not None:
            fields[key] = value
    for key, value in options.items():
        if key not in QUEUE_OPTIONS:
            raise TypeError(f"create_queue() got an unexpected keyword argument {key!r}")
        if key in _SECONDS_OPTIONS and value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or value != value):
            raise TypeError(f"{key} must be a number of seconds, not {value!r}")
        fields[key] = value
    return fields


def _check_int(value, what) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    return value


def create_args(f) -> dict:
    """``Broker.create_queue``'s keyword arguments from CREATE's checked fields."""
    vis = f.get("visibility_timeout_ms")
    args = {
        "max_bytes": f.get("max_bytes", QUEUE.max_bytes), "max_message_bytes": f.get("max_message_bytes"),
        "visibility_timeout": QUEUE.visibility_timeout if vis is None else vis / 1000,
        "max_deliveries": f.get("max_deliveries"), "dead_letter_queue": f.get("dead_letter_queue"),
        "exist_ok": bool(f.get("exist_ok", False)),
    }
    if "durability" in f:
        args["durability"] = f["durability"]
    args.update((k, f[k]) for k in QUEUE_OPTIONS if k in f)
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
        if name == "ready_by_priority":  # a list on the wire; one level from an older server
            values[name] = tuple(p.get(wire, (p["ready"],)))
            continue
        value = p.get(wire, _STATS_ADDED[name]) if name in _STATS_ADDED else p[wire]
        values[name] = value / 1000 if name in _STATS_MS else value
    return QueueStats(**values)


def _bytes_like(value, what) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"{what} must be bytes-like, not {type(value).__name__}")
    return bytes(value)


def message_fields(body, headers) -> dict:
    """The wire form of one message (PRODUCE, or an item of PRODUCE_BATCH), checked as
    the local engine checks it."""
    m = {"body": _bytes_like(body, "message body")}
    if headers is not None and encode_headers(headers):  # same TypeError / MessageTooLarge as local
        m["headers"] = headers
    return m


def messages_fields(bodies, headers) -> list:
    """PRODUCE_BATCH's ``messages``: bodies, with ``headers`` as put_many takes them (one
    map for all, or a list item by item; ``per_item``); checked as the local engine checks them."""
    if headers is None:
        return [message_fields(_no_tuple(b), None) for b in bodies]
    bodies = list(bodies)
    return [message_fields(_no_tuple(b), h) for b, h in zip(bodies, per_item(headers, len(bodies)))]


_body_of = itemgetter("body")


def messages_args(messages) -> tuple:
    """(bodies, headers) for put_many from PRODUCE_BATCH's checked ``messages``: headers
    None when no message has any, else a map or None item by item."""
    if messages and type(messages[0]) is bytes:  # bodies alone (checked: all of them bins)
        return messages, None
    bodies = list(map(_body_of, messages))
    if set(map(len, messages)) <= {1}:  # bodies only (the usual batch): no pass in Python
        return bodies, None
    headers = [m.get("headers") for m in messages]
    return bodies, headers if any(headers) else None


def _no_tuple(body):
    if type(body) is tuple:
        as_body(body)  # its TypeError says where headers go
    return body


def put_fields(priority=0, delay=0.0, ttl=None, group=None, dedup_id=None) -> dict:
    """A put's options on the wire (PRODUCE; PRODUCE_BATCH without ``group`` and
    ``dedup_id``), checked as the local engine checks their types; a default is left out,
    so a plain put stays as small as before. The priority's range is the engine's to check."""
    fields = {}
    if _check_int(priority, "priority"):
        fields["priority"] = priority
    if delay_ms := ms(delay, "delay"):
        fields["delay_ms"] = delay_ms
    if ttl is not None:  # a ttl under 1 ms is 1 ms, not 0 (which the engine refuses)
        fields["ttl_ms"] = ms(ttl, "ttl") or (1 if ttl > 0 else 0)
    if group is not None:
        if not isinstance(group, str):
            raise TypeError(f"group must be a str, not {type(group).__name__}")
        fields["group"] = group
    if dedup_id is not None:
        if not isinstance(dedup_id, (str, bytes, bytearray)):
            raise TypeError(f"dedup_id must be str or bytes, not {type(dedup_id).__name__}")
        fields["dedup_id"] = bytes(dedup_id) if isinstance(dedup_id, bytearray) else dedup_id
    return fields


_PUT_AS_IS = ("priority", "group", "dedup_id")  # a put's options named on the wire as put names them
_PUT_MS = (("delay_ms", "delay"), ("ttl_ms", "ttl"))  # milliseconds on the wire, seconds for put
_PUT_OPTIONS = _PUT_AS_IS + tuple(wire for wire, _ in _PUT_MS)


def put_args(f) -> dict:
    """A put's keyword arguments (priority, delay, ttl, group, dedup_id) from PRODUCE's or
    PRODUCE_BATCH's checked fields: those sent, so the engine's defaults apply to the rest."""
    if f.keys().isdisjoint(_PUT_OPTIONS):  # a plain put, the usual one
        return {}
    args = {k: f[k] for k in _PUT_AS_IS if k in f}
    for wire, key in _PUT_MS:
        if wire in f:
            args[key] = f[wire] / 1000
    return args


def consume_fields(max_messages, visibility_timeout, max_bytes=None, ack=True) -> dict:
    """The CONSUME fields of a get_many, checked as the local engine checks them."""
    if type(max_messages) is not int or max_messages < 1:
        raise ValueError(f"max_messages must be a positive int, not {max_messages!r}")
    fields = {"max": max_messages}
    if visibility_timeout is not None:
        fields["visibility_ms"] = ms(visibility_timeout, "visibility_timeout")
    if max_bytes is not None:
        if type(max_bytes) is not int or max_bytes < 1:
            raise ValueError(f"max_bytes must be a positive int, not {max_bytes!r}")
        fields["max_bytes"] = max_bytes
    if not ack:
        fields["auto_ack"] = True
    return fields


def consume_args(f) -> tuple:
    """(max_messages, visibility_timeout in seconds or None, max_bytes or None) from
    CONSUME's checked fields."""
    vis = f.get("visibility_ms")
    return f["max"], None if vis is None else vis / 1000, f.get("max_bytes")


def delivery_fields(d, tag: int) -> dict:
    """The wire form of one leased message in a CONSUME reply; ``tag`` names the lease."""
    out = {"id": d.id, "delivery": tag, "body": d.body, "headers": d.headers, "attempt": d.attempt,
           "enqueued_at": d.enqueued_at}
    if d.has_options:
        if priority := d.priority:
            out["priority"] = priority
        if (group := d.group) is not None:
            out["group"] = group
    return out


# A message as a row (CONSUME's and SUBSCRIBE's ``rows``): these items in this order, the
# last three only where the message has headers, a priority or a group
ROW_ITEMS = ("id", "delivery", "body", "attempt", "enqueued_at", "headers", "priority", "group")


def delivery_row(d, tag: int) -> list:
    """The wire form of one leased message as a row (``ROW_ITEMS``); ``tag`` names the lease."""
    if d.has_options or d.headers:
        return [d.id, tag, d.body, d.attempt, d.enqueued_at, d.headers, d.priority, d.group]
    return [d.id, tag, d.body, d.attempt, d.enqueued_at]


def peeked_fields(m) -> dict:
    """The wire form of one ``Message`` in a PEEK reply."""
    return _with_options({"id": m.id, "body": m.body, "headers": m.headers, "attempt": m.attempt}, m)


def _with_options(out, m) -> dict:
    """``out`` and what a message has beyond its body: enqueue time (epoch seconds, a
    float), and its priority and group when it has them (a reader takes 0 and None)."""
    out["enqueued_at"] = m.enqueued_at
    if priority := m.priority:
        out["priority"] = priority
    if (group := m.group) is not None:
        out["group"] = group
    return out


def message_from_fields(queue: str, m: dict):
    """A ``shmq.Message`` from one message of a PEEK reply."""
    return Message(id=m["id"], body=m["body"], headers=m.get("headers") or {}, attempt=m["attempt"],
                   priority=m.get("priority", 0), enqueued_at=m.get("enqueued_at"), group=m.get("group"), queue=queue)


# ---------------------------------------------------------------- streams
_STREAM_INTS = ("partitions", "max_bytes", "max_message_bytes")  # the engine's TypeError for anything else


def stream_create_fields(name, exist_ok, **settings) -> dict:
    """STREAM_CREATE's fields for ``create_stream``'s arguments; the engine checks their
    ranges on the server, in its own words, and the types it raises TypeError for here."""
    for what in _STREAM_INTS:
        value = settings[what]
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    fields = {"stream": name, "exist_ok": exist_ok}
    fields.update((k, v) for k, v in settings.items() if v is not None)
    return fields


def stream_create_args(f) -> dict:
    """``Broker.create_stream``'s keyword arguments from STREAM_CREATE's checked fields."""
    return {k: v for k, v in f.items() if k != "stream"}


def stream_info_fields(s) -> dict:
    """A STREAM_INFO (and STREAM_CREATE) reply: the stream's settings."""
    return {"stream": s.name, **{k: getattr(s, k) for k in STREAM_INFO}}


def record_fields(value, key, headers) -> dict:
    """The wire form of one record to append (value None: a tombstone, nil), checked as
    the local engine checks it."""
    r = {"value": None if value is None else _bytes_like(value, "value")}
    if key is not None:
        r["key"] = _bytes_like(key, "key")
    if headers is not None and encode_record_headers(headers):  # same TypeError / MessageTooLarge as local
        r["headers"] = headers
    return r


def batch_fields(values, keys, headers, compression) -> dict | None:
    """APPEND_BATCH's records (or, with ``compression``, their compressed ``data``);
    None for no records."""
    check_codec(compression)
    values = list(values)
    n = len(values)
    keys = [None] * n if keys is None else list(keys)
    hdrs = [None] * n if headers is None else list(headers)
    if len(keys) != n or len(hdrs) != n:
        raise ValueError(f"keys and headers must be as many as values ({n})")
    records = [record_fields(v, k, h) for v, k, h in zip(values, keys, hdrs)]
    if not records:
        return None
    if compression is None:
        return {"records": records}
    return {"compression": compression, "data": compress(records, compression)}


def batch_args(f, max_bytes) -> tuple:
    """(values, keys, headers) of APPEND_BATCH's checked fields; compressed records are
    decompressed (at most ``max_bytes``) and checked as plain ones are."""
    if "compression" in f:
        if "data" not in f:
            raise ValueError("APPEND_BATCH: field 'compression' needs the field 'data'")
        records = decompress(f["data"], f["compression"], max_bytes)
        if (why := check_records(records)) is not None:
            raise ValueError(f"APPEND_BATCH: compressed records must be {why}")
        records = normalize_records(records)
    elif "records" in f:
        records = f["records"]
    else:
        raise ValueError("APPEND_BATCH: missing required field 'records' (or 'compression' and 'data')")
    return [r["value"] for r in records], [r.get("key") for r in records], [r.get("headers") for r in records]


def read_fields(stream, p, offset, max_records, timeout) -> dict:
    """READ's fields, checked as the local engine checks ``read``'s arguments (the partition
    by ``check_partition``); more than MAX_RECORDS asks for MAX_RECORDS."""
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"offset must be an int, not {type(offset).__name__}")
    if offset < 0:
        raise ValueError(f"offset must be >= 0, not {offset}")
    return {"stream": stream.name, "partition": check_partition(stream, p), "offset": offset,
            "max": max_records_field(max_records), "wait_ms": ms(timeout, "timeout")}


def check_partition(stream, p) -> int:
    """``p``, a partition of ``stream`` (it has ``name`` and ``partitions``), or the local
    engine's TypeError / ValueError."""
    if isinstance(p, bool) or not isinstance(p, int):
        raise TypeError(f"partition must be an int, not {type(p).__name__}")
    if not 0 <= p < stream.partitions:
        raise ValueError(f"stream {stream.name!r} has partitions 0..{stream.partitions - 1}, not {p}")
    return p


def max_records_field(max_records) -> int:
    if isinstance(max_records, bool) or not isinstance(max_records, int) or max_records < 1:
        raise ValueError(f"max_records must be a positive int, not {max_records!r}")
    return min(max_records, MAX_RECORDS)


def record_reply(r: Record) -> dict:
    """The wire form of one record read (READ and POLL replies); ``timestamp`` is a float
    of UTC epoch seconds, the engine's own."""
    out = {"partition": r.partition, "offset": r.offset, "value": r.value, "timestamp": r.timestamp}
    if r.key is not None:
        out["key"] = r.key
    if r.headers:
        out["headers"] = r.headers
    return out


def record_from_fields(stream: str, m: dict) -> Record:
    return Record(stream, m["partition"], m["offset"], m.get("key"), m["value"], record_headers(m.get("headers")),
                  m["timestamp"])


def metadata_fields(m: RecordMetadata) -> list:
    """Where one append went, as [partition, offset, timestamp]."""
    return [m.partition, m.offset, m.timestamp]


def metadata_from_fields(item) -> RecordMetadata:
    return RecordMetadata(*item)


def pairs(by_partition: dict) -> list:
    """{partition: n} as the wire's [[partition, n]] (msgpack map keys are strings)."""
    return [[p, n] for p, n in sorted(by_partition.items())]


def from_pairs(items) -> dict:
    return {p: n for p, n in items}


def commit_pairs(offsets: dict) -> list:
    """COMMIT's and RESET's offsets, checked as the local engine checks them."""
    if not isinstance(offsets, dict):
        raise TypeError(f"offsets must be a dict of partition: offset, not {type(offsets).__name__}")
    for o in offsets.values():
        if isinstance(o, bool) or not isinstance(o, int) or o < 0:
            raise ValueError(f"offsets must be ints >= 0, not {o!r}")
    return pairs(offsets)


def stream_stats_fields(stats: dict) -> dict:
    """A STREAM_STATS reply: ``Stream.stats()`` with each group's lag and committed
    offsets as pairs."""
    groups = {g: {**v, "lag": pairs(v["lag"]), "committed": pairs(v["committed"])}
              for g, v in stats["groups"].items()}
    return {**stats, "groups": groups}


def stream_stats_from_fields(p: dict) -> dict:
    groups = {g: {**v, "lag": from_pairs(v["lag"]), "committed": from_pairs(v["committed"])}
              for g, v in p["groups"].items()}
    return {**p, "groups": groups}
