"""What the transaction coordinator holds of each transactional id (``Txn``), the producer
ids it hands out (``ProducerIds``), its refusals (``TxnError``, with Kafka's codes) and the
states of a transaction, as Kafka names them."""

import datetime
import time

from ...kafka import ErrorCode as E
from ...model.checks import MAX_TXN_TIMEOUT_MS

__all__ = ["TxnError", "ProducerIds", "Txn", "MAX_TIMEOUT_MS", "MAX_EPOCH", "EMPTY", "ONGOING", "PREPARE_COMMIT",
           "PREPARE_ABORT", "COMPLETE_COMMIT", "COMPLETE_ABORT", "ms_time"]

MAX_TIMEOUT_MS = MAX_TXN_TIMEOUT_MS  # Kafka's transaction.max.timeout.ms
MAX_EPOCH = 32767
EMPTY, ONGOING, PREPARE_COMMIT, PREPARE_ABORT, COMPLETE_COMMIT, COMPLETE_ABORT = (
    "Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort")


def ms_time(ms: int) -> datetime.datetime:
    """A time in ms as kio's non-null datetime fields take it (-1, Kafka's none, included)."""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)


class TxnError(Exception):
    """A transactional request refused with Kafka's ``code``."""

    def __init__(self, code: E, message: str = ""):
        super().__init__(message or code.name)
        self.code = code


class ProducerIds:
    """The producer ids a server hands out, one counter for Kafka's idempotent producers
    (``kafka/produce.Sequences``) and every transactional id, native or Kafka's: from the
    clock in ms, shifted, so above any id an earlier run of the server gave."""

    def __init__(self):
        self._next = int(time.time() * 1000) << 10

    def next(self) -> int:
        self._next += 1
        return self._next

    def above(self, pid: int) -> None:
        """Ids from now on are above ``pid`` (a journal's)."""
        self._next = max(self._next, pid)


class Txn:
    """One transactional id's state."""

    __slots__ = ("tid", "pid", "epoch", "timeout_ms", "state", "started", "partitions", "groups", "offsets",
                 "native", "marked")

    def __init__(self, tid, pid, epoch, timeout_ms):
        self.tid, self.pid, self.epoch, self.timeout_ms = tid, pid, epoch, timeout_ms
        self.state = EMPTY
        self.started = 0.0  # wall clock s of its first partition or group
        self.partitions = {}  # (stream, created, partition) -> first offset (at or below its first record)
        self.groups = set()
        self.offsets = {}  # group -> {(topic, partition): (offset, metadata, leader epoch)}
        self.native = {}  # (native group, stream) -> [member id, generation, owned, {partition: offset}]
        self.marked = set()  # partitions whose marker is written (while it ends)

    def clear(self) -> None:
        self.partitions, self.groups, self.offsets, self.native, self.marked = {}, set(), {}, {}, set()

    def row(self) -> list:
        return ["txn", self.tid, self.pid, self.epoch, self.timeout_ms, self.state, self.started]
