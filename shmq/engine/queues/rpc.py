"""Request/reply over queues: a request carries where to answer and a correlation id.

Strategy: no engine change. ``request`` makes a reply queue of its own for the one
request (durability "memory"), puts the request with the headers ``x-reply-to`` (that
queue) and ``x-correlation-id``, waits on the reply queue, and deletes it, whatever
happens. A reply that comes after the wait gave up finds no queue and is dropped, so
late replies never pile up. A reply queue is named after its owner's identity
(``_rpc.PID.START_MS.N``, ``process``): one left behind by a requester killed while it
waited is removed by the next ``request`` in the namespace, and by the server's
housekeeper (``remove_orphans``). Over TCP the server makes and owns the reply queue of
each waiting request for its connection, and deletes it when the request ends or the
connection closes; a server killed meanwhile is a dead owner like any other.
"""

import itertools
import time
import uuid

from ...errors import QueueEmpty, QueueNotFound, RequestTimeout
from ...model.headers import CORRELATION_ID, REPLY_TO, reply_headers
from ..shm.process import current_identity, is_alive

__all__ = ["REPLY_TO", "CORRELATION_ID", "REPLY_PREFIX", "Call", "request", "reply", "reply_queue_name",
           "owner_of", "remove_orphans"]

REPLY_PREFIX = "_rpc."
REPLY_QUEUE_BYTES = 2 * 2**20 + 4096  # a reply queue holds one reply of up to 2 MiB
_seq = itertools.count(1)


def reply_queue_name() -> str:
    """A new reply queue name owned by this process: ``_rpc.PID.START_MS.N``."""
    pid, start = current_identity()
    return f"{REPLY_PREFIX}{pid}.{start}.{next(_seq)}"


def owner_of(name: str):
    """(pid, start_ms) of the process owning reply queue ``name``; None if it is not one."""
    if not name.startswith(REPLY_PREFIX):
        return None
    parts = name[len(REPLY_PREFIX):].split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def remove_orphans(broker, names=None) -> list[str]:
    """Delete the reply queues whose owner process is dead; returns their names.
    ``names``: the namespace's queues, if the caller has listed them already."""
    removed = []
    for name in broker.list_queues() if names is None else names:
        owner = owner_of(name)
        if owner is not None and owner != current_identity() and not is_alive(*owner):
            try:
                broker.delete_queue(name)
            except QueueNotFound:
                continue  # someone else removed it first
            removed.append(name)
    return removed


class Call:
    """One request on its way: its reply queue made and the request put (``broker``: a
    local Broker). ``poll()`` takes the reply if it is there; ``close()`` deletes the
    reply queue. A full ``queue`` is waited for ``put_timeout`` seconds (0: QueueFull at
    once; None: for ever). ``lock_timeout``: for the handles (the server's)."""

    def __init__(self, broker, queue: str, body, headers=None, put_timeout=0, lock_timeout=None):
        if headers is not None and not isinstance(headers, dict):
            raise TypeError(f"headers must be a dict, not {type(headers).__name__}")
        target = broker.queue(queue)  # QueueNotFound before anything is made
        try:
            if lock_timeout is not None:
                target.lock_timeout = lock_timeout
            self.broker = broker
            self.queue = queue
            self.correlation_id = uuid.uuid4().hex
            self.reply_queue = reply_queue_name()
            self.replies = broker.create_queue(self.reply_queue, max_bytes=REPLY_QUEUE_BYTES, durability="memory")
            if lock_timeout is not None:
                self.replies.lock_timeout = lock_timeout
            try:
                hdrs = {**(headers or {}), REPLY_TO: self.reply_queue, CORRELATION_ID: self.correlation_id}
                if put_timeout == 0:
                    target.put_nowait(body, hdrs)
                else:
                    target.put(body, hdrs, put_timeout)
            except BaseException:
                self.close()
                raise
        finally:
            target.close()

    def _take(self, d):
        d.ack()
        if d.headers.get(CORRELATION_ID) == self.correlation_id:
            return d.body, {k: v for k, v in d.headers.items() if k != CORRELATION_ID}
        return None  # not ours (a stray put): dropped

    def poll(self, replies=None):
        """The reply (body, headers) if it came, else None; never waits. ``replies``:
        another handle on the reply queue to take it through (the server's)."""
        while True:
            try:
                d = (replies or self.replies).get_nowait()
            except QueueEmpty:
                return None
            got = self._take(d)
            if got is not None:
                return got

    def wait(self, timeout=None):
        """The reply (body, headers); RequestTimeout after ``timeout`` seconds (None: for ever)."""
        until = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if until is None else max(0.0, until - time.monotonic())
            try:
                d = self.replies.get(timeout=left)
            except QueueEmpty:
                raise RequestTimeout(f"no reply to the request on queue {self.queue!r} within "
                                     f"{getattr(self, 'timeout', timeout)}s") from None
            got = self._take(d)
            if got is not None:
                return got

    def close(self) -> None:
        """Delete the reply queue (a reply still to come is then dropped)."""
        replies, self.replies = getattr(self, "replies", None), None
        if replies is not None:
            replies.close()
            try:
                self.broker.delete_queue(self.reply_queue)
            except QueueNotFound:
                pass


def request(broker, queue: str, body, headers=None, timeout=None) -> bytes:
    """Put a request into ``queue`` and return the reply's body; RequestTimeout after
    ``timeout`` seconds (None: wait for ever). Reply queues of dead requesters go first."""
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0):
        raise ValueError(f"timeout must be a number of seconds >= 0 or None, not {timeout!r}")
    remove_orphans(broker)
    start = time.monotonic()
    call = Call(broker, queue, body, headers, put_timeout=timeout)
    call.timeout = timeout
    try:
        if timeout is not None:
            timeout = max(0.0, timeout - (time.monotonic() - start))
        return call.wait(timeout)[0]
    finally:
        call.close()


def reply(delivery, body, headers=None) -> bool:
    """Answer a delivery that asked for a reply (``x-reply-to``): put ``body`` into its
    reply queue with its correlation id. Returns False when the requester has gone (its
    reply queue is deleted: it timed out or died), True otherwise. ValueError if the
    message asked for no reply. (``Delivery.reply``: the queue opens the reply queue.)"""
    return delivery.reply(body, headers)
