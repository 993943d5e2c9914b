"""The server's transaction coordinator (``coordinator.Transactions``), for Kafka producers
with a ``transactional.id`` and native ones alike, and what it knows of each partition's
transactions (``index``)."""

from .coordinator import Transactions
from .state import MAX_TIMEOUT_MS, ProducerIds, TxnError
from .index import ABORT_MARKER, COMMIT_MARKER, DATA, PartitionTxns, TxnIndex

__all__ = ["Transactions", "TxnError", "ProducerIds", "MAX_TIMEOUT_MS", "TxnIndex", "PartitionTxns", "DATA",
           "ABORT_MARKER", "COMMIT_MARKER"]
