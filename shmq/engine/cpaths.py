"""The C hot paths (``_fast.c``: plain put, get and ack; a stream partition's bulk read) when they were built and are
wanted (``SHMQ_PURE_PYTHON=1`` turns them off); else None each, and the Python paths run.
"""

import os
import warnings

try:
    from . import _fast
except ImportError as e:  # pragma: no cover - depends on the build
    _fast = None
    if os.environ.get("SHMQ_PURE_PYTHON", "") in ("", "0"):  # never silently three times slower
        warnings.warn(f"shmq's C hot paths are not built for {os.path.dirname(os.path.abspath(__file__))} ({e}): "
                      "running on the pure-Python paths, about three times slower. Build them with "
                      "`pip install -e .` in this checkout (gcc and the Python headers), or set "
                      "SHMQ_PURE_PYTHON=1 to choose the Python paths and silence this.", RuntimeWarning, stacklevel=2)

__all__ = ["FAST", "put", "take", "take_many", "take_next", "ack", "ack_many", "put_many", "nack_many", "reserve",
           "publish", "Loan", "DeliveryBase", "read_columns", "columns_check", "columns_end", "columns_log",
           "write_columns", "key_partitions", "murmur2", "OWNERDEAD", "FALLBACK", "BUSY", "EMPTY", "SLEEP", "FULL", "W_REGISTER",
           "EXPIRED", "DELETED", "WAL_MAX_PAYLOAD", "serve_own", "set_enabled", "enabled"]

FAST = _fast is not None and os.environ.get("SHMQ_PURE_PYTHON", "") in ("", "0")
put = _fast.put if FAST else None
take = _fast.take if FAST else None
take_many = _fast.take_many if FAST else None  # the plain take repeated under one lock hold
ack = _fast.ack if FAST else None
take_next = _fast.take_next if FAST else None  # the consume loop's step: ack the previous, take the next
ack_many = _fast.ack_many if FAST else None  # the plain ack repeated under one lock hold (no log)
put_many = _fast.put_many if FAST else None  # a batch appended under one lock hold (no log)
nack_many = _fast.nack_many if FAST else None  # the immediate requeue repeated under one lock hold
reserve = _fast.reserve if FAST else None  # a record placed at the tail, the lock kept
publish = _fast.publish if FAST else None  # its commit, and the unlock
Loan = _fast.Loan if FAST else None  # a writable window of a mapping that counts its views
DeliveryBase = _fast.DeliveryBase if FAST else None  # a delivery's fields, built by take / take_many
read_columns = _fast.read_columns if FAST else None  # a stream partition's records as Arrow buffers
# and its mirror: records given as Arrow buffers appended to a stream partition (Partition.append_columns)
columns_check = _fast.columns_check if FAST else None
columns_end = _fast.columns_end if FAST else None
columns_log = _fast.columns_log if FAST else None
write_columns = _fast.write_columns if FAST else None
key_partitions = _fast.key_partitions if FAST else None  # each record's partition by its key (the Spark sink)
murmur2 = _fast.murmur2 if FAST else None  # a key's hash, as Kafka's (partitioner.murmur2)
OWNERDEAD = _fast.OWNERDEAD if FAST else None  # the lock was taken from a dead holder: repair, then unlock
FALLBACK = _fast.FALLBACK if FAST else None  # not a plain case: nothing done, take the Python path
BUSY = _fast.BUSY if FAST else None  # the lock stayed busy past LOCK_WAIT_NS (a stopped holder?): Python waits on
EMPTY = _fast.EMPTY if FAST else None  # a take found nothing ready and nothing due: spin, or sleep
SLEEP = _fast.SLEEP if FAST else None  # ... and counted the caller as a sleeper (W_REGISTER): sleep, then take again
FULL = _fast.FULL if FAST else None  # a put found no room now (SLEEP: and counted the caller as waiting for some)
W_REGISTER = _fast.W_REGISTER if FAST else 0  # a take's wait bit: count the caller as a sleeper when it finds nothing
EXPIRED = _fast.EXPIRED if FAST else None
DELETED = _fast.DELETED if FAST else None
WAL_MAX_PAYLOAD = _fast.WAL_MAX_PAYLOAD if FAST else 0  # larger wal puts take the Python fast path
serve_own = _fast.serve_own if _fast is not None else None  # the C paths' side of ``waits.serving``


def set_enabled(enabled: bool) -> None:
    """Use the C paths in this process or not (the benchmark and the tests run both)."""
    from .queues import consume, produce, reserve as reserving, settle
    from .streams import partition

    on = enabled and FAST
    produce._fast_put = put if on else None
    consume._fast_take = take if on else None
    consume._fast_take_many = take_many if on else None
    consume._fast_take_next = take_next if on else None
    settle._fast_ack = ack if on else None
    settle._fast_ack_many = ack_many if on else None
    settle._fast_nack_many = nack_many if on else None
    produce._fast_put_many = put_many if on else None
    reserving._fast_reserve = reserve if on else None
    reserving._fast_publish = publish if on else None
    reserving._Loan = Loan if on else None
    partition._fast_columns = write_columns if on else None


def enabled() -> bool:
    """Whether this process uses the C paths now."""
    from .queues import produce

    return produce._fast_put is not None
