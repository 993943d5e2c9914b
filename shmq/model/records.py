"""A stream's values, whichever transport hands them out: ``Record``,
``RecordMetadata``, and ``TopicPartition`` (one partition of one stream, as a member
of a group on several streams names it) with its checks."""

from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["Record", "RecordMetadata", "TopicPartition", "as_tp", "by_stream"]


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where an append went: its partition, offset and timestamp (UTC epoch seconds)."""

    partition: int
    offset: int
    timestamp: float


@dataclass(frozen=True, slots=True)
class Record:
    """One record read from a stream: ``value`` None is a tombstone (a null value, not
    b""); ``headers`` a dict, or a list of (key, value) pairs where a key repeats or a
    value is None (docs/STREAMS.md, Headers)."""

    stream: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict | list = field(default_factory=dict)
    timestamp: float = 0.0


class TopicPartition(NamedTuple):
    """One partition of one stream, as a consumer of several streams names it (Kafka's
    ``TopicPartition``); a plain ``(stream, partition)`` tuple is taken too."""

    stream: str
    partition: int


def as_tp(tp) -> TopicPartition:
    """``tp`` checked: a TopicPartition, or a (stream name, partition) pair."""
    if isinstance(tp, tuple) and len(tp) == 2 and isinstance(tp[0], str) and type(tp[1]) is int:
        return TopicPartition(*tp)
    raise TypeError(f"a consumer of several streams names partitions as (stream, partition) pairs "
                    f"(shmq.TopicPartition), not {tp!r:.60}")


def by_stream(tps) -> dict:
    """{stream: [partition, ...]} of the pairs ``tps``, checked, in their order."""
    out = {}
    for tp in tps:
        s, p = as_tp(tp)
        out.setdefault(s, []).append(p)
    return out
