"""The engine's calls for the broker's own machinery (``shmq server``, persistence),
kept off the public ``Queue``: housekeeping, a waiter's readiness probe, giving back
pushed deliveries unseen, and moving a queue's messages out and in.
"""

from .queues import lifetime

__all__ = ["housekeep", "sweep_unused", "ready_hint", "release_many", "export_messages", "import_messages"]


def housekeep(q) -> int:
    """Expire lapsed leases, requeue due delays, reclaim dead processes' leases; how many
    messages came back."""
    return q._housekeep()


def sweep_unused(broker, handles) -> list:
    """Delete the queues among ``handles`` (attached by ``broker``'s namespace) whose last
    consumer went or that expired (``lifetime``), with their bindings; (name, why) of each."""
    return lifetime.sweep(handles, lambda name: broker._delete(name, unused=True))


def ready_hint(q) -> bool:
    """Whether a get could find something now (a message ready or a deadline due)."""
    return q._ready_hint()


def release_many(q, deliveries) -> int:
    """Make leased deliveries ready again at once, no attempt counted (pushed, never seen)."""
    return q._release_many(deliveries)


def export_messages(q, rotate_wal: bool = False) -> list:
    """Every message of ``q`` as (msg_id, attempt, enqueued_ns, header bytes, body)."""
    return q._export_messages(rotate_wal=rotate_wal)


def import_messages(q, messages, once: int = 0, skip_present: bool = False) -> int:
    """Append exported messages (``export_messages``' tuples), keeping their ids; how many
    were appended (``skip_present``: not those whose id the queue holds)."""
    return q._import_messages(messages, once=once, skip_present=skip_present)
