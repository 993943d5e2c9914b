"""Serializers: what turns a queue handle's objects into message bodies and back
(``broker.queue(name, serializer=...)``), as faster-fifo's ``dumps``/``loads`` do.

A serializer is named ("pickle", "json", "msgpack") or given as a ``(dumps, loads)``
pair: ``dumps(obj) -> bytes``, ``loads(bytes) -> obj``. Only the bodies go through it;
headers stay msgpack maps. Handles of one queue must agree on it: a body its ``loads``
cannot read is given back (nacked, its attempt counted) and the get raises
SerializationError, so a stray message is never lost and never silently mangled.
"""

import json
import pickle
from typing import Any, Callable, NamedTuple

import msgpack

from .errors import SerializationError

__all__ = ["Serializer", "SerializerSpec", "resolve", "dump", "load", "NAMES"]


class Serializer(NamedTuple):
    name: str
    dumps: Callable[[Any], bytes]
    loads: Callable[[bytes], Any]


# what ``serializer=`` takes: a name, a (dumps, loads) pair, a Serializer, or None (bytes)
SerializerSpec = str | tuple[Callable[[Any], bytes], Callable[[bytes], Any]] | Serializer | None


def _pickle_dumps(obj) -> bytes:
    return pickle.dumps(obj, protocol=5)


def _json_dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _msgpack_dumps(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _msgpack_loads(data: bytes):
    return msgpack.unpackb(data, raw=False)


NAMES = {
    "pickle": Serializer("pickle", _pickle_dumps, pickle.loads),
    "json": Serializer("json", _json_dumps, json.loads),
    "msgpack": Serializer("msgpack", _msgpack_dumps, _msgpack_loads),
}


def resolve(spec) -> Serializer | None:
    """The serializer ``spec`` names: None, a name of ``NAMES``, a ``(dumps, loads)`` pair
    or a ``Serializer``; ValueError / TypeError for anything else."""
    if spec is None or isinstance(spec, Serializer):
        return spec
    if isinstance(spec, str):
        try:
            return NAMES[spec]
        except KeyError:
            raise ValueError(f"unknown serializer {spec!r}: use one of {sorted(NAMES)} or (dumps, loads)") from None
    if isinstance(spec, tuple) and len(spec) == 2 and all(callable(f) for f in spec):
        return Serializer(getattr(spec[0], "__qualname__", "custom"), spec[0], spec[1])
    raise TypeError(f"serializer must be a name ({', '.join(sorted(NAMES))}) or a (dumps, loads) pair, "
                    f"not {type(spec).__name__}")


def dump(ser: Serializer, obj) -> bytes:
    """``obj`` as a body; the serializer's own error (TypeError, ValueError, pickling
    errors) propagates, raised before anything is put."""
    body = ser.dumps(obj)
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise TypeError(f"serializer {ser.name!r} dumps returned {type(body).__name__}, not bytes")
    return body


def load(ser: Serializer, queue: str, msg_id: int, body):
    """The object in ``body``; SerializationError naming the message when it does not load."""
    try:
        return ser.loads(body)
    except Exception as e:
        raise SerializationError(
            f"message {queue}#{msg_id} does not load with serializer {ser.name!r}: {type(e).__name__}: {e}; "
            f"it was given back (nacked)") from e
