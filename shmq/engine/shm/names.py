"""What each kind of object owns in /dev/shm: the one table of names, made and read back.

Strategy: every segment and semaphore of a namespace is named ``shmq.NS.REST`` (a
semaphore's file in /dev/shm is ``sem.shmq.NS.REST``). Each kind of object declares here,
in ``KINDS``, the entries it owns, as patterns with the object's name in them, and how
one tells that the object lives; the code that makes an entry takes its name from the
functions below, and ``owner`` reads any entry back to its kind and object. ``shmq
doctor``, ``shmq namespace`` and the tests ask ``owner``, so a kind that owns more than
it declares is seen at once: a name made outside this module fails tests/test_owners.py
(a scan for ``segment_name(``), and an entry that no kind declares is no one's to doctor.
The data dir's files have their one place too: persistence/files.py (``owner_of``).
"""

import os
import re
from dataclasses import dataclass

__all__ = ["Kind", "Owner", "KINDS", "owner", "default_namespace", "NOT_EMPTY", "NOT_FULL", "STREAM_MARK", "STORE_SUFFIX",
           "namespace_prefix", "lane_name", "queue_segment", "queue_base", "lane_prefix", "stream_base",
           "partition_segment", "store_file", "store_prefix", "registry_segment", "exchanges_segment",
           "kafka_journal_entry", "broker_lock_entry", "log_bell", "mp_semaphore", "mp_body_segment", "spark_spool_prefix"]

NOT_EMPTY, NOT_FULL = ".ne", ".nf"  # a ring's two semaphores: its sleeping consumers', its sleeping producers'
STREAM_MARK = "@"  # a stream's name in the registry (and in a data dir's files): ``@NAME``
STORE_SUFFIX = ".db"  # a keyed store's SQLite file (SQLite adds -wal, -shm, -journal beside it)
_REGISTRY, _EXCHANGES, _KAFKA_JOURNAL, _BROKER_LOCK, _LOG_BELL, _SPOOL = "registry", "exchanges", "kafka-txns", \
    "broker", "logbell", "spark-spool"
_MP_SEMAPHORES = ("slots", "unfinished", "idle")


def default_namespace() -> str:
    """The namespace a handle, a command or a server takes when none is named:
    $SHMQ_NAMESPACE, else "shmq"."""
    return os.environ.get("SHMQ_NAMESPACE") or "shmq"


def segment_name(namespace: str, *parts: str) -> str:
    """``/shmq.<namespace>.<parts...>``: every name carries the namespace. (Only this
    module calls it: a name is one of a kind's, below.)"""
    return "/" + ".".join(("shmq", namespace) + parts)


def namespace_prefix(namespace: str) -> str:
    """What every entry of ``namespace`` in /dev/shm starts with (a semaphore's after ``sem.``)."""
    return f"shmq.{namespace}."


# ------------------------------------------------------------------ the names, made
def lane_name(name: str, lane: int) -> str:
    """The name of lane ``lane`` of queue ``name`` (its segment's, its log's): ``name`` for
    lane 0, ``name#LANE`` for the others (``#`` is never in a queue's name)."""
    return f"{name}#{lane}" if lane else name


def queue_segment(namespace: str, name: str, lane: int = 0) -> str:
    """``/shmq.NS.q.NAME`` (lane 0), ``/shmq.NS.q.NAME#LANE``: a queue's ring, with its
    two semaphores ``+ NOT_EMPTY``, ``+ NOT_FULL``."""
    return segment_name(namespace, "q", lane_name(name, lane))


def lane_prefix(namespace: str, name: str) -> str:
    """What the entries of lanes 1.. of queue ``name`` start with (``sem.`` before a semaphore's)."""
    return queue_segment(namespace, name).lstrip("/") + "#"


def queue_base(namespace: str) -> str:
    """What every queue segment of ``namespace`` starts with."""
    return segment_name(namespace, "q", "")


def stream_base(namespace: str, name: str) -> str:
    """``/shmq.NS.s.NAME``: a stream's meta segment (groups, settings), with its semaphore
    ``+ NOT_EMPTY``; its partitions are ``partition_segment``."""
    return segment_name(namespace, "s", name)


def partition_segment(stream_base_name: str, index: int) -> str:
    """``/shmq.NS.s.NAME#P``: ``#`` cannot appear in a name, so no stream's partition can
    be taken for another stream."""
    return f"{stream_base_name}#{index}"


def store_file(namespace: str, name: str) -> str:
    """``shmq.NS.kv.NAME.db``: a keyed store's SQLite file, as an entry of /dev/shm."""
    return store_prefix(namespace) + name + STORE_SUFFIX


def store_prefix(namespace: str) -> str:
    """What every keyed store's file of ``namespace`` starts with."""
    return segment_name(namespace, "kv", "").lstrip("/")


def registry_segment(namespace: str) -> str:
    """``/shmq.NS.registry``: which queues and streams the namespace has."""
    return segment_name(namespace, _REGISTRY)


def exchanges_segment(namespace: str) -> str:
    """``/shmq.NS.exchanges``: the namespace's exchanges and their bindings."""
    return segment_name(namespace, _EXCHANGES)


def kafka_journal_entry(namespace: str) -> str:
    """``shmq.NS.kafka-txns``: the transactions' journal of a server with no data dir."""
    return segment_name(namespace, _KAFKA_JOURNAL).lstrip("/")


def broker_lock_entry(namespace: str) -> str:
    """``shmq.NS.broker``: the lock file one broker of the namespace holds."""
    return segment_name(namespace, _BROKER_LOCK).lstrip("/")


def log_bell(namespace: str) -> str:
    """``/shmq.NS.logbell``: the semaphore a server with a data dir waits on for creates
    of ``wal`` queues and streams to open the logs of (``logbell.py``)."""
    return segment_name(namespace, _LOG_BELL)


def mp_semaphore(namespace: str, what: str) -> str:
    """A ``shmq.mp`` queue's semaphore (``slots``, ``unfinished``, ``idle``) in its own namespace."""
    assert what in _MP_SEMAPHORES, what
    return segment_name(namespace, what)


def mp_body_segment(namespace: str, key: str) -> str:
    """A ``shmq.mp`` queue's body too large for its ring: ``/shmq.NS.b.KEY``."""
    return segment_name(namespace, "b", key)


def spark_spool_prefix(namespace: str) -> str:
    """What a Spark JVM sink task's spool starts with (``SinkWrite.java`` makes the rest:
    ``PID.TXN.BATCH.PART.TASK``, its driver's pid first)."""
    return segment_name(namespace, _SPOOL, "").lstrip("/")


# ------------------------------------------------------------------ the table, read back
@dataclass(frozen=True)
class Kind:
    """A kind of object and the entries it owns: ``patterns`` (regular expressions over
    what follows ``shmq.NS.``, a semaphore's with ``sem:`` before it, the object's name
    the group ``name``); ``lives``: how one tells the object is there --
    ``"registry"`` (the namespace's registry lists it live), ``"namespace"`` (it is the
    namespace's own, as long as the namespace), ``"itself"`` (its entries are the object:
    a keyed store), ``"process"`` (the process whose pid is the group ``pid`` runs) or
    ``"lock"`` (a broker holds it); ``gone``: what an entry of a ``"process"`` kind is
    once its process is gone."""

    name: str
    patterns: tuple[str, ...]
    lives: str
    gone: str = ""


_NAME = r"(?P<name>[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127})"  # segment.check_queue_name's rule

KINDS = (
    Kind("queue", (rf"q\.{_NAME}(?:#[1-9][0-9]*)?", rf"sem:q\.{_NAME}(?:#[1-9][0-9]*)?\.(?:ne|nf)"), "registry"),
    Kind("stream", (rf"s\.{_NAME}(?:#[0-9]+)?", rf"sem:s\.{_NAME}\.ne"), "registry"),
    Kind("store", (rf"kv\.{_NAME}\.db(?:-wal|-shm|-journal)?",), "itself"),
    Kind("registry", (_REGISTRY,), "namespace"),
    Kind("exchanges", (_EXCHANGES,), "namespace"),
    Kind("kafka-txns", (re.escape(_KAFKA_JOURNAL),), "namespace"),
    Kind("broker", (_BROKER_LOCK, f"sem:{_LOG_BELL}"), "lock",
         "the log bell of a server that is gone (the next start makes its own)"),
    # a task's spool of the Spark JVM sink (io.shmq.spark.sink.SinkWrite: PID.TXN.BATCH.PART.TASK), its
    # driver's while that driver lives, which publishes and deletes it
    Kind("spark-spool", (rf"{re.escape(_SPOOL)}\.(?P<pid>[0-9]+)\..+",), "process",
         "a spool of the Spark JVM sink whose driver is gone (nothing publishes it)"),
    Kind("mp-queue", (f"sem:(?:{'|'.join(_MP_SEMAPHORES)})", r"b\.[0-9A-Za-z_.-]+"), "namespace"),
)

_COMPILED = [(k, re.compile(p)) for k in KINDS for p in k.patterns]


@dataclass(frozen=True)
class Owner:
    """What owns an entry: its kind, the object's name (a stream's ``@NAME``, as the
    registry has it; None for a namespace's own), and a process's pid (a spool's)."""

    kind: Kind
    name: str | None = None
    pid: int | None = None


def owner(namespace: str, entry: str) -> Owner | None:
    """The kind and object that own ``entry`` (a name in /dev/shm: ``shmq.NS...`` or
    ``sem.shmq.NS...``) of ``namespace``, or None if no kind declares it."""
    sem = entry.startswith("sem.")
    prefix = namespace_prefix(namespace)
    rest = entry[4:] if sem else entry
    if not rest.startswith(prefix):
        return None
    rest = ("sem:" if sem else "") + rest[len(prefix):]
    for kind, pattern in _COMPILED:
        m = pattern.fullmatch(rest)
        if m is None:
            continue
        groups = m.groupdict()
        name = groups.get("name")
        if name is not None and kind.name == "stream":
            name = STREAM_MARK + name
        pid = int(groups["pid"]) if groups.get("pid") else None
        return Owner(kind, name, pid)
    return None
