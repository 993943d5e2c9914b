"""Kafka's error codes (kio's ``ErrorCode``), the error a malformed frame raises, and
the one table from shmq's errors to the code that answers them.

Strategy: the listener catches an engine error at one place per request and turns it
into a code with ``code_of``; the order of ``_TABLE`` matters (subclasses first).
"""

from kio.schema.errors import ErrorCode

from ..errors import (LockTimeout, MessageTooLarge, OffsetOutOfRange, ShmqError, StorageError, StreamExists,
                      StreamNotFound)

__all__ = ["ErrorCode", "KafkaProtocolError", "code_of"]


class KafkaProtocolError(ShmqError):
    """Bytes on a Kafka port that break Kafka's protocol (a frame too big or cut short,
    a header or body that does not parse, a record batch with a wrong CRC). The listener
    logs the reason and closes the connection, or answers ``code`` where the request could
    be read."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.corrupt_message):
        super().__init__(message)
        self.code = code


_TABLE = (
    (StreamNotFound, ErrorCode.unknown_topic_or_partition),
    (StreamExists, ErrorCode.topic_already_exists),
    (MessageTooLarge, ErrorCode.message_too_large),
    (OffsetOutOfRange, ErrorCode.offset_out_of_range),
    (StorageError, ErrorCode.kafka_storage_error),
    (LockTimeout, ErrorCode.request_timed_out),
    (KafkaProtocolError, None),  # its own code
    (ShmqError, ErrorCode.unknown_server_error),
)


def code_of(e: BaseException) -> ErrorCode:
    """The Kafka error code that answers the exception ``e``."""
    for cls, code in _TABLE:
        if isinstance(e, cls):
            return e.code if code is None else code
    return ErrorCode.unknown_server_error
