"""The DEADBEEF wire protocol, sans-IO (docs/PROTOCOL.md): ``frames`` (the header,
encoding, ``FrameDecoder``), ``requests`` (the fields of each request type, checked),
``status`` (status codes and exceptions, one table), ``payloads`` (the payloads both
sides share). It owns no socket: the server and both clients move the bytes."""

from ..errors import ProtocolError
from .frames import (
    DEFAULT_MAX_FRAME_BYTES,
    HEADER_SIZE,
    MAGIC,
    REPLY_BIT,
    VERSION,
    Frame,
    FrameDecoder,
    Header,
    MsgType,
    PushType,
    Status,
    encode_error,
    encode_frame,
    encode_reply,
    encode_request,
    pack_header,
    unpack_header,
)
from .requests import REQUEST_FIELDS, Field, validate_request
from .status import EXCEPTIONS, error_from_reply, status_of

__all__ = [
    "MAGIC", "VERSION", "HEADER_SIZE", "DEFAULT_MAX_FRAME_BYTES", "REPLY_BIT", "MsgType", "PushType", "Status", "Frame",
    "Header", "Field", "REQUEST_FIELDS", "ProtocolError", "pack_header", "unpack_header", "encode_frame",
    "encode_request", "encode_reply", "encode_error", "FrameDecoder", "validate_request", "EXCEPTIONS",
    "status_of", "error_from_reply",
]
