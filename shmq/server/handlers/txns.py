"""The transaction requests of the DEADBEEF port (docs/PROTOCOL.md, Transactions): TXN_INIT,
TXN_OFFSETS, TXN_END, and an APPEND or APPEND_BATCH that names a transaction, each asking the
server's transaction coordinator (``transactions.Transactions``), as the Kafka listener's
transaction APIs do (``kafka/txns.py``).

Strategy: a native producer's transactional records are appended here, by the server,
never by the producer's process in shared memory: the coordinator then knows each record
of the transaction (producer id, epoch, span), as it knows a Kafka producer's, so a
read_committed Kafka consumer and a native reader see the same transaction. Before the
records of a partition go in, the partition is taken into the transaction and its
readers held back from where they go (``Transactions.adding``); after, the span is noted
(``produced``). The coordinator's refusals carry Kafka's codes; ``_ERRORS`` turns them
into shmq's exceptions, the one translation of this port.
"""

from ...errors import ProducerFenced, StreamNotFound, TransactionError
from ...kafka import ErrorCode as E
from ...engine.shm.waits import serving
from ..transactions import TxnError
from .answers import BlockingAppend, OnLoop

__all__ = ["txn_init", "txn_offsets", "txn_end", "append_in"]

# the coordinator's codes -> the exception a DEADBEEF client gets (any other: TransactionError)
_ERRORS = {
    E.producer_fenced: ProducerFenced,
    E.invalid_producer_epoch: ProducerFenced,
    E.invalid_producer_id_mapping: ProducerFenced,
    E.unknown_topic_or_partition: StreamNotFound,
    E.invalid_topic_exception: ValueError,
    E.invalid_commit_offset_size: ValueError,
    E.invalid_transaction_timeout: ValueError,
    E.invalid_request: ValueError,
}
_FENCED = E.producer_fenced  # what a zombie is told (TxnError's code for a stale epoch)


def _shmq_error(e: TxnError) -> Exception:
    return _ERRORS.get(e.code, TransactionError)(str(e))


def _coordinator(conn):
    coord = conn.server.txns
    if coord is None:  # (a TcpServer run without ``main.serve``: the tests' threaded one)
        raise TransactionError("this server runs no transaction coordinator")
    return coord


def txn_init(conn, f):
    """TXN_INIT: the transactional id's producer id and next epoch (an open transaction of
    the id aborted first, whoever held it fenced)."""
    coord = _coordinator(conn)

    async def init():
        try:
            return await coord.init(f["transactional_id"], f["timeout_ms"], -1, -1, _FENCED)
        except TxnError as e:
            raise _shmq_error(e) from None

    return OnLoop(init(), lambda ids: {"producer_id": ids[0], "epoch": ids[1]})


def txn_offsets(conn, f):
    """TXN_OFFSETS: a native group member's offsets held in the transaction until it ends:
    a member of this connection (``member``: its positions, or ``offsets``), or one of a
    local process (``group``, ``member_id``, ``generation``, ``owned``, ``offsets``)."""
    s = conn.server.stream(f["stream"])
    if "member" in f:
        c = conn.members.get(s.name, f["member"])
        group, member_id, generation, owned = c.membership()
        offsets = dict(f["offsets"]) if "offsets" in f else {p: c.position(p) for p in owned}
    else:
        missing = [k for k in ("group", "member_id", "generation", "owned", "offsets") if k not in f]
        if missing:
            raise ValueError(f"TXN_OFFSETS: member, or {', '.join(missing)} too")
        group, member_id, generation, owned, offsets = (f["group"], f["member_id"], f["generation"], f["owned"],
                                                        dict(f["offsets"]))
    try:
        _coordinator(conn).commit_native_offsets(f["transactional_id"], f["producer_id"], f["epoch"], group, s.name,
                                               member_id, generation, owned, offsets, _FENCED)
    except TxnError as e:
        raise _shmq_error(e) from None
    return {}


def txn_end(conn, f):
    """TXN_END: commit (the records seen, the offsets the groups') or abort; answered once
    the markers are written. A commit whose group offsets are refused aborts and answers
    COMMIT_FAILED."""
    coord = _coordinator(conn)

    async def end():
        try:  # (a CommitFailed comes as it is: the transaction aborted)
            await coord.end(f["transactional_id"], f["producer_id"], f["epoch"], f["commit"], _FENCED)
        except TxnError as e:
            raise _shmq_error(e) from None

    return OnLoop(end(), lambda _none: {})


def append_in(conn, s, txn, values, keys, headers, partition, reply):
    """An APPEND or APPEND_BATCH in transaction ``txn`` ([transactional id, producer id,
    epoch]): per partition (as ``Stream.route`` places them), taken into the transaction,
    then appended, all or nothing per partition, then noted; ``reply(metadata)``. With
    retention="block" the appends may wait for room, in the stream's appender."""
    tid, pid, epoch = txn
    coord = _coordinator(conn)
    route = s.route(keys, partition)
    parts = {}
    for i, p in enumerate(route):
        parts.setdefault(p, []).append(i)
    try:
        for p in parts:
            coord.adding(tid, pid, epoch, s, p, _FENCED)
    except TxnError as e:
        raise _shmq_error(e) from None

    intents = {p: coord.appending(pid, epoch, s, p, [values[i] for i in idx]) for p, idx in parts.items()}

    def run():
        """(each record's metadata, or None where its partition's append failed; the error)."""
        out = [None] * len(values)
        try:
            for p, idx in parts.items():
                got = s.append_many([values[i] for i in idx], keys=[keys[i] for i in idx],
                                    headers=None if headers is None else [headers[i] for i in idx], partition=p)
                for i, m in zip(idx, got):
                    out[i] = m
        except Exception as e:  # (the partitions appended before it are the transaction's all the same)
            return out, e
        return out, None

    def done(result):
        out, error = result
        for p, idx in parts.items():
            if out[idx[0]] is not None:
                coord.produced(pid, epoch, s, p, out[idx[0]].offset, len(idx), intents[p])
            else:
                coord.not_appended(intents[p])
        if error is not None:
            raise error
        return reply(out)

    if s.retention == "block":
        return BlockingAppend(s, run, done)
    with serving():
        result = run()
    conn.server.streams.notify(s.name)
    return done(result)
