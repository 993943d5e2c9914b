"""Streams reached over a connection, written once and sans-IO like the rest of the core:
``StreamCalls`` (the local ``Stream``'s methods) and ``ConsumerCalls`` (the local
``Consumer``'s). ``remote`` and ``aio`` only move the bytes.

Strategy: the server is the group member on behalf of the connection (JOIN gives a
member id, valid on this connection only; a closed connection leaves), so a consumer
here is a name for that member. Once its connection is lost, the first call on the
broker handle's new connection joins again (``_come_back``): the group rebalances, the
new member reads from the committed offsets, and on_revoke / on_assign are told as
for any rebalance; a poll the loss broke returns [] (``core.Resuming``). Without
reconnecting, its calls raise BrokerUnavailable. Arguments are
checked with the local engine's words before a byte is sent (``protocol.payloads``), the
server's engine checks the rest, and its errors come back through the one status table,
so both transports fail alike. A READ
or POLL that waits at the end waits at the server, in slices (``core.waiting``).
"""

import logging
from collections import deque

from ..errors import BrokerUnavailable, CommitFailed, ShmqError, StreamNotFound
from ..model.checks import check_auto_commit, check_callback, check_offset, check_poll_interval, check_txn
from ..protocol import MsgType
from ..protocol.payloads import (
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
from .core import Resuming, Send, deadline, driven, resumable, waiting, waiting_until

__all__ = ["StreamCalls", "ConsumerCalls"]

log = logging.getLogger("shmq.client")
CONSUMER_OPTIONS = ("on_assign", "on_revoke", "auto_commit", "auto_commit_interval", "max_poll_interval")


class ConsumerCalls(Resuming):
    """A member of a consumer group, held for this connection by the server: polls the
    partitions it owns from the group's committed offsets on, commits what it processed.
    Positions and paused partitions are the server's (SEEK, PAUSE); on_assign / on_revoke
    run here, when a POLL reply tells the assignment moved (the server answers such a
    poll before it reads); auto-commit commits from here; the iteration polls batches of
    up to 500 and hands them out one at a time (``poll`` returns what it still holds
    first, and ``commit()`` never commits past a record not yet handed out)."""

    def __init__(self, stream, group: str, auto_offset_reset: str, member: int, on_assign=None, on_revoke=None,
                 auto_commit: bool = False, auto_commit_interval: float = 5.0):
        self.stream = stream
        self.group = group
        self.auto_offset_reset = auto_offset_reset
        self.on_assign, self.on_revoke = check_callback(on_assign, "on_assign"), check_callback(on_revoke, "on_revoke")
        self._auto_s = check_auto_commit(auto_commit, auto_commit_interval)
        self._auto_s = None if self._auto_s is None else self._auto_s / 1e9
        self._member = member
        self._core = stream._broker._core  # the connection the server holds the member for
        self._clock = stream._broker._clock
        self._next_auto = None if self._auto_s is None else self._clock() + self._auto_s
        self._buffer = deque()  # polled by the iteration, not yet handed out
        self._lost = {}  # in on_revoke: {revoked partition: position}
        self._revoking = False
        self._first = None  # the assignment the JOIN reply told, for on_assign at the first poll
        self._owned = set()  # the partitions on_assign was told of and on_revoke was not (``_come_back``)
        self._join = None  # the JOIN's fields, to join again after a reconnect
        self._closed = False

    def __repr__(self):
        return f"<shmq.{type(self).__name__} {self.stream.name}/{self.group} member={self._member}>"

    def _broker_handle(self):
        return self.stream._broker

    def _drive(self, call):
        return self.stream._drive(self._resumed(call))

    def _resumed(self, call):
        yield from self._come_back()
        return (yield from call)

    def _come_back(self):
        """Once the member's connection has ended and the broker handle reconnected (the
        server let the member go, uncommitted records included): JOIN again with the same
        fields, as after a rebalance — the records buffered are dropped, on_revoke is told
        of the partitions owned, and on_assign at the next poll of the new ones."""
        lost, broker = self._core, self.stream._broker
        if self._closed or self._join is None or broker._core is lost or not resumable(lost, broker):
            return
        reply = yield Send(MsgType.JOIN, self._join)
        self._member, self._core = reply["member"], broker._core
        revoked, self._owned = sorted(self._owned), set()
        self._buffer.clear()
        if revoked and self.on_revoke is not None:
            self.on_revoke(revoked)
        self._first = reply["partitions"]
        log.info("stream %s group %s: joined again after a reconnect (member %s)", self.stream.name, self.group,
                 self._member)

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

    def _unhanded(self, positions: dict) -> dict:
        """``positions`` moved back to the first record the iteration holds, per partition."""
        for r in self._buffer:
            positions[r.partition] = min(positions.get(r.partition, r.offset), r.offset)
        return positions

    def _drop_buffered(self, partitions) -> None:
        """Forget the records the iteration holds of ``partitions`` (None: all)."""
        if self._buffer:
            self._buffer = deque(r for r in self._buffer if partitions is not None and r.partition not in partitions)

    @driven
    def assignment(self):
        """The partitions this member owns now."""
        return (yield Send(MsgType.ASSIGNMENT, self._fields()))["partitions"]

    @driven
    def position(self, p: int):
        """The next offset this member reads from partition ``p`` (one it owns, or one
        being revoked, in on_revoke; else KeyError)."""
        if self._revoking and p in self._lost:
            return self._lost[p]
        positions = self._unhanded(from_pairs((yield Send(MsgType.ASSIGNMENT, self._fields()))["positions"]))
        if p not in positions:
            raise KeyError(f"partition {p!r} of stream {self.stream.name!r} is not assigned to this member of group "
                           f"{self.group!r} (it owns {sorted(positions)})")
        return positions[p]

    @driven
    def seek(self, p: int, offset: int):
        """Read partition ``p`` (owned; else ValueError) from ``offset`` at the next poll."""
        yield Send(MsgType.SEEK, {**self._fields(), "partitions": [p], "offset": check_offset(offset)})
        self._drop_buffered({p})

    @driven
    def seek_to_beginning(self, *partitions):
        """Read these partitions (default: all owned) from their earliest retained offset."""
        yield Send(MsgType.SEEK, {**self._fields(), "partitions": list(partitions), "to": "beginning"})
        self._drop_buffered(set(partitions) or None)

    @driven
    def seek_to_end(self, *partitions):
        """Read these partitions (default: all owned) from their end: only what comes next."""
        yield Send(MsgType.SEEK, {**self._fields(), "partitions": list(partitions), "to": "end"})
        self._drop_buffered(set(partitions) or None)

    @driven
    def pause(self, *partitions):
        """Stop reading these owned partitions (they stay this member's) until ``resume``."""
        fields = self._fields()
        held = {p: o for p, o in self._unhanded({}).items() if p in partitions}
        yield Send(MsgType.PAUSE, {**fields, "partitions": list(partitions), "paused": True})
        for p, o in held.items():  # records polled and not handed out are read again after resume
            yield Send(MsgType.SEEK, {**fields, "partitions": [p], "offset": o})
        self._drop_buffered(set(held))

    @driven
    def resume(self, *partitions):
        """Read these paused partitions again."""
        yield Send(MsgType.PAUSE, {**self._fields(), "partitions": list(partitions), "paused": False})

    @driven
    def paused(self):
        """The owned partitions paused now."""
        return (yield Send(MsgType.PAUSE, self._fields()))["paused"]

    @driven
    def poll(self, max_records: int = 500, timeout: float = 1.0):
        """Records from the partitions this member owns and has not paused, from where it
        is on; waits up to ``timeout`` seconds for some, returns [] if none came. Calls
        on_revoke / on_assign first when the assignment moved, and commits when
        auto-commit is due."""
        fields = self._fields()
        n = max_records_field(max_records)
        ms(timeout, "timeout")
        if self._buffer:
            return [self._buffer.popleft() for _ in range(min(n, len(self._buffer)))]
        return (yield from self._poll(fields, n, timeout))

    def _poll(self, fields, n, timeout):
        until = deadline(timeout, self._clock)
        if self._next_auto is not None and self._clock() >= self._next_auto:
            self._next_auto = self._clock() + self._auto_s
            yield from self._quietly(Send(MsgType.COMMIT, fields))
        if self._first is not None:
            first, self._first = self._first, None
            yield from self._changed({}, first)
        while True:
            left = None if until is None else max(0.0, until - self._clock())
            try:
                reply = yield from waiting_until(MsgType.POLL, {**fields, "max": n}, _answered, left, self._clock)
            except BrokerUnavailable:
                if resumable(self._core, self.stream._broker) and not self._closed:
                    return []  # the next call joins again on the new connection
                raise
            if "revoked" in reply or "assigned" in reply:
                yield from self._changed(from_pairs(reply.get("revoked", [])), reply.get("assigned", []))
                if not reply["records"]:  # the server answered before it read: read now
                    continue
            return [record_from_fields(self.stream.name, m) for m in reply["records"]]

    def _changed(self, revoked: dict, assigned):
        """The assignment moved (as the local ``Consumer._changed``): auto-commit commits the
        revoked positions, then on_revoke and on_assign are called."""
        self._owned.difference_update(revoked)
        self._owned.update(assigned)
        if revoked:
            self._drop_buffered(set(revoked))
        if revoked and self._auto_s is not None:
            yield from self._quietly(Send(MsgType.COMMIT, {**self._fields(), "offsets": commit_pairs(revoked),
                                                           "revoked": True}))
        if revoked and self.on_revoke is not None:
            self._lost, self._revoking = revoked, True
            try:
                self.on_revoke(sorted(revoked))
            finally:
                self._lost, self._revoking = {}, False
        if assigned and self.on_assign is not None:
            self.on_assign(list(assigned))

    def _quietly(self, request):
        """An auto-commit: a refusal is logged, as Kafka's auto-commit does."""
        try:
            yield request
        except CommitFailed as e:
            log.warning("stream %s group %s: auto-commit refused: %s", self.stream.name, self.group, e)

    @driven
    def commit(self, offsets: dict | None = None):
        """Commit ``{partition: next offset to read}`` (default: where this member is),
        all or nothing, as the local ``Consumer.commit`` does (it says when CommitFailed
        is raised, and what then); one COMMIT."""
        fields = self._fields()
        if offsets is None and self._buffer:
            offsets = self._unhanded(from_pairs((yield Send(MsgType.ASSIGNMENT, fields))["positions"]))
            offsets.update((p, o) for p, o in self._lost.items() if self._revoking)
        if offsets is not None:
            fields["offsets"] = commit_pairs(offsets)
        if self._revoking:
            fields["revoked"] = True
        yield Send(MsgType.COMMIT, fields)

    def _next_record(self):
        """The next record for the iteration, polling (and waiting) as needed."""
        while not self._buffer:
            self._buffer.extend((yield from self._poll(self._fields(), 500, None)))
        return self._buffer.popleft()

    def close(self):
        """Leave the group: this member's partitions go to the others. With auto-commit,
        commits where it is first (and on_revoke is told of the partitions it gives up)."""
        return self.stream._drive(self._close_steps())  # (a lost member is not joined again to leave)

    def _close_steps(self):
        if self._closed:
            return
        if self._core.failed:  # the member left with its connection
            self._closed = True
            return
        fields = self._fields()
        try:
            if self._auto_s is not None or self.on_revoke is not None:
                positions = self._unhanded(from_pairs((yield Send(MsgType.ASSIGNMENT, fields))["positions"]))
                if positions:
                    yield from self._changed(positions, [])
        finally:
            self._closed = True
            try:
                yield Send(MsgType.LEAVE, fields)
            except (StreamNotFound, BrokerUnavailable):
                pass  # gone with its stream, or with its connection: left already


def _answered(reply) -> bool:
    """A POLL reply to hand on: records, or the assignment's changes."""
    return bool(reply["records"]) or "revoked" in reply or "assigned" in reply


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
    def stable(self, p: int):
        """Partition ``p``'s last stable offset: readers read below it (the end, unless a
        transaction is open there; an older server, which has none, answers the end)."""
        reply = yield Send(MsgType.OFFSETS, {"stream": self.name, "partition": check_partition(self, p)})
        return reply.get("stable", reply["end"])

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
    def consumer(self, group: str, auto_offset_reset: str = "earliest", **options):
        """Join ``group`` as a new member (held by the server for this connection).
        ``options``: on_assign, on_revoke, auto_commit, auto_commit_interval,
        max_poll_interval, as the local ``Consumer`` takes them."""
        unknown = sorted(set(options) - set(CONSUMER_OPTIONS))
        if unknown:
            raise TypeError(f"consumer() got unexpected keyword arguments {unknown}")
        limit = check_poll_interval(options.pop("max_poll_interval", 300.0))
        check_callback(options.get("on_assign"), "on_assign")
        check_callback(options.get("on_revoke"), "on_revoke")
        check_auto_commit(options.get("auto_commit", False), options.get("auto_commit_interval", 5.0))
        fields = {"stream": self.name, "group": group, "auto_offset_reset": auto_offset_reset,
                  "max_poll_interval_ms": 0 if limit is None else max(1, limit // 10**6)}
        reply = yield Send(MsgType.JOIN, fields)
        calls = self._consumer_class(self, group, auto_offset_reset, reply["member"], **options)
        calls._first = reply["partitions"]
        calls._join = fields
        return calls

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
