"""The transaction APIs of the Kafka listener (``HANDLERS``, ``VERSIONS``): each reads its
request, asks the server's transaction coordinator (``server/transactions``) and describes the answer
(InitProducerId with a transactional id, AddPartitionsToTxn, AddOffsetsToTxn,
TxnOffsetCommit, EndTxn, DescribeTransactions, ListTransactions)."""

import datetime
import logging
from typing import Any, Callable

from ...kafka import ErrorCode as E
from ...kafka import build
from ...kafka.messages import response_class
from ..transactions.state import TxnError, ms_time

__all__ = ["HANDLERS", "VERSIONS", "init_transactional"]

log = logging.getLogger("shmq.server")

ADD_PARTITIONS, ADD_OFFSETS, END_TXN, TXN_OFFSET_COMMIT = 24, 25, 26, 28
DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 65, 66
# KIP-588: from these versions a zombie hears PRODUCER_FENCED, before them INVALID_PRODUCER_EPOCH
_FENCED_FROM = {22: 4, ADD_PARTITIONS: 2, ADD_OFFSETS: 2, END_TXN: 2, TXN_OFFSET_COMMIT: 3}


def _respond(request: Any, **values) -> Any:
    return build(response_class(request.__api_key__, request.__version__), values)


def _fenced(request: Any) -> E:
    return E.producer_fenced if int(request.__version__) >= _FENCED_FROM[int(request.__api_key__)] \
        else E.invalid_producer_epoch


def _ms(value) -> int:
    return int(value / datetime.timedelta(milliseconds=1)) if isinstance(value, datetime.timedelta) else int(value)


async def init_transactional(ctx, header, request):
    """InitProducerId of a producer with a ``transactional.id`` (handlers.init_producer_id)."""
    try:
        pid, epoch = await ctx.server.txns.init(
            request.transactional_id, _ms(request.transaction_timeout), getattr(request, "producer_id", -1),
            getattr(request, "producer_epoch", -1), _fenced(request))
    except TxnError as e:
        return _respond(request, error_code=e.code, producer_id=-1, producer_epoch=-1)
    log.info("Kafka transactional id %r: producer %d, epoch %d", request.transactional_id, pid, epoch,
             extra={"event": "kafka_txn_init", "transactional_id": request.transactional_id, "producer_id": pid,
                    "producer_epoch": epoch})
    return _respond(request, error_code=E.none, producer_id=pid, producer_epoch=epoch)


async def add_partitions_to_txn(ctx, header, request):
    topics = {t.name: list(t.partitions) for t in request.v3_and_below_topics}
    got = ctx.server.txns.add_partitions(request.v3_and_below_transactional_id, request.v3_and_below_producer_id,
                                         request.v3_and_below_producer_epoch, topics, _fenced(request))
    return _respond(request, results_by_topic_v3_and_below=[
        {"name": name, "results_by_partition": [{"partition_index": p, "partition_error_code": code}
                                                for p, code in parts]} for name, parts in got.items()])


async def add_offsets_to_txn(ctx, header, request):
    try:
        ctx.server.txns.add_offsets(request.transactional_id, request.producer_id, request.producer_epoch,
                                    request.group_id, _fenced(request))
    except TxnError as e:
        return _respond(request, error_code=e.code)
    return _respond(request, error_code=E.none)


async def txn_offset_commit(ctx, header, request):
    topics = {t.name: [(p.partition_index, p.committed_offset, p.committed_metadata,
                        getattr(p, "committed_leader_epoch", -1)) for p in t.partitions] for t in request.topics}
    member = (getattr(request, "generation_id", -1), getattr(request, "member_id", ""),
              getattr(request, "group_instance_id", None))
    got = ctx.server.txns.commit_offsets(request.transactional_id, request.group_id, request.producer_id,
                                         request.producer_epoch, member, topics, _fenced(request))
    return _respond(request, topics=[{"name": t, "partitions": [{"partition_index": p, "error_code": code}
                                                                for p, code in parts]} for t, parts in got.items()])


async def end_txn(ctx, header, request):
    try:
        await ctx.server.txns.end(request.transactional_id, request.producer_id, request.producer_epoch,
                                  request.committed, _fenced(request))
    except TxnError as e:
        return _respond(request, error_code=e.code)
    return _respond(request, error_code=E.none)


async def describe_transactions(ctx, header, request):
    out = []
    for tid in request.transactional_ids:
        d = ctx.server.txns.describe(tid)
        out.append({"error_code": E.none, **d} if d is not None else
                   {"error_code": E.transactional_id_not_found, "transactional_id": tid, "transaction_state": "",
                    "transaction_timeout": 0, "transaction_start_time": ms_time(0), "producer_id": 0,
                    "producer_epoch": 0})  # (Kafka's: the fields' defaults)
    return _respond(request, transaction_states=out)


async def list_transactions(ctx, header, request):
    states = set(request.state_filters or ())
    pids = set(request.producer_id_filters or ())
    known = {"Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort"}
    rows = [{"transactional_id": t.tid, "producer_id": t.pid, "transaction_state": t.state}
            for t in ctx.server.txns.txns.values()
            if (not states or t.state in states) and (not pids or t.pid in pids)]
    return _respond(request, error_code=E.none, unknown_state_filters=sorted(states - known),
                    transaction_states=rows)


# api key -> async handler(ctx, header, request) -> response
HANDLERS: dict[int, Callable[..., Any]] = {
    ADD_PARTITIONS: add_partitions_to_txn, ADD_OFFSETS: add_offsets_to_txn, END_TXN: end_txn,
    TXN_OFFSET_COMMIT: txn_offset_commit, DESCRIBE_TRANSACTIONS: describe_transactions,
    LIST_TRANSACTIONS: list_transactions,
}
# api key -> (min version, max version); AddPartitionsToTxn v4+ is between brokers, EndTxn and
# TxnOffsetCommit v4+ are KIP-890's second phase: not offered
VERSIONS: dict[int, tuple[int, int]] = {
    ADD_PARTITIONS: (0, 3), ADD_OFFSETS: (0, 3), END_TXN: (0, 3), TXN_OFFSET_COMMIT: (0, 3),
    DESCRIBE_TRANSACTIONS: (0, 0), LIST_TRANSACTIONS: (0, 0),
}
