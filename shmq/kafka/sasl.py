"""SASL/PLAIN (RFC 4616), the one mechanism the Kafka listener takes: the message is
``authzid NUL authcid NUL password`` in UTF-8."""

from .codes import ErrorCode, KafkaProtocolError

__all__ = ["MECHANISMS", "parse_plain"]

MECHANISMS = ("PLAIN",)


def parse_plain(message: bytes) -> tuple[str, str]:
    """(user, password) of a PLAIN message; KafkaProtocolError (SASL_AUTHENTICATION_FAILED)
    if it is not one."""
    parts = bytes(message).split(b"\0")
    if len(parts) != 3 or not parts[1]:
        raise KafkaProtocolError("a SASL/PLAIN message is authzid NUL user NUL password",
                                 ErrorCode.sasl_authentication_failed)
    try:
        return parts[1].decode(), parts[2].decode()
    except UnicodeDecodeError:
        raise KafkaProtocolError("a SASL/PLAIN message that is not UTF-8",
                                 ErrorCode.sasl_authentication_failed) from None
