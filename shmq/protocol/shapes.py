"""Request shapes: the frames of the common requests (a get's CONSUME, a put's PRODUCE, an
ACK of one delivery; a get_many's CONSUME of N, a put_many's PRODUCE_BATCH, an ACK of many)
encoded from bytes made once per queue.

Strategy: a request of one shape differs from the last one only in its msg id and one
field's value (a PRODUCE's body, an ACK's delivery tag, a CONSUME's ``wait_ms``). A
``Shape`` packs its fixed fields once, with msgpack itself (the map of the fixed fields
and the varying one as nil, less nil's one byte), so a frame costs one header pack, one
msgpack pack of the varying value and one concatenation: the bytes are exactly those of
``encode_request`` of the same payload (a test holds them equal), and the header is
still packed in ``frames`` alone. Where the C codec is built (``cwire``) a frame of a
bytes, int or list value is packed there in one call, the same bytes (``Leased`` and
``leased``, the clients' deliveries read out of a CONSUME reply, are re-exported for the
clients). Sans-IO, as the rest of the package.
"""

from __future__ import annotations

import struct
import threading

import msgpack

from .cwire import Leased, frame as _c_frame, leased
from .frames import MAGIC, VERSION, MsgType, _out_of_range, _pack_header

__all__ = ["Shape", "consume_shape", "produce_shape", "ack_shape", "consume_many_shape", "produce_batch_shape",
           "acks_shape", "Leased", "leased"]

_NIL = b"\xc0"  # msgpack's nil: what the varying field is packed as, and cut off
_packers = threading.local()  # one Packer per thread (a Packer is not shared safely), packing whole values


def _packer():
    packer = _packers.pack = msgpack.Packer(use_bin_type=True).pack
    return packer


class Shape:
    """A request type with fixed fields and one field ``last`` that varies: ``frame(msg_id,
    value)`` is the frame of {**fixed, last: value}. ``in_list``: the value goes in a
    one-item list (an ACK's ``deliveries``)."""

    __slots__ = ("msg_type", "fixed", "last", "_prefix", "_wrap", "_size")

    def __init__(self, msg_type: int, fixed: dict, last: str, in_list: bool = False):
        self.msg_type = int(msg_type)
        self.fixed = dict(fixed)
        self.last = last
        if last in fixed:
            raise ValueError(f"{last!r} is both fixed and varying")
        packed = msgpack.packb({**fixed, last: None}, use_bin_type=True)
        assert packed.endswith(_NIL)
        self._prefix = packed[:-1] + (b"\x91" if in_list else b"")  # a fixarray of one item
        self._wrap = in_list
        self._size = len(self._prefix)

    def payload(self, value) -> dict:
        """The payload this shape encodes for ``value`` (what ``encode_request`` would take)."""
        return {**self.fixed, self.last: [value] if self._wrap else value}

    def frame(self, msg_id: int, value) -> bytes:
        """The request frame of ``value`` with ``msg_id``: ``encode_request(msg_type,
        msg_id, self.payload(value))``'s bytes."""
        if _c_frame is not None and (data := _c_frame(self._prefix, self.msg_type, msg_id, value)) is not None:
            return data
        try:
            body = _packers.pack(value)
        except AttributeError:
            body = _packer()(value)
        size = self._size + len(body)
        try:
            return _pack_header(MAGIC, size, self.msg_type, VERSION, 0, msg_id) + self._prefix + body
        except struct.error:
            raise _out_of_range(size, self.msg_type, 0, msg_id, VERSION) from None


def consume_shape(queue: str) -> Shape:
    """A blocking get's CONSUME of one message from ``queue``; the value is ``wait_ms``."""
    return Shape(MsgType.CONSUME, {"queue": queue, "max": 1}, "wait_ms")


def produce_shape(queue: str) -> Shape:
    """A plain put's PRODUCE to ``queue`` (no headers, no options); the value is the body."""
    return Shape(MsgType.PRODUCE, {"queue": queue}, "body")


def ack_shape(queue: str) -> Shape:
    """An ACK of one delivery of ``queue``; the value is its tag."""
    return Shape(MsgType.ACK, {"queue": queue}, "deliveries", in_list=True)


def consume_many_shape(queue: str, most: int, rows: bool = False) -> Shape:
    """A blocking get_many's CONSUME of up to ``most`` messages (``rows``: as rows); the
    value is ``wait_ms``."""
    return Shape(MsgType.CONSUME, {"queue": queue, "max": most, "rows": True} if rows else
                 {"queue": queue, "max": most}, "wait_ms")


def produce_batch_shape(queue: str) -> Shape:
    """A plain put_many's PRODUCE_BATCH to ``queue``; the value is its ``messages``."""
    return Shape(MsgType.PRODUCE_BATCH, {"queue": queue}, "messages")


def acks_shape(queue: str) -> Shape:
    """An ACK of deliveries of ``queue``; the value is the list of their tags."""
    return Shape(MsgType.ACK, {"queue": queue}, "deliveries")
