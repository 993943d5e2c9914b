"""Kafka's wire protocol, sans-IO: what shmq's Kafka listener (``shmq.server.kafka``)
parses and writes, with no socket in sight (docs/KAFKA.md).

Strategy: one module per concern, each a few pure functions over bytes, so every part
can be fed garbage in a test: ``frames`` (the 4-byte size prefix, bounded),
``messages`` (request headers and bodies, responses: the schemas are kio's generated
classes, one per API and version), ``records`` (record batches v2, CRC-32C) with
``compression`` (gzip, snappy, lz4, zstd, bounded on the way in), ``headers`` (Kafka's
record headers <-> a native record's), ``sasl`` (SASL/PLAIN) and ``codes`` (Kafka's error
codes, and the shmq errors they answer). None of them imports the engine.
"""

from .codes import ErrorCode, KafkaProtocolError
from .frames import FrameDecoder, frame
from .messages import Request, build, encode_response, parse_request

__all__ = ["ErrorCode", "KafkaProtocolError", "FrameDecoder", "frame", "Request", "build", "encode_response",
           "parse_request"]
