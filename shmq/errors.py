"""Every error shmq raises: one hierarchy under :class:`ShmqError`.

Each class says when it happens and what the caller should do about it. The two
queue-state errors also subclass their :mod:`queue` counterparts, so code written
for ``queue.Queue`` / ``multiprocessing.Queue`` keeps working.
"""

import queue as _stdlib_queue

__all__ = [
    "ShmqError",
    "NamespaceNotFound",
    "QueueNotFound",
    "QueueExists",
    "SettingsMismatch",
    "QueueFull",
    "QueueEmpty",
    "MessageTooLarge",
    "DeliveryExpired",
    "SerializationError",
    "QueueCorrupted",
    "LayoutMismatch",
    "StreamLayoutMismatch",
    "ProtocolError",
    "Unauthorized",
    "BrokerUnavailable",
    "OutcomeUnknown",
    "StorageError",
    "ShmFull",
    "LockTimeout",
    "LimitExceeded",
    "StreamNotFound",
    "StreamExists",
    "OffsetOutOfRange",
    "CommitFailed",
    "TransactionError",
    "ProducerFenced",
    "ExchangeNotFound",
    "ExchangeExists",
    "RequestTimeout",
    "WrongType",
]


class ShmqError(Exception):
    """Base class of every shmq error."""


class NamespaceNotFound(ShmqError, FileNotFoundError):
    """``connect(namespace=..., create=False)`` found no such namespace on this host
    (nothing made a queue, stream or exchange in it, or it was destroyed): check the
    name, or connect without ``create=False`` and create what you need."""


class QueueNotFound(ShmqError, LookupError):
    """No queue of that name exists (or it was deleted): create it first."""


class QueueExists(ShmqError):
    """``create_queue`` found the name taken: attach with ``queue()`` or pass ``exist_ok=True``.
    With ``exist_ok``: the queue there has other settings than those asked (the message
    names each, with both values): use it as it is, or delete it and create it again."""


class SettingsMismatch(QueueExists):
    """``declare_queue`` / ``update_queue`` asked to change a setting that a live queue
    cannot change (its size, priorities, lanes, durability: the message names each, with
    both values): keep the queue's value, or delete the queue and create it again. Over
    TCP it travels as QueueExists' status, and the clients raise this class again."""


class QueueFull(ShmqError, _stdlib_queue.Full):
    """No room for the message before the timeout: back off, consume, or raise ``max_bytes``."""


class QueueEmpty(ShmqError, _stdlib_queue.Empty):
    """No message became ready before the timeout: try again later."""


class MessageTooLarge(ShmqError, ValueError):
    """The body, its headers, or the record could never fit: nothing was enqueued."""


class DeliveryExpired(ShmqError):
    """The delivery is no longer yours: its lease expired, it was already settled, or it
    is unknown. Nothing changed; the message is (or will be) delivered again."""


class QueueCorrupted(ShmqError):
    """A segment does not hold a shmq queue of this layout version (foreign or damaged)."""


class LayoutMismatch(QueueCorrupted):
    """A queue's or stream's shared memory was made by another shmq version, of another
    layout (the version word in its header): this one cannot read it. ``kind`` ("queue" or
    "stream"), ``name``, ``found`` and ``expected`` (layout versions) say which. An older
    one's: stop every process using the namespace and start this version's ``shmq server
    --data-dir`` on the data dir its broker snapshotted to: it rebuilds them from the files
    (docs/OPERATIONS.md, Upgrading). A newer one's: use that newer shmq."""

    def __init__(self, message: str, kind: str = "queue", name: str = "", found: int = 0, expected: int = 0):
        super().__init__(message)
        self.kind, self.name, self.found, self.expected = kind, name, found, expected


class ProtocolError(ShmqError):
    """Bytes on the wire that break the DEADBEEF protocol (docs/PROTOCOL.md).

    ``status`` is the reply status code that answers it, ``msg_id`` the request's id
    when the header could be read (else 0), and ``fatal`` says whether the connection
    must close after the error reply (bad magic, oversized frame) or stays usable.
    """

    def __init__(self, message: str, status: int, msg_id: int = 0, fatal: bool = False):
        super().__init__(message)
        self.status = status
        self.msg_id = msg_id
        self.fatal = fatal


class Unauthorized(ShmqError, PermissionError):
    """The server wants a token and this one is missing or wrong: pass ``token=``. Locally:
    the namespace is another user's, or shared with a group this user is not in."""


class BrokerUnavailable(ShmqError, ConnectionError):
    """The broker at the endpoint could not be reached or the connection broke: check
    that ``shmq server`` runs there, then reconnect."""


class OutcomeUnknown(BrokerUnavailable):
    """The connection ended after a request was sent and before its reply came (lost,
    dropped for a late reply, or closed by another thread): the server may or may not
    have carried it out — a put may have landed, an ack may have settled. Nothing is
    sent again by itself. Repeat only what is safe to repeat (a put with a ``dedup_id``;
    a get: what the lost connection leased is given back), else look first (``stats``,
    ``peek``). The next call connects again. A request that was never sent raises a
    plain ``BrokerUnavailable``: it was not carried out."""


class StorageError(ShmqError, OSError):
    """Storage ran out: the broker's data directory could not take a write-ahead log
    entry (disk full, directory deleted, I/O error), or /dev/shm has no room for a new
    queue. Nothing was enqueued, settled or created, and the log is as it was: free
    space (or restore the data directory), then retry."""


class ShmFull(StorageError, QueueFull):
    """/dev/shm had no room for the records before the timeout (a put with a timeout waits
    for room there within it, as for a full queue; one with none, and an append, raise at
    once, since /dev/shm may never have room again): nothing was
    written, and what is stored is intact. Consume, purge or delete messages, or enlarge
    /dev/shm (Docker: --shm-size). Also a ``queue.Full``, as a full queue's error is. Over
    TCP it arrives as a StorageError (status STORAGE)."""


class LockTimeout(ShmqError, TimeoutError):
    """A queue's lock stayed held by a live process (stopped, or in a debugger) for
    longer than this call may wait. Nothing changed: retry later, or find that process."""


class LimitExceeded(ShmqError):
    """The server refused the request because a limit was reached (waiting requests
    per connection, connections, buffered bytes). Nothing changed: wait for replies
    before sending more, or raise the limit on the server."""


class StreamNotFound(ShmqError, LookupError):
    """No stream of that name exists (or it was deleted): create it first."""


class StreamExists(ShmqError):
    """``create_stream`` found the name taken: attach with ``stream()`` or pass ``exist_ok=True``.
    With ``exist_ok``: the stream there has other settings than those asked (the message
    names each, with both values): use it as it is, or delete it and create it again."""


class OffsetOutOfRange(ShmqError, IndexError):
    """A read below the partition's retained range (retention dropped it) or past its end.
    ``earliest`` and ``end`` say what can be read now: seek there and read again."""

    def __init__(self, message: str, earliest: int = 0, end: int = 0):
        super().__init__(message)
        self.earliest = earliest
        self.end = end


class CommitFailed(ShmqError):
    """A commit was refused, and nothing was committed: a partition it names is not the
    consumer's, or went to another member (and perhaps came back) since the consumer
    last polled; the message says which. Poll again: partitions it kept go on from its
    position; the owner of those it lost reads them from the last commit."""


class TransactionError(ShmqError):
    """A transaction cannot go on: its state does not take this call (a commit with none
    begun), the coordinator aborted it (past its timeout), or its records cannot be
    written; the message says which. Abort it, and begin again."""


class ProducerFenced(TransactionError):
    """Another producer initialized this transactional id since this one did (or this
    one's transaction ran past its timeout and was aborted): this producer can do no
    more. Close it; a new one takes the id over."""


class ExchangeNotFound(ShmqError, LookupError):
    """No exchange of that name exists (or it was deleted): create it first."""


class ExchangeExists(ShmqError):
    """``create_exchange`` found the name taken by an exchange of another type, or
    ``exist_ok`` was not given: pick another name, or pass ``exist_ok=True``."""


class RequestTimeout(ShmqError, TimeoutError):
    """``request`` got no reply within its timeout. The request may still be handled
    (it stays in the queue until a worker takes it), but its reply is dropped: make
    requests safe to repeat, then retry or give up."""


class SerializationError(ShmqError, ValueError):
    """A body the queue handle's serializer could not load (a message put by a producer
    with another serializer, or none): it was given back, its attempt counted; with
    ``max_deliveries`` it ends in the dead-letter queue."""


class StreamLayoutMismatch(LayoutMismatch, StreamNotFound):
    """A stream's LayoutMismatch. It is also a StreamNotFound, as such a stream was taken
    before: a delete goes on, what looks streams over passes it by, and over TCP it travels
    as StreamNotFound's status, with this message."""


class WrongType(ShmqError, TypeError):
    """A keyed store's key holds another kind than the call works on: a set where a
    value is read or counted, a value where a set is, or (``incr``) a value that is not
    an integer. Nothing changed: use another key, or delete this one first."""
