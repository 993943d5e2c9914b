"""Message headers: their home is ``shmq.model.headers``; the engine's old name for it."""

from ..model.headers import MAX_HEADERS_BYTES, decode_headers, encode_headers, per_item

__all__ = ["MAX_HEADERS_BYTES", "encode_headers", "decode_headers", "per_item"]
