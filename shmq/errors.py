"""Every error shmq raises: one hierarchy under :class:`ShmqError`.

Each class says when it happens and what the caller should do about it. The two
queue-state errors also subclass their :mod:`queue` counterparts, so code written
for ``queue.Queue`` / ``multiprocessing.Queue`` keeps working.
"""

import queue as _stdlib_queue

__all__ = [
    "ShmqError",
    "QueueNotFound",
    "QueueExists",
    "QueueFull",
    "QueueEmpty",
    "MessageTooLarge",
    "DeliveryExpired",
    "QueueCorrupted",
]


class ShmqError(Exception):
    """Base class of every shmq error."""


class QueueNotFound(ShmqError, LookupError):
    """No queue of that name exists (or it was deleted): create it first."""


class QueueExists(ShmqError):
    """``create_queue`` found the name taken: attach with ``queue()`` or pass ``exist_ok=True``."""


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
