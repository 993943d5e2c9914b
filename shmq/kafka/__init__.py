"""Kafka's wire protocol, sans-IO: what shmq's Kafka listener (``shmq.server.kafka``)
parses and writes, with no socket in sight (docs/KAFKA.md).

Strategy: one module per concern, each a few pure functions over bytes, so every part
can be fed garbage in a test: ``frames`` (the 4-byte size prefix, bounded),
``messages`` (request headers and bodies, responses: the schemas are kio's generated
classes, one per API and version), ``records`` (record batches v2, CRC-32C) with
``compression`` (gzip, snappy, lz4, zstd, bounded on the way in), ``headers`` (Kafka's
record headers <-> a native record's), ``sasl`` (SASL/PLAIN) and ``codes`` (Kafka's error
codes, and the shmq errors they answer), ``control`` (a transaction's control records).
None of them imports the engine.
"""

import importlib

# name -> the module that holds it: imported when first asked for, so that ``codes`` and
# ``control`` (what the DEADBEEF server's transaction coordinator shares with the Kafka
# listener) load without the ``kafka`` extra's kio, crc32c and codecs
_EXPORTS = {"ErrorCode": "codes", "KafkaProtocolError": "codes", "FrameDecoder": "frames", "frame": "frames",
            "Request": "messages", "build": "messages", "encode_response": "messages", "parse_request": "messages"}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
