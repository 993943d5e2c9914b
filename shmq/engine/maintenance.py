"""The engine's calls for the broker's own machinery (``shmq server``, persistence),
kept off the public ``Queue``: housekeeping, a waiter's readiness probe, giving back
pushed deliveries unseen, moving a queue's messages out and in, and what the server's
plain requests in C (``server/_plain.c``) need of a handle to call the C paths
themselves.
"""

from .queues import lifetime

__all__ = ["housekeep", "sweep_unused", "ready_hint", "release_many", "export_messages", "import_messages",
           "c_arguments", "wal_descriptor", "wake_consumers", "wake_producers", "repair_lock", "expired_error"]


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


# ---- for the server's plain requests in C (server/_plain.c): a handle's C calls' arguments, and
# what its Python paths do around those calls (posts owed, a repair, the error of an expired lease)

def c_arguments(q):
    """What ``q``'s C calls take, as its own paths pass them: (segment address, ring offset,
    capacity, process slot or -1 before its first take, visibility timeout ns, max deliveries
    or 0, max message bytes, id step, logged, general take: priorities, TTLs or a prefetch
    cap); None where ``q`` does not run the C paths on one ring (Python's paths, lanes, closed)."""
    paths = getattr(q, "paths", None)
    if paths is None or not paths.uses_c or getattr(q, "_segp", None) is None or q._lockp is None:
        return None
    return (q._segp, q._base, q._cap, q._slot, q._vis_ns, q.max_deliveries or 0, q.max_message_bytes, q._id_step,
            q._logged, q._general or q._held is not None)


def wal_descriptor(q):
    """(generation, fd) of a logged ``q``'s write-ahead log, as its C put and ack take it; None
    when it has none open now (the Python paths log then)."""
    return q.wal.fd


def wake_consumers(q, n: int) -> None:
    """The ``n`` posts a C put owed sleeping consumers of ``q``."""
    for _ in range(n):
        q._ne.release()


def wake_producers(q) -> None:
    """The post a C settle owed a producer of ``q`` waiting for room."""
    q._nf.release()


def repair_lock(q) -> None:
    """A C call took ``q``'s lock from a dead holder (R_OWNERDEAD): repair, then let it go."""
    q._repair_held_lock()


def expired_error(q, deliveries):
    """The error ``q.ack_many`` raises for ``deliveries`` found no longer leased."""
    try:
        q._raise_expired(list(deliveries))
    except Exception as e:
        return e
    raise ValueError("expired_error: no deliveries")
