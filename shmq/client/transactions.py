"""A native transactional producer reached over a connection, written once and sans-IO like
the rest of the core: ``TransactionalCalls`` (``broker.transactional``). ``remote`` and
``aio`` add ``with``.

Strategy: Kafka's transactional producer, in shmq's words. The server's coordinator
(``server/transactions``) holds the transactional id: ``TXN_INIT`` gives its producer id
and a new epoch, which fences whoever held the id before. A transaction begins at its
first append or offsets; its appends go through the server (APPEND / APPEND_BATCH naming
the transaction), which writes them and holds readers back from them; its group's offsets
(``commit_offsets``) wait for its end, as a Kafka producer's ``send_offsets_to_transaction``
do; ``commit`` makes them all visible and committed at once, ``abort`` none. Readers of
every kind, native and Kafka's read_committed consumers, see committed records only.
"""

from ..errors import TransactionError
from ..model.checks import MAX_TXN_TIMEOUT_MS
from ..protocol import MsgType
from ..protocol.payloads import batch_fields, commit_pairs, from_pairs, metadata_from_fields, record_fields
from .core import Send, driven

__all__ = ["TransactionalCalls"]

MAX_TIMEOUT_S = MAX_TXN_TIMEOUT_MS / 1000


class TransactionalCalls:
    """A transactional producer of ``broker`` for ``transactional_id``: a transaction over
    appends to any streams and native groups' offsets, committed or aborted as one. A
    transaction open longer than ``timeout`` seconds is aborted by the server (this
    producer is then fenced). Made by ``broker.transactional``, which takes the id (init)."""

    def __init__(self, broker, transactional_id: str, timeout: float = 60.0):
        if not isinstance(transactional_id, str) or not transactional_id:
            raise ValueError(f"transactional_id must be a non-empty string, not {transactional_id!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT_S:
            raise ValueError(f"timeout must be a number of seconds in (0, {MAX_TIMEOUT_S:g}], not {timeout!r}")
        self._broker = broker
        self.transactional_id = transactional_id
        self.timeout = float(timeout)
        self.producer_id = self.epoch = None
        self._open = False  # a transaction begun here
        self._sent = False  # ... and the server told of it (an append or offsets: the server begins it there)
        self._closed = False

    def __repr__(self):
        return (f"<shmq.{type(self).__name__} {self.transactional_id!r} producer={self.producer_id} "
                f"epoch={self.epoch}>")

    def _drive(self, call):
        return self._broker._drive(call)

    def _ids(self) -> dict:
        if self._closed:
            raise TransactionError(f"transactional producer {self.transactional_id!r} is closed")
        if self.producer_id is None:
            raise TransactionError(f"transactional producer {self.transactional_id!r} has no producer id (init)")
        return {"transactional_id": self.transactional_id, "producer_id": self.producer_id, "epoch": self.epoch}

    def _init_steps(self):
        if self._closed:
            raise TransactionError(f"transactional producer {self.transactional_id!r} is closed")
        reply = yield Send(MsgType.TXN_INIT, {"transactional_id": self.transactional_id,
                                              "timeout_ms": max(1, round(self.timeout * 1000))})
        self.producer_id, self.epoch = reply["producer_id"], reply["epoch"]
        self._open = self._sent = False

    @driven
    def init(self):
        """Take the transactional id (``broker.transactional`` did): its producer id and
        next epoch; a transaction the id had open is aborted, and the producer that held it
        fenced (ProducerFenced at its next call). After an error whose outcome is not
        known (a commit whose connection broke), ``init`` again: what was open is aborted."""
        yield from self._init_steps()

    def begin(self):
        """Begin a transaction (TransactionError if one is open here). The server begins it
        at its first append or offsets."""
        self._ids()
        if self._open:
            raise TransactionError(f"transactional producer {self.transactional_id!r}: a transaction is open already "
                                   "(commit or abort it first)")
        self._open, self._sent = True, False

    def _in(self) -> list:
        ids = self._ids()
        if not self._open:
            raise TransactionError(f"transactional producer {self.transactional_id!r}: no transaction begun "
                                   "(begin() first)")
        self._sent = True
        return [ids["transactional_id"], ids["producer_id"], ids["epoch"]]

    @driven
    def append(self, stream: str, value, key=None, headers=None, partition=None):
        """Append one record to ``stream`` (a name or a handle) in the transaction: where it
        goes (``RecordMetadata``); readers see it once the transaction commits."""
        fields = {"stream": _name(stream), **record_fields(value, key, headers), "txn": self._in()}
        if partition is not None:
            fields["partition"] = _partition(partition)
        reply = yield Send(MsgType.APPEND, fields)
        return metadata_from_fields((reply["partition"], reply["offset"], reply["timestamp"]))

    @driven
    def append_many(self, stream: str, values, keys=None, headers=None, partition=None):
        """Append a batch to ``stream`` in the transaction (routed as ``append_many`` routes
        one, all or nothing per partition)."""
        txn = self._in()
        fields = batch_fields(values, keys, headers, None)
        if fields is None:
            return []
        if partition is not None:
            fields["partition"] = _partition(partition)
        reply = yield Send(MsgType.APPEND_BATCH, {"stream": _name(stream), **fields, "txn": txn})
        return [metadata_from_fields(m) for m in reply["records"]]

    @driven
    def commit_offsets(self, consumer, offsets: dict | None = None):
        """Commit a native group member's offsets (``{partition: next offset}``; default:
        where it is in each partition it owns) with the transaction: stored when it
        commits, as the member's own commit would store them. CommitFailed now if the
        member does not own them, and from ``commit`` if it lost one since (the
        transaction is then aborted). ``consumer``: a local ``Consumer`` of one stream, or
        one of this broker handle's connection."""
        stream = getattr(consumer, "stream", None)
        if stream is None:
            raise TypeError(f"commit_offsets takes a consumer of one stream, not a {type(consumer).__name__}")
        fields = {**self._ids(), "stream": stream.name}
        if not self._open:
            self._in()  # (raises: no transaction begun)
        if hasattr(consumer, "membership"):  # a local one: its process holds the membership
            group, member_id, generation, owned = consumer.membership()
            if offsets is None:
                offsets = consumer.positions()
            fields.update(group=group, member_id=member_id, generation=generation, owned=owned)
        else:  # held by the server for the connection: the same one as this producer's
            if getattr(consumer, "_core", None) is not self._broker._core:
                raise ValueError("commit_offsets takes a consumer of this broker handle's connection, or a local one")
            fields["member"] = consumer._fields()["member"]
            if offsets is None and consumer._buffer:  # (records polled, not handed out: not past them)
                offsets = consumer._unhanded(from_pairs((yield Send(MsgType.ASSIGNMENT, consumer._fields()))
                                                        ["positions"]))
        if offsets is not None:
            fields["offsets"] = commit_pairs(offsets)
        self._in()
        yield Send(MsgType.TXN_OFFSETS, fields)

    @driven
    def commit(self):
        """Commit the transaction: its records seen by every reader, its offsets the
        groups'. CommitFailed if a group's member lost a partition since its offsets were
        given (then it was aborted instead: nothing of it is seen)."""
        fields = self._ids()
        if not self._open:
            raise TransactionError(f"transactional producer {self.transactional_id!r}: no transaction to commit")
        self._open = False
        if self._sent:  # (else the server has nothing of it: an empty transaction)
            yield Send(MsgType.TXN_END, {**fields, "commit": True})

    @driven
    def abort(self):
        """Abort the transaction: none of its records is ever seen by a reader (a Kafka
        read_uncommitted consumer aside), none of its offsets committed. Nothing to do
        when none is open here (a commit that failed aborted it already)."""
        fields = self._ids()
        if not self._open:
            return
        self._open = False
        if self._sent:
            yield Send(MsgType.TXN_END, {**fields, "commit": False})

    def close(self) -> None:
        """No more calls. A transaction left open is aborted by the server at its timeout,
        or at once by the next ``init`` of the id."""
        self._closed = True


def _name(stream) -> str:
    name = getattr(stream, "name", stream)
    if not isinstance(name, str):
        raise TypeError(f"stream must be a name or a stream handle, not {type(stream).__name__}")
    return name


def _partition(p) -> int:
    if isinstance(p, bool) or not isinstance(p, int) or p < 0:
        raise ValueError(f"partition must be an int >= 0, not {p!r}")
    return p
