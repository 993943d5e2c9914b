"""Kafka requests and responses as kio's generated classes: parsing a request frame
(header, then body), writing a response frame, and ``build``, which makes a response of
any version from one description.

Strategy: a handler describes its answer once, as nested dicts and lists with Kafka's
field names; ``build`` keeps the fields the negotiated version has and fills those it
lacks with their defaults, so one handler serves every version kio knows. The request
header's version follows the body's (flexible versions take header v2); a response's
header is the one kio names for it (ApiVersions' is always v0, KIP-511).
"""

import dataclasses
import datetime
import functools
import io
import logging
import struct
import typing
from pkgutil import resolve_name

from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

from .codes import ErrorCode, KafkaProtocolError
from .frames import frame

__all__ = ["Request", "parse_request", "encode_response", "build", "request_class", "response_class", "api_name",
           "peek"]

log = logging.getLogger("shmq.server.kafka")

_PEEK = struct.Struct(">hhi")
_HEADERS = {}


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """A parsed request: its header (kio's RequestHeader v1 or v2) and body."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    header: typing.Any
    body: typing.Any


def api_name(api_key: int) -> str:
    """``Metadata`` for 3: a key's name for logs (``api 99`` if Kafka has none)."""
    name = api_key_map.get(api_key)
    return "".join(w.title() for w in name.split("_")) if name else f"api {api_key}"


@functools.cache
def _entity(api_key: int, version: int, kind: EntityType):
    try:
        return resolve_name(schema_name_map[api_key_map[api_key]][version][kind])
    except KeyError:
        return None


def request_class(api_key: int, version: int):
    """kio's request class of that key and version, or None if kio has none."""
    return _entity(api_key, version, EntityType.request)


def response_class(api_key: int, version: int):
    """kio's response class of that key and version, or None if kio has none."""
    return _entity(api_key, version, EntityType.response)


def peek(data: bytes) -> tuple[int, int, int]:
    """(api key, api version, correlation id): the fixed start of every request header.
    KafkaProtocolError if the frame is shorter than that."""
    if len(data) < _PEEK.size:
        raise KafkaProtocolError(f"a request of {len(data)} bytes: too short for a request header")
    return _PEEK.unpack_from(data, 0)


def parse_request(data: bytes, versions: dict) -> Request:
    """The request in one frame's body. ``versions``: {api key: (min, max)} this side
    answers. KafkaProtocolError (code UNSUPPORTED_VERSION) for a key or version outside
    them, or one that does not parse (bytes after what the version's schema defines are
    ignored, as Kafka's brokers do: librdkafka's Metadata v9+ writes some); its ``correlation_id`` and ``api_key`` /
    ``api_version`` say what to answer, when they could be read."""
    api_key, version, correlation_id = peek(data)
    low, high = versions.get(api_key, (0, -1))
    cls = request_class(api_key, version) if low <= version <= high else None
    if cls is None:
        e = KafkaProtocolError(f"{api_name(api_key)} v{version} is not supported here",
                               ErrorCode.unsupported_version)
        e.request = (api_key, version, correlation_id)
        raise e
    header_cls = cls.__header_schema__
    try:
        header, used = _reader(header_cls)(data, 0)
        body, n = _reader(cls)(data, used)
    except Exception as exc:  # the parser's promise: it parses, or KafkaProtocolError
        e = KafkaProtocolError(f"{api_name(api_key)} v{version}: the request does not parse "
                               f"({type(exc).__name__}: {exc})"[:300])
        e.request = (api_key, version, correlation_id)
        raise e from None
    if used + n < len(data):  # as Kafka's brokers: what the schema defines is read, the rest ignored
        log.debug("%s v%d: %d bytes after the request, ignored", api_name(api_key), version, len(data) - used - n)
    return Request(api_key, version, correlation_id, header.client_id, header, body)


@functools.cache
def _reader(cls):
    return entity_reader(cls)


@functools.cache
def _writer(cls):
    return entity_writer(cls)


def encode_response(correlation_id: int, response) -> bytes:
    """The whole frame of ``response`` (a kio response object) to the request
    ``correlation_id``."""
    header_cls = response.__header_schema__
    out = io.BytesIO()
    _writer(header_cls)(out, header_cls(correlation_id=correlation_id))
    _writer(type(response))(out, response)
    return frame(out.getvalue())


# ---------------------------------------------------------------------------- build
@functools.cache
def _shape(cls):
    """[(field name, struct class of a struct or an array of them, or None, default, is an array,
    converter of ints to the field's time type, or None)]."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        arms = [a for a in typing.get_args(t) if a is not type(None)]
        shape = arms[0] if len(arms) == 1 and typing.get_origin(arms[0]) is tuple else t  # a nullable array
        nested = None
        args = [a for a in typing.get_args(shape) if a is not type(None) and a is not Ellipsis]
        if dataclasses.is_dataclass(shape):
            nested = shape
        elif args and dataclasses.is_dataclass(args[0]):
            nested = args[0]
        out.append((f.name, nested, _default(f, t), typing.get_origin(shape) is tuple,
                    _CONVERT.get(f.metadata.get("kafka_type"))))
    return out


_MISSING = dataclasses.MISSING


def _datetime(ms):
    if isinstance(ms, int):
        return None if ms < 0 else datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)
    return ms


def _timedelta(ms):
    return datetime.timedelta(milliseconds=ms) if isinstance(ms, int) else ms


_CONVERT = {"datetime_i64": _datetime, "timedelta_i32": _timedelta, "timedelta_i64": _timedelta}


def _default(f, t):
    if f.default is not _MISSING:
        return f.default
    if f.default_factory is not _MISSING:
        return f.default_factory()
    kafka_type = f.metadata.get("kafka_type", "")
    if typing.get_origin(t) is tuple:
        return ()
    if type(None) in typing.get_args(t):
        return None
    if kafka_type.startswith("timedelta"):
        return datetime.timedelta(0)
    if kafka_type == "error_code":
        return ErrorCode.none
    if kafka_type in ("string",):
        return ""
    if kafka_type in ("bytes", "records"):
        return b""
    if kafka_type == "bool":
        return False
    if kafka_type == "uuid":
        return None
    return 0


def build(cls, data: dict):
    """An instance of the kio class ``cls`` from ``data``: its fields by name (nested
    structs and arrays of them as dicts and lists of dicts); fields ``cls`` lacks are
    left out, fields ``data`` lacks take their defaults. Times may be ints (ms; a
    negative one is null)."""
    kwargs = {}
    for name, nested, default, is_array, convert in _shape(cls):
        if name not in data:
            kwargs[name] = default
            continue
        value = data[name]
        if convert is not None:
            value = convert(value)
        elif nested is not None and value is not None:
            value = tuple(build(nested, v) for v in value) if is_array else build(nested, value)
        elif is_array and value is not None:
            value = tuple(value)
        kwargs[name] = value
    return cls(**kwargs)
