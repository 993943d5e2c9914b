"""Compressed batches: the records of an APPEND_BATCH may travel as one zstd frame of
their msgpack list (``compression: "zstd"``, ``data: bin``).

Strategy: zstandard is optional (``pip install 'shmq[zstd]'``): a client without it
says so when asked to compress, a server without it answers BAD_REQUEST, and the HELLO
reply lists what a server can read (``CODECS``). Nothing decompressed is trusted: the
output is read in a bounded loop, never sized from the frame's own header (a zstd frame
may claim any content size), and stops past ``max_bytes``.
"""

import msgpack

from ..errors import MessageTooLarge
from .frames import _DECODE_ERRORS, _malformed, describe

try:
    import zstandard
except ImportError:  # the optional extra is not installed
    zstandard = None

__all__ = ["CODECS", "check_codec", "compress", "decompress"]

CODECS = ["zstd"] if zstandard is not None else []  # what this process can compress and read
_INSTALL = "pip install 'shmq[zstd]'"


def check_codec(codec):
    """``codec`` is None or a codec's name, else the local engine's ValueError."""
    if codec not in (None, "zstd"):
        raise ValueError(f"compression must be None or 'zstd', not {codec!r}")


def compress(records: list, codec: str) -> bytes:
    """One frame of ``records`` (their wire forms) compressed with ``codec``."""
    check_codec(codec)
    if zstandard is None:
        raise ModuleNotFoundError(f"compression='zstd' needs the zstandard package: {_INSTALL}")
    return zstandard.ZstdCompressor().compress(msgpack.packb(records, use_bin_type=True))


def decompress(data: bytes, codec: str, max_bytes: int):
    """What ``compress`` made (a msgpack value, for the caller to check), at most
    ``max_bytes`` once decompressed; ValueError for what cannot be read,
    MessageTooLarge past ``max_bytes``."""
    if codec is None:
        raise ValueError("compressed data needs its compression named")
    if codec != "zstd":  # (a server's words: the field is a str on the wire)
        raise ValueError(f"compression must be \"zstd\", not {describe(codec)}")
    if zstandard is None:
        raise ValueError(f"this server cannot read compression='zstd' ({_INSTALL} on its host)")
    raw = bytearray()
    try:
        with zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=False) as reader:
            while chunk := reader.read(max_bytes + 1 - len(raw)):
                raw += chunk
                if len(raw) > max_bytes:
                    raise MessageTooLarge(f"a compressed batch must decompress to at most {max_bytes} bytes")
    except zstandard.ZstdError as e:
        raise ValueError(f"compressed data cannot be read: {e}") from None
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except _DECODE_ERRORS as e:
        raise ValueError(f"compressed data is not a msgpack array of records: {_malformed(e, len(raw))}") from None
