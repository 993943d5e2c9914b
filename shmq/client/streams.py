"""Streams reached over a connection, written once and sans-IO like the rest of the core:
``StreamCalls`` (the local ``Stream``'s methods) and ``ConsumerCalls`` (the local
``Consumer``'s). ``remote`` and ``aio`` only move the bytes.

Strategy: the server is the group member on behalf of the connection (JOIN gives a
member id, valid on this connection only; a closed connection leaves), so a consumer
here is a name for that member: once its connection is lost, its calls raise
BrokerUnavailable, also after the broker handle reconnected (join again). Arguments are
checked with the local engine's words before a byte is sent (``protocol.forms``), the
server's engine checks the rest, and its errors come back through the one status table,
so both transports fail alike. A READ
or POLL that waits at the end waits at the server, in slices (``core.waiting``).
"""

from ..engine.stream import check_txn
from ..errors import BrokerUnavailable, ShmqError, StreamNotFound
from ..protocol import MsgType
from ..protocol.forms import (
    STREAM_INFO,
    batch_fields,
    check_partition,
    commit_pairs,
    from_pairs,
    max_records_field,
    metadata_from_fields,
    ms,
    read_fields,
    record_fields,
    record_from_fields,
    stream_stats_from_fields,
)
from .core import Send, driven, waiting

__all__ = ["StreamCalls", "ConsumerCalls"]


class ConsumerCalls:
    """A member of a consumer group, held for this connection by the server: polls the
    partitions it owns from the group's committed offsets on, commits what it processed."""

    def __init__(self, stream, group: str, auto_offset_reset: str, member: int):
        self.stream = stream
        self.group = group
        self.auto_offset_reset = auto_offset_reset
        self._member = member
        self._core = stream._broker._core  # the connection the server holds the member for
        self._closed = False

    def __repr__(self):
        return f"<shmq.{type(self).__name__} {self.stream.name}/{self.group} member={self._member}>"

    def _drive(self, call):
        return self.stream._drive(call)

    def _fields(self) -> dict:
        if self._closed:
            raise ShmqError(f"consumer of group {self.group!r} is closed")
        if self._core.failed:
            if self._core.forked_from is not None:  # a child of fork(): the member stays the parent's
                raise BrokerUnavailable(f"consumer of group {self.group!r} is a member for the connection of process "
                                        f"{self._core.forked_from}, of which this process is a fork: join in this "
                                        "process (stream.consumer)")
            raise BrokerUnavailable(f"consumer of group {self.group!r} left the group with its connection to "
                                    f"{self._core.endpoint}, which ended: join again (stream.consumer)")
        return {"stream": self.stream.name, "member": self._member}

    @driven
    def assignment(self):
        """The partitions this member owns now."""
        return (yield Send(MsgType.ASSIGNMENT, self._fields()))["partitions"]

    @driven
    def position(self, p: int):
        """The next offset this member reads from partition ``p`` (one it owns; else KeyError)."""
        return from_pairs((yield Send(MsgType.ASSIGNMENT, self._fields()))["positions"])[p]

    @driven
    def poll(self, max_records: int = 500, timeout: float = 1.0):
        """Records from the partitions this member owns, from where it is on; waits up to
        ``timeout`` seconds for some, returns [] if none came."""
        fields = self._fields()
        fields["max"] = max_records_field(max_records)
        ms(timeout, "timeout")
        return (yield from self._poll(fields, timeout))

    def _poll(self, fields, timeout):
        records = yield from waiting(MsgType.POLL, fields, "records", timeout, self.stream._broker._clock)
        return [record_from_fields(self.stream.name, m) for m in records]

    @driven
    def commit(self, offsets: dict | None = None):
        """Commit ``{partition: next offset to read}`` (default: where this member is in
        every partition it owns), all or nothing; an explicit offset may be below the
        committed one (the group reads from there again, this member's position stays).
        CommitFailed, committing nothing, if a partition named went to another member
        since this member's last poll (also if it came back since); then poll again:
        partitions it kept go on from its position."""
        fields = self._fields()
        if offsets is not None:
            fields["offsets"] = commit_pairs(offsets)
        yield Send(MsgType.COMMIT, fields)

    @driven
    def close(self):
        """Leave the group: this member's partitions go to the others."""
        if self._closed:
            return
        if self._core.failed:  # the member left with its connection
            self._closed = True
            return
        fields = self._fields()
        self._closed = True
        try:
            yield Send(MsgType.LEAVE, fields)
        except (StreamNotFound, BrokerUnavailable):
            pass  # gone with its stream, or with its connection: left already


class StreamCalls:
    """A stream reached over a connection: the methods and errors of the local ``Stream``,
    and its settings as attributes (``partitions``, ``max_message_bytes``, ``retention``...)."""

    _consumer_class = ConsumerCalls  # the transport's

    def __init__(self, broker, info: dict):
        self._broker = broker
        self.name = info["stream"]
        for name in STREAM_INFO:
            setattr(self, name, info.get(name))

    def __repr__(self):
        return f"<shmq.{type(self).__name__} {self._broker.url}/{self.name} partitions={self.partitions}>"

    def _drive(self, call):
        return self._broker._drive(call)

    @driven
    def append(self, value, key=None, headers=None, partition=None):
        """Append one record; returns where it went (``RecordMetadata``)."""
        fields = {"stream": self.name, **record_fields(value, key, headers)}
        if partition is not None:
            fields["partition"] = check_partition(self, partition)
        reply = yield Send(MsgType.APPEND, fields)
        return metadata_from_fields((reply["partition"], reply["offset"], reply["timestamp"]))

    @driven
    def append_many(self, values, keys=None, headers=None, partition=None, compression=None):
        """Append a batch, all or nothing per partition, as the local ``append_many``; with
        ``compression="zstd"`` it travels compressed (needs ``pip install 'shmq[zstd]'``)."""
        fields = batch_fields(values, keys, headers, compression)
        if fields is None:
            return []
        if partition is not None:
            fields["partition"] = check_partition(self, partition)
        reply = yield Send(MsgType.APPEND_BATCH, {"stream": self.name, **fields})
        return [metadata_from_fields(m) for m in reply["records"]]

    @driven
    def offsets(self, p: int):
        """(earliest retained offset, the offset the next append gets) of partition ``p``."""
        reply = yield Send(MsgType.OFFSETS, {"stream": self.name, "partition": check_partition(self, p)})
        return reply["earliest"], reply["end"]

    @driven
    def read(self, p: int, offset: int, max_records: int = 1000, timeout: float = 0.0):
        """Records of partition ``p`` from ``offset`` on; at the end, waits up to ``timeout``
        seconds and returns [] if nothing came. OffsetOutOfRange (with ``earliest`` and
        ``end``) below the retained range or past the end."""
        fields = read_fields(self, p, offset, max_records, timeout)
        records = yield from waiting(MsgType.READ, fields, "records", timeout, self._broker._clock)
        return [record_from_fields(self.name, m) for m in records]

    @driven
    def publish(self, staging, ranges: dict, txn_id: bytes, batch: int):
        """Append records staged in the stream ``staging`` exactly once per (``txn_id``,
        ``batch``) and partition, as the local ``Stream.publish``; the records move inside
        the server."""
        txn_id = check_txn(txn_id, batch)
        rows = [[check_partition(self, p), sp, first, end] for p in sorted(ranges) for sp, first, end in ranges[p]]
        reply = yield Send(MsgType.PUBLISH, {"stream": self.name, "staging": getattr(staging, "name", staging),
                                             "ranges": rows, "txn": txn_id, "batch": batch})
        return from_pairs(reply["first"])

    @driven
    def published(self, txn_id: bytes):
        """{partition: the newest batch publisher ``txn_id`` published there, -1 if none}."""
        return from_pairs((yield Send(MsgType.PUBLISHED, {"stream": self.name, "txn": check_txn(txn_id)}))["published"])

    @driven
    def delete_records(self, offsets: dict):
        """Drop the records below ``{partition: offset}`` now; returns how many."""
        reply = yield Send(MsgType.DELETE_RECORDS, {"stream": self.name, "offsets": commit_pairs(offsets)})
        return reply["deleted"]

    @driven
    def consumer(self, group: str, auto_offset_reset: str = "earliest"):
        """Join ``group`` as a new member (held by the server for this connection)."""
        reply = yield Send(MsgType.JOIN, {"stream": self.name, "group": group, "auto_offset_reset": auto_offset_reset})
        return self._consumer_class(self, group, auto_offset_reset, reply["member"])

    @driven
    def groups(self):
        return (yield Send(MsgType.GROUPS, {"stream": self.name}))["groups"]

    @driven
    def committed(self, group: str):
        """{partition: committed offset} of ``group`` (the next offset it reads)."""
        return from_pairs((yield Send(MsgType.COMMITTED, {"stream": self.name, "group": group}))["committed"])

    @driven
    def lag(self, group: str):
        """{partition: records between the group's committed offset (or the earliest
        retained one) and the end}."""
        return from_pairs((yield Send(MsgType.LAG, {"stream": self.name, "group": group}))["lag"])

    @driven
    def reset(self, group: str, to="earliest"):
        """Move ``group``'s committed offsets (only while it has no live member): to
        "earliest", "latest" or {partition: offset}."""
        fields = {"stream": self.name, "group": group}
        if isinstance(to, dict):
            fields["offsets"] = commit_pairs(to)
        else:
            fields["to"] = to
        yield Send(MsgType.RESET, fields)

    @driven
    def stats(self):
        """Per partition: earliest, end, bytes; per group: members and lag."""
        return stream_stats_from_fields((yield Send(MsgType.STREAM_STATS, {"stream": self.name})))
