"""Streams: partitioned append-only logs with offsets, replay, and consumer groups —
Kafka's model on one host.

Strategy: a stream is a meta segment (its settings, the group table, the count of
readers waiting) and one segment per partition (``partition.Partition``). An append
goes to one partition: by a stable hash of its key (Kafka's default partitioner,
``partitioner.partition_of``: the same key always lands in the same partition, in append
order, whichever client wrote it, native or Kafka), else to the next partition
in turn, sticky for one call, so an ``append_many`` without keys lands whole in one
partition. Readers read by offset, so replay is a read from an older offset; a
``Consumer`` (``consumer``) is a member of a group (``groups``) that polls the partitions it owns
from the group's committed offsets. Readers waiting at the end sleep on the stream's
semaphore; an append posts it only when someone waits.
"""

import ctypes
import itertools
import os
import random
import logging
import threading
import time

import posix_ipc

from ...errors import MessageTooLarge, OffsetOutOfRange, ShmqError, StreamNotFound
from ...model import faces
from ...model.settings import STREAM
from ...model.checks import check_txn
from ...model.checks import check_group as _group_name
from ...model.checks import check_offset as _check_offset
from ...model.headers import decode_headers, encode_record_headers
from ...model.records import Record, RecordMetadata
from ..shm import layout as L
from . import partition as partition_mod
from ..shm import header, waits
from . import compaction
from .groups import Groups
from ..shm.mutex import RobustMutex, acquire
from ..shm.mutex import unlock as _unlock
from .partition import Partition, check_timestamps, chunks_by_time, create_partition
from .paths import chosen as _chosen_paths
from .partitioner import partition_of
from ..queues.produce import as_bytes
from ..shm.names import partition_segment, stream_base
from ..shm.segment import open_segment, open_semaphore, unlink_segment
from ..shm.versions import mismatch

__all__ = ["Stream", "Record", "RecordMetadata", "stream_base", "partition_of", "check_txn"]

log = logging.getLogger("shmq.stream")

_mono = time.monotonic_ns
_wall = time.time_ns
WAIT_SLICE_S = 0.05  # longest sleep of a reader waiting at the end before it looks again
_READERS = waits.READERS
_GROWING = threading.Lock()  # a handle's list of partitions growing to a new count (``_part``)


def _payload(key, hraw, value) -> int:
    """A record's bytes of key, headers and value (None: a tombstone's), as max_message_bytes counts them."""
    return len(hraw) + (len(key) if key is not None else 0) + (len(value) if value is not None else 0)


def store_live(mem, values: dict) -> None:
    """Store ``values`` of ``layout.STREAM_LIVE``'s fields in a stream's meta segment
    (``mem``: its mmap or its words), each by one store of its word."""
    mq = mem if isinstance(mem, memoryview) and mem.format == "Q" else memoryview(mem).cast("Q")
    try:
        header.store_fields(mq, L.STREAM_LIVE, values)
    finally:
        if mq is not mem:
            mq.release()


class Stream:
    """A handle on a named stream, attached in this process (``Broker.stream``)."""

    lock_timeout = None  # how long a call waits for a lock a live process keeps (None: mutex.LOCK_TIMEOUT_S)
    def __init__(self, namespace: str, name: str):
        self.namespace = namespace
        self.name = name
        self._base = stream_base(namespace, name)
        try:
            seg = open_segment(self._base)
        except (FileNotFoundError, ValueError):
            raise StreamNotFound(f"no stream {name!r} in namespace {namespace!r}") from None
        mm = seg._mmap
        if seg.size < L.STREAM_SIZE:
            seg.close()
            raise StreamNotFound(f"no stream {name!r} in namespace {namespace!r} (being created)")
        (magic, version, parts, retention, durability, _ts_type, _compression, max_bytes, _maxmsg, _ret_bytes,
         _ret_ns, idle_ns, created) = L.STREAM_STATIC.unpack_from(mm, 0)
        if magic == L.STREAM_MAGIC and version != L.STREAM_VERSION:  # another shmq's memory
            seg.close()
            raise mismatch("stream", name, namespace, version)
        if magic != L.STREAM_MAGIC:
            seg.close()
            raise StreamNotFound(f"no stream {name!r} in namespace {namespace!r} (being created)")
        try:
            self._ne = open_semaphore(self._base + ".ne")
        except posix_ipc.ExistentialError:  # deleted as this handle attached
            seg.close()
            raise StreamNotFound(f"no stream {name!r} in namespace {namespace!r} (deleted)") from None
        self._seg, self._mm, self._mq = seg, mm, memoryview(mm).cast("Q")
        self.paths = _chosen_paths()  # the bulk paths it and its partitions run (``paths.PartitionPaths``)
        self._final = None  # the live settings as they were at close (``_live``)
        self.retention = L.RETENTION_NAMES[retention]
        self.durability = L.DURABILITY_NAMES.get(durability, "memory")
        self.max_bytes = max_bytes
        self.group_idle_timeout = idle_ns / 1e9
        self._idle_ns = idle_ns
        self.created_at = created / 1e9
        self._mutex = RobustMutex(ctypes.addressof(ctypes.c_char.from_buffer(mm, L.STREAM_MUTEX_OFF)))
        self._lockp = self._mutex.ptr
        self._parts = [None] * parts
        self._turn = itertools.count(random.randrange(parts))  # where key-less appends start
        self.groups_table = Groups(self)

    def __repr__(self):
        return f"<shmq.Stream {self.namespace}/{self.name} partitions={self.partitions}>"

    def __reduce__(self):
        return (Stream, (self.namespace, self.name))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_lockp", None) is not None:
            self.close()

    def close(self) -> None:
        """Detach in this process; the stream stays."""
        if self._lockp is None:
            return
        self._final = {f: self._live(f) for f in L.STREAM_LIVE}
        self._lockp = None
        for p in self._parts:
            if p is not None:
                p.close()
        self._mq.release()
        self._ne.close()
        self._seg.close()

    def _restore_created(self, created_ns: int) -> None:
        """A stream rebuilt from its files keeps the creation time they carry (which tells
        its files from those of a deleted stream of the same name)."""
        header.set_created(self._mm, created_ns)
        self.created_at = created_ns / 1e9

    @property
    def deleted(self) -> bool:
        return self._lockp is None or bool(self._mq[L.SI_DELETED])

    # ------------------------------------------------------------------ settings that change on a live stream
    def _live(self, field: str) -> int:
        """A field of ``layout.STREAM_LIVE``, read now from the meta segment (one load): every
        handle sees a change (``Broker.update_stream``, ``add_partitions``) at its next call."""
        if self._final is not None:
            return self._final[field]
        w, shift, mask = L.STREAM_LIVE[field]
        return self._mq[w] >> shift & mask

    @property
    def partitions(self) -> int:
        return self._live("partitions")

    @property
    def max_message_bytes(self) -> int:
        return self._live("max_message_bytes")

    @property
    def retention_bytes(self) -> int | None:
        return self._live("retention_bytes") or None

    @property
    def retention_seconds(self) -> float | None:
        return self._live("retention_ns") / 1e9 or None

    @property
    def timestamp_type(self) -> str:
        """"create_time" (a record's own timestamp: a Kafka producer's) or "log_append_time"."""
        return L.TIMESTAMP_TYPE_NAMES.get(self._live("timestamp_type"), "create_time")

    @property
    def compression(self) -> str:
        """The codec of the batches the Kafka listener serves: "producer" (as they came), or one."""
        return L.COMPRESSION_NAMES.get(self._live("compression"), "producer")

    @property
    def segment_bytes(self) -> int | None:
        return self._live("segment_bytes") or None

    @property
    def compact(self) -> bool:
        """Whether housekeeping compacts it (``compaction``: the latest record of each key stays)."""
        return bool(self._live("compact"))

    @property
    def delete_retention_seconds(self) -> float:
        """How long a tombstone stays in a compacted stream."""
        held = self._live("delete_retention_ns")
        return (held - 1) / 1e9 if held else STREAM.delete_retention_seconds

    @property
    def min_cleanable_dirty_ratio(self) -> float:
        held = self._live("dirty_ratio_ppm")
        return (held - 1) / 1e6 if held else STREAM.min_cleanable_dirty_ratio

    @property
    def max_compaction_lag_seconds(self) -> float | None:
        return self._live("max_compaction_lag_ns") / 1e9 or None

    def _write_settings(self, values: dict) -> None:
        """Store checked values of STREAM_LIVE's fields (as the header holds them), each by
        one store of its word, under the stream's lock (``Broker.update_stream``)."""
        self._acquire()
        try:
            self._store(values)
        finally:
            _unlock(self._lockp)

    def _store(self, values: dict) -> None:
        store_live(self._mq, values)

    def add_partitions(self, n: int) -> int:
        """Add ``n`` partitions (Kafka's CreatePartitions, which names the new total);
        returns the new count. Records appended stay where they are; keyed appends go on
        by the hash over the new count, as Kafka's do (a key's records before and after
        may be in two partitions). Every handle, in every process, sees the new count at
        its next call; each group's members get the new partitions at their next poll.
        ValueError past MAX_PARTITIONS; StorageError (nothing added) when /dev/shm has no
        room for them. The new partitions are made first, then the count is published by
        one store under the stream's lock: a crash in between leaves segments no count
        names, which the next growth or the stream's delete removes."""
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"n must be an int, not {type(n).__name__}")
        if n < 1:
            raise ValueError(f"n must be positive (partitions to add), not {n}")
        self._acquire()
        try:
            old = self.partitions
            if old + n > L.MAX_PARTITIONS:
                raise ValueError(f"stream {self.name!r} has {old} partitions: {n} more would pass the most, "
                                 f"{L.MAX_PARTITIONS}")
            now, group, names = _wall(), self._shared_with(), [partition_segment(self._base, p)
                                                                  for p in range(old, old + n)]
            try:
                for p, name in zip(range(old, old + n), names):
                    unlink_segment(name)  # a crash's leftover: never counted
                    create_partition(self._base, p, self.max_bytes, self.max_message_bytes, now, group)
            except BaseException:  # (none counted: none stays)
                for name in names:
                    unlink_segment(name)
                raise
            self.groups_table.grown(old, old + n)
            self._store({"partitions": old + n})  # the commit
        finally:
            _unlock(self._lockp)
        return old + n

    def _shared_with(self) -> int | None:
        """The gid the meta segment is shared with (0660), which its new segments take too; None: 0600."""
        st = os.fstat(self._seg._fd)
        return st.st_gid if st.st_mode & 0o060 else None

    # ------------------------------------------------------------------ locking (meta)
    def _acquire(self):
        lp = self._lockp
        if lp is None:
            raise ShmqError(f"stream handle {self.name!r} is closed")
        # the group table is written entry by entry: a dead holder leaves nothing to rebuild
        acquire(self._mutex, None, self.lock_timeout, f"stream {self.name!r}")
        if self._mq[L.SI_DELETED]:
            _unlock(lp)
            raise StreamNotFound(f"stream {self.name!r} in namespace {self.namespace!r} was deleted")

    def _part(self, p) -> Partition:
        if isinstance(p, bool) or not isinstance(p, int):
            raise TypeError(f"partition must be an int, not {type(p).__name__}")
        parts = self._parts
        if not 0 <= p < len(parts):
            n = self.partitions  # grown since (``add_partitions``)?
            if not 0 <= p < n:
                raise ValueError(f"stream {self.name!r} has partitions 0..{n - 1}, not {p}")
            with _GROWING:  # (threads sharing the handle: the list grows to the count, never past it)
                parts.extend([None] * (n - len(parts)))
        part = parts[p]
        if part is None:
            if self._lockp is None:
                raise ShmqError(f"stream handle {self.name!r} is closed")
            part = self._parts[p] = Partition(self._base, p, self.name, self.durability, self.paths)
            part.lock_timeout = self.lock_timeout
            part.make_room = lambda part=part: self._make_room(part)
            part.compact_word = (self._mq, *L.STREAM_LIVE["compact"])
        return part

    def _make_room(self, part) -> None:
        """An append would fill ``part`` past half its ring, or drop records for room: a
        compacted stream's partition is compacted first, by the appender (appends wait for
        it rather than lose a key's latest record), when a quarter of the ring is dirty
        (a run needs room past the tail: half the ring is there for it)."""
        if self._live("compact") and 4 * compaction.dirty(part)[0] >= part._cap:
            compaction.compact(part, int(self.delete_retention_seconds * 1e9))

    # ------------------------------------------------------------------ append
    def _item(self, value, key, headers, maxmsg):
        if value is not None:  # (None: a tombstone)
            value = as_bytes(value, "value")
        if key is not None:
            key = as_bytes(key, "key")
        hraw = b"" if headers is None else encode_record_headers(headers)
        # (``_payload``, inline: this runs per record)
        n = len(hraw) + (len(key) if key is not None else 0) + (len(value) if value is not None else 0)
        if n > maxmsg:
            raise MessageTooLarge(f"record of {n} bytes (key, headers and value); stream {self.name!r} takes "
                                  f"at most {maxmsg}")
        return key, hraw, value

    def append(self, value, key=None, headers=None, partition=None) -> RecordMetadata:
        """Append one record (``value`` None: a tombstone, a null value; ``headers`` a dict,
        or a list of (key, value) pairs: docs/STREAMS.md); returns where it went. Blocks
        only with retention="block" while the slowest group has not committed enough."""
        return self.append_many([value], keys=None if key is None else [key],
                                headers=None if headers is None else [headers], partition=partition)[0]

    def append_many(self, values, keys=None, headers=None, partition=None, compression=None) -> list[RecordMetadata]:
        """Append a batch, all or nothing per partition (without keys or with
        ``partition``, one partition: all or nothing). ``keys`` and ``headers`` are
        lists as long as ``values`` (or None). ``compression`` applies to the wire only
        (a remote stream); locally there is no wire, and it is checked and ignored."""
        if compression not in (None, "zstd"):
            raise ValueError(f"compression must be None or 'zstd', not {compression!r}")
        values = list(values)
        n = len(values)
        keys = [None] * n if keys is None else list(keys)
        hdrs = [None] * n if headers is None else list(headers)
        if len(keys) != n or len(hdrs) != n:
            raise ValueError(f"keys and headers must be as many as values ({n})")
        maxmsg = self.max_message_bytes
        items = [self._item(v, k, h, maxmsg) for v, k, h in zip(values, keys, hdrs)]
        if not items:
            return []
        if partition is not None:  # (``route``'s first case, without its list of keys: the plain append's)
            self._part(partition)
            route = [partition] * n
        else:
            route = self.route([k for k, _h, _v in items])
        now = _wall()
        out = [None] * n
        for p in sorted(set(route)):
            idx = [i for i in range(n) if route[i] == p]
            floor = None
            if self.retention == "block":
                floor = lambda p=p: self.groups_table.floor(p, self._idle_ns)  # noqa: E731
            first = self._part(p).append([items[i] for i in idx], now, floor)
            for j, i in enumerate(idx):
                out[i] = RecordMetadata(p, first + j, now / 1e9)
        self._wake_readers()
        return out

    def route(self, keys, partition=None) -> list:
        """The partition of each record of a batch whose keys are ``keys``, as
        ``append_many`` places them: all in ``partition`` if given; a batch without keys in
        one partition, the next in turn; else each key's (``partition_of``: Kafka's
        murmur2), a record without one in the batch's sticky partition."""
        if partition is not None:
            self._part(partition)
            return [partition] * len(keys)
        if all(k is None for k in keys):
            return [next(self._turn) % self.partitions] * len(keys)
        count = self.partitions  # one count for the whole call
        sticky = next(self._turn) % count
        return [sticky if k is None else partition_of(k, count, self.paths.murmur2) for k in keys]

    def publish(self, staging, ranges: dict, txn_id: bytes, batch: int) -> dict:
        """Append records staged in the stream ``staging`` (a handle or a name) to this one, exactly once per
        (publisher ``txn_id``, ``batch``) and partition: ``ranges`` maps a partition of
        this stream to [(staging partition, first offset, end offset), ...], appended in
        that order, all or nothing per partition, noting the batch in the same step
        (``Partition.append(txn=...)``). A partition that has this batch already is
        skipped without reading its staged records, so a publish cut short by a crash is
        finished by calling it again. Returns {partition: first offset, or None when it
        was in already}. OffsetOutOfRange when staged records are no longer there."""
        txn_id = check_txn(txn_id, batch)
        if isinstance(staging, str):
            with Stream(self.namespace, staging) as attached:
                return self.publish(attached, ranges, txn_id, batch)
        if staging.name == self.name and staging.namespace == self.namespace:
            raise ValueError(f"stream {self.name!r} cannot publish records staged in itself")
        out = {}
        for p in sorted(ranges):
            part = self._part(p)
            if part.published(txn_id) >= batch:
                out[p] = None
                continue
            floor = None
            if self.retention == "block":
                floor = lambda p=p: self.groups_table.floor(p, self._idle_ns)  # noqa: E731
            chunks = staging._chunks(ranges[p]) if part.paths.write_columns is not None else None
            if chunks is not None:  # in C: the staged records' buffers, appended as they are
                biggest = part.paths.columns_check(chunks)[2] if chunks else 0
                self._check_staged(biggest)
                out[p] = part.append_columns(chunks, _wall(), floor, txn=(txn_id, batch))
                continue
            items = []
            for sp, first, end in ranges[p]:
                items += staging.raw_records(sp, first, end)
            if staging.max_message_bytes > self.max_message_bytes:  # else each fit when it was staged
                self._check_staged(max((_payload(k, h, v) for k, h, v in items), default=0))
            out[p] = part.append(items, _wall(), floor, txn=(txn_id, batch)) if items else None
        self._wake_readers()
        return out

    def publish_columns(self, chunks: dict, txn_id: bytes, batch: int) -> dict:
        """``publish`` of records given as chunks of Arrow buffers (``append_columns``' chunks)
        instead of ranges of a staging stream: ``chunks`` maps a partition to its chunks,
        appended in that order, all or nothing per partition, exactly once per (publisher
        ``txn_id``, ``batch``): a partition that has this batch already is skipped (a publish
        cut short is finished by calling it again). Returns {partition: first offset, or
        None}. Local handles only (the JVM sink's publisher, ``shmq.spark.publisher``)."""
        txn_id = check_txn(txn_id, batch)
        out = {}
        for p in sorted(chunks):
            part = self._part(p)
            if part.published(txn_id) >= batch:
                out[p] = None
                continue
            cs = [tuple(c) for c in chunks[p]]
            if part.paths.columns_check is not None:
                self._check_staged(part.paths.columns_check(cs)[2] if cs else 0)
            else:
                self._check_staged(max((_payload(k, h, v) for k, h, v in partition_mod.columns_items(cs)), default=0))
            floor = None
            if self.retention == "block":
                floor = lambda p=p: self.groups_table.floor(p, self._idle_ns)  # noqa: E731
            out[p] = part.append_columns(cs, _wall(), floor, txn=(txn_id, batch))
        self._wake_readers()
        return out

    def prepare(self, chunks: dict) -> None:
        """Make ready, in each partition ``chunks`` names (``publish_columns``' argument),
        the room such records would take past its tail (``Partition.prepare``), for a
        writer about to append as much again: the JVM sink's publisher, with the batch it
        has just published, while Spark runs the next. Local handles, C paths."""
        for p, cs in chunks.items():
            part = self._part(p)
            if cs and part.paths.columns_check is not None:
                part.prepare(part.paths.columns_check([tuple(c) for c in cs])[1])

    def _check_staged(self, biggest: int) -> None:
        if biggest > self.max_message_bytes:
            raise MessageTooLarge(f"a staged record of {biggest} bytes; stream {self.name!r} takes at most "
                                  f"{self.max_message_bytes}")

    def _chunks(self, spans) -> list | None:
        """The records of ``spans`` [(partition, first, end), ...] as chunks of Arrow
        buffers (``read_columns``), or None where that path is not there (no C build,
        records on disk only): then ``raw_records``. OffsetOutOfRange if any of them is
        not retained."""
        if self.paths.read_columns is None:
            return None
        out = []
        for p, first, end in spans:
            offset = first
            while offset < end:
                cols = self._part(p).read_columns(offset, end - offset)
                if cols is None:
                    return None
                if not cols[0]:
                    raise OffsetOutOfRange(f"stream {self.name!r} partition {p}: offsets {offset}..{end - 1} are "
                                           "not retained", *self._part(p).offsets())
                out.append(cols)
                offset = cols[11]
        return out

    def append_columns(self, columns, partition: int, timestamps_ns=None) -> int | None:
        """Append records given as Arrow buffers to ``partition``, all or nothing: one
        chunk, (n, value offsets, values, key offsets, keys, key validity, header offsets,
        encoded headers[, value validity]) as ``read_columns`` gives them (None for no
        keys, all keys valid, no headers, no null value); int32 offsets into their data;
        a value not valid is a tombstone (a null value). Written and logged in C
        (``Partition.append_columns``). ``timestamps_ns``: each record's own timestamp
        (UTC epoch ns, as a Kafka producer's CreateTime) instead of the time of the
        append. Returns the first record's offset, None if there were none. Local handles
        only (the Spark sink's tasks stage with it; the Kafka listener appends with it)."""
        part = self._part(partition)
        chunks = [tuple(columns)]
        times = None
        if timestamps_ns is not None:
            chunks, times = chunks_by_time(chunks[0], check_timestamps(timestamps_ns, chunks[0][0]))
        if part.paths.columns_check is not None:
            n, _total, biggest = part.paths.columns_check(chunks)
        else:
            items = partition_mod.columns_items(chunks)
            n = len(items)
            biggest = max((_payload(k, h, v) for k, h, v in items), default=0)
        if biggest > self.max_message_bytes:
            raise MessageTooLarge(f"record of {biggest} bytes (key, headers and value); stream {self.name!r} takes "
                                  f"at most {self.max_message_bytes}")
        if not n:
            return None
        floor = None
        if self.retention == "block":
            floor = lambda: self.groups_table.floor(partition, self._idle_ns)  # noqa: E731
        first = part.append_columns(chunks, _wall(), floor, times=times)
        self._wake_readers()
        return first

    def published(self, txn_id: bytes) -> dict:
        """{partition: the newest batch publisher ``txn_id`` published there, -1 if none}."""
        txn_id = check_txn(txn_id)
        return {p: self._part(p).published(txn_id) for p in range(self.partitions)}

    def read_raw(self, p: int, offset: int, max_records: int = 1000, max_bytes: int | None = None,
                 visible: bool = False) -> list:
        """``read`` without waiting, the records as they are stored: (offset, timestamp in
        ns, key or None, encoded headers, value or None) — for bulk readers that convert them
        themselves (the Spark source builds Arrow columns from them). With ``max_bytes``,
        stops before the values pass it (the first record always comes). Every record, or
        with ``visible`` those a reader sees (``Partition.read``: ``Rows``, with ``next``).
        Local handles only."""
        return self._part(p).read(offset, max_records, max_bytes, visible)

    def stable(self, p: int) -> int:
        """Partition ``p``'s last stable offset: readers read below it (the end, unless a
        transaction is open there: docs/STREAMS.md, Transactions)."""
        return self._part(p).stable()

    def append_marker(self, p: int, key: bytes, value: bytes) -> int:
        """A transaction's marker (the coordinator's: ``server/transactions``) at
        the end of partition ``p``: a record readers pass over; returns its offset. Local
        handles only."""
        self._check_p(p)
        floor = None
        if self.retention == "block":
            floor = lambda: self.groups_table.floor(p, self._idle_ns)  # noqa: E731
        first = self._part(p).append([(key, b"", value)], _wall(), floor, flags=L.FLAG_CONTROL)
        self._wake_readers()
        return first

    def hide(self, p: int, spans, flag: int) -> int:
        """Partition ``p``'s records of ``[first, end)`` spans marked ``flag``
        (``Partition.hide``: the coordinator's). Local handles only."""
        self._check_p(p)
        n = self._part(p).hide(spans, flag)
        self._wake_readers()
        return n

    def set_stable(self, p: int, offset: int | None) -> None:
        """The coordinator's: partition ``p``'s readers read below ``offset`` (None: no
        transaction is open there). Local handles only."""
        self._check_p(p)
        self._part(p).set_stable(offset)
        self._wake_readers()

    def read_columns(self, p: int, offset: int, max_records: int = 1000):
        """``read`` without waiting, as Arrow buffers built in C (``Partition.read_columns``:
        the last field says where to read on), or None where that path is not there (no C
        build; records only on disk): then ``read_raw(visible=True)``. Local handles only."""
        return self._part(p).read_columns(offset, max_records)

    def raw_records(self, p: int, first: int, end: int) -> list:
        """Records [first, end) of partition ``p`` as (key, encoded headers, value), the
        form an append takes; OffsetOutOfRange if any of them is not retained."""
        part, out, offset = self._part(p), [], first
        while offset < end:
            rows = part.read(offset, min(end - offset, 10_000))
            if not rows or rows[0][0] != offset:
                raise OffsetOutOfRange(f"stream {self.name!r} partition {p}: offsets {offset}..{end - 1} are "
                                       "not retained", *part.offsets())
            rows = rows[:end - offset]
            out += [(k, h, v) for _o, _t, k, h, v in rows]
            offset = rows[-1][0] + 1
        return out

    def housekeep(self) -> tuple[int, int]:
        """Each partition's retention in memory and its memory given back
        (``Partition.housekeep``: records older than ``retention_seconds`` or past
        ``retention_bytes`` dropped; with retention="block", only those every group has
        committed). Returns (records dropped, bytes given back). What ``shmq server`` runs
        every housekeeping round; appends give memory back every so often too."""
        ret_ns = int(self.retention_seconds * 1e9) if self.retention_seconds else None
        dropped = given = 0
        for p in range(self.partitions):
            floor = None
            if self.retention == "block":
                floor = lambda p=p: self.groups_table.floor(p, self._idle_ns)  # noqa: E731
            d, g = self._part(p).housekeep(ret_ns, self.retention_bytes, floor)
            dropped += d
            given += g
        return dropped, given

    def compact_now(self, partitions=None, force: bool = True) -> tuple[int, int]:
        """Compact ``partitions`` (all by default) now (``compaction.compact``), or with
        ``force=False`` those whose dirty ratio or max lag asks for it (what housekeeping
        runs for a compacted stream). Returns (records taken back, ring bytes taken back).
        Runs whether or not the stream is ``compact``."""
        now = time.monotonic_ns()
        delete_ns = int(self.delete_retention_seconds * 1e9)
        ratio, lag = self.min_cleanable_dirty_ratio, int((self.max_compaction_lag_seconds or 0) * 1e9)
        records = taken = 0
        for p in range(self.partitions) if partitions is None else partitions:
            part = self._part(self._check_p(p))
            if force or compaction.due(part, now, ratio, lag):
                done = compaction.compact(part, delete_ns)
                if done is not None:
                    records += done.records
                    taken += done.bytes
        return records, taken

    def dirty_ratio(self, p: int) -> float:
        """Partition ``p``'s bytes appended since its last compaction over all it holds (0: empty)."""
        d, total = compaction.dirty(self._part(self._check_p(p)))
        return d / total if total else 0.0

    def delete_records(self, offsets: dict) -> int:
        """Drop the records below ``{partition: offset}`` now (Kafka's deleteRecords), as
        retention would; returns how many were dropped. A "wal" stream's logs on disk
        stay for retention to delete."""
        return sum(self._part(self._check_p(p)).trim(_check_offset(o)) for p, o in offsets.items())

    def _wake_readers(self):
        if self._mq[L.SI_CWAIT]:  # someone waits: settle the posts owed under the lock
            self._acquire()
            try:
                posts = waits.owed_posts(self._mq, _READERS, 2**31)
            finally:
                _unlock(self._lockp)
            for _ in range(posts):
                self._ne.release()

    def producer(self, linger_ms: float = 5, batch_bytes: int = 64 * 2**10, compression=None):
        """A batching producer of this stream (``shmq.producer.Producer``); close it."""
        return faces.producer(self, linger_ms=linger_ms, batch_bytes=batch_bytes, compression=compression)

    # ------------------------------------------------------------------ read
    def offsets(self, p: int) -> tuple[int, int]:
        """(earliest readable offset, the offset the next append gets) of partition ``p``:
        a "wal" stream's earliest is in the oldest log still on disk, when that is older
        than what shared memory holds."""
        return self._part(p).offsets()

    def read(self, p: int, offset: int, max_records: int = 1000, timeout: float = 0.0) -> list[Record]:
        """Records of partition ``p`` from ``offset`` on, the same every time while they
        are retained (in memory, or for "wal" in a log on disk): those of committed
        transactions only, below the last stable offset, no marker (docs/STREAMS.md,
        Transactions). At the end, waits up to ``timeout`` seconds and returns [] if
        nothing came; OffsetOutOfRange below the retained range, past the end, or in a gap
        of lost offsets (its ``earliest`` says where to read on)."""
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise TypeError(f"offset must be an int, not {type(offset).__name__}")
        if offset < 0:
            raise ValueError(f"offset must be >= 0, not {offset}")
        if isinstance(max_records, bool) or not isinstance(max_records, int) or max_records < 1:
            raise ValueError(f"max_records must be a positive int, not {max_records!r}")
        part = self._part(p)
        deadline = _mono() + waits.seconds_ns(timeout, "timeout")
        while True:
            rows = part.read(offset, max_records, None, True)  # (visible)
            if rows or _mono() >= deadline:
                return [self._record(p, row) for row in rows]
            if rows.next > offset:  # past markers and aborted records: on from there
                offset = rows.next
                continue
            self._wait(deadline, lambda: part.stable() > offset)

    def _record(self, p, row) -> Record:
        off, ts, key, hraw, value = row
        return Record(self.name, p, off, key, value, decode_headers(hraw) if hraw else {}, ts / 1e9)

    def _wait(self, deadline, ready, bell=False) -> bool:
        """Sleep until an append (or a rebalance) may have come, or ``deadline``, as a
        registered reader; not at all if ``ready()`` holds once it is registered. True if
        it did, or a post woke the sleep. ``bell``: a server's doorbell (``doze.bell``),
        counted in ``bells`` too, whom that server's own appends owe no post."""
        self._acquire()
        waits.register_reader(self._mq, bell)
        _unlock(self._lockp)
        try:
            return ready() or waits.sleep_slice(self._ne, deadline, _mono(), slice_s=WAIT_SLICE_S) == 2
        finally:
            self._acquire()
            waits.unregister_reader(self._mq, bell)
            _unlock(self._lockp)

    # ------------------------------------------------------------------ groups
    def consumer(self, group: str, auto_offset_reset: str = "earliest", **options):
        """Join ``group`` as a new member; the context manager leaves on exit. ``options``:
        on_assign, on_revoke, auto_commit, auto_commit_interval, max_poll_interval
        (``consumer.Consumer``)."""
        from .consumer import Consumer  # (it names Stream: imported on use)

        return Consumer(self, group, auto_offset_reset, **options)

    def groups(self) -> list[str]:
        return self.groups_table.names()

    def committed(self, group: str) -> dict:
        """{partition: committed offset} of ``group`` (the next offset it reads)."""
        return self.groups_table.committed(_group_name(group))

    def lag(self, group: str) -> dict:
        """{partition: records between the group's committed offset (or the earliest
        retained one) and the end}."""
        committed = self.committed(group)
        out = {}
        for p in range(self.partitions):
            earliest, end = self.offsets(p)
            out[p] = end - max(committed.get(p, earliest), earliest)
        return out

    def reset(self, group: str, to="earliest") -> None:
        """Move ``group``'s committed offsets (only while it has no live member): to
        "earliest", "latest" or {partition: offset}."""
        group = _group_name(group)
        if isinstance(to, dict):
            offsets = {self._check_p(p): _check_offset(o) for p, o in to.items()}
        elif to in ("earliest", "latest"):
            offsets = {p: self.offsets(p)[0 if to == "earliest" else 1] for p in range(self.partitions)}
        else:
            raise ValueError(f"reset to 'earliest', 'latest' or {{partition: offset}}, not {to!r}")
        self.groups_table.set_offsets(group, offsets)

    def _check_p(self, p):
        self._part(p)
        return p

    def stats(self) -> dict:
        """Per partition: earliest, end, bytes (a compacted stream's: its dirty ratio); per
        group: members and lag."""
        parts = [self._part(p).stats() for p in range(self.partitions)]
        compact = self.compact
        if compact:
            for st in parts:
                st["dirty_ratio"] = self.dirty_ratio(st["partition"])
        groups = {g: {"members": self.groups_table.members(g), "lag": self.lag(g), "committed": self.committed(g)}
                  for g in self.groups()}
        return {"stream": self.name, "partitions": parts, "groups": groups, "retention": self.retention,
                "durability": self.durability, "compact": compact}
