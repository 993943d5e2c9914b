"""Topic configs and partitions on the Kafka listener: CreateTopics (with its configs),
DescribeConfigs, AlterConfigs, IncrementalAlterConfigs and CreatePartitions (``VERSIONS``,
``HANDLERS``, merged into the listener's beside ``handlers``' and ``groups``').

Strategy: a topic's configs are its stream's settings (``Broker.create_stream``,
``update_stream``), read from the stream's header at each request, so a change made
natively (``shmq stream set``) shows here and one made here reaches every process. One
table, ``CONFIGS``, says for each config Kafka names the stream setting it is, how its
value reads and shows, its default and Kafka's type; a config not in it, or a value it
does not take, is refused with INVALID_CONFIG naming it, never kept; the few Kafka
configs that mean nothing here (segment.ms, file.delete.delay.ms) are taken, checked
and not kept, as their documentation says. A resource's changes are checked whole
before any is made (``update_stream``: all or nothing).
"""

import asyncio
import logging
from typing import Callable, NamedTuple

from ...engine.broker import check_stream_settings, stream_settings
from ...errors import SettingsMismatch, ShmqError, StreamExists
from ...model.settings import STREAM_TABLE
from ...kafka import ErrorCode, KafkaProtocolError, build
from ...kafka.codes import code_of
from ...kafka.messages import response_class

__all__ = ["HANDLERS", "VERSIONS", "CONFIGS", "topic_configs"]

log = logging.getLogger("shmq.server")

CREATE_TOPICS, DESCRIBE_CONFIGS, ALTER_CONFIGS, CREATE_PARTITIONS, INCREMENTAL_ALTER_CONFIGS = 19, 32, 33, 37, 44
VERSIONS = {CREATE_TOPICS: (2, 7), DESCRIBE_CONFIGS: (1, 4), ALTER_CONFIGS: (0, 2), CREATE_PARTITIONS: (0, 3),
            INCREMENTAL_ALTER_CONFIGS: (0, 1)}
TOPIC, BROKER = 2, 4  # resource types
DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG = 1, 5  # a config's source, as Kafka names them
STRING, INT, LONG, DOUBLE, LIST = 2, 3, 5, 6, 7  # Kafka's config types
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3  # IncrementalAlterConfigs' operations
KAFKA_SEGMENT_BYTES = 1 << 30  # Kafka's default segment.bytes, shown for a stream that has none
LONG_MAX = 2**63 - 1  # Kafka's max.compaction.lag.ms default: no bound
MAX_MS = 10**12  # the longest time a stream setting holds (1e9 s)


def _ms(value: str) -> float | None:
    ms = int(value)
    if ms == -1:
        return None
    if ms <= 0:
        raise ValueError("-1 (none) or a positive number of ms")
    return ms / 1000


def _bytes_or_none(value: str) -> int | None:
    n = int(value)
    if n == -1:
        return None
    if n <= 0:
        raise ValueError("-1 (none) or a positive number of bytes")
    return n


def _positive(value: str) -> int:
    n = int(value)
    if n <= 0:
        raise ValueError("a positive number of bytes")
    return n


def _ms_from_zero(value: str) -> float:
    ms = int(value)
    if not 0 <= ms <= MAX_MS:
        raise ValueError(f"a number of ms from 0 to {MAX_MS}")
    return ms / 1000


def _lag(value: str) -> float | None:
    ms = int(value)
    if ms == LONG_MAX:
        return None
    if not 1 <= ms <= MAX_MS:
        raise ValueError(f"a number of ms from 1 to {MAX_MS}, or {LONG_MAX} (none)")
    return ms / 1000


def _show_ms(seconds: float | None, none: str = "-1") -> str:
    return none if seconds is None else str(round(seconds * 1000))


def _ratio(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        x = -1.0
    if not 0 <= x <= 1:
        raise ValueError("a number from 0 to 1")
    return x


def _policy_words(value: str) -> set:
    words = {w.strip() for w in value.split(",")}
    if not words <= {"compact", "delete"}:
        raise ValueError("compact, delete or both (compact,delete)")
    return words


def _policy(value: str) -> bool:
    """cleanup.policy's value as the setting ``compact`` (delete is the retention bounds,
    there either way)."""
    return "compact" in _policy_words(value)


def _show_policy(compact: bool, retention_seconds, retention_bytes) -> str:
    if not compact:
        return "delete"
    return "compact" if retention_seconds is None and retention_bytes is None else "compact,delete"


def _taken(check: Callable[[int], bool], what: str) -> Callable[[str], int]:
    """A config taken, checked and not kept (no stream setting)."""
    def parse(value: str) -> int:
        n = int(value)
        if not check(n):
            raise ValueError(what)
        return n
    return parse


def _one_of(names: dict) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value not in names:
            raise ValueError(f"one of {', '.join(names)}")
        return names[value]
    return parse


_TIMESTAMP_TYPES = {"CreateTime": "create_time", "LogAppendTime": "log_append_time"}
_COMPRESSIONS = {c: c for c in ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")}


class Config(NamedTuple):
    """A topic config: the stream setting it is (None: none, a fixed value), its value
    read (str -> setting; ValueError saying what it takes) and shown (setting, then the
    settings named by ``reads`` -> str), the stream's default, Kafka's type, what it does
    here (DescribeConfigs' documentation), and the other settings its shown value reads."""

    setting: str | None
    parse: Callable
    show: Callable
    default: object
    type: int
    doc: str
    reads: tuple = ()


# how each stream setting that is a topic config reads, shows and is typed (its Kafka name
# and its default are model/settings.py's)
_AS_CONFIG = {
    "compact": (_policy, _show_policy, LIST,
                "delete: records go by retention.ms and retention.bytes; compact: the latest record of each key "
                "stays, the older ones go (retention still drops records where a bound is set: shown compact,delete)",
                ("retention_seconds", "retention_bytes")),
    "compression": (_one_of(_COMPRESSIONS), str, STRING,
                    "the codec of the batches Fetch answers; producer: as they were sent"),
    "delete_retention_seconds": (_ms_from_zero, _show_ms, LONG,
                                 "how long a tombstone stays in a compacted topic (by its timestamp)"),
    "max_compaction_lag_seconds": (_lag, lambda v: _show_ms(v, str(LONG_MAX)), LONG,
                                   f"the longest a record waits before its partition is compacted ({LONG_MAX}: no "
                                   "bound)"),
    "max_message_bytes": (_positive, str, INT, "the largest record: key, headers and value"),
    "timestamp_type": (_one_of(_TIMESTAMP_TYPES), {v: k for k, v in _TIMESTAMP_TYPES.items()}.get, STRING,
                       "CreateTime: the producer's timestamp; LogAppendTime: the time of the append"),
    "min_cleanable_dirty_ratio": (_ratio, str, DOUBLE,
                                  "a compacted partition is compacted once the bytes appended since its last "
                                  "compaction are this share of what it holds"),
    "retention_bytes": (_bytes_or_none, lambda v: "-1" if v is None else str(v), LONG,
                        "the most bytes a partition keeps (-1: no bound)"),
    "retention_seconds": (_ms, _show_ms, LONG, "how long a partition keeps a record (-1: no bound)"),
    "segment_bytes": (_positive, lambda v: str(KAFKA_SEGMENT_BYTES if v is None else v), INT,
                      "kept and shown; no effect (a partition is one ring and its logs)"),
}


def _as_config(s) -> Config:
    parse, show, kind, doc, *reads = _AS_CONFIG[s.name]
    return Config(s.name, parse, show, s.default, kind, doc, *reads)


CONFIGS = dict(sorted({
    **{s.kafka: _as_config(s) for s in STREAM_TABLE if s.kafka},
    # Kafka's configs that are no setting here: taken, checked, not kept
    "file.delete.delay.ms": Config(None, _taken(lambda n: n >= 0, "a number of ms from 0"), str, 60000, LONG,
                                   "taken, not kept: no effect here (a partition has no files to delete)"),
    "min.compaction.lag.ms": Config(None, _taken(lambda n: n == 0, "0 only (a record can be compacted at once here)"),
                                    str, 0, LONG, "0 only: a record can be compacted at once"),
    "segment.ms": Config(None, _taken(lambda n: n >= 1, "a positive number of ms"), str, 604800000, LONG,
                         "taken, not kept: no effect here (a partition is one ring and its logs; no segments roll)"),
}.items()))


def _refused(name: str, value, why: str) -> KafkaProtocolError:
    return KafkaProtocolError(f"config {name}={value}: {why}", ErrorCode.invalid_config)


def _config(name: str, value) -> Config:
    """The config ``name``; KafkaProtocolError (INVALID_CONFIG) naming it if it is none of ours."""
    c = CONFIGS.get(name)
    if c is None:
        raise _refused(name, value, f"not taken here (the topic configs are {', '.join(CONFIGS)})")
    return c


def _setting(name: str, value) -> tuple[str | None, object]:
    """(stream setting, value) of config ``name`` set to ``value`` (a str); KafkaProtocolError
    (INVALID_CONFIG) naming it for a config or a value not taken here."""
    c = _config(name, value)
    if value is None:
        raise _refused(name, value, "a value is wanted")
    try:
        return c.setting, c.parse(value)
    except ValueError as e:
        why = str(e) if "invalid literal" not in str(e) else "not a number"
        raise _refused(name, value, f"takes {why}") from None


def settings_of(configs) -> dict:
    """CreateTopics' (or AlterConfigs') ``configs`` as ``create_stream``'s settings."""
    out = {}
    for c in configs or ():
        key, value = _setting(c.name, c.value)
        if key is not None:
            out[key] = value
    return out


def _defaults() -> dict:
    return {c.setting: c.default for c in CONFIGS.values() if c.setting is not None}


def topic_configs(settings: dict) -> list[tuple[str, str, int, bool]]:
    """A stream's ``settings`` (``stream_settings``) as Kafka's topic configs: (name,
    value, source, read-only)."""
    out = []
    for name, c in sorted(CONFIGS.items()):
        value = c.default if c.setting is None else settings.get(c.setting, c.default)
        out.append((name, c.show(value, *(settings.get(k) for k in c.reads)),
                    DEFAULT_CONFIG if value == c.default else DYNAMIC_TOPIC_CONFIG, c.setting is None))
    return out


def _respond(header, data: dict):
    return build(response_class(header.request_api_key, header.request_api_version), data)


class _NoTopic(Exception):
    """No topic of that name: ``code`` answers it."""

    def __init__(self, code, name):
        super().__init__(f"no topic {name!r}")
        self.code = code


def _settings(server, name) -> dict:
    """The settings of topic ``name``'s stream, read now (``stream_settings``); _NoTopic."""
    s, code = server.topic(name)
    if s is None:
        raise _NoTopic(code, name)
    return stream_settings(s)


def _error(e: BaseException) -> tuple[ErrorCode, str]:
    """The code and message that answer a resource's or a topic's failure."""
    if isinstance(e, _NoTopic):
        return e.code, str(e)
    if isinstance(e, (ValueError, TypeError, SettingsMismatch)):
        return ErrorCode.invalid_config, str(e)
    return code_of(e), str(e)


# ---------------------------------------------------------------------------- CreateTopics
async def create_topics(ctx, header, request):
    server, out = ctx.server, []
    for t in request.topics:
        n = len(t.assignments) if t.assignments else t.num_partitions
        if n == -1:
            n = server.auto_create_partitions
        entry = {"name": t.name, "num_partitions": n, "replication_factor": 1, "error_code": ErrorCode.none}
        try:
            if t.replication_factor != -1 and not 1 <= t.replication_factor <= server.max_replication_factor:
                raise KafkaProtocolError(f"replication factor {t.replication_factor}: a single node has 1 (a server "
                                         f"with --kafka-max-replication-factor takes up to that)",
                                         ErrorCode.invalid_replication_factor)
            if n < 1:
                raise KafkaProtocolError(f"{n} partitions", ErrorCode.invalid_partitions)
            settings = settings_of(t.configs)
            if request.validate_only:
                if t.name in server.broker.list_streams():
                    raise StreamExists(f"topic {t.name!r} exists")
                held = {**_defaults(), **settings}
            else:
                server.create_topic(t.name, n, **settings)
                log.info("topic %s created with %d partition(s)", t.name, n,
                         extra={"event": "kafka_topic_created", "topic": t.name, "partitions": n})
                s, _code = server.topic(t.name)
                if s is not None:
                    entry["topic_id"] = server.topic_id(s)
                held = _settings(server, t.name)
            entry["configs"] = [{"name": k, "value": v, "read_only": ro, "config_source": src, "is_sensitive": False}
                                for k, v, src, ro in topic_configs(held)]
        except (ShmqError, ValueError, TypeError, _NoTopic) as e:
            code = ErrorCode.invalid_topic_exception if isinstance(e, (ValueError, TypeError)) else code_of(e)
            entry.update(error_code=code, error_message=str(e), num_partitions=-1, replication_factor=-1, configs=[])
        out.append(entry)
    return _respond(header, {"topics": out})


# ---------------------------------------------------------------------------- DescribeConfigs
async def describe_configs(ctx, header, request):
    """A topic's configs (``topic_configs``); a broker has none to tell; other resources
    are refused."""
    results = []
    docs = getattr(request, "include_documentation", False)
    for r in request.resources:
        entry = {"error_code": ErrorCode.none, "resource_type": r.resource_type, "resource_name": r.resource_name,
                 "configs": []}
        if r.resource_type == TOPIC:
            try:
                held = _settings(ctx.server, r.resource_name)
            except _NoTopic as e:
                entry.update(error_code=e.code, error_message=str(e))
            else:
                wanted = None if r.configuration_keys is None else set(r.configuration_keys)
                entry["configs"] = [{"name": k, "value": v, "read_only": ro, "config_source": src,
                                     "is_default": src == DEFAULT_CONFIG, "is_sensitive": False,
                                     "config_type": CONFIGS[k].type, "documentation": CONFIGS[k].doc if docs else None}
                                    for k, v, src, ro in topic_configs(held) if wanted is None or k in wanted]
        elif r.resource_type != BROKER:
            entry.update(error_code=ErrorCode.invalid_request,
                         error_message=f"resource type {r.resource_type}: only topics (2) and brokers (4)")
        results.append(entry)
    return _respond(header, {"results": results})


# ---------------------------------------------------------------------------- AlterConfigs
def _alter(server, r, changes: Callable[[dict], dict], validate_only: bool) -> dict:
    """One resource of an AlterConfigs or IncrementalAlterConfigs: its new settings
    (``changes(held)``) made, all or none (none with ``validate_only``); its response."""
    entry = {"error_code": ErrorCode.none, "error_message": None, "resource_type": r.resource_type,
             "resource_name": r.resource_name}
    try:
        if r.resource_type != TOPIC:
            raise KafkaProtocolError(f"resource type {r.resource_type}: only topics (2) have configs to change",
                                     ErrorCode.invalid_request)
        held = _settings(server, r.resource_name)
        new = changes(held)
        if not validate_only:
            server.broker.update_stream(r.resource_name, **new)
            log.info("topic %s: configs changed (%s)", r.resource_name,
                     ", ".join(f"{k} {v!r}" for k, v in new.items() if held.get(k) != v) or "none",
                     extra={"event": "kafka_topic_configs_changed", "topic": r.resource_name})
        else:
            check_stream_settings({**held, **new})  # the checks update_stream makes, nothing written
    except (ShmqError, ValueError, TypeError, _NoTopic) as e:
        code, message = _error(e)
        entry.update(error_code=code, error_message=message)
    return entry


async def alter_configs(ctx, header, request):
    """The configs named set, every other one back to its default (AlterConfigs replaces
    a resource's whole set, as Kafka's does)."""
    def changes(r):
        return lambda held: {**_defaults(), **settings_of(r.configs)}

    return _respond(header, {"responses": [_alter(ctx.server, r, changes(r), request.validate_only)
                                           for r in request.resources]})


def _policy_change(op: int, value, now: dict) -> bool:
    """cleanup.policy's ``compact`` after APPEND or SUBTRACT of ``value`` (a list) where
    ``now`` holds the settings so far. Delete cannot be taken away: it is the retention
    bounds, which stay (SUBTRACT delete is refused where the topic shows delete, nothing
    where it does not)."""
    name = "cleanup.policy"
    if value is None:
        raise _refused(name, value, "a value is wanted")
    try:
        words = _policy_words(value)
    except ValueError as e:
        raise _refused(name, value, f"takes {e}") from None
    compact = now["compact"]
    if op == SUBTRACT and "delete" in words and "delete" in _show_policy(compact, now["retention_seconds"],
                                                                          now["retention_bytes"]):
        raise _refused(name, value, "SUBTRACT delete is not taken: delete is what retention.ms and retention.bytes "
                                    "do, and a topic is delete unless it is compact with neither set (-1)")
    if "compact" in words:
        compact = op == APPEND
    return compact


def _incremental(configs) -> Callable[[dict], dict]:
    def changes(held: dict) -> dict:
        out = {}
        for c in configs:
            op = c.config_operation
            if op == SET:
                key, value = _setting(c.name, c.value)
            elif op == DELETE:
                spec = _config(c.name, c.value)
                key, value = spec.setting, spec.default
            elif op in (APPEND, SUBTRACT) and c.name == "cleanup.policy":
                key, value = "compact", _policy_change(op, c.value, {**held, **out})
            elif op in (APPEND, SUBTRACT):
                _config(c.name, c.value)
                raise _refused(c.name, c.value, f"{'APPEND' if op == APPEND else 'SUBTRACT'} is not taken "
                                                f"({c.name} is not a list)")
            else:
                raise KafkaProtocolError(f"config operation {c.config_operation}: 0 SET, 1 DELETE, 2 APPEND, "
                                         "3 SUBTRACT", ErrorCode.invalid_request)
            if key is not None:
                out[key] = value
        return out
    return changes


async def incremental_alter_configs(ctx, header, request):
    """SET a config, DELETE it (back to its default); APPEND and SUBTRACT of the list
    config cleanup.policy (``_policy_change``), refused for the others."""
    return _respond(header, {"responses": [_alter(ctx.server, r, _incremental(r.configs), request.validate_only)
                                           for r in request.resources]})


# ---------------------------------------------------------------------------- CreatePartitions
async def create_partitions(ctx, header, request):
    """Each topic grown to ``count`` partitions (its new total, more than it has:
    ``Stream.add_partitions``); a durable stream's new partitions are opened for the data
    dir at once, as a new topic's are."""
    server, results = ctx.server, []
    for t in request.topics:
        entry = {"name": t.name, "error_code": ErrorCode.none, "error_message": None}
        try:
            s, code = server.topic(t.name)
            if s is None:
                raise _NoTopic(code, t.name)
            have = s.partitions
            if t.count <= have:
                raise KafkaProtocolError(f"topic {t.name!r} has {have} partitions: the count asked ({t.count}) "
                                         "must be more", ErrorCode.invalid_partitions)
            if t.assignments is not None and any(list(a.broker_ids) != [server.node_id] for a in t.assignments):
                raise KafkaProtocolError(f"replica assignments: a single node, broker {server.node_id}",
                                         ErrorCode.invalid_replica_assignment)
            if not request.validate_only:
                s.add_partitions(t.count - have)
                log.info("topic %s: %d partition(s) now", t.name, t.count,
                         extra={"event": "kafka_partitions_created", "topic": t.name, "partitions": t.count})
                if server.on_create is not None:  # a durable stream's new partitions log their first append
                    await asyncio.to_thread(server.on_create, s)  # (it may write a snapshot: off the loop)
        except (ShmqError, ValueError, TypeError, _NoTopic) as e:
            code, message = _error(e)
            entry.update(error_code=ErrorCode.invalid_partitions if isinstance(e, ValueError) else code,
                         error_message=message)
        results.append(entry)
    return _respond(header, {"results": results})


HANDLERS = {CREATE_TOPICS: create_topics, DESCRIBE_CONFIGS: describe_configs, ALTER_CONFIGS: alter_configs,
            CREATE_PARTITIONS: create_partitions, INCREMENTAL_ALTER_CONFIGS: incremental_alter_configs}
