"""Status codes and exceptions, mapped in one table for the server and both clients.

Strategy: as redis-py's ``EXCEPTION_CLASSES``, one table pairs each error status with
the exception it stands for. A client raises the first class listed for a reply's
status (``error_from_reply``); the server answers an exception with the status of the
first row it is an instance of (``status_of``), so subclasses come before their bases.
An exception that carries data for programs names its attributes in the row's third
column: they travel beside the error text (``error_details``) and come back as the
exception's keyword arguments (OffsetOutOfRange's ``earliest`` and ``end``).
"""

from ..errors import (
    CommitFailed,
    DeliveryExpired,
    ExchangeExists,
    ExchangeNotFound,
    LimitExceeded,
    LockTimeout,
    MessageTooLarge,
    OffsetOutOfRange,
    ProducerFenced,
    ProtocolError,
    QueueEmpty,
    QueueExists,
    QueueFull,
    QueueNotFound,
    RequestTimeout,
    ShmqError,
    StorageError,
    StreamExists,
    StreamNotFound,
    TransactionError,
    Unauthorized,
    WrongType,
)
from .frames import Frame, Status

__all__ = ["STATUS_EXCEPTIONS", "EXCEPTIONS", "status_of", "error_from_reply", "error_details", "reason_of"]

STATUS_EXCEPTIONS = (
    (Status.STREAM_NOT_FOUND, StreamNotFound),
    (Status.STREAM_EXISTS, StreamExists),
    (Status.OFFSET_OUT_OF_RANGE, OffsetOutOfRange, ("earliest", "end")),
    (Status.COMMIT_FAILED, CommitFailed),
    (Status.PRODUCER_FENCED, ProducerFenced),  # (before TRANSACTION: it is a TransactionError)
    (Status.TRANSACTION, TransactionError),
    (Status.EXCHANGE_NOT_FOUND, ExchangeNotFound),
    (Status.EXCHANGE_EXISTS, ExchangeExists),
    (Status.REQUEST_TIMEOUT, RequestTimeout),
    (Status.WRONG_TYPE, WrongType),  # (before BAD_REQUEST's TypeError: it is one)
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
_DETAILS = {}  # exception class -> the attributes that travel with it
for _status, _cls, *_details in STATUS_EXCEPTIONS:
    EXCEPTIONS.setdefault(_status, _cls)
    _DETAILS[_cls] = tuple(*_details)


def status_of(exc: BaseException) -> int:
    """The reply status that answers ``exc``: a ProtocolError's own, else the first row
    of the table it is an instance of, else INTERNAL."""
    if isinstance(exc, ProtocolError):
        return exc.status
    for status, cls, *_details in STATUS_EXCEPTIONS:
        if isinstance(exc, cls):
            return status
    return Status.INTERNAL


def reason_of(exc: BaseException) -> str:
    """An exception's text for an error reply: its first line, at most 500 characters (one
    without a text: its status's name, never a Python class's)."""
    text = str(exc).strip() or f"{Status(status_of(exc)).name} (the server gave no reason)"
    return text.splitlines()[0][:500]


def error_details(exc: BaseException) -> dict:
    """What an error reply carries besides its text: the attributes its row names."""
    return {name: getattr(exc, name) for name in _DETAILS.get(type(exc), ())}


def error_from_reply(frame: Frame, endpoint: str) -> Exception:
    """The exception a non-OK reply stands for, with the server's reason as its text (and
    the details its row names, where the reply has them as ints)."""
    payload = frame.payload if isinstance(frame.payload, dict) else {}
    cls = EXCEPTIONS.get(frame.status, ShmqError)
    message = payload.get("error") or f"{endpoint}: status {frame.status}"
    if cls is ProtocolError:
        return ProtocolError(message, frame.status, frame.msg_id)
    details = {k: payload[k] for k in _DETAILS[cls] if type(payload.get(k)) is int}
    return cls(message, **details)


assert QueueEmpty not in EXCEPTIONS.values()  # an empty queue is an empty CONSUME reply, never an error
