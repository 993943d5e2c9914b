"""A backup: every durable queue and stream of a namespace, its exchanges and (from a
server) the Kafka listener's commit metadata, copied into a new directory that is a data
dir (``shmq server --data-dir DEST`` starts from it; docs/OPERATIONS.md, Backup and
restore).

Strategy: the copy is taken from shared memory, not from the server's files, so it holds
what the queues and streams hold now, whatever the snapshot interval, and it works with
or without a server running. Each queue is copied whole under its lock in one critical
section, as a snapshot round copies it; each stream partition too, with the size its
current log had in that same critical section, so the log is copied up to there and
agrees with the records (its older generations, which nothing appends to any more, are
copied whole: they are the stream's long tail). A stream's groups' committed offsets are
read before its partitions are copied, so none is past the records kept. Nothing of the
source changes: no log is rotated, no high-water epoch begun, no file of its data dir
written. Every file is written and fsynced in ``DEST.partial``, which is renamed to
``DEST`` last, so a backup that did not finish is never taken for one. What the copy does
not promise: one instant for all of them (each queue and partition has its own, as in a
snapshot round); the Kafka idempotent producers' sequence numbers, which cannot be taken
in step with the records without stopping produce (a restored server has none: the
producers start new epochs, as after a crash).
"""

import os
import shutil
import time

from ..formats import dmsq
from ..engine import maintenance
from ..engine.broker import Broker, stream_settings
from ..errors import LayoutMismatch, QueueNotFound, ShmqError, StreamNotFound
from .files import snapshot_path
from .kafka_state import write_state
from .kafka_txns import Journal, journal_path
from .streams import committed_offsets, partition_extra
from ..formats.logfiles import log_files, partition_log_name

__all__ = ["backup", "PARTIAL_SUFFIX"]

PARTIAL_SUFFIX = ".partial"  # where a backup is written until it is whole
_CHUNK = 1 << 20


def backup(broker: Broker, dest: str, kafka_state: dict | None = None, kafka_txns=None) -> dict:
    """Copy every queue and stream of ``broker``'s namespace whose durability is not
    "memory", and its exchanges, into the new directory ``dest`` (its parent must exist;
    ``dest`` must not), and ``kafka_state`` (the listener's, ``kafka_state.py``'s form)
    if given, and the events of its transaction journal that ``kafka_txns()`` gives once
    the streams are copied (``kafka_txns.py``: every transaction the copied records
    belong to is in them; a server started on the copy completes or aborts them).
    Returns what it wrote: {"dest", "queues", "messages", "streams",
    "partitions", "records", "log_files", "exchanges", "kafka_state", "kafka_txns", "bytes",
    "skipped"} (``skipped``: queues and streams an older shmq's layout holds, which this
    one cannot read). ShmqError naming the path when ``dest`` or ``dest.partial`` exists
    or cannot be made; nothing is left behind on an error."""
    dest = os.path.abspath(dest)
    staging = dest + PARTIAL_SUFFIX
    if os.path.lexists(dest):
        raise ShmqError(f"{dest} exists: a backup goes into a new directory (name one that is not there)")
    if os.path.lexists(staging):
        raise ShmqError(f"{staging} exists: a backup that did not finish? remove it, then back up again")
    try:
        os.mkdir(staging, 0o700)
    except OSError as e:
        raise ShmqError(f"cannot make {staging}: {e.strerror or e}") from None
    try:
        done = {"dest": dest, "queues": 0, "messages": 0, "streams": 0, "partitions": 0, "records": 0,
                "log_files": 0, "exchanges": 0, "kafka_state": kafka_state is not None, "kafka_txns": 0,
                "skipped": []}
        _queues(broker, staging, done)
        _streams(broker, staging, done)
        table = broker.exchange_table().table()
        if table:
            dmsq.write_exchanges(os.path.join(staging, dmsq.EXCHANGES_FILE), table)
            done["exchanges"] = len(table)
        if kafka_state is not None:
            write_state(staging, kafka_state)
        rows = kafka_txns() if kafka_txns is not None else None
        if rows:
            Journal(journal_path(staging), rows).close()
            done["kafka_txns"] = len(rows)
        done["bytes"] = sum(os.path.getsize(os.path.join(staging, f)) for f in os.listdir(staging))
        _fsync_dir(staging)
        os.rename(staging, dest)  # (rename(2) refuses a non-empty dest made meanwhile; an empty one is replaced)
        _fsync_dir(os.path.dirname(dest))
    except BaseException as e:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(e, OSError):  # a full disk, a directory made read-only...: one line naming where
            raise ShmqError(f"cannot write the backup in {staging}: {e.strerror or e}") from None
        raise
    return done


def _queues(broker, staging, done):
    for name in broker.list_queues():
        try:
            q = broker.queue(name)
        except LayoutMismatch:
            done["skipped"].append(name)
            continue
        except QueueNotFound:
            continue  # deleted meanwhile
        try:
            if q.durability == "memory":
                continue
            messages = maintenance.export_messages(q)  # one critical section, nothing rotated
            header = dmsq.SnapshotHeader(queue=name, settings=q.settings(), created_ns=int(q.created_at * 1e9),
                                         snapshot_ns=time.time_ns(), version=dmsq.FORMAT_VERSION)
            dmsq.write_snapshot(snapshot_path(staging, name),
                                header, (dmsq.SnapshotRecord(*m) for m in messages))
        except QueueNotFound:
            continue
        finally:
            q.close()
        done["queues"] += 1
        done["messages"] += len(messages)


def _streams(broker, staging, done):
    for name in broker.list_streams():
        try:
            s = broker.stream(name)
        except LayoutMismatch:
            done["skipped"].append("@" + name)
            continue
        except StreamNotFound:
            continue
        try:
            if s.durability == "memory":
                continue
            groups = committed_offsets(s)  # before the copies: no commit is past them
            settings = stream_settings(s)
            for p in range(s.partitions):
                image = s._part(p).export(backup=True)
                fname = partition_log_name(name, p)
                if image.wal_from is not None:  # its logs up to the copy, opened at once (retention may delete them)
                    done["log_files"] += _copy_logs(s._part(p).log.config()[3], fname, image, staging)
                header = dmsq.SnapshotHeader(queue=fname, settings={**settings, **partition_extra(s, p, image, groups)},
                                             created_ns=int(s.created_at * 1e9), snapshot_ns=time.time_ns())
                dmsq.write_snapshot(snapshot_path(staging, fname),
                                    header, (dmsq.stream_record(*row) for row in image.rows))
                done["records"] += len(image.rows)
            done["partitions"] += s.partitions
        except StreamNotFound:
            continue
        finally:
            s.close()
        done["streams"] += 1


def _copy_logs(directory: str, name: str, image, staging: str) -> int:
    """Copy the logs of partition file ``name`` from ``directory`` into ``staging``: the
    generations before ``image.wal_from`` whole (nothing appends to them), that one up to
    ``image.log_size`` (what it held when the records were copied). Each is opened first,
    so retention deleting it meanwhile takes nothing from the copy. Returns how many."""
    opened = []
    try:
        for gen, path in log_files(directory, name):
            if gen > image.wal_from:
                continue
            try:
                opened.append((gen, os.path.basename(path), os.open(path, os.O_RDONLY | os.O_CLOEXEC)))
            except FileNotFoundError:
                if gen == image.wal_from:  # rotated, then deleted by retention, since the records' copy
                    raise ShmqError(f"{path}: deleted while the backup copied it; back up again") from None
                continue  # one of the oldest, deleted by retention meanwhile: as if before the backup
        for gen, entry, fd in opened:
            _copy(fd, entry, staging, image.log_size if gen == image.wal_from else None)
    finally:
        for _gen, _entry, fd in opened:
            os.close(fd)
    return len(opened)


def _copy(src: int, entry: str, staging: str, size: int | None) -> None:
    """Copy descriptor ``src`` (its first ``size`` bytes; None: all) into ``staging/entry``,
    0600, fsynced."""
    fd = os.open(os.path.join(staging, entry), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        offset = 0
        while size is None or offset < size:
            chunk = os.pread(src, _CHUNK if size is None else min(_CHUNK, size - offset), offset)
            if not chunk:
                if size is not None:
                    raise ShmqError(f"{entry}: the log holds {offset} byte(s), not the {size} it held at the copy")
                break
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
            offset += len(chunk)
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
