"""A queue's values, whichever transport hands them out: ``Message`` (a peek),
``QueueStats``, and what a body may be (``as_bytes``, ``as_body``, ``raw_body``)."""

from dataclasses import dataclass

__all__ = ["Message", "QueueStats", "as_bytes", "as_buffer", "as_body", "raw_body"]


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A snapshot of one queue's counters (``Queue.stats()``)."""

    ready: int
    in_flight: int
    oldest_ready_age_s: float
    bytes_used: int
    max_bytes: int
    enqueued_total: int
    acked_total: int
    redelivered_total: int
    dead_lettered_total: int
    consumers_waiting: int
    producers_waiting: int
    delayed: int = 0
    purged_total: int = 0
    expired_total: int = 0
    ready_by_priority: tuple = ()  # ready messages per priority level, level 0 first
    groups_in_flight: int = 0  # message groups with a message leased or delayed
    dead_letter_depth: int | None = None  # ready messages in the dead-letter queue (None: no DLQ)
    bytes_held: int = 0  # bytes of /dev/shm the queue's segments hold (what the kernel counts)
    consumers: int = 0  # consumers registered (``add_consumer``), every process's and connection's


@dataclass(frozen=True, slots=True)
class Message:
    """A message looked at without leasing it (``Queue.peek``)."""

    id: int
    body: bytes
    headers: dict
    attempt: int
    priority: int
    enqueued_at: float
    group: str | None
    queue: str


def _view(value, what) -> memoryview:
    try:
        return memoryview(value)
    except TypeError:
        raise TypeError(f"{what} must be bytes-like, not {type(value).__name__}") from None


def as_bytes(value, what="message body"):
    """``value`` as bytes (any object with the buffer protocol: bytearray, memoryview,
    array.array, a numpy array, its bytes as they lie); TypeError naming ``what`` otherwise."""
    if type(value) is bytes:
        return value
    with _view(value, what) as view:
        return view.tobytes()


def as_buffer(value, what="message body"):
    """``value`` as bytes, or as a flat byte view of its own memory where that is one piece (a
    C-contiguous bytearray, memoryview, array or numpy array: the queue then copies it once,
    into its memory); TypeError naming ``what`` for what has no buffer."""
    if type(value) is bytes:
        return value
    view = _view(value, what)
    if view.c_contiguous:
        if view.format == "B" and view.ndim == 1:
            return view
        try:
            return view.cast("B")
        except (TypeError, ValueError):  # (a format cast cannot take: its bytes, copied)
            pass
    with view:
        return view.tobytes()


def as_body(value):
    """A put_many item as bytes; a tuple gets a TypeError that says where headers go."""
    if type(value) is tuple:
        raise TypeError("put_many items are bodies, not tuples: give headers with headers= "
                        "(one map for all, or a list of maps item by item)")
    return as_bytes(value)


def raw_body(d) -> bytes:
    """A delivery's body as bytes, also when a serializer loaded ``d.body``."""
    try:
        raw = d._raw
    except AttributeError:  # a TCP client's delivery with no serializer
        return d.body
    return d.body if raw is None else raw
