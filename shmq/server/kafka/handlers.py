"""The APIs of the Kafka listener and the versions it answers (``VERSIONS``,
``HANDLERS``; the group APIs come from ``groups``, the topic configs' and partitions'
from ``configs``), and the small handlers: ApiVersions, Metadata, ListOffsets,
InitProducerId, DeleteTopics, SaslHandshake, SaslAuthenticate. Produce and Fetch have
modules of their own.

Strategy: a handler is ``async def handler(ctx, header, request) -> response``; it
describes its answer once as a dict and ``shmq.kafka.build`` makes the negotiated
version's response of it. The versions are those kio knows and these handlers fill:
topic names, not topic ids (Produce <= 11, Fetch <= 12). Produce is advertised from 0
(librdkafka wants it, KAFKA-18659) but only 3+ parse: magic 2 batches.
"""

import asyncio
import hmac
import logging

from ...errors import ShmqError, StreamNotFound
from ...kafka import ErrorCode, KafkaProtocolError, build
from ...kafka.codes import authorized_operations, code_of
from ...kafka.messages import response_class
from ...kafka.sasl import MECHANISMS, parse_plain
from .fetch import fetch
from .produce import produce
from .txns import init_transactional

__all__ = ["HANDLERS", "VERSIONS", "api_versions_data", "respond", "PRE_AUTH", "API_VERSIONS", "check_plain"]

log = logging.getLogger("shmq.server")

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
SASL_HANDSHAKE, API_VERSIONS, DELETE_TOPICS, INIT_PRODUCER_ID, SASL_AUTHENTICATE = 17, 18, 20, 22, 36
DELETE_RECORDS, DESCRIBE_CLUSTER = 21, 60
PRE_AUTH = frozenset((API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE))

VERSIONS = {
    PRODUCE: (0, 11), FETCH: (4, 12), LIST_OFFSETS: (1, 9), METADATA: (0, 12), SASL_HANDSHAKE: (0, 1),
    API_VERSIONS: (0, 3), DELETE_TOPICS: (1, 5), INIT_PRODUCER_ID: (0, 5),
    SASL_AUTHENTICATE: (0, 2), DELETE_RECORDS: (0, 2), DESCRIBE_CLUSTER: (0, 1),
}
LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3
MAX_PRODUCER_EPOCH = 32767


def respond(header, data: dict):
    """The response to ``header``'s request, of its version, from ``data``."""
    return build(response_class(header.request_api_key, header.request_api_version), data)


def api_versions_data(server) -> dict:
    return {"api_keys": [{"api_key": k, "min_version": lo, "max_version": hi}
                         for k, (lo, hi) in sorted(server.versions.items())],
            "finalized_features_epoch": -1}


async def api_versions(ctx, header, request):
    return respond(header, api_versions_data(ctx.server))


# ---------------------------------------------------------------------------- topics
def _partitions(server, s) -> list:
    return [{"error_code": ErrorCode.none, "partition_index": p, "leader_id": server.node_id, "leader_epoch": 0,
             "replica_nodes": [server.node_id], "isr_nodes": [server.node_id]} for p in range(s.partitions)]


def _topic_entry(server, name, s, code, ops):
    if s is None:
        return {"error_code": code, "name": name, "topic_id": None, "partitions": []}
    return {"error_code": ErrorCode.none, "name": name, "topic_id": server.topic_id(s),
            "partitions": _partitions(server, s), "topic_authorized_operations": ops}


async def metadata(ctx, header, request):
    server = ctx.server
    names = None if request.topics is None else [t.name for t in request.topics]
    if header.request_api_version == 0 and names == []:  # v0: empty means all
        names = None
    create = getattr(request, "allow_auto_topic_creation", True)
    ops = authorized_operations("topic", getattr(request, "include_topic_authorized_operations", False))
    topics = []
    if names is None:
        for name in server.broker.list_streams():
            s, code = server.topic(name)
            if s is not None:
                topics.append(_topic_entry(server, name, s, code, ops))
    else:
        for name in names:
            if name is None:  # asked by topic id: ids are not looked up
                topics.append({"error_code": ErrorCode.unknown_topic_id, "name": None, "partitions": []})
                continue
            s, code = server.topic(name, create=create)
            topics.append(_topic_entry(server, name, s, code, ops))
    return respond(header, {
        "brokers": [{"node_id": server.node_id, "host": server.advertised_host,
                     "port": server.advertised_port or server.port}],
        "cluster_id": server.cluster_id, "controller_id": server.node_id, "topics": topics,
        "cluster_authorized_operations": authorized_operations(  # (v8-10: librdkafka's DescribeCluster)
            "cluster", getattr(request, "include_cluster_authorized_operations", False))})


async def delete_topics(ctx, header, request):
    out = []
    for name in request.topic_names:
        entry = {"name": name, "error_code": ErrorCode.none}
        try:
            ctx.server.delete_topic(name)
            log.info("topic %s deleted", name, extra={"event": "kafka_topic_deleted", "topic": name})
        except (StreamNotFound, ValueError) as e:
            entry.update(error_code=ErrorCode.unknown_topic_or_partition, error_message=str(e))
        except ShmqError as e:
            entry.update(error_code=code_of(e), error_message=str(e))
        out.append(entry)
    return respond(header, {"responses": out})


# ---------------------------------------------------------------------------- offsets
SCAN = 10_000  # records read at a time by a ListOffsets by timestamp


def _scan(s, p, ts_ms) -> tuple[int, int]:
    """(offset, timestamp ms) of the first record of partition ``p`` stamped at or after
    ``ts_ms``, or with ``ts_ms`` None the first with the greatest timestamp; (-1, -1) if
    none. A walk of the records (their timestamps are their producers': they need not
    grow with offsets), as Kafka's time index finds them."""
    offset, end = s.offsets(p)
    best = (-1, -1)
    while offset < end:
        rows = s.read_raw(p, offset, SCAN)
        if not rows:
            break
        for off, ts_ns, _k, _h, _v in rows:
            ms = ts_ns // 1_000_000
            if ts_ms is None:
                if ms > best[1]:
                    best = (off, ms)
            elif ms >= ts_ms:
                return off, ms
        offset = rows[-1][0] + 1
    return best


def _list_offset(s, p, ts) -> tuple[int, int]:
    earliest, end = s.offsets(p)
    if ts == LATEST:
        return end, -1
    if ts == EARLIEST:
        return earliest, -1
    if ts == MAX_TIMESTAMP:
        return _scan(s, p, None)
    if ts < 0:
        raise KafkaProtocolError(f"timestamp {ts} is not taken (-1 latest, -2 earliest, -3 max timestamp, "
                                 f"or a time in ms)", ErrorCode.invalid_request)
    return _scan(s, p, ts)


async def _per_partition(server, topics, entry, act) -> list:
    """[{name, partitions}] of a request's ``topics``: for each partition asked, ``entry(rp)``
    (its answer's fields if nothing is done: the topic's error code set) updated by
    ``await act(stream, rp, entry)`` for a partition the topic has; an engine error there
    becomes the partition's error code."""
    out = []
    for t in topics:
        s, code = server.topic(t.name)
        parts = []
        for rp in t.partitions:
            e = {"partition_index": rp.partition_index, "error_code": code, **entry(rp)}
            if s is not None:
                try:
                    if not 0 <= rp.partition_index < s.partitions:
                        raise StreamNotFound(f"no partition {rp.partition_index}")
                    await act(s, rp, e)
                except (ShmqError, ValueError) as exc:
                    e["error_code"] = code_of(exc)
            parts.append(e)
        out.append({"name": t.name, "partitions": parts})
    return out


async def list_offsets(ctx, header, request):
    committed = getattr(request, "isolation_level", 0) == 1  # read_committed: the latest is the last stable offset

    async def act(s, rp, entry):
        if rp.timestamp == LATEST and committed:
            txns = ctx.server.txns.index.get(s, rp.partition_index)
            end = s.offsets(rp.partition_index)[1]
            entry["offset"], entry["timestamp"] = (end if txns is None else txns.stable(end)), -1
        elif rp.timestamp in (LATEST, EARLIEST):
            entry["offset"], entry["timestamp"] = _list_offset(s, rp.partition_index, rp.timestamp)
        else:  # a walk of the records: off the loop
            entry["offset"], entry["timestamp"] = await asyncio.to_thread(
                _list_offset, s, rp.partition_index, rp.timestamp)

    return respond(header, {"topics": await _per_partition(
        ctx.server, request.topics, lambda rp: {"offset": -1, "timestamp": -1, "leader_epoch": 0}, act)})


async def delete_records(ctx, header, request):
    """Each partition's start offset moved up to the offset named (-1: its end), the
    records below dropped as retention drops them (``Stream.delete_records``)."""
    async def act(s, rp, entry):
        p = rp.partition_index
        earliest, end = s.offsets(p)
        to = end if rp.offset == -1 else rp.offset
        if not 0 <= to <= end:
            raise KafkaProtocolError(f"offset {rp.offset}: -1 or 0..{end}", ErrorCode.offset_out_of_range)
        if to > earliest:
            s.delete_records({p: to})
            log.info("topic %s partition %d: records below %d deleted", s.name, p, to,
                     extra={"event": "kafka_records_deleted", "topic": s.name, "partition": p, "offset": to})
        entry.update(error_code=ErrorCode.none, low_watermark=s.offsets(p)[0])

    return respond(header, {"topics": await _per_partition(ctx.server, request.topics,
                                                           lambda rp: {"low_watermark": -1}, act)})


async def describe_cluster(ctx, header, request):
    server = ctx.server
    if getattr(request, "endpoint_type", 1) != 1:
        return respond(header, {"error_code": ErrorCode.unsupported_endpoint_type, "endpoint_type":
                                request.endpoint_type, "error_message": "only brokers (endpoint type 1)",
                                "cluster_id": server.cluster_id, "controller_id": -1})
    return respond(header, {"error_code": ErrorCode.none, "endpoint_type": 1, "cluster_id": server.cluster_id,
                            "controller_id": server.node_id, "cluster_authorized_operations": authorized_operations(
                                "cluster", request.include_cluster_authorized_operations),
                            "brokers": [{"broker_id": server.node_id, "host": server.advertised_host,
                                         "port": server.advertised_port or server.port, "rack": None}]})


# ---------------------------------------------------------------------------- producers, SASL
async def init_producer_id(ctx, header, request):
    if request.transactional_id is not None:
        return await init_transactional(ctx, header, request)
    pid, epoch = ctx.server.sequences.init(getattr(request, "producer_id", -1), getattr(request, "producer_epoch", -1))
    return respond(header, {"error_code": ErrorCode.none, "producer_id": pid, "producer_epoch": epoch})


async def sasl_handshake(ctx, header, request):
    """v1: SaslAuthenticate requests follow; v0 (older clients: librdkafka 2.0's kcat) the
    raw SASL tokens, each in a frame of its own (``KafkaConnection``)."""
    if request.mechanism not in MECHANISMS:
        log.warning("%s: SASL mechanism %r refused (this listener takes %s)", ctx.peer, request.mechanism,
                    ", ".join(MECHANISMS), extra={"event": "kafka_sasl_refused", "peer": ctx.peer,
                                                  "mechanism": request.mechanism})
        return respond(header, {"error_code": ErrorCode.unsupported_sasl_mechanism, "mechanisms": MECHANISMS})
    ctx.mechanism = request.mechanism
    ctx.raw_sasl = header.request_api_version == 0
    return respond(header, {"error_code": ErrorCode.none, "mechanisms": MECHANISMS})


def check_plain(ctx, message: bytes) -> bool:
    """Whether the SASL/PLAIN ``message`` carries the server's token (a refusal logged);
    the connection is authenticated if so."""
    token = ctx.server.token
    try:
        user, password = parse_plain(message)
        ok = token is None or hmac.compare_digest(password.encode(), token.encode())
    except KafkaProtocolError:
        user, ok = None, False
    if not ok:
        log.warning("%s: SASL/PLAIN refused (user %r): a wrong token", ctx.peer, user,
                    extra={"event": "token_refused", "peer": ctx.peer, "listener": "kafka"})
        return False
    ctx.authenticated()
    return True


async def sasl_authenticate(ctx, header, request):
    if ctx.mechanism is None or ctx.raw_sasl:
        ctx.close_after = "SaslAuthenticate without a SaslHandshake v1 first"
        return respond(header, {"error_code": ErrorCode.illegal_sasl_state,
                                "error_message": "SaslHandshake first", "auth_bytes": b""})
    if not check_plain(ctx, request.auth_bytes):
        ctx.close_after = "SASL authentication failed"
        return respond(header, {"error_code": ErrorCode.sasl_authentication_failed,
                                "error_message": "Authentication failed: invalid credentials (the password is "
                                                 "the shmq server's token)", "auth_bytes": b""})
    return respond(header, {"error_code": ErrorCode.none, "auth_bytes": b"", "session_lifetime": 0})


HANDLERS = {
    PRODUCE: produce, FETCH: fetch, LIST_OFFSETS: list_offsets, METADATA: metadata, SASL_HANDSHAKE: sasl_handshake,
    API_VERSIONS: api_versions, DELETE_TOPICS: delete_topics,
    INIT_PRODUCER_ID: init_producer_id, SASL_AUTHENTICATE: sasl_authenticate,
    DELETE_RECORDS: delete_records, DESCRIBE_CLUSTER: describe_cluster,
}
