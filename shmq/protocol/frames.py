"""DEADBEEF frames: the header, frames to bytes, and bytes to frames (``FrameDecoder``).

Strategy: this module is sans-IO, like h11. It owns no socket and never blocks: the
caller hands received bytes to ``FrameDecoder.feed`` and pulls whole frames out of
``next_frame`` (or their fields as a plain tuple, ``next_parts``), which returns None
until a frame is complete. The asyncio server and the sync and async clients share it,
so there is one reading of the spec (docs/PROTOCOL.md). The 16-byte header is one
precompiled ``struct.Struct`` (``_HEADER``): one pack per frame out, one ``unpack_from``
per frame in, read where it lies in the buffer; a big payload is decoded from a
memoryview of the buffer, not a copy (a small one from a copy, which costs less than
the view). Nothing read off the wire is trusted: a declared length is checked against
``max_frame_bytes`` as soon as the header is in, before a byte of payload is buffered;
msgpack is decoded with limits tied to the payload size; request fields are checked
against one table (``requests.REQUEST_FIELDS``).

The decoder's promise: for any bytes, in any chunking, ``next_frame`` parses, or it
raises ProtocolError — anything else is a bug. A non-fatal ProtocolError leaves the
stream in sync (the bad frame's bytes are consumed), so the next call goes on with the
next frame; after a fatal one the decoder stays failed and the connection must close.
"""

from __future__ import annotations

import enum
import json
import re
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import msgpack

from ..errors import ProtocolError

__all__ = [
    "MAGIC",
    "VERSION",
    "HEADER_SIZE",
    "DEFAULT_MAX_FRAME_BYTES",
    "REPLY_BIT",
    "MsgType",
    "PushType",
    "Status",
    "Frame",
    "Header",
    "ProtocolError",
    "pack_header",
    "unpack_header",
    "unpack_length",
    "encode_frame",
    "encode_request",
    "encode_reply",
    "encode_error",
    "FrameDecoder",
    "decode_payload",
    "kind",
    "describe",
    "c_header",
]

MAGIC = 0xDEADBEEF
VERSION = 1
HEADER_SIZE = 16
DEFAULT_MAX_FRAME_BYTES = 16 * 2**20
REPLY_BIT = 0x80


class MsgType(enum.IntEnum):
    """Request types; a reply's type is the request's type | REPLY_BIT."""

    HELLO = 0x01
    CREATE = 0x02
    DELETE = 0x03
    LIST = 0x04
    STATS = 0x05
    PURGE = 0x06
    PING = 0x07
    CONSUMER_ADD = 0x08  # a queue's consumer count (engine/queues/lifetime.py): one more of this connection
    CONSUMER_REMOVE = 0x09  # ... one of this connection's fewer
    BACKUP = 0x0A  # the server copies what it holds durably into a new directory of its host (``shmq backup``)
    PRODUCE = 0x10
    PRODUCE_BATCH = 0x11
    CONSUME = 0x12
    ACK = 0x13
    NACK = 0x14
    EXTEND = 0x15
    REJECT = 0x16
    PEEK = 0x17
    REDRIVE = 0x18
    SUBSCRIBE = 0x19
    CANCEL = 0x1B
    STREAM_CREATE = 0x20
    STREAM_DELETE = 0x21
    STREAM_LIST = 0x22
    STREAM_INFO = 0x23
    STREAM_STATS = 0x24
    APPEND = 0x28
    APPEND_BATCH = 0x29
    READ = 0x2A
    OFFSETS = 0x2B
    PUBLISH = 0x2C
    PUBLISHED = 0x2D
    DELETE_RECORDS = 0x2E
    JOIN = 0x30
    POLL = 0x31
    COMMIT = 0x32
    LEAVE = 0x33
    ASSIGNMENT = 0x34
    GROUPS = 0x35
    COMMITTED = 0x36
    LAG = 0x37
    RESET = 0x38
    SEEK = 0x39  # a member's positions (seek, seek_to_beginning, seek_to_end)
    PAUSE = 0x3A  # a member's paused partitions (pause, resume, paused)
    POLL_MANY = 0x3B  # one poll of several members of this connection (a consumer of several streams)
    TXN_INIT = 0x3C  # transactions (server/transactions): a transactional id's producer id and epoch
    TXN_OFFSETS = 0x3D  # a native group member's offsets held in the transaction
    TXN_END = 0x3E  # commit or abort
    X_CREATE = 0x40  # exchanges (engine/queues/exchange.py)
    X_DELETE = 0x41
    X_LIST = 0x42
    X_BIND = 0x43
    X_UNBIND = 0x44
    X_PUBLISH = 0x45
    REQUEST = 0x46  # request/reply (engine/queues/rpc.py)
    KV_OPEN = 0x60  # keyed stores (engine/store.py): a store made if absent
    KV_LIST = 0x61
    KV_DROP = 0x62  # delete_store
    KV_SET = 0x63
    KV_GET = 0x64
    KV_GET_MANY = 0x65
    KV_DELETE = 0x66
    KV_INCR = 0x67
    KV_ADD = 0x68
    KV_MEMBERS = 0x69
    KV_EXPIRE = 0x6A
    KV_TTL = 0x6B
    KV_KEYS = 0x6C
    KV_CLEAR = 0x6D
    KV_SWEEP = 0x6E


class PushType(enum.IntEnum):
    """Frames the server sends unasked: msg id 0, status 0, type = the push type | REPLY_BIT
    (a client reads msg id 0 with a non-zero status as the end of the connection)."""

    DELIVER = 0x1A  # messages leased to a subscription (SUBSCRIBE), or its end
    HEARTBEAT = 0x1B  # the server is alive: every ``heartbeat_ms`` a HELLO asked for, payload {}


class Status(enum.IntEnum):
    """The header's status field: 0 in requests; in replies OK or an error code."""

    OK = 0
    BAD_FRAME = 1
    BAD_REQUEST = 2
    UNAUTHORIZED = 3
    NO_SUCH_QUEUE = 4
    QUEUE_EXISTS = 5
    QUEUE_FULL = 6
    TOO_LARGE = 7
    UNKNOWN_DELIVERY = 8
    UNSUPPORTED_VERSION = 9
    INTERNAL = 10
    STORAGE = 11
    LOCK_TIMEOUT = 12
    LIMIT_EXCEEDED = 13
    STREAM_NOT_FOUND = 14
    STREAM_EXISTS = 15
    OFFSET_OUT_OF_RANGE = 16
    COMMIT_FAILED = 17
    PRODUCER_FENCED = 18  # another producer took the transactional id over (ProducerFenced)
    TRANSACTION = 19  # a transaction cannot go on (TransactionError)
    EXCHANGE_NOT_FOUND = 64
    EXCHANGE_EXISTS = 65
    REQUEST_TIMEOUT = 66
    WRONG_TYPE = 67  # a keyed store's key holds another kind (WrongType)


# ---------------------------------------------------------------------------- header

# magic u32, length u32, type u8, version u8, status u16, msg id u32; network order.
# One precompiled Struct: a frame's header is one pack or one unpack_from call.
_HEADER = struct.Struct("!IIBBHI")
assert _HEADER.size == HEADER_SIZE
_pack_header = _HEADER.pack
_unpack_header_from = _HEADER.unpack_from
# unpack_length(buf, offset) -> (length,): the length field alone of the header at buf[offset:]
unpack_length = struct.Struct("!4xI").unpack_from
assert unpack_length(_pack_header(MAGIC, 123, 0, VERSION, 0, 0)) == (123,)


class Header(NamedTuple):
    """A header as read off the wire, fields in wire order, not yet checked."""

    magic: int
    length: int
    type: int
    version: int
    status: int
    msg_id: int


def pack_header(length: int, msg_type: int, status: int, msg_id: int, version: int = VERSION) -> bytes:
    """The 16 header bytes; ValueError if a field does not fit its width."""
    try:
        return _pack_header(MAGIC, length, msg_type, version, status, msg_id)
    except struct.error:
        raise _out_of_range(length, msg_type, status, msg_id, version) from None


def _out_of_range(length, msg_type, status, msg_id, version) -> ValueError:
    return ValueError(
        f"header field out of range: length={length!r} (u32) type={msg_type!r} (u8) "
        f"version={version!r} (u8) status={status!r} (u16) msg_id={msg_id!r} (u32)"
    )


def unpack_header(buf, offset: int = 0) -> Header:
    """Read the header at ``buf[offset:offset+16]``; the caller checks magic etc."""
    if len(buf) - offset < HEADER_SIZE:
        raise ValueError(f"a header takes {HEADER_SIZE} bytes, only {len(buf) - offset} given")
    return Header._make(_unpack_header_from(buf, offset))


# -------------------------------------------------------------------- the C codec's copy


def c_header() -> str:
    """The text of ``_frames.h``: the header's constants, the OK status and every request type
    (``MSG_<NAME>``), from this module, for the C codec and the extensions that include it.
    (``python -m shmq.mirrors`` writes it, under its banner; a test fails while it is stale)."""
    lines = ["#ifndef SHMQ_FRAMES_H", "#define SHMQ_FRAMES_H", "",
             f"#define WIRE_MAGIC 0x{MAGIC:X}u", f"#define WIRE_VERSION {VERSION}",
             f"#define WIRE_HEADER {HEADER_SIZE}", f"#define WIRE_REPLY_BIT 0x{REPLY_BIT:02X}",
             f"#define WIRE_OK {int(Status.OK)}",
             "/* request types (MsgType) */"]
    lines += [f"#define MSG_{t.name} 0x{t.value:02X}" for t in MsgType]
    lines += ["", "#endif", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- frames


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame: ``type`` is the raw type byte (a reply has REPLY_BIT set)."""

    type: int
    msg_id: int
    payload: dict
    status: int = 0
    version: int = VERSION

    @property
    def is_reply(self) -> bool:
        return bool(self.type & REPLY_BIT)

    @property
    def request_type(self) -> int:
        return self.type & 0x7F


_packers = threading.local()  # one msgpack Packer per thread: a Packer is not shared safely


def _encode(msg_type: int, msg_id: int, payload, status: int, version: int = VERSION) -> bytes:
    """Header + msgpack payload, the header packed in one call; an empty payload dict
    encodes as zero bytes. The payload is packed into the thread's Packer, whose buffer
    is kept from frame to frame, and copied once, behind the header: a big frame costs
    one new buffer, not three."""
    if type(payload) is not dict and not isinstance(payload, dict):
        raise TypeError(f"a frame payload must be a dict, not {type(payload).__name__}")
    if not payload:
        try:
            return _pack_header(MAGIC, 0, msg_type, version, status, msg_id)
        except struct.error:
            raise _out_of_range(0, msg_type, status, msg_id, version) from None
    try:
        packer = _packers.packer
    except AttributeError:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True, autoreset=False)
    try:
        packer.pack(payload)
        body = packer.getbuffer()
        try:
            return _pack_header(MAGIC, len(body), msg_type, version, status, msg_id) + body
        except struct.error:
            raise _out_of_range(len(body), msg_type, status, msg_id, version) from None
        finally:
            body.release()
    finally:
        packer.reset()


def encode_frame(frame: Frame) -> bytes:
    """Header + msgpack payload; an empty payload dict encodes as zero bytes."""
    return _encode(frame.type, frame.msg_id, frame.payload, frame.status, frame.version)


def encode_request(msg_type: int, msg_id: int, payload: dict | None = None) -> bytes:
    """A request frame (status 0)."""
    return _encode(msg_type, msg_id, {} if payload is None else payload, 0)


def encode_reply(request_type: int, msg_id: int, payload: dict | None = None, status: int = Status.OK) -> bytes:
    """The reply to a request of ``request_type``: type | REPLY_BIT, same msg id."""
    return _encode(request_type | REPLY_BIT, msg_id, {} if payload is None else payload, status)


def encode_error(request_type: int, msg_id: int, status: int, message: str, details: dict | None = None) -> bytes:
    """An error reply: a non-zero ``status`` and payload {"error": message, **details}
    (details: what the error carries for programs, e.g. OFFSET_OUT_OF_RANGE's earliest, end)."""
    if status == Status.OK:
        raise ValueError("an error reply needs a non-zero status")
    return encode_reply(request_type, msg_id, {**(details or {}), "error": str(message)}, status)


def _error(message: str, status: int, msg_id: int = 0, fatal: bool = False, msg_type: int = 0) -> ProtocolError:
    """A ProtocolError that also carries the offending frame's type byte (0 if unknown),
    so the error reply can be typed ``msg_type | REPLY_BIT``."""
    err = ProtocolError(message, status, msg_id, fatal)
    err.msg_type = msg_type
    return err


# Everything msgpack.unpackb raises on hostile input: its own errors (subclasses of
# ValueError or UnpackException), UnicodeDecodeError (a ValueError) for bad UTF-8 in a
# str, TypeError for unhashable map keys, OverflowError / RecursionError for extremes.
_DECODE_ERRORS = (ValueError, TypeError, OverflowError, RecursionError, msgpack.UnpackException)
_COPY_BELOW = 4096  # a payload up to this size is decoded from a copy, a bigger one from a view of the buffer
# how a payload is decoded: msgpack.unpackb(data, **UNPACK), a map with str keys expected (``_decode_payload``)
UNPACK = {"raw": False, "strict_map_key": True, "use_list": True}
unpackb = msgpack.unpackb


def _decode_payload(data, msg_id: int, msg_type: int) -> dict:
    """msgpack bytes -> dict with str keys, or BAD_REQUEST. Limits follow len(data)."""
    if not data:
        return {}
    try:
        obj = unpackb(data, **UNPACK)
    except _DECODE_ERRORS as exc:
        raise _error(f"malformed msgpack payload: {_malformed(exc, len(data))}", Status.BAD_REQUEST, msg_id, False,
                     msg_type) from None
    if type(obj) is not dict:  # msgpack makes plain dicts
        raise _error(f"the payload must be a msgpack map, not {kind(obj)}", Status.BAD_REQUEST, msg_id, False, msg_type)
    for key in obj:
        if type(key) is not str:  # msgpack makes str and bytes keys, never subclasses
            raise _error(f"payload keys must be strings (msgpack str), not {describe(key)}", Status.BAD_REQUEST,
                         msg_id, False, msg_type)
    return obj


# ------------------------------------------------------------------ error texts in msgpack's words
# An error reply speaks of the wire's types (msgpack's: nil, bool, int, float, str, bin,
# array, map, ext), never of the Python objects the decoder made of them. These run on
# error paths only.

_KINDS = {type(None): "nil", bool: "bool", int: "int", float: "float", str: "str", bytes: "bin",
          msgpack.ExtType: "ext", msgpack.Timestamp: "timestamp", list: "array", tuple: "array", dict: "map"}


def kind(value) -> str:
    """The msgpack type of a decoded value: nil, bool, int, float, str, bin, array, map,
    ext or timestamp (msgpack's ext type -1)."""
    name = _KINDS.get(type(value))
    if name is None:
        name = next((n for t, n in _KINDS.items() if isinstance(value, t)), "a value of no msgpack type")
    return name


def describe(value, most: int = 40) -> str:
    """A short rendering of a decoded value in msgpack's words, for an error text: nil,
    true, false, an int or float as written, a str in double quotes (cut at ``most``
    characters), ``a bin of N bytes``, ``an array of N``, ``a map of N``, ``an ext of type
    N``, ``a timestamp``."""
    if value is None:
        return "nil"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        text = repr(value) if isinstance(value, int) else _FLOATS.get(repr(value), repr(value))
        return text if len(text) <= most else text[: most - 3] + "..."
    if isinstance(value, str):
        text = value if len(value) <= most else value[: most - 3] + "..."
        return json.dumps(text, ensure_ascii=False)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"a bin of {_count(len(value), 'byte')}"
    if isinstance(value, msgpack.ExtType):  # (a tuple: before arrays)
        return f"an ext of type {value.code} ({_count(len(value.data), 'byte')})"
    if isinstance(value, msgpack.Timestamp):
        return "a timestamp (ext type -1)"
    if isinstance(value, (list, tuple)):
        return f"an array of {len(value)}"
    if isinstance(value, dict):
        return f"a map of {len(value)}"
    return kind(value)


_FLOATS = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
_MAP_KEY = re.compile(r"^(\w+) is not allowed for map key")
_TOO_LONG = re.compile(r"^(\d+) exceeds max_(str|bin|array|map|ext)_len\((\d+)\)")
_PY_KINDS = {"NoneType": "nil", "bool": "bool", "int": "int", "float": "float", "str": "str", "bytes": "bin",
             "list": "array", "tuple": "array", "dict": "map", "ExtType": "ext", "Timestamp": "timestamp"}


def _count(n: int, unit: str) -> str:
    return f"{n} {unit}{'' if n == 1 else 's'}"


def _malformed(exc: BaseException, size: int) -> str:
    """What is wrong with a payload msgpack could not decode, in msgpack's words (never empty)."""
    text = str(exc)
    if isinstance(exc, msgpack.ExtraData):
        return (f"{_count(len(exc.extra), 'byte')} after the first msgpack value: a payload is exactly one map, "
                "as long as the frame says")
    if isinstance(exc, msgpack.FormatError):
        return "the byte 0xc1, which starts no msgpack value (msgpack never uses it)"
    if isinstance(exc, (msgpack.StackError, RecursionError)):
        return "arrays and maps nested deeper than the decoder allows"
    if isinstance(exc, UnicodeDecodeError):
        return f"a str that is not valid UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start} of the str)"
    if "incomplete input" in text:
        return f"the payload ends inside a value: its msgpack needs more than the frame's {_count(size, 'byte')}"
    if m := _MAP_KEY.match(text):
        return f"a map key must be a str or a bin (the payload's own keys a str), not {_PY_KINDS.get(m[1], m[1])}"
    if m := _TOO_LONG.match(text):
        unit = "bytes" if m[2] in ("str", "bin", "ext") else "items" if m[2] == "array" else "pairs"
        return f"a msgpack {m[2]} of {m[1]} {unit}, more than the payload's {_count(size, 'byte')} can hold"
    if text.startswith("invalid timestamp data"):
        return "a timestamp (ext type -1) whose data is not 4, 8 or 12 bytes"
    if text.startswith("nanoseconds must be"):
        return "a timestamp (ext type -1) of more than 999999999 nanoseconds"
    if isinstance(exc, OverflowError):
        return "a number out of the decoder's range"
    if isinstance(exc, TypeError) and "unhashable" in text:
        return "a map key that is an array or a map"
    return "bytes that are not one msgpack value"


def decode_payload(data, msg_id: int = 0, msg_type: int = 0) -> dict:
    """A frame's payload bytes (one kept raw by ``next_parts``) as the decoder decodes them:
    a dict with str keys, or ProtocolError (BAD_REQUEST)."""
    return _decode_payload(data, msg_id, msg_type)


class FrameDecoder:
    """Bytes in (``feed``), frames out (``next_frame``); see the module docstring."""

    _COMPACT_AT = 64 * 1024  # drop consumed bytes once this many lead the buffer
    _KEEP = 64 * 1024  # a drained buffer up to this size is kept for the next bytes; a bigger one goes

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES):
        if isinstance(max_frame_bytes, bool) or not isinstance(max_frame_bytes, int) or max_frame_bytes < 0:
            raise ValueError(f"max_frame_bytes must be a non-negative int, not {max_frame_bytes!r}")
        self.max_frame_bytes = max_frame_bytes
        # Received bytes are _buf[_pos:_end]; len(_buf) is the room, grown by doubling
        # (``_room``), so a big frame fed in chunks is copied O(1) times per byte, not
        # once per chunk as ``bytearray +=`` does when it grows a big buffer.
        self._buf = bytearray()
        self._pos = 0  # start of the unconsumed bytes in _buf
        self._end = 0  # end of the received bytes in _buf
        self._skip = 0  # payload bytes of a rejected frame still to discard as they arrive
        self._failed: ProtocolError | None = None  # set by a fatal error; raised again

    @property
    def buffered(self) -> int:
        """Bytes received and held, not yet returned as a frame."""
        return self._end - self._pos

    def feed(self, data) -> None:
        """Append received bytes; any chunking is fine."""
        if self._failed is not None:
            return  # the connection is closing; hold nothing more
        if self._skip:
            n = min(self._skip, len(data))
            self._skip -= n
            if n == len(data):
                return
            data = memoryview(data)[n:]
        n = len(data)
        end = self._end
        if end + n > len(self._buf):
            end = self._room(n)
        self._buf[end : end + n] = data  # same size: a copy, never a resize
        self._end = end + n

    def expect(self, n: int) -> None:
        """Make room now for ``n`` more bytes the caller knows are coming (the rest of a
        frame it holds memory for), so that feeding them copies each byte once."""
        if self._end + n > len(self._buf) and not self._skip and self._failed is None:
            live = self._end - self._pos
            buf = bytearray(live + n)
            buf[:live] = memoryview(self._buf)[self._pos : self._end]
            self._buf, self._pos, self._end = buf, 0, live

    def _room(self, n: int) -> int:
        """Make room for ``n`` more bytes; returns where they go. The unconsumed bytes move
        to the front, into a buffer of twice what is then held (at least 4 KiB)."""
        pos, end = self._pos, self._end
        live = end - pos
        cap = max(2 * (live + n), 4096)
        if len(self._buf) >= cap and pos >= live:  # big enough: move them down, no overlap
            self._buf[:live] = memoryview(self._buf)[pos:end]
        else:
            buf = bytearray(cap)
            buf[:live] = memoryview(self._buf)[pos:end]
            self._buf = buf
        self._pos, self._end = 0, live
        return live

    def next_frame(self) -> Frame | None:
        """One complete frame, or None when more bytes are needed; raises ProtocolError."""
        parts = self.next_parts()
        return None if parts is None else Frame(*parts)

    def next_parts(self, raw=None) -> tuple | None:
        """``next_frame``'s fields as a plain tuple, (type, msg_id, payload, status,
        version), for a caller that unpacks them at once (the server, per request: a
        Frame costs more to make than the rest of a PING's decoding). ``raw``: msg ids
        whose payload, if their status is OK, comes as its bytes, not decoded (a client's
        plain CONSUME, whose reply the C codec reads itself: ``decode_payload`` reads it
        otherwise)."""
        if self._failed is not None:
            raise self._failed
        if self._skip:
            return None  # feed drops the rest of the rejected frame; the buffer is empty
        buf = self._buf
        start = self._pos
        end = self._end
        if end - start < HEADER_SIZE:
            return None
        header = _unpack_header_from(buf, start)  # the whole header in one call
        magic, length, msg_type, version, status, msg_id = header
        if magic != MAGIC or length > self.max_frame_bytes or version != VERSION:
            self._check_header(Header._make(header))  # raises; consumes a rejected frame
        start += HEADER_SIZE
        if end - start < length:
            return None  # a frame not whole yet stays as it came, its header too (``offer`` hands it on whole)
        pos = self._pos = start + length
        try:
            if raw and not status and msg_id in raw:
                with memoryview(buf)[start:pos] as view:
                    payload = bytes(view)
            elif length > _COPY_BELOW:
                with memoryview(buf)[start:pos] as view:  # msgpack reads a big payload in place
                    payload = _decode_payload(view, msg_id, msg_type)
            elif length:
                payload = _decode_payload(buf[start:pos], msg_id, msg_type)  # a small one: a copy costs less
            else:
                payload = {}
        finally:
            if pos == end:  # drained, as after most frames: no call to _compact
                self._pos = self._end = 0
                if len(buf) > self._KEEP:
                    self._buf = bytearray()
            elif pos >= self._COMPACT_AT:  # else nothing to drop yet
                self._compact()
        return msg_type, msg_id, payload, status, version

    def one_frame(self, data) -> tuple | None:
        """``feed(data)`` then ``next_parts()`` in one call, for the usual read of a client
        that waits for its replies: ``data`` is exactly one whole, good frame of up to
        4 KiB and nothing is buffered. Its parts; else None, nothing taken (a read of
        any other kind, or a frame that ``next_parts`` would refuse: the caller feeds
        it, and ``next_parts`` says what is wrong)."""
        n = len(data)
        if self._end or self._skip or self._failed is not None or n < HEADER_SIZE:
            return None
        magic, length, msg_type, version, status, msg_id = _unpack_header_from(data)
        if magic != MAGIC or version != VERSION or n != HEADER_SIZE + length or length > min(self.max_frame_bytes,
                                                                                               _COPY_BELOW):
            return None
        if not length:
            return msg_type, msg_id, {}, status, version
        try:
            return msg_type, msg_id, _decode_payload(data[HEADER_SIZE:], msg_id, msg_type), status, version
        except ProtocolError:
            return None

    def offer(self, take, *args):
        """Offer the held bytes, from a frame's start, to ``take(view, *args)``, which
        returns None (nothing taken) or a tuple whose first item is how many bytes it took
        (whole frames): those are consumed. ``take``'s result; None when it was not called
        (less than a header held, bytes being skipped, a failure). The
        server's plain requests in C get this way the frames a read completed, that came
        in more than one read."""
        if self._skip or self._failed is not None or self._end - self._pos < HEADER_SIZE:
            return None
        with memoryview(self._buf)[self._pos : self._end] as view:
            took = take(view, *args)
        if took is not None and took[0]:
            self._pos += took[0]
            self._compact()
        return took

    def frames(self) -> Iterator[Frame]:
        """Yield every complete frame buffered so far (raises like next_frame)."""
        while (frame := self.next_frame()) is not None:
            yield frame

    def _check_header(self, header: Header) -> None:
        if header.magic != MAGIC:
            self._fail(
                _error(f"bad magic 0x{header.magic:08X} (expected 0x{MAGIC:08X})", Status.BAD_FRAME, fatal=True)
            )
        if header.length > self.max_frame_bytes:
            self._fail(
                _error(
                    f"frame payload of {header.length} bytes exceeds max_frame_bytes={self.max_frame_bytes}",
                    Status.TOO_LARGE,
                    header.msg_id,
                    True,
                    header.type,
                )
            )
        if header.version != VERSION:
            # Consume the whole frame, as much as is here now and the rest as it arrives.
            self._pos += HEADER_SIZE
            here = min(header.length, self._end - self._pos)
            self._pos += here
            self._skip = header.length - here
            self._compact()
            raise _error(
                f"unsupported protocol version {header.version} (this side speaks {VERSION})",
                Status.UNSUPPORTED_VERSION,
                header.msg_id,
                False,
                header.type,
            )

    def _fail(self, err: ProtocolError) -> None:
        self._failed = err
        self._buf = bytearray()
        self._pos = self._end = 0
        raise err

    def _compact(self) -> None:
        # Consumed bytes are dropped all at once when the buffer is drained, or when
        # they are most of a big buffer: amortised O(1) per byte, even with 1-byte feeds.
        # A drained buffer is kept for the next bytes unless it is big (an idle
        # connection holds little).
        pos, end = self._pos, self._end
        if pos == end:
            self._pos = self._end = 0
            if len(self._buf) > self._KEEP:
                self._buf = bytearray()
        elif pos >= self._COMPACT_AT and 2 * pos >= end:
            self._buf = bytearray(memoryview(self._buf)[pos:end])
            self._pos, self._end = 0, end - pos
