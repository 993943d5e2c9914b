"""Kafka's error codes (kio's ``ErrorCode``), the error a malformed frame raises, and
the one table from shmq's errors to the code that answers them.

Strategy: the listener catches an engine error at one place per request and turns it
into a code with ``code_of``; the order of ``_TABLE`` matters (subclasses first).
"""

from kio.schema.errors import ErrorCode

from ..errors import (LockTimeout, MessageTooLarge, OffsetOutOfRange, ShmqError, StorageError, StreamExists,
                      StreamNotFound)

__all__ = ["ErrorCode", "KafkaProtocolError", "code_of", "authorized_operations"]


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


# Kafka's ACL operations (AclOperation) that each kind of resource has: with no ACLs, one
# who holds the token may do all of them, and a request that asks is told so
_OPERATIONS = {"cluster": (5, 7, 8, 9, 10, 11, 12), "topic": (3, 4, 5, 6, 7, 8, 10, 11), "group": (3, 6, 8)}
NOT_ASKED = -2**31  # an authorized-operations field not asked for (INT32_MIN)


def authorized_operations(resource: str, asked: bool) -> int:
    """The authorized-operations bit field of a response: every operation ``resource``
    ("cluster", "topic", "group") has, where the request ``asked``."""
    return sum(1 << op for op in _OPERATIONS[resource]) if asked else NOT_ASKED
