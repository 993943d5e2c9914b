"""Request checks: the fields each request type takes (one table, ``REQUEST_FIELDS``),
and ``validate_request`` (``check_request`` of a frame's parts), which answers a bad one
with BAD_REQUEST; ``PLAIN_CHECKS``: the same verdict, sooner, for the plain shapes of
PRODUCE, CONSUME and ACK (the server's fast path)."""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Callable

from ..errors import ProtocolError
from ..model.checks import MAX_PARTITIONS  # a stream's partitions are numbered below it
from ..model.settings import QUEUE_TABLE, STREAM_TABLE
from .frames import REPLY_BIT, Frame, MsgType, Status, _error, describe, kind

__all__ = ["Field", "REQUEST_FIELDS", "validate_request", "check_request", "check_records", "normalize_records",
           "MAX_RECORDS", "PLAIN_CHECKS", "check_plain_produce", "check_plain_consume", "check_plain_ack"]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_HEADER_VALUE_TYPES = (str, int, float, bool, bytes)  # what a message header may hold


def _passes(exact: type):
    """Marks a check that passes every value of type ``exact`` (not of a subclass):
    ``check_request`` takes such a value without calling it."""

    def mark(check):
        check.passes = exact
        return check

    return mark


@_passes(str)
def _check_str(v):
    return None if isinstance(v, str) else "a string"


@_passes(bytes)
def _check_bytes(v):
    return None if isinstance(v, bytes) else "a msgpack bin"


@_passes(bytes)
def _check_value(v):
    return None if v is None or isinstance(v, bytes) else "a msgpack bin, or nil (a tombstone)"


def _check_str_or_bytes(v):
    return None if isinstance(v, (str, bytes)) else "a string or a msgpack bin"


@_passes(bool)
def _check_bool(v):
    return None if isinstance(v, bool) else "a boolean"


def _check_non_negative(v):
    return None if (type(v) is int or _is_int(v)) and v >= 0 else "a non-negative integer"


def _check_positive(v):
    return None if (type(v) is int or _is_int(v)) and v >= 1 else "a positive integer"


def _check_headers(v):
    if not isinstance(v, dict):
        return "a map of string keys to str, int, float, bool or bin values"
    for key, value in v.items():
        if not isinstance(key, str):
            return f"a map with string keys (found the key {describe(key)})"
        if not isinstance(value, _HEADER_VALUE_TYPES):
            return f"a map of str, int, float, bool or bin values (key {describe(key)} holds {kind(value)})"
    return None


def _check_record_headers(v):
    """A stream record's headers: a map as ``_check_headers``, or an array of [key, value]
    pairs (a key may repeat, a value may be nil: model/headers.py)."""
    if not isinstance(v, list):
        return _check_headers(v)
    for pair in v:
        if not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[0], str):
            return f"an array of [string key, value] pairs (found {_pair(pair)})"
        if pair[1] is not None and not isinstance(pair[1], _HEADER_VALUE_TYPES):
            return f"an array of pairs of str, int, float, bool, bin or nil values (key {describe(pair[0])} holds " \
                   f"{kind(pair[1])})"
    return None


# Lists of many items (a batch's messages, an ACK's deliveries) are checked first in one
# pass of C-level calls (``set(map(type, v))``); only a list that fails it, or holds
# subclasses, is walked item by item, to say which item is wrong.
_INTS, _DICTS, _BYTES, _ONE = {int}, {dict}, {bytes}, {1}
_body_of = itemgetter("body")


def _check_deliveries(v):
    if type(v) is list and (type(v[0]) is int if len(v) == 1 else set(map(type, v)) <= _INTS):
        return None
    if not isinstance(v, list):
        return "an array of integers"
    for i, item in enumerate(v):
        if not _is_int(item):
            return f"an array of integers (item {i} is {kind(item)})"
    return None


def _check_messages(v):
    types = set(map(type, v)) if type(v) is list else None
    if types == _BYTES:
        return None  # bodies alone (compact: a server that says so takes them)
    if types is not None and types <= _DICTS:
        try:
            if set(map(type, map(_body_of, v))) <= _BYTES and set(map(len, v)) <= _ONE:
                return None  # the common batch: maps of a bin body and nothing else
        except KeyError:
            pass  # one has no body: the walk below says which
    if not isinstance(v, list):
        return "an array of maps {body: bin, headers?: map}, or of bin bodies"
    if v and all(type(item) is bytes for item in v):
        return None
    for i, item in enumerate(v):
        if not isinstance(item, dict):
            return f"an array of maps {{body: bin, headers?: map}} (item {i} is {kind(item)})"
        if "body" not in item:
            return f"an array of maps with a body (item {i} has none)"
        if (why := _check_bytes(item["body"])) is not None:
            return f"an array of maps whose body is {why} (item {i}: {kind(item['body'])})"
        if "headers" in item and (why := _check_headers(item["headers"])) is not None:
            return f"an array of maps whose headers are {why} (item {i})"
    return None


def _normalize_messages(v):
    if (v and type(v[0]) is bytes) or set(map(len, v)) <= _ONE:  # bodies only (bins, or maps of one, checked)
        return list(v)
    return [m if len(m) == 1 or (len(m) == 2 and "headers" in m) else {k: m[k] for k in ("body", "headers") if k in m}
            for m in v]


MAX_RECORDS = 100_000  # most records one READ or POLL may ask for


def _check_names(v):
    if not isinstance(v, list) or not all(type(x) is str for x in v):
        return "an array of strings"
    return None


def _check_int(v):
    return None if _is_int(v) else "an integer"


def _check_number(v):
    return None if isinstance(v, (int, float)) and not isinstance(v, bool) else "a msgpack float or int"


def _check_number_or_nil(v):
    return None if v is None else "a msgpack float or int, or nil" if _check_number(v) else None


def _check_partition(v):
    return None if _is_int(v) and 0 <= v < MAX_PARTITIONS else f"an integer 0..{MAX_PARTITIONS - 1}"


def _check_max_records(v):
    return None if _is_int(v) and 1 <= v <= MAX_RECORDS else f"an integer 1..{MAX_RECORDS}"


def check_records(v):
    """A list of records to append: maps {value: bin or nil, key?: bin, headers?: map or
    array of pairs}."""
    form = "an array of maps {value: bin or nil, key?: bin, headers?: map}"
    if not isinstance(v, list):
        return form
    for i, item in enumerate(v):
        if not isinstance(item, dict):
            return f"{form} (item {i} is {kind(item)})"
        if "value" not in item:
            return f"an array of maps with a value (item {i} has none)"
        for name, check in (("value", _check_value), ("key", _check_bytes), ("headers", _check_record_headers)):
            if name in item and (why := check(item[name])) is not None:
                return f"an array of maps whose {name} {'are' if name == 'headers' else 'is'} {why} (item {i})"
    return None


def normalize_records(v):
    return [{k: r[k] for k in ("value", "key", "headers") if k in r} for r in v]


def _check_partitions(v):
    if not isinstance(v, list) or any(_check_partition(p) is not None for p in v):
        return f"an array of partitions 0..{MAX_PARTITIONS - 1}"
    return None


MAX_POLLED_MEMBERS = 4096  # most members one POLL_MANY may name


def _check_members(v):
    form = f"an array of 1..{MAX_POLLED_MEMBERS} [stream name, member id >= 1] pairs"
    if not isinstance(v, list) or not 1 <= len(v) <= MAX_POLLED_MEMBERS:
        return form
    for i, pair in enumerate(v):
        if (not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[0], str)
                or _check_positive(pair[1]) is not None):
            return f"{form} (item {i} is {_pair(pair)})"
    return None


def _check_offsets(v):
    form = f"an array of [partition 0..{MAX_PARTITIONS - 1}, offset >= 0] pairs"
    if not isinstance(v, list):
        return form
    for i, pair in enumerate(v):
        if (not isinstance(pair, list) or len(pair) != 2 or _check_partition(pair[0]) is not None
                or _check_non_negative(pair[1]) is not None):
            return f"{form} (item {i} is {_pair(pair)})"
    return None


def _check_ranges(v):
    form = (f"an array of [partition 0..{MAX_PARTITIONS - 1}, staging partition 0..{MAX_PARTITIONS - 1}, "
            "first offset >= 0, end offset >= first] arrays")
    if not isinstance(v, list):
        return form
    for i, item in enumerate(v):
        if (not isinstance(item, list) or len(item) != 4 or _check_partition(item[0]) is not None
                or _check_partition(item[1]) is not None or _check_non_negative(item[2]) is not None
                or _check_non_negative(item[3]) is not None or item[3] < item[2]):
            return f"{form} (item {i} is {_pair(item)})"
    return None


def _check_txn(v):
    return None if isinstance(v, bytes) and len(v) == 16 else "a msgpack bin of 16 bytes"


def _check_transaction(v):
    form = "[transactional id (a string), producer id >= 0, epoch >= 0]"
    if not isinstance(v, list) or len(v) != 3 or not isinstance(v[0], str):
        return form
    return None if all(_check_non_negative(x) is None for x in v[1:]) else form


@dataclass(frozen=True, slots=True)
class Field:
    """One request field: ``check(value)`` returns None, or what the value should be."""

    name: str
    check: Callable[[Any], str | None]
    required: bool = False
    default: Any = None  # filled in when absent (None: left out)
    normalize: Callable[[Any], Any] | None = None


_QUEUE = Field("queue", _check_str, required=True)
_DELIVERIES = Field("deliveries", _check_deliveries, required=True)
_STREAM = Field("stream", _check_str, required=True)
_GROUP = Field("group", _check_str, required=True)
_MEMBER = Field("member", _check_positive, required=True)
_PARTITION = Field("partition", _check_partition, required=True)
_MAX_RECORDS = Field("max", _check_max_records, default=1000)
_WAIT_MS = Field("wait_ms", _check_non_negative, default=0)
_EXCHANGE = Field("exchange", _check_str, required=True)
_TXN_ID = Field("transactional_id", _check_str, required=True)
_TXN_FIELDS = (_TXN_ID, Field("producer_id", _check_non_negative, required=True),
               Field("epoch", _check_non_negative, required=True))
_IN_TXN = Field("txn", _check_transaction)  # an append in a transaction: [transactional id, producer id, epoch]
_STORE = Field("store", _check_str, required=True)
_KEY = Field("key", _check_str, required=True)
_KEYS = Field("keys", _check_names, required=True)
_TTL = Field("ttl", _check_number_or_nil)
# a put's options (PRODUCE and PRODUCE_BATCH); the engine checks the priority's range
_PUT_OPTIONS = (Field("priority", _check_int), Field("delay_ms", _check_non_negative),
                Field("ttl_ms", _check_non_negative))

# The one table of request payloads: type -> its fields. Unknown fields are ignored.
# a setting's field on the wire checks its type only; its range is the engine's to check, in its
# words (model/settings.py's table names each field and its check)
_WIRE_CHECKS = {"positive": _check_positive, "int": _check_int, "non_negative": _check_non_negative,
                "number": _check_number, "number_or_nil": _check_number_or_nil, "str": _check_str, "bool": _check_bool}


def _setting_fields(table) -> tuple[Field, ...]:
    return tuple(Field(s.wire_field, _WIRE_CHECKS[s.wire]) for s in table)


REQUEST_FIELDS: dict[int, tuple[Field, ...]] = {
    MsgType.HELLO: (Field("client", _check_str), Field("token", _check_str), Field("heartbeat_ms", _check_positive)),
    MsgType.CREATE: (
        _QUEUE,
        *_setting_fields(QUEUE_TABLE),  # (nil: None)
        Field("exist_ok", _check_bool, default=False),
        # a live queue's settings (``declare_queue``: create it or change them; ``update_queue``: change
        # them): only the settings given are sent, and ``clear`` names those set to none
        Field("declare", _check_bool),
        Field("update", _check_bool),
        Field("clear", _check_names),
    ),
    MsgType.DELETE: (_QUEUE,),
    MsgType.CONSUMER_ADD: (_QUEUE,),
    MsgType.CONSUMER_REMOVE: (_QUEUE,),
    MsgType.LIST: (),
    MsgType.STATS: (_QUEUE,),
    MsgType.BACKUP: (Field("dest", _check_str, required=True),),  # an absolute path on the server's host
    MsgType.PURGE: (_QUEUE, Field("delayed", _check_bool)),  # delayed: the delayed messages too (absent: false)
    MsgType.PING: (),
    MsgType.PRODUCE: (_QUEUE, Field("body", _check_bytes, required=True), Field("headers", _check_headers),
                      *_PUT_OPTIONS, Field("group", _check_str), Field("dedup_id", _check_str_or_bytes)),
    MsgType.PRODUCE_BATCH: (_QUEUE, Field("messages", _check_messages, required=True, normalize=_normalize_messages),
                            *_PUT_OPTIONS, Field("each", _check_bool)),
    MsgType.CONSUME: (
        _QUEUE,
        Field("max", _check_positive, default=1),
        Field("wait_ms", _check_non_negative, default=0),
        Field("visibility_ms", _check_non_negative),
        Field("max_bytes", _check_positive),
        Field("auto_ack", _check_bool),  # settled as taken (get(ack=False)): tag 0, nothing to settle
        Field("rows", _check_bool),  # the messages as rows (arrays), not maps
    ),
    MsgType.ACK: (_QUEUE, _DELIVERIES),
    MsgType.NACK: (
        _QUEUE,
        _DELIVERIES,
        Field("requeue", _check_bool, default=True),
        Field("delay_ms", _check_non_negative),  # absent: the queue's retry policy
        Field("unseen", _check_bool),  # given back unseen (an abandoned CONSUME): no attempt counted
    ),
    MsgType.EXTEND: (_QUEUE, _DELIVERIES, Field("visibility_ms", _check_non_negative, required=True)),
    MsgType.REJECT: (_QUEUE, _DELIVERIES),
    MsgType.PEEK: (_QUEUE, Field("max", _check_positive, default=10)),
    MsgType.REDRIVE: (_QUEUE, Field("to", _check_str), Field("max", _check_positive)),
    # prefetch: the server's --max-prefetch caps it (BAD_REQUEST past it)
    MsgType.SUBSCRIBE: (_QUEUE, Field("prefetch", _check_positive, required=True),
                        Field("visibility_ms", _check_non_negative), Field("rows", _check_bool)),
    MsgType.CANCEL: (Field("subscription", _check_positive, required=True),
                     Field("delivered", _check_non_negative, default=0)),
    # streams: the engine checks the ranges of STREAM_CREATE's settings, with its own words
    MsgType.STREAM_CREATE: (
        _STREAM,
        *_setting_fields(STREAM_TABLE),
        Field("exist_ok", _check_bool, default=False),
    ),
    MsgType.STREAM_DELETE: (_STREAM,),
    MsgType.STREAM_LIST: (),
    MsgType.STREAM_INFO: (_STREAM,),
    MsgType.STREAM_STATS: (_STREAM,),
    MsgType.APPEND: (
        _STREAM,
        Field("value", _check_value, required=True),
        Field("key", _check_bytes),
        Field("headers", _check_record_headers),
        Field("partition", _check_partition),
        _IN_TXN,
    ),
    MsgType.APPEND_BATCH: (
        _STREAM,
        Field("records", check_records, normalize=normalize_records),
        Field("compression", _check_str),
        Field("data", _check_bytes),
        Field("partition", _check_partition),
        _IN_TXN,
    ),
    MsgType.READ: (_STREAM, _PARTITION, Field("offset", _check_non_negative, required=True), _MAX_RECORDS, _WAIT_MS),
    # transactions: the producer's id and epoch from TXN_INIT; a TXN_OFFSETS names a member of
    # this connection (member), or a local one (group, member_id, generation, owned)
    MsgType.TXN_INIT: (_TXN_ID, Field("timeout_ms", _check_positive, default=60_000)),
    MsgType.TXN_OFFSETS: (*_TXN_FIELDS, _STREAM, Field("member", _check_positive), Field("group", _check_str),
                          Field("member_id", _check_non_negative), Field("generation", _check_non_negative),
                          Field("owned", _check_partitions), Field("offsets", _check_offsets)),
    MsgType.TXN_END: (*_TXN_FIELDS, Field("commit", _check_bool, required=True)),
    MsgType.OFFSETS: (_STREAM, _PARTITION),
    MsgType.PUBLISH: (
        _STREAM,
        Field("staging", _check_str, required=True),
        Field("ranges", _check_ranges, required=True),
        Field("txn", _check_txn, required=True),
        Field("batch", _check_non_negative, required=True),
    ),
    MsgType.PUBLISHED: (_STREAM, Field("txn", _check_txn, required=True)),
    MsgType.DELETE_RECORDS: (_STREAM, Field("offsets", _check_offsets, required=True)),
    # max_poll_interval_ms: 0 for no bound; absent: the engine's default
    MsgType.JOIN: (_STREAM, _GROUP, Field("auto_offset_reset", _check_str, default="earliest"),
                   Field("max_poll_interval_ms", _check_non_negative)),
    MsgType.POLL: (_STREAM, _MEMBER, Field("max", _check_max_records, default=500), _WAIT_MS),
    # members: [[stream, member], ...] of this connection, polled as one (``max`` for them all)
    MsgType.POLL_MANY: (Field("members", _check_members, required=True), Field("max", _check_max_records, default=500),
                        _WAIT_MS),
    # revoked: the commit of the client's on_revoke (the partitions being revoked count)
    MsgType.COMMIT: (_STREAM, _MEMBER, Field("offsets", _check_offsets), Field("revoked", _check_bool, default=False)),
    # offset, or to: "beginning" / "end" (partitions: [] for all owned)
    MsgType.SEEK: (_STREAM, _MEMBER, Field("partitions", _check_partitions, required=True),
                   Field("offset", _check_non_negative), Field("to", _check_str)),
    # paused: true pauses them, false resumes them, absent only tells which are paused
    MsgType.PAUSE: (_STREAM, _MEMBER, Field("partitions", _check_partitions, default=[]), Field("paused", _check_bool)),
    MsgType.LEAVE: (_STREAM, _MEMBER),
    MsgType.ASSIGNMENT: (_STREAM, _MEMBER),
    MsgType.GROUPS: (_STREAM,),
    MsgType.COMMITTED: (_STREAM, _GROUP),
    MsgType.LAG: (_STREAM, _GROUP),
    MsgType.RESET: (_STREAM, _GROUP, Field("to", _check_str), Field("offsets", _check_offsets)),
    # exchanges: the engine checks names, types, patterns and routing keys, in its words
    MsgType.X_CREATE: (_EXCHANGE, Field("type", _check_str, default="fanout"),
                       Field("exist_ok", _check_bool, default=False)),
    MsgType.X_DELETE: (_EXCHANGE,),
    MsgType.X_LIST: (Field("exchange", _check_str),),
    MsgType.X_BIND: (_EXCHANGE, Field("target", _check_str, required=True), Field("pattern", _check_str, default="#")),
    MsgType.X_UNBIND: (_EXCHANGE, Field("target", _check_str, required=True), Field("pattern", _check_str)),
    MsgType.X_PUBLISH: (_EXCHANGE, Field("body", _check_bytes, required=True), Field("routing_key", _check_str),
                        Field("headers", _check_headers), Field("dedup_id", _check_str)),
    MsgType.REQUEST: (_QUEUE, Field("body", _check_bytes, required=True), Field("headers", _check_headers),
                      Field("timeout_ms", _check_non_negative)),
    # keyed stores: the engine checks names, keys, members and ttls (seconds > 0, nil: none), in its words
    MsgType.KV_OPEN: (_STORE,),
    MsgType.KV_LIST: (),
    MsgType.KV_DROP: (_STORE,),
    MsgType.KV_SET: (_STORE, _KEY, Field("value", _check_bytes, required=True), _TTL,
                     Field("only_new", _check_bool, default=False)),
    MsgType.KV_GET: (_STORE, _KEY, _WAIT_MS),
    MsgType.KV_GET_MANY: (_STORE, _KEYS),
    MsgType.KV_DELETE: (_STORE, _KEYS),
    MsgType.KV_INCR: (_STORE, _KEY, Field("by", _check_int, default=1), _TTL),
    MsgType.KV_ADD: (_STORE, _KEY, Field("member", _check_str, required=True), _TTL),
    MsgType.KV_MEMBERS: (_STORE, _KEY),
    MsgType.KV_EXPIRE: (_STORE, _KEY, Field("ttl", _check_number_or_nil, required=True)),
    MsgType.KV_TTL: (_STORE, _KEY),
    MsgType.KV_KEYS: (_STORE, Field("prefix", _check_str, default="")),
    MsgType.KV_CLEAR: (_STORE,),
    MsgType.KV_SWEEP: (_STORE,),
}


def _type_name(msg_type: int) -> str:
    try:
        return MsgType(msg_type).name
    except ValueError:
        return f"0x{msg_type:02X}"


_NAMES = {t: _type_name(t) for t in REQUEST_FIELDS}  # every request's name, looked up once per request


class _Form:
    """One request type's fields (from REQUEST_FIELDS), laid out for ``check_request``:
    by name, each field's check, normalizer and the type its check passes outright
    (``_passes``; None: none), the required names, the defaults."""

    __slots__ = ("by_name", "required", "defaults")

    def __init__(self, fields):
        self.by_name = {f.name: (f.check, f.normalize, getattr(f.check, "passes", None)) for f in fields}
        self.required = frozenset(f.name for f in fields if f.required)
        self.defaults = {f.name: f.default for f in fields if f.default is not None and not f.required}


_FORMS = {t: _Form(fields) for t, fields in REQUEST_FIELDS.items()}


def validate_request(frame: Frame) -> dict:
    """The request's known fields, checked, with defaults filled in; else BAD_REQUEST."""
    return check_request(frame.type, frame.msg_id, frame.payload, frame.status)


def check_request(msg_type: int, msg_id: int, payload: dict, status: int = 0) -> dict:
    """``validate_request`` of a frame's parts (the server's per-request call). The fields
    the payload holds are checked as they come, each by its field's own check; anything
    unusual (a bad value, a missing field, a bad type or status) goes to the walk of the
    table in its order (``_walk``), which gives the same verdict and says what is wrong."""
    form = _FORMS.get(msg_type)
    if form is not None and not status and type(payload) is dict:
        out = form.defaults.copy()
        by_name = form.by_name
        for name, value in payload.items():
            field = by_name.get(name)
            if field is None:
                continue  # unknown fields are ignored
            check, normalize, passes = field
            if type(value) is not passes and check(value) is not None:
                break
            out[name] = value if normalize is None else normalize(value)
        else:
            if form.required <= out.keys():
                return out
    return _walk(msg_type, msg_id, payload, status)


def _walk(msg_type, msg_id, payload, status) -> dict:
    """The reference check: REQUEST_FIELDS walked in order; the first bad field is the
    one the BAD_REQUEST names."""

    def bad(message: str) -> ProtocolError:
        return _error(message, Status.BAD_REQUEST, msg_id, False, msg_type)

    fields = REQUEST_FIELDS.get(msg_type)
    if fields is None:
        raise bad(f"type 0x{msg_type:02X} is {'a reply' if msg_type & REPLY_BIT else 'an unknown request type'}")
    name = _NAMES[msg_type]
    if status != Status.OK:
        raise bad(f"{name}: a request's status must be 0, not {status}")
    out = {}
    for field in fields:
        if field.name not in payload:
            if field.required:
                raise bad(f"{name}: missing required field {field.name!r}")
            if field.default is not None:
                out[field.name] = field.default
            continue
        value = payload[field.name]
        why = field.check(value)
        if why is not None:
            raise bad(f"{name}: field {field.name!r} must be {why}, not {describe(value)}")
        out[field.name] = field.normalize(value) if field.normalize else value
    return out


def _pair(value) -> str:
    """A bad item of an array of pairs (or of ranges), in msgpack's words: an array's
    items one by one (up to 4), else ``describe``'s."""
    if isinstance(value, list) and len(value) <= 4:
        return f"[{', '.join(describe(x, 20) for x in value)}]"
    return describe(value)


# The plain shapes (``shapes.produce_shape``, ``consume_shape``, ``ack_shape`` and
# ``acks_shape``: a put with no options, a get of one, an ACK): the server's per-request
# checks of these shapes alone, each a few C-level tests. One returns the fields exactly
# as ``check_request`` would (a test holds them equal), or None for anything else —
# other fields, other types, a bad value — which then goes to ``check_request``, so a bad
# request gets the same BAD_REQUEST as ever.

def check_plain_produce(payload: dict) -> dict | None:
    """A PRODUCE of {queue: str, body: bin} and nothing else: its fields; else None."""
    if len(payload) == 2 and type(payload.get("body")) is bytes and type(payload.get("queue")) is str:
        return payload
    return None


def check_plain_consume(payload: dict) -> dict | None:
    """A CONSUME of {queue: str, max: 1, wait_ms: int >= 0} and nothing else: its fields; else None."""
    if (len(payload) == 3 and type(payload.get("queue")) is str and type(payload.get("max")) is int
            and payload["max"] == 1 and type(wait := payload.get("wait_ms")) is int and wait >= 0):
        return payload
    return None


def check_plain_ack(payload: dict) -> dict | None:
    """An ACK of {queue: str, deliveries: [int, ...]} and nothing else: its fields; else None."""
    if (len(payload) == 2 and type(payload.get("queue")) is str
            and type(tags := payload.get("deliveries")) is list and _check_deliveries(tags) is None):
        return payload
    return None


PLAIN_CHECKS = {MsgType.PRODUCE: check_plain_produce, MsgType.CONSUME: check_plain_consume,
                MsgType.ACK: check_plain_ack}
