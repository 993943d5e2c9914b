"""Kafka's framing: each request and response is an int32 size, then that many bytes.

Strategy: the decoder holds the bytes received and hands out whole frames; a size below
zero or above ``max_frame_bytes`` is refused when its four bytes are in, before any of
the body is kept (Kafka's ``socket.request.max.bytes`` does the same). The caller stops
reading while ``buffered`` is above what it wants to hold, so one connection holds about
one frame at most.
"""

import struct

from .codes import KafkaProtocolError

__all__ = ["FrameDecoder", "frame", "SIZE"]

SIZE = struct.Struct(">i")


def frame(body: bytes) -> bytes:
    """``body`` with its size in front."""
    return SIZE.pack(len(body)) + body


class FrameDecoder:
    """``receive_data(bytes)``, then ``next_frame()`` until None. It parses, or it raises
    KafkaProtocolError: anything else is a bug."""

    def __init__(self, max_frame_bytes: int):
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._pos = 0
        self._scan = 0  # where the first frame not yet seen whole by ``scan`` starts

    @property
    def buffered(self) -> int:
        """Bytes received and not yet handed out."""
        return len(self._buf) - self._pos

    def receive_data(self, data) -> None:
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = self._scan = 0
        self._buf += data

    def scan(self) -> tuple[int, int]:
        """(bytes received of a frame not yet whole, frames that became whole since the
        last scan): what a frame timeout needs. A size out of bounds counts as a frame
        still open (``next_frame`` raises on it)."""
        buf, n = self._buf, len(self._buf)
        pos = max(self._scan, self._pos)
        ended = 0
        while n - pos >= 4:
            (size,) = SIZE.unpack_from(buf, pos)
            if size < 0 or pos + 4 + size > n:
                break
            pos += 4 + size
            ended += 1
        self._scan = pos
        return n - pos, ended

    def next_frame(self) -> bytes | None:
        """The next whole frame's body, or None until more bytes come. KafkaProtocolError
        for a size out of bounds (the connection cannot go on: where the next frame
        starts is unknown)."""
        buf, pos = self._buf, self._pos
        if len(buf) - pos < 4:
            return None
        (n,) = SIZE.unpack_from(buf, pos)
        if n < 0 or n > self.max_frame_bytes:
            raise KafkaProtocolError(f"a frame of {n} bytes; this port takes 0..{self.max_frame_bytes}")
        end = pos + 4 + n
        if len(buf) < end:
            return None
        body = bytes(buf[pos + 4:end])
        if end == len(buf):
            buf.clear()
            self._pos = self._scan = 0
        elif end > 65536:  # drop what was handed out, now and then
            del buf[:end]
            self._pos = 0
            self._scan = max(self._scan - end, 0)
        else:
            self._pos = end
        return body
