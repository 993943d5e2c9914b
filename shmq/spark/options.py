"""The options of the "shmq" data source, read once and checked before a task starts,
and the connection they name.

Spark lower-cases option names (``maxRecordsPerTrigger`` arrives as
``maxrecordspertrigger``), so every name is looked up lower-cased. An ``Options`` holds
plain strings only: it is pickled to every Spark worker, and each worker opens its own
connection, lazily, from it (local attach by namespace, or TCP by url and token).
"""

import difflib
import json
import re

import shmq
from shmq.client.options import DEFAULT_MAX_OUTAGE_S, ConnectOptions
from shmq.engine.broker import Broker, default_namespace
from shmq.errors import ShmqError

__all__ = ["Options", "SpecError", "OPTIONS", "KAFKA_NAMES", "STREAM_SOURCE", "BATCH_SOURCE", "SINK",
           "refuse_unknown", "MAX_OUTAGE_S", "RECONNECT_PAUSES_S", "jvm_defaults"]

# How long a query's parts keep trying to reach the server of ``url`` after it went away
# (option maxOutage, seconds), and the first and the longest pause between tries: the Python
# clients' (a long-lived consumer's max_outage, and the reconnect's backoff); the JVM connector
# gets them in its jar (``jvm_defaults``, written by jar.py), so they are defined once
MAX_OUTAGE_S = DEFAULT_MAX_OUTAGE_S
RECONNECT_PAUSES_S = ConnectOptions().backoff


class SpecError(ShmqError, ValueError):
    """An option of the "shmq" or "dmsq" data source is missing or malformed."""


# The options each part reads (docs/SPARK.md), by the part's name in errors; any other is
# refused, naming these: an option that looks taken must never do nothing. The source also
# takes Kafka's source's names where they mean the same: subscribe and subscribePattern
# (one stream), and those of KAFKA_NAMES.
STREAM_SOURCE, BATCH_SOURCE, SINK = "the shmq streaming source", "the shmq batch source", "the shmq sink"
_CONNECTION = ("stream", "queue", "namespace", "url", "token", "maxOutage")
_SOURCE = _CONNECTION + ("subscribe", "subscribePattern", "startingOffsets", "failOnDataLoss", "includeHeaders",
                         "minPartitions", "maxPartitions", "queueStageMaxBytes")
OPTIONS = {
    STREAM_SOURCE: _SOURCE + ("maxRecordsPerTrigger", "maxOffsetsPerTrigger", "minRecordsPerTrigger",
                              "minOffsetsPerTrigger", "maxTriggerDelay"),
    BATCH_SOURCE: _SOURCE + ("endingOffsets",),
    SINK: _CONNECTION + ("sinkStagingMaxBytes", "checkpointLocation", "queryName"),  # (the last two: Spark's own)
}


def refuse_unknown(given, what: str, known) -> None:
    """SpecError naming each of the option names ``given`` (lower-cased, as Spark hands
    them) that ``what`` does not read (not in ``known``), with the part that reads it
    (``OPTIONS``) or else the closest known name, and listing those it reads."""
    by_lower = {k.lower(): k for k in known}
    unknown = sorted(set(given) - set(by_lower))
    if not unknown:
        return
    hints = []
    for u in unknown:
        parts = [part for part, names in OPTIONS.items() if u in map(str.lower, names)]
        close = difflib.get_close_matches(u, by_lower, 1)
        hints.append(f"{u} (an option of {' and '.join(parts)})" if parts
                     else f"{u} (did you mean {by_lower[close[0]]}?)" if close else u)
    raise SpecError(f"{what} has no option{'s' if len(hints) > 1 else ''} {', '.join(hints)}; its options are "
                    f"{', '.join(known)}")


# Kafka's name for an option of ours that means the same (a stream's offsets are dense: an
# offset is a record), read as ours by ``Options.get``; giving both is refused
KAFKA_NAMES = {"maxRecordsPerTrigger": "maxOffsetsPerTrigger", "minRecordsPerTrigger": "minOffsetsPerTrigger"}
_TARGETS = ("stream", "queue", "subscribe", "subscribePattern")
_UNIT_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_INTERNAL = re.compile(r".*(:staging:.*|:stage)")  # what the Spark parts make beside a stream (staging, stager)

# options renamed, so that the queue source's stage and the sink's staging cannot be taken for each other
RENAMED = {"stageMaxBytes": ("queueStageMaxBytes", "the size of the stream that stages a queue source"),
           "stagingMaxBytes": ("sinkStagingMaxBytes", "the size of each partition of the sink's staging stream")}


class Options:
    def __init__(self, raw):
        self._raw = {str(k).lower(): str(v) for k, v in dict(raw or {}).items()}
        for old, (new, what) in RENAMED.items():
            if old.lower() in self._raw:
                raise SpecError(f"option {old} is now {new} ({what})")
        for ours, kafkas in KAFKA_NAMES.items():
            if ours.lower() in self._raw and kafkas.lower() in self._raw:
                raise SpecError(f"give option {ours} or Kafka's name for it, {kafkas}, not both")
        given = [n for n in _TARGETS if self.get(n) is not None]
        if len(given) != 1:
            raise SpecError("the shmq data source needs exactly one of .option('stream', NAME) or "
                            ".option('queue', NAME) (a source also takes Kafka's subscribe or subscribePattern)"
                            + (f", not {' and '.join(given)}" if given else ""))
        self.stream, self.queue = self.get("stream"), self.get("queue")
        self.pattern = None  # subscribePattern: the stream is the one it matches (``resolve``)
        subscribe, pattern = self.get("subscribe"), self.get("subscribePattern")
        if subscribe is not None:
            names = [n.strip() for n in subscribe.split(",") if n.strip()]
            if len(names) != 1:
                raise SpecError(f"option subscribe must name one stream, not {subscribe!r}: a shmq source reads "
                                "one stream (start a query per stream, or union their DataFrames)")
            self.stream = names[0]
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as e:
                raise SpecError(f"option subscribePattern is not a regular expression ({e}): {pattern!r}") from None
            self.pattern = pattern
        self.url, self.token = self.get("url"), self.get("token")
        self.namespace = self.get("namespace")
        if self.url is not None and self.namespace is not None:
            raise SpecError("give .option('namespace', ...) for a local broker or .option('url', ...) for a "
                            "remote one, not both")
        if self.url is not None and not self.url.startswith(("tcp://", "tcps://")):
            raise SpecError(f"option url must be tcp://host:port (tcps:// for TLS), not {self.url!r}")
        self.max_outage = self.seconds("maxOutage", MAX_OUTAGE_S)

    def __repr__(self):
        return f"<shmq.spark.Options {self.target} {self.url or 'namespace=' + repr(self.namespace)}>"

    @property
    def target(self) -> str:
        """What the options name, for messages: "stream 'events'", "queue 'orders'" or
        "the stream matching 'ev.*'"."""
        if self.pattern is not None:
            return f"the stream matching {self.pattern!r}"
        return f"stream {self.stream!r}" if self.stream is not None else f"queue {self.queue!r}"

    def resolve(self, names) -> str:
        """The stream that ``subscribePattern`` matches (whole names, as Kafka's consumer
        matches topics) among the stream ``names``, leaving out those the Spark parts make
        (``NAME:staging:...``, ``QUEUE:stage``); SpecError unless it is exactly one."""
        pattern = re.compile(self.pattern)
        found = sorted(n for n in names if pattern.fullmatch(n) and not _INTERNAL.fullmatch(n))
        if len(found) != 1:
            raise SpecError(f"option subscribePattern {self.pattern!r} matches "
                            + (f"{len(found)} streams ({', '.join(found)})" if found else "no stream")
                            + f" in {self.url or 'namespace ' + repr(self.namespace or default_namespace())}: "
                            "a shmq source reads one stream")
        return found[0]

    def refuse_unknown(self, part: str, known) -> None:
        """SpecError for an option given that ``part`` (STREAM_SOURCE, BATCH_SOURCE or
        SINK) does not read: one not in ``known`` (``refuse_unknown``)."""
        refuse_unknown(self._raw, part, known)

    def get(self, name: str, default=None):
        """Option ``name`` as given (a str), or under Kafka's name for it (``KAFKA_NAMES``)."""
        raw = self._raw.get(name.lower())
        if raw is None and name in KAFKA_NAMES:
            raw = self._raw.get(KAFKA_NAMES[name].lower())
        return default if raw is None else raw

    def given_as(self, name: str) -> str:
        """The name option ``name`` was given under (ours, or Kafka's), for messages."""
        kafkas = KAFKA_NAMES.get(name)
        return kafkas if kafkas and name.lower() not in self._raw and kafkas.lower() in self._raw else name

    def integer(self, name: str, default=None, minimum: int = 0):
        raw = self.get(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise SpecError(f"option {self.given_as(name)} must be an integer, not {raw!r}") from None
        if value < minimum:
            raise SpecError(f"option {self.given_as(name)} must be >= {minimum}, not {value}")
        return value

    def number(self, name: str, default=None):
        raw = self.get(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise SpecError(f"option {name} must be a number, not {raw!r}") from None
        if not value >= 0:
            raise SpecError(f"option {name} must be >= 0, not {raw!r}")
        return value

    def seconds(self, name: str, default: float) -> float:
        """Option ``name`` in seconds: a number of seconds (``90``, ``2.5``) or a number and
        its unit (``500ms``, ``90s``, ``5m``; us, ms, s, m or min, h, d)."""
        raw = self.get(name)
        if raw is None:
            return default
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", raw.lower())
        if m is None or (m.group(2) or "s") not in _UNIT_SECONDS:
            raise SpecError(f"option {name} must be seconds (300) or a duration like 500ms, 90s or 5m, not {raw!r}")
        return float(m.group(1)) * _UNIT_SECONDS[m.group(2) or "s"]

    def flag(self, name: str, default: bool) -> bool:
        raw = self.get(name)
        if raw is None:
            return default
        if raw.lower() in ("true", "1", "yes"):
            return True
        if raw.lower() in ("false", "0", "no"):
            return False
        raise SpecError(f"option {name} must be true or false, not {raw!r}")

    def offsets(self, name: str, default: str):
        """``earliest`` / ``latest`` or JSON offsets per partition (-2: earliest, -1:
        latest), as Kafka's source reads them: ``{"STREAM": {"0": 23}}``, or without the
        stream, ``{"0": 23}``. A str, {partition: offset}, or {stream: {partition: offset}}."""
        raw = self.get(name, default)
        if raw in ("earliest", "latest"):
            return raw
        try:
            spec = json.loads(raw)
            if spec and all(isinstance(v, dict) for v in spec.values()):
                out = {str(s): {int(p): int(o) for p, o in parts.items()} for s, parts in spec.items()}
            else:
                out = {int(p): int(o) for p, o in spec.items()}
        except (ValueError, TypeError, AttributeError):
            raise SpecError(f"option {name} must be earliest, latest or JSON like {{\"STREAM\": {{\"0\": 23, "
                            f"\"1\": -2}}}} or {{\"0\": 23, \"1\": -2}}, not {raw!r}") from None
        flat = [o for v in out.values() for o in (v.values() if isinstance(v, dict) else [v])]
        if any(o < -2 for o in flat):
            raise SpecError(f"option {name}: an offset is >= 0, or -2 (earliest) or -1 (latest): {raw!r}")
        return out

    def connect(self):
        """A new broker connection: over TCP with ``url`` (and ``token``), else attached
        locally to ``namespace`` (default: $SHMQ_NAMESPACE, else "shmq"), which must exist."""
        if self.url is not None:
            return shmq.connect(self.url, token=self.token)
        namespace = self.namespace or default_namespace()
        try:  # never made here: a task of a stopped query must not bring a deleted namespace back
            return Broker(namespace, create=False)
        except FileNotFoundError:
            raise SpecError(f"there is no shmq namespace {namespace!r} on this host (nothing made a queue or stream "
                            "in it): check .option('namespace', ...)") from None


def jvm_defaults() -> str:
    """The JVM connector's defaults, as the properties file jar.py writes into its jar
    (io/shmq/spark/defaults.properties): defined once, here."""
    return ("# written by shmq.spark.jar from shmq/spark/options.py\n"
            f"maxOutage={MAX_OUTAGE_S!r}\n"
            f"reconnectFirstPause={RECONNECT_PAUSES_S[0]!r}\n"
            f"reconnectMostPause={RECONNECT_PAUSES_S[1]!r}\n")
