"""Status codes and exceptions, mapped in one table for the server and both clients.

Strategy: as redis-py's ``EXCEPTION_CLASSES``, one table pairs each error status with
the exception it stands for. A client raises the first class listed for a reply's
status (``error_from_reply``); the server answers an exception with the status of the
first row it is an instance of (``status_of``), so subclasses come before their bases.
"""

from ..errors import (
    DeliveryExpired,
    LimitExceeded,
    LockTimeout,
    MessageTooLarge,
    ProtocolError,
    QueueEmpty,
    QueueExists,
    QueueFull,
    QueueNotFound,
    ShmqError,
    StorageError,
    Unauthorized,
)
from .frames import Frame, Status

__all__ = ["STATUS_EXCEPTIONS", "EXCEPTIONS", "status_of", "error_from_reply", "reason_of"]

STATUS_EXCEPTIONS = (
    (Status.STORAGE, StorageError),
    (Status.LOCK_TIMEOUT, LockTimeout),
    (Status.LIMIT_EXCEEDED, LimitExceeded),
    (Status.UNAUTHORIZED, Unauthorized),
    (Status.NO_SUCH_QUEUE, QueueNotFound),
    (Status.QUEUE_EXISTS, QueueExists),
    (Status.QUEUE_FULL, QueueFull),
    (Status.TOO_LARGE, MessageTooLarge),
    (Status.UNKNOWN_DELIVERY, DeliveryExpired),
    (Status.BAD_FRAME, ProtocolError),
    (Status.UNSUPPORTED_VERSION, ProtocolError),
    (Status.BAD_REQUEST, ValueError),
    (Status.BAD_REQUEST, TypeError),
    (Status.INTERNAL, ShmqError),
)

# status -> the exception a client raises for it (the first row of that status)
EXCEPTIONS = {}
for _status, _cls in STATUS_EXCEPTIONS:
    EXCEPTIONS.setdefault(_status, _cls)


def status_of(exc: BaseException) -> int:
    """The reply status that answers ``exc``: a ProtocolError's own, else the first row
    of the table it is an instance of, else INTERNAL."""
    if isinstance(exc, ProtocolError):
        return exc.status
    for status, cls in STATUS_EXCEPTIONS:
        if isinstance(exc, cls):
            return status
    return Status.INTERNAL


def reason_of(exc: BaseException) -> str:
    """An exception's text for an error reply: its first line, at most 500 characters."""
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:500]


def error_from_reply(frame: Frame, endpoint: str) -> Exception:
    """The exception a non-OK reply stands for, with the server's reason as its text."""
    reason = frame.payload.get("error") if isinstance(frame.payload, dict) else None
    cls = EXCEPTIONS.get(frame.status, ShmqError)
    message = reason or f"{endpoint}: status {frame.status}"
    if cls is ProtocolError:
        return ProtocolError(message, frame.status, frame.msg_id)
    return cls(message)


assert QueueEmpty not in EXCEPTIONS.values()  # an empty queue is an empty CONSUME reply, never an error
