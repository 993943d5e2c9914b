"""The local broker: create, attach, list and delete the queues of one namespace.

Strategy: a Broker is a thin handle on the namespace registry. It never sits on the
message path: a Queue handle it returns talks to shared memory directly.
"""

import ctypes
import os
import time
import weakref

from . import layout as L
from .mutex import init_mutex
from .process import monotonic_offset
from .registry import CREATING, DELETING, LIVE, Registry
from .segment import (
    check_namespace,
    check_queue_name,
    create_segment,
    create_semaphore,
    segment_name,
    unlink_segment,
    unlink_semaphore,
)
from ..errors import QueueExists, QueueNotFound
from .queue import Queue

__all__ = ["Broker", "DEFAULT_PROCESS_SLOTS"]

DEFAULT_PROCESS_SLOTS = 256
DEFAULT_MAX_MESSAGE_BYTES = 2**20
_MIN_BYTES = 4096
_DURABILITY_MODES = ("memory", "snapshot", "wal")


class Broker:
    """Local access to a namespace's queues (``shmq.connect()``)."""

    def __init__(self, namespace: str = "shmq"):
        self.namespace = check_namespace(namespace)
        self._registry = Registry(namespace)
        self._queues = weakref.WeakSet()

    def __repr__(self):
        return f"<shmq.Broker namespace={self.namespace!r}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce__(self):
        return (Broker, (self.namespace,))

    def __del__(self):
        # Only our own mapping: queue handles we returned live on without the broker
        # (``shmq.connect().queue("q")`` must work as a one-liner).
        if getattr(self, "_registry", None) is not None:
            self._registry.close()
            self._registry = None

    def close(self) -> None:
        """Close this broker and every queue handle it returned. Queues stay."""
        for q in list(self._queues):
            q.close()
        if self._registry is not None:
            self._registry.close()
            self._registry = None

    # ---------------------------------------------------------------- queues
    def queue(self, name: str) -> Queue:
        """Attach to an existing queue; raises QueueNotFound."""
        q = Queue(self.namespace, check_queue_name(name))
        self._queues.add(q)
        return q

    def create_queue(
        self,
        name: str,
        max_bytes: int = 64 * 2**20,
        max_message_bytes: int | None = None,
        visibility_timeout: float = 30.0,
        max_deliveries: int | None = None,
        dead_letter_queue: str | None = None,
        exist_ok: bool = False,
        durability: str = "snapshot",
    ) -> Queue:
        """Create a queue and attach to it. Raises QueueExists unless ``exist_ok``
        (then the existing queue is returned as it is).

        ``max_message_bytes`` defaults to 1 MiB (less if ``max_bytes`` is smaller).
        ``durability``: "memory" (never written to disk), "snapshot" (saved by a
        ``shmq server`` that has a ``--data-dir``, every ``--snapshot-interval``) or
        "wal" (also every put and ack appended to a write-ahead log before it returns;
        the log is opened by that server).
        """
        check_queue_name(name)
        max_bytes = _positive_int(max_bytes, "max_bytes")
        if max_bytes < _MIN_BYTES:
            raise ValueError(f"max_bytes must be at least {_MIN_BYTES}, not {max_bytes}")
        max_bytes = L.align(max_bytes)
        if max_message_bytes is None:  # 1 MiB, or as much as one record can hold
            max_message_bytes = min(DEFAULT_MAX_MESSAGE_BYTES, max_bytes - L.REC_SIZE)
        max_message_bytes = _positive_int(max_message_bytes, "max_message_bytes")
        if L.record_size(0, max_message_bytes) > max_bytes:
            raise ValueError(
                f"max_message_bytes={max_message_bytes} can never fit in max_bytes={max_bytes} "
                f"(each record also takes a {L.REC_SIZE}-byte header)"
            )
        if isinstance(visibility_timeout, bool) or not isinstance(visibility_timeout, (int, float)):
            raise TypeError("visibility_timeout must be a number of seconds")
        if not 0 < visibility_timeout < 10**9:
            raise ValueError(f"visibility_timeout must be > 0 seconds, not {visibility_timeout!r}")
        if max_deliveries is not None:
            max_deliveries = _positive_int(max_deliveries, "max_deliveries")
        if durability not in _DURABILITY_MODES:
            raise ValueError(f"durability must be one of {', '.join(_DURABILITY_MODES)}, not {durability!r}")
        if dead_letter_queue is not None:
            check_queue_name(dead_letter_queue)
            if dead_letter_queue == name:
                raise ValueError("a queue cannot be its own dead-letter queue")
        reg = self._registry
        with reg:
            self._clean_stale(reg)
            index, state = reg.find(name)
            if state == LIVE:
                if exist_ok:
                    return self.queue(name)
                raise QueueExists(f"queue {name!r} already exists in namespace {self.namespace!r}")
            if dead_letter_queue is not None and reg.find(dead_letter_queue)[1] != LIVE:
                raise QueueNotFound(f"dead-letter queue {dead_letter_queue!r} does not exist: create it first")
            index = reg.claim(name, CREATING)
            self._unlink_queue_files(name)  # leftovers of a crash, if any
            try:
                self._build(name, max_bytes, max_message_bytes, visibility_timeout, max_deliveries,
                            dead_letter_queue, durability)
            except BaseException:
                self._unlink_queue_files(name)
                reg.free(index)
                raise
            reg.set_state(index, LIVE, name)
        return self.queue(name)

    def _build(self, name, capacity, max_message_bytes, visibility_timeout, max_deliveries, dlq, durability):
        slots = DEFAULT_PROCESS_SLOTS
        base = segment_name(self.namespace, "q", name)
        seg = create_segment(base, L.segment_size(capacity, slots))
        try:
            create_semaphore(base + ".ne").close()
            create_semaphore(base + ".nf").close()
            mm = seg._mmap
            raw_name, raw_dlq = name.encode(), (dlq or "").encode()
            L.STATIC.pack_into(
                mm, L.STATIC_OFF, b"\0\0\0\0", L.LAYOUT_VERSION, L.DURABILITY[durability], capacity, max_message_bytes,
                int(visibility_timeout * 1e9), max_deliveries or 0, slots, time.time_ns(),
                L.data_offset(slots), len(raw_name), raw_name, len(raw_dlq), raw_dlq,
            )
            L.WORD.pack_into(mm, L.TIMENS_OFF, monotonic_offset())
            hot = dict.fromkeys(L.HOT_FIELDS, 0)
            hot.update(next_id=1, next_deadline=L.NEVER)
            L.HOT.pack_into(mm, L.HOT_OFF, *hot.values())
            anchor = ctypes.c_char.from_buffer(mm, L.MUTEX_OFF)
            init_mutex(ctypes.addressof(anchor))
            del anchor
            mm[0:4] = L.MAGIC  # published
        finally:
            seg.close()

    def _unlink_queue_files(self, name):
        base = segment_name(self.namespace, "q", name)
        unlink_segment(base)
        unlink_semaphore(base + ".ne")
        unlink_semaphore(base + ".nf")

    def _clean_stale(self, reg):
        """Finish off creates and deletes whose process died holding the registry lock."""
        for index, state, name in reg.entries():
            if state in (CREATING, DELETING):
                self._unlink_queue_files(name)
                reg.free(index)

    def delete_queue(self, name: str) -> None:
        """Delete a queue and every message in it. Handles elsewhere get QueueNotFound."""
        check_queue_name(name)
        reg = self._registry
        with reg:
            self._clean_stale(reg)
            index, state = reg.find(name)
            if state != LIVE:
                raise QueueNotFound(f"no queue {name!r} in namespace {self.namespace!r}")
            reg.set_state(index, DELETING, name)
            try:
                q = Queue(self.namespace, name)
            except QueueNotFound:
                pass
            else:
                q._mark_deleted()
                q.close()
            self._unlink_queue_files(name)
            reg.free(index)

    def list_queues(self) -> list[str]:
        """Names of the namespace's queues, sorted."""
        reg = self._registry
        with reg:
            self._clean_stale(reg)
            return sorted(name for _i, state, name in reg.entries() if state == LIVE)


def _positive_int(value, what):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{what} must be positive, not {value}")
    return value


def default_namespace() -> str:
    return os.environ.get("SHMQ_NAMESPACE") or "shmq"
