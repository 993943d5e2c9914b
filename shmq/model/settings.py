"""Every setting of a queue and a stream, in one table: its name (``create_queue`` /
``create_stream``'s keyword), its default, whether it may change on a live object
(``update_queue`` / ``update_stream``), its DEADBEEF field and that field's check on the
wire, its CLI flag, and the Kafka topic config it is. The faces read it: the engine's and
the TCP clients' signatures take their defaults from ``QUEUE`` and ``STREAM``, the
protocol's field table its settings' fields, the Kafka listener's config table its names
and defaults, the CLI its flags and defaults; ``tests/test_settings.py`` walks the table
against every face. Adding a setting is one row here, and its behaviour. (A value's range
is checked once, by the engine, in its own words, wherever the call came from: the wire
checks only the type, the CLI only what its option type says.)
"""

from typing import NamedTuple

__all__ = ["Setting", "QUEUE_TABLE", "STREAM_TABLE", "QUEUE", "STREAM", "MUTABLE_QUEUE_SETTINGS",
           "FIXED_QUEUE_SETTINGS", "MUTABLE_STREAM_SETTINGS", "FIXED_STREAM_SETTINGS", "STREAM_INFO", "SAME",
           "QUEUE_SETTINGS", "QUEUE_SECONDS", "STREAM_SECONDS"]

SAME = "same"  # a remote default that is the row's own


class Setting(NamedTuple):
    """One row: ``wire`` names the field's check (``protocol.requests``: positive, int,
    non_negative, number, number_or_nil, str, bool); ``field`` is the DEADBEEF field where
    it is not the name (a duration in ms); ``remote`` the TCP clients' default where it is
    not ``default`` (None: the server decides); ``cli`` whether ``shmq queue|stream
    create`` has ``--NAME``; ``kafka`` the topic config it is; ``seconds`` whether it is a
    duration in seconds (a number: ``QUEUE_SECONDS``, ``STREAM_SECONDS``)."""

    name: str
    default: object
    mutable: bool
    wire: str
    field: str | None = None
    remote: object = SAME
    cli: bool = True
    kafka: str | None = None
    seconds: bool = False

    @property
    def wire_field(self) -> str:
        return self.field or self.name

    @property
    def flag(self) -> str | None:
        return "--" + self.name.replace("_", "-") if self.cli else None

    @property
    def clearable(self) -> bool:
        """A live value that may be set to none (``update_queue(x=None)``; CREATE's ``clear``)."""
        return self.mutable and (self.default is None or self.wire == "number_or_nil")

    @property
    def remote_default(self):
        return self.default if self.remote is SAME else self.remote


MiB = 2**20

QUEUE_TABLE = (
    Setting("max_bytes", 64 * MiB, False, "positive"),
    Setting("max_message_bytes", None, False, "positive"),  # None: 1 MiB, less if max_bytes is smaller
    Setting("visibility_timeout", 30.0, True, "non_negative", field="visibility_timeout_ms", seconds=True),
    Setting("max_deliveries", None, True, "positive"),
    Setting("dead_letter_queue", None, True, "str"),
    Setting("durability", "snapshot", False, "str", remote=None),
    Setting("priorities", 1, False, "int"),
    Setting("message_ttl", None, True, "number_or_nil", seconds=True),
    Setting("dedup_window", 300.0, True, "number", seconds=True),
    Setting("retry_delay", 0.0, True, "number", seconds=True),
    Setting("retry_backoff", 1.0, True, "number"),
    Setting("retry_delay_max", None, True, "number_or_nil", seconds=True),
    Setting("priority_aging", 60.0, True, "number_or_nil", seconds=True),
    Setting("lanes", 1, False, "int"),
    Setting("auto_delete", False, False, "bool"),
    Setting("expires", None, True, "number_or_nil", seconds=True),
)

STREAM_TABLE = (
    Setting("partitions", 4, True, "int"),
    Setting("max_bytes", 64 * MiB, False, "int"),
    Setting("max_message_bytes", MiB, True, "int", kafka="max.message.bytes"),
    Setting("retention", "drop", False, "str"),
    Setting("retention_bytes", None, True, "number", kafka="retention.bytes"),
    Setting("retention_seconds", None, True, "number", kafka="retention.ms", seconds=True),
    Setting("group_idle_timeout", 300.0, False, "number", seconds=True),
    Setting("durability", "snapshot", False, "str"),
    Setting("timestamp_type", "create_time", True, "str", cli=False, kafka="message.timestamp.type"),
    Setting("compression", "producer", True, "str", cli=False, kafka="compression.type"),
    Setting("segment_bytes", None, True, "int", cli=False, kafka="segment.bytes"),
    Setting("compact", False, True, "bool", kafka="cleanup.policy"),
    Setting("delete_retention_seconds", 86400.0, True, "number", kafka="delete.retention.ms", seconds=True),
    Setting("min_cleanable_dirty_ratio", 0.5, True, "number", cli=False, kafka="min.cleanable.dirty.ratio"),
    Setting("max_compaction_lag_seconds", None, True, "number", cli=False, kafka="max.compaction.lag.ms", seconds=True),
)


class _Defaults:
    """The defaults of a table as attributes (``QUEUE.visibility_timeout``), for signatures."""

    def __init__(self, table):
        for s in table:
            setattr(self, s.name, s.default)
        self.rows = {s.name: s for s in table}


QUEUE = _Defaults(QUEUE_TABLE)
STREAM = _Defaults(STREAM_TABLE)

# what ``update_queue`` / ``update_stream`` can change on a live object, and what they cannot
MUTABLE_QUEUE_SETTINGS = tuple(s.name for s in QUEUE_TABLE if s.mutable)
FIXED_QUEUE_SETTINGS = tuple(s.name for s in QUEUE_TABLE if not s.mutable)
MUTABLE_STREAM_SETTINGS = tuple(s.name for s in STREAM_TABLE if s.mutable)
FIXED_STREAM_SETTINGS = tuple(s.name for s in STREAM_TABLE if not s.mutable)
# a queue's settings, in the table's order (``Queue.settings()``'s keys; what a snapshot keeps)
QUEUE_SETTINGS = tuple(s.name for s in QUEUE_TABLE)
# the durations in seconds
QUEUE_SECONDS = frozenset(s.name for s in QUEUE_TABLE if s.seconds)
STREAM_SECONDS = frozenset(s.name for s in STREAM_TABLE if s.seconds)

# a stream's settings, as STREAM_CREATE and STREAM_INFO replies give them (and a handle has them)
STREAM_INFO = ("partitions", "max_bytes", "max_message_bytes", "retention", "retention_bytes", "retention_seconds",
               "group_idle_timeout", "durability", "created_at", "compact")
