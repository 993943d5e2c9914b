"""The codecs of Kafka's record batches (attributes bits 0-2): none, gzip, snappy, lz4,
zstd, both ways.

Strategy: what comes in is decompressed with a bound (``limit`` bytes out at most, else
KafkaProtocolError), so a small batch cannot unfold into gigabytes. Snappy is read in
both forms clients send: raw blocks (librdkafka) and the xerial framing of the Java
client (snappy-java's stream: a magic header, then length-prefixed blocks); it is
written in the xerial form, which every client reads.
"""

import gzip
import io
import struct
import zlib

import lz4.frame
import snappy
import zstandard

from .codes import KafkaProtocolError

__all__ = ["CODECS", "NONE", "GZIP", "SNAPPY", "LZ4", "ZSTD", "compress", "decompress"]

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODECS = {"none": NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}
_NAMES = {v: k for k, v in CODECS.items()}
_XERIAL = b"\x82SNAPPY\x00"
_XERIAL_HEAD = _XERIAL + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024
_INT = struct.Struct(">i")


def compress(codec: int, data: bytes) -> bytes:
    if codec == NONE:
        return data
    if codec == GZIP:
        return gzip.compress(data, compresslevel=6)
    if codec == SNAPPY:
        out = [_XERIAL_HEAD]
        for i in range(0, len(data), _XERIAL_BLOCK):
            block = snappy.compress(data[i:i + _XERIAL_BLOCK])
            out += [_INT.pack(len(block)), block]
        return b"".join(out)
    if codec == LZ4:
        return lz4.frame.compress(data)
    if codec == ZSTD:
        return zstandard.ZstdCompressor().compress(data)
    raise KafkaProtocolError(f"compression codec {codec} is not one of Kafka's (0-4)")


def decompress(codec: int, data, limit: int) -> bytes:
    """``data`` decompressed with ``codec``: at most ``limit`` bytes, else (or for data
    that is not of that codec) KafkaProtocolError."""
    if codec == NONE:
        return bytes(data)
    name = _NAMES.get(codec)
    if name is None:
        raise KafkaProtocolError(f"compression codec {codec} is not one of Kafka's (0-4)")
    try:
        out = _DECODERS[codec](bytes(data), limit)
    except KafkaProtocolError:
        raise
    except Exception as e:  # whatever the library says of bad input
        raise KafkaProtocolError(f"a {name} batch that does not decompress ({type(e).__name__}: {e})"[:300]) from None
    if len(out) > limit:
        raise _too_big(name, limit)
    return out


def _too_big(name, limit):
    return KafkaProtocolError(f"a {name} batch that decompresses to more than {limit} bytes")


def _gzip(data, limit):
    d = zlib.decompressobj(wbits=47)  # gzip or zlib header
    out = d.decompress(data, limit + 1)
    if len(out) > limit:
        raise _too_big("gzip", limit)
    if not d.eof:
        raise KafkaProtocolError("a gzip batch cut short")
    return out


def _snappy_block(block, budget, limit):
    """One raw snappy block, whose varint prefix (the length it unfolds to) is checked first."""
    n = shift = 0
    for i in range(min(len(block), 5)):
        n |= (block[i] & 0x7F) << shift
        shift += 7
        if not block[i] & 0x80:
            break
    else:
        raise KafkaProtocolError("a snappy block without its length")
    if n > budget:
        raise _too_big("snappy", limit)
    return snappy.uncompress(block)


def _snappy(data, limit):
    if not data.startswith(_XERIAL):
        return _snappy_block(data, limit, limit)
    out, pos = [], 16
    if len(data) < pos:
        raise KafkaProtocolError("a snappy (xerial) batch cut short")
    left = limit
    while pos < len(data):
        if pos + 4 > len(data):
            raise KafkaProtocolError("a snappy (xerial) batch cut short")
        (n,) = _INT.unpack_from(data, pos)
        if n < 0 or pos + 4 + n > len(data):
            raise KafkaProtocolError("a snappy (xerial) block cut short")
        block = _snappy_block(data[pos + 4:pos + 4 + n], left, limit)
        left -= len(block)
        out.append(block)
        pos += 4 + n
    return b"".join(out)


def _lz4(data, limit):
    d = lz4.frame.LZ4FrameDecompressor()
    out = d.decompress(data, max_length=limit + 1)
    if len(out) > limit:
        raise _too_big("lz4", limit)
    if not d.eof:
        raise KafkaProtocolError("an lz4 batch cut short")
    return out


def _zstd(data, limit):
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) as r:
        out = r.read(limit + 1)
    if len(out) > limit:
        raise _too_big("zstd", limit)
    return out


_DECODERS = {GZIP: _gzip, SNAPPY: _snappy, LZ4: _lz4, ZSTD: _zstd}
