"""Kafka's error codes (those shmq answers with), the error a malformed frame raises, and
the one table from shmq's errors to the code that answers them.

Strategy: the listener catches an engine error at one place per request and turns it
into a code with ``code_of``; the order of ``_TABLE`` matters (subclasses first). The
codes are shmq's own enum, not kio's, so that what a DEADBEEF server shares with the
Kafka listener (the transaction coordinator's refusals) imports without the ``kafka``
extra; kio writes any int enum's value, and a test holds each number to kio's.
"""

import enum

from ..errors import (LockTimeout, MessageTooLarge, OffsetOutOfRange, ShmqError, StorageError, StreamExists,
                      StreamNotFound)

__all__ = ["ErrorCode", "KafkaProtocolError", "code_of", "authorized_operations"]


class ErrorCode(enum.IntEnum):
    """Kafka's error codes (its protocol guide, "Error Codes"), by kio's names."""

    unknown_server_error = -1
    none = 0
    offset_out_of_range = 1
    corrupt_message = 2
    unknown_topic_or_partition = 3
    request_timed_out = 7
    message_too_large = 10
    offset_metadata_too_large = 12
    coordinator_not_available = 15
    invalid_topic_exception = 17
    invalid_required_acks = 21
    illegal_generation = 22
    inconsistent_group_protocol = 23
    invalid_group_id = 24
    unknown_member_id = 25
    invalid_session_timeout = 26
    rebalance_in_progress = 27
    invalid_commit_offset_size = 28
    invalid_timestamp = 32
    unsupported_sasl_mechanism = 33
    illegal_sasl_state = 34
    unsupported_version = 35
    topic_already_exists = 36
    invalid_partitions = 37
    invalid_replication_factor = 38
    invalid_replica_assignment = 39
    invalid_config = 40
    invalid_request = 42
    unsupported_for_message_format = 43
    out_of_order_sequence_number = 45
    invalid_producer_epoch = 47
    invalid_txn_state = 48
    invalid_producer_id_mapping = 49
    invalid_transaction_timeout = 50
    concurrent_transactions = 51
    operation_not_attempted = 55
    kafka_storage_error = 56
    sasl_authentication_failed = 58
    unknown_producer_id = 59
    non_empty_group = 68
    group_id_not_found = 69
    member_id_required = 79
    fenced_instance_id = 82
    group_subscribed_to_topic = 86
    invalid_record = 87
    unstable_offset_commit = 88
    producer_fenced = 90
    unknown_topic_id = 100
    transactional_id_not_found = 105
    unsupported_endpoint_type = 115


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
