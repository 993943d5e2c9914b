"""The APIs of the Kafka listener and the versions it answers (``VERSIONS``,
``HANDLERS``; the group APIs come from ``groups``), and the small handlers: ApiVersions,
Metadata, ListOffsets, InitProducerId, CreateTopics, DeleteTopics, DescribeConfigs,
SaslHandshake, SaslAuthenticate. Produce and Fetch have modules of their own.

Strategy: a handler is ``async def handler(ctx, header, request) -> response``; it
describes its answer once as a dict and ``shmq.kafka.build`` makes the negotiated
version's response of it. The versions are those kio knows and these handlers fill:
topic names, not topic ids (Produce <= 11, Fetch <= 12). Produce is advertised from 0
(librdkafka wants it, KAFKA-18659) but only 3+ parse: magic 2 batches.
"""

import asyncio
import hmac
import logging

from ...errors import ShmqError, StreamExists, StreamNotFound
from ...kafka import ErrorCode, KafkaProtocolError, build
from ...kafka.codes import code_of
from ...kafka.messages import response_class
from ...kafka.sasl import MECHANISMS, parse_plain
from .fetch import fetch
from .produce import produce

__all__ = ["HANDLERS", "VERSIONS", "api_versions_data", "respond", "PRE_AUTH", "API_VERSIONS"]

log = logging.getLogger("shmq.server")

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
SASL_HANDSHAKE, API_VERSIONS, CREATE_TOPICS, DELETE_TOPICS, INIT_PRODUCER_ID, SASL_AUTHENTICATE = 17, 18, 19, 20, 22, 36
DESCRIBE_CONFIGS = 32
PRE_AUTH = frozenset((API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE))

VERSIONS = {
    PRODUCE: (0, 11), FETCH: (4, 12), LIST_OFFSETS: (1, 9), METADATA: (0, 12), SASL_HANDSHAKE: (1, 1),
    API_VERSIONS: (0, 3), CREATE_TOPICS: (2, 7), DELETE_TOPICS: (1, 5), INIT_PRODUCER_ID: (0, 5),
    SASL_AUTHENTICATE: (0, 2), DESCRIBE_CONFIGS: (1, 4),
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


def _topic_entry(server, name, s, code):
    if s is None:
        return {"error_code": code, "name": name, "topic_id": None, "partitions": []}
    return {"error_code": ErrorCode.none, "name": name, "topic_id": server.topic_id(s),
            "partitions": _partitions(server, s)}


async def metadata(ctx, header, request):
    server = ctx.server
    names = None if request.topics is None else [t.name for t in request.topics]
    if header.request_api_version == 0 and names == []:  # v0: empty means all
        names = None
    create = getattr(request, "allow_auto_topic_creation", True)
    topics = []
    if names is None:
        for name in server.broker.list_streams():
            s, code = server.topic(name)
            if s is not None:
                topics.append(_topic_entry(server, name, s, code))
    else:
        for name in names:
            if name is None:  # asked by topic id: ids are not looked up
                topics.append({"error_code": ErrorCode.unknown_topic_id, "name": None, "partitions": []})
                continue
            s, code = server.topic(name, create=create)
            topics.append(_topic_entry(server, name, s, code))
    return respond(header, {
        "brokers": [{"node_id": server.node_id, "host": server.advertised_host,
                     "port": server.advertised_port or server.port}],
        "cluster_id": server.cluster_id, "controller_id": server.node_id, "topics": topics})


_CONFIGS = {"retention.bytes": "retention_bytes", "retention.ms": "retention_seconds",
            "max.message.bytes": "max_message_bytes"}


# configs every topic has, whatever CreateTopics said: (name, value)
FIXED_CONFIGS = (("cleanup.policy", "delete"), ("message.timestamp.type", "CreateTime"))
DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG = 1, 5  # a config's source, as Kafka names them
TOPIC, BROKER = 2, 4  # DescribeConfigs' resource types
_TYPES = {"cleanup.policy": 7, "message.timestamp.type": 2, "retention.ms": 5, "retention.bytes": 5,
          "max.message.bytes": 3}  # Kafka's config types: LIST, STRING, LONG, LONG, INT


def _settings(configs) -> dict:
    """CreateTopics' configs as create_stream's settings; KafkaProtocolError (INVALID_CONFIG)
    for one shmq has no equal of."""
    out = {}
    for c in configs or ():
        if (c.name, c.value) in FIXED_CONFIGS:
            continue
        key = _CONFIGS.get(c.name)
        try:
            value = int(c.value)
        except (TypeError, ValueError):
            key = None
        if key is None or value < 0:
            raise KafkaProtocolError(f"config {c.name}={c.value} is not taken here (only "
                                     f"{', '.join(f'{k}={v}' for k, v in FIXED_CONFIGS)}, {', '.join(_CONFIGS)})",
                                     ErrorCode.invalid_config)
        out[key] = value / 1000 if key == "retention_seconds" else value
    return out


async def create_topics(ctx, header, request):
    server, out = ctx.server, []
    for t in request.topics:
        n = len(t.assignments) if t.assignments else t.num_partitions
        if n == -1:
            n = server.auto_create_partitions
        entry = {"name": t.name, "num_partitions": n, "replication_factor": 1, "error_code": ErrorCode.none,
                 "configs": [{"name": k, "value": v, "read_only": True, "config_source": DEFAULT_CONFIG,
                              "is_sensitive": False} for k, v in FIXED_CONFIGS]}
        try:
            if t.replication_factor not in (-1, 1):
                raise KafkaProtocolError(f"replication factor {t.replication_factor}: a single node has 1",
                                         ErrorCode.invalid_replication_factor)
            if n < 1:
                raise KafkaProtocolError(f"{n} partitions", ErrorCode.invalid_partitions)
            settings = _settings(t.configs)
            if request.validate_only:
                if t.name in server.broker.list_streams():
                    raise StreamExists(f"topic {t.name!r} exists")
            else:
                server.create_topic(t.name, n, **settings)
                log.info("topic %s created with %d partition(s)", t.name, n,
                         extra={"event": "kafka_topic_created", "topic": t.name, "partitions": n})
                s, _code = server.topic(t.name)
                if s is not None:
                    entry["topic_id"] = server.topic_id(s)
        except (ShmqError, ValueError, TypeError) as e:
            code = ErrorCode.invalid_topic_exception if isinstance(e, (ValueError, TypeError)) else code_of(e)
            entry.update(error_code=code, error_message=str(e), num_partitions=-1, replication_factor=-1, configs=[])
        out.append(entry)
    return respond(header, {"topics": out})


def topic_configs(s) -> list[tuple[str, str, int]]:
    """A stream's settings as Kafka's topic configs: (name, value, source)."""
    out = [(k, v, DEFAULT_CONFIG) for k, v in FIXED_CONFIGS]
    secs, size = s.retention_seconds, s.retention_bytes
    out += [("retention.ms", str(round(secs * 1000)) if secs else "-1", _source(secs)),
            ("retention.bytes", str(size) if size else "-1", _source(size)),
            ("max.message.bytes", str(s.max_message_bytes), DYNAMIC_TOPIC_CONFIG)]
    return out


def _source(value) -> int:
    return DYNAMIC_TOPIC_CONFIG if value else DEFAULT_CONFIG


async def describe_configs(ctx, header, request):
    """A topic's configs (``topic_configs``, read-only: no AlterConfigs); a broker has
    none to tell; other resources are refused."""
    results = []
    for r in request.resources:
        entry = {"error_code": ErrorCode.none, "resource_type": r.resource_type, "resource_name": r.resource_name,
                 "configs": []}
        if r.resource_type == TOPIC:
            s, code = ctx.server.topic(r.resource_name)
            if s is None:
                entry.update(error_code=code, error_message=f"no topic {r.resource_name!r}")
            else:
                wanted = None if r.configuration_keys is None else set(r.configuration_keys)
                entry["configs"] = [{"name": k, "value": v, "read_only": True, "config_source": src,
                                     "is_default": src == DEFAULT_CONFIG, "is_sensitive": False,
                                     "config_type": _TYPES[k]}
                                    for k, v, src in topic_configs(s) if wanted is None or k in wanted]
        elif r.resource_type != BROKER:
            entry.update(error_code=ErrorCode.invalid_request,
                         error_message=f"resource type {r.resource_type}: only topics (2) and brokers (4)")
        results.append(entry)
    return respond(header, {"results": results})


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


async def list_offsets(ctx, header, request):
    server, topics = ctx.server, []
    for t in request.topics:
        s, code = server.topic(t.name)
        parts = []
        for rp in t.partitions:
            entry = {"partition_index": rp.partition_index, "error_code": code, "offset": -1, "timestamp": -1,
                     "leader_epoch": 0}
            if s is not None:
                try:
                    if not 0 <= rp.partition_index < s.partitions:
                        raise StreamNotFound(f"no partition {rp.partition_index}")
                    if rp.timestamp in (LATEST, EARLIEST):
                        entry["offset"], entry["timestamp"] = _list_offset(s, rp.partition_index, rp.timestamp)
                    else:  # a walk of the records: off the loop
                        entry["offset"], entry["timestamp"] = await asyncio.to_thread(
                            _list_offset, s, rp.partition_index, rp.timestamp)
                except (ShmqError, ValueError) as e:
                    entry["error_code"] = code_of(e)
            parts.append(entry)
        topics.append({"name": t.name, "partitions": parts})
    return respond(header, {"topics": topics})


# ---------------------------------------------------------------------------- producers, SASL
async def init_producer_id(ctx, header, request):
    if request.transactional_id is not None:
        return respond(header, {"error_code": ErrorCode.transactional_id_authorization_failed,
                                "producer_id": -1, "producer_epoch": -1})
    pid, epoch = ctx.server.sequences.init(getattr(request, "producer_id", -1), getattr(request, "producer_epoch", -1))
    return respond(header, {"error_code": ErrorCode.none, "producer_id": pid, "producer_epoch": epoch})


async def sasl_handshake(ctx, header, request):
    if request.mechanism not in MECHANISMS:
        return respond(header, {"error_code": ErrorCode.unsupported_sasl_mechanism, "mechanisms": MECHANISMS})
    ctx.mechanism = request.mechanism
    return respond(header, {"error_code": ErrorCode.none, "mechanisms": MECHANISMS})


async def sasl_authenticate(ctx, header, request):
    if ctx.mechanism is None:
        ctx.close_after = "SaslAuthenticate without a SaslHandshake first"
        return respond(header, {"error_code": ErrorCode.illegal_sasl_state,
                                "error_message": "SaslHandshake first", "auth_bytes": b""})
    token = ctx.server.token
    try:
        user, password = parse_plain(request.auth_bytes)
        ok = token is None or hmac.compare_digest(password.encode(), token.encode())
    except KafkaProtocolError:
        user, ok = None, False
    if not ok:
        log.warning("%s: SASL/PLAIN refused (user %r): a wrong token", ctx.peer, user,
                    extra={"event": "token_refused", "peer": ctx.peer, "listener": "kafka"})
        ctx.close_after = "SASL authentication failed"
        return respond(header, {"error_code": ErrorCode.sasl_authentication_failed,
                                "error_message": "Authentication failed: invalid credentials (the password is "
                                                 "the shmq server's token)", "auth_bytes": b""})
    ctx.authenticated()
    return respond(header, {"error_code": ErrorCode.none, "auth_bytes": b"", "session_lifetime": 0})


HANDLERS = {
    PRODUCE: produce, FETCH: fetch, LIST_OFFSETS: list_offsets, METADATA: metadata, SASL_HANDSHAKE: sasl_handshake,
    API_VERSIONS: api_versions, CREATE_TOPICS: create_topics, DELETE_TOPICS: delete_topics,
    INIT_PRODUCER_ID: init_producer_id, SASL_AUTHENTICATE: sasl_authenticate, DESCRIBE_CONFIGS: describe_configs,
}
