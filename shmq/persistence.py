"""Snapshots of queues to .dmsq files, and queues rebuilt from them.

Strategy: shared memory survives any process crash, the broker's included, but not a
reboot. A snapshot copies a queue's unsettled messages (the lock is held only for one
copy of the ring) and writes them with ``shmq.dmsq`` (temp file, fsync, rename,
directory fsync), so a crash mid-snapshot leaves the previous file whole. On start, a
queue whose segment is still there is kept as it is (memory is newer than any file);
a queue whose segment is gone is rebuilt from its file. A damaged file (snapshot or
log) is replayed up to the damage, set aside as ``.corrupt`` and reported in one line;
start-up goes on. A full disk or a vanished data directory is reported, never fatal:
snapshots are retried every interval, and while the directory is gone every logged put
fails (``Log.suspend``) rather than return without a log behind it.
"""

import logging
import os
import time

from . import dmsq
from .engine.broker import Broker
from .engine.queue import Queue
from .engine.wal import parse_wal_name
from .errors import QueueNotFound, ShmqError

__all__ = ["snapshot_path", "snapshot_queue", "restore_file", "recover", "Snapshotter"]

log = logging.getLogger("shmq.persistence")


def snapshot_path(data_dir: str, name: str) -> str:
    return os.path.join(data_dir, name + dmsq.SUFFIX)


def wal_files(data_dir: str, name: str) -> list[tuple[int, str]]:
    """(generation, path) of every write-ahead log of queue ``name``, oldest first."""
    out = []
    for entry in os.listdir(data_dir):
        parsed = parse_wal_name(entry)
        if parsed is not None and parsed[0] == name:
            out.append((parsed[1], os.path.join(data_dir, entry)))
    return sorted(out)


def _owner(entry: str) -> str | None:
    """The queue a data-dir entry (snapshot or log) belongs to, or None."""
    if entry.endswith(dmsq.SUFFIX):
        return entry[: -len(dmsq.SUFFIX)]
    parsed = parse_wal_name(entry)
    return parsed[0] if parsed is not None else None


def snapshot_queue(q: Queue, data_dir: str, fsync: bool = True) -> tuple[str, int]:
    """Write ``q``'s unsettled messages to ``<data_dir>/<name>.dmsq``; (path, count).

    For a "wal" queue the log is rotated in the same critical section as the copy, the
    snapshot records the first generation it does not cover, and older logs are
    removed once the snapshot is on disk.
    """
    wal = q.durability == "wal" and q.wal.config()[0] > 0
    messages = q.export_messages(rotate_wal=wal)
    settings = q.settings()
    if wal:
        settings["wal_from"] = q.wal.config()[0]
    header = dmsq.SnapshotHeader(queue=q.name, settings=settings, created_ns=int(q.created_at * 1e9),
                                 snapshot_ns=time.time_ns(), version=dmsq.FORMAT_VERSION)
    path = snapshot_path(data_dir, q.name)
    dmsq.write_snapshot(path, header, (dmsq.SnapshotRecord(i, a, e, h, b) for i, a, e, h, b in messages),
                        fsync=fsync)
    if wal:
        for gen, log_path in wal_files(data_dir, q.name):
            if gen < settings["wal_from"]:
                os.unlink(log_path)
    return path, len(messages)


_CREATE_KEYS = ("max_bytes", "max_message_bytes", "visibility_timeout", "max_deliveries", "dead_letter_queue",
                "durability")


def restore_file(broker: Broker, path: str, into: str | None = None) -> tuple[str, int, str | None]:
    """Load a .dmsq file into queue ``into`` (default: the queue it was taken from),
    creating it with the file's settings if needed. Returns (queue, messages, error):
    ``error`` is the one-line description of damage that stopped the replay (the
    records before it are restored), or None."""
    result = dmsq.read_snapshot(path)
    if result.header is None:
        return into or "", 0, result.error or f"{path}: not a snapshot"
    name = into or result.header.queue
    settings = {k: v for k, v in result.header.settings.items() if k in _CREATE_KEYS}
    if settings.get("dead_letter_queue") and settings["dead_letter_queue"] not in broker.list_queues():
        settings.pop("dead_letter_queue")  # restored without its DLQ rather than not at all
    q = broker.create_queue(name, exist_ok=True, **settings)
    try:
        n = q.import_messages((r.msg_id, r.attempt, r.enqueued_ns, r.headers, r.body) for r in result.records)
    finally:
        q.close()
    return name, n, result.error


def _replay_logs(data_dir, name, wal_from, records):
    """Apply the logs of ``name`` from generation ``wal_from`` on to ``records`` (an id ->
    message dict, in order). Damage stops a log there (what precedes it is kept) and
    the log is moved aside as ``.corrupt``, out of reach of the clean-up of old logs."""
    for gen, path in wal_files(data_dir, name):
        if gen < wal_from:
            continue
        entries, error, _offset = dmsq.read_log(path)
        for e in entries:
            if e.op == dmsq.PUT:
                records[e.msg_id] = (e.msg_id, e.attempt, e.enqueued_ns, e.headers, e.body)
            else:
                records.pop(e.msg_id, None)
        if error:
            aside = dmsq.quarantine(path)
            log.error("%s; replayed %d entries before it; file moved to %s", error, len(entries), aside)


def recover(broker: Broker, data_dir: str) -> list[str]:
    """On start: rebuild every queue whose segment is gone from its snapshot and its
    write-ahead logs; keep the ones still in shared memory. Damaged snapshots are
    restored up to the damage and moved aside (``.corrupt``). Returns the names rebuilt."""
    rebuilt = []
    live = set(broker.list_queues())
    names = {owner for owner in map(_owner, os.listdir(data_dir)) if owner is not None}
    for name in sorted(names - live):  # the live ones: memory is newer than any file
        path = snapshot_path(data_dir, name)
        records, settings, error = {}, None, None
        if os.path.exists(path):
            result = dmsq.read_snapshot(path)
            error = result.error
            if result.header is not None:
                settings = result.header.settings
                for r in result.records:
                    records[r.msg_id] = (r.msg_id, r.attempt, r.enqueued_ns, r.headers, r.body)
            if error:
                aside = dmsq.quarantine(path)
                log.error("%s; kept %d message(s) before it; file moved to %s", error, len(records), aside)
        if settings is None:
            settings = {"durability": "wal"} if wal_files(data_dir, name) else None
        if settings is None:
            continue
        _replay_logs(data_dir, name, settings.get("wal_from", 0), records)
        create = {k: v for k, v in settings.items() if k in _CREATE_KEYS}
        if create.get("dead_letter_queue") and create["dead_letter_queue"] not in broker.list_queues():
            create.pop("dead_letter_queue")
        try:
            q = broker.create_queue(name, exist_ok=True, **create)
            try:
                n = q.import_messages(records.values())
            finally:
                q.close()
        except (ValueError, TypeError, OSError, ShmqError) as e:
            log.error("%s: cannot rebuild queue %s: %s", data_dir, name, e)
            continue
        log.info("queue %s rebuilt from %s: %d message(s)", name, data_dir, n)
        rebuilt.append(name)
    return rebuilt


class Snapshotter:
    """Snapshots every queue whose durability is not "memory" into ``data_dir``, and
    opens the write-ahead log of every "wal" queue there."""

    def __init__(self, broker: Broker, data_dir: str, fsync: bool = True, wal_mode: int = 2, wal_batch_ms: int = 2):
        self.broker = broker
        self.data_dir = data_dir
        self.fsync = fsync
        self.wal_mode = wal_mode
        self.wal_batch_ms = wal_batch_ms
        self._logs = {}  # name -> [attached Queue, generation of fd, fd or None], for sync_logs
        self._failing = {}  # name -> the snapshot error last logged
        self._lost = False  # the data dir vanished
        os.makedirs(data_dir, mode=0o700, exist_ok=True)

    def open_wal(self, q: Queue) -> None:
        """Point a "wal" queue's log at our data dir, in a generation after any on disk."""
        if q.durability != "wal":
            return
        gen, _mode, _ms, directory = q.wal.config()
        if gen and directory == os.path.abspath(self.data_dir):
            q.wal.configure(self.data_dir, self.wal_mode, self.wal_batch_ms)  # keep its generation
            return
        on_disk = [g for g, _p in wal_files(self.data_dir, q.name)]
        q.wal.configure(self.data_dir, self.wal_mode, self.wal_batch_ms, generation=max(on_disk, default=0) + 1)

    def _each_queue(self):
        """Attach to each queue of the namespace in turn (closed after use)."""
        for name in self.broker.list_queues():
            try:
                q = self.broker.queue(name)
            except QueueNotFound:
                continue
            try:
                yield q
            finally:
                q.close()

    def run_once(self) -> int:
        """One snapshot of every durable queue; returns how many files were written.
        Files of queues deleted since (or made "memory") are removed. A snapshot that
        fails (a full disk) is logged once, keeps the previous file, and is retried."""
        if not self.data_dir_present():
            return 0
        written = 0
        keep = set()
        for q in self._each_queue():
            try:
                if q.durability == "wal" and not q.wal.config()[0]:
                    self.open_wal(q)
                if q.durability != "memory":
                    keep.add(q.name)
                    snapshot_queue(q, self.data_dir, self.fsync)
                    written += 1
                    self._report(q.name, None)
            except QueueNotFound:
                pass  # deleted meanwhile
            except OSError as e:
                self._report(q.name, f"cannot write the snapshot of queue {q.name} to {self.data_dir}: {e}")
        for entry in os.listdir(self.data_dir):
            owner = _owner(entry)
            if owner is not None and owner not in keep:
                os.unlink(os.path.join(self.data_dir, entry))
        return written

    def _report(self, name: str, error: str | None) -> None:
        """Log a queue's snapshot failure when it starts or changes, and its end."""
        before = self._failing.get(name)
        if error == before:
            return
        if error is None:
            del self._failing[name]
            log.info("snapshot of queue %s written again", name)
        else:
            self._failing[name] = error
            log.error("%s; retrying every interval", error)

    def data_dir_present(self) -> bool:
        """Whether the data directory is there. When it vanishes, every "wal" queue's
        log is suspended (its puts and acks fail); when it is back, they get a new log."""
        present = os.path.isdir(self.data_dir)
        if present == (not self._lost):
            return present
        self._lost = not present
        if present:
            log.warning("data dir %s is back: write-ahead logs reopened", self.data_dir)
        else:
            log.error("data dir %s is gone: puts and acks of 'wal' queues fail until it is back", self.data_dir)
        for q in self._each_queue():
            try:
                if q.durability == "wal":
                    if present:
                        self.open_wal(q)
                    else:
                        q.wal.suspend()
            except QueueNotFound:
                pass
        return present

    def sync_logs(self) -> int:
        """fsync the log of every "wal" queue that has entries not yet synced (the
        ``batch:MS`` policy: the broker does this every MS milliseconds). Queues stay
        attached and logs open between calls. Returns how many logs were synced."""
        if not self.data_dir_present():
            return 0
        names = set(self.broker.list_queues())
        for name in [n for n, entry in self._logs.items() if n not in names or entry[0].deleted]:
            self._forget_log(name)
        synced = 0
        for name in names:
            entry = self._logs.get(name)
            if entry is None:
                try:
                    entry = self._logs[name] = [self.broker.queue(name), 0, None]
                except QueueNotFound:
                    continue
            q = entry[0]
            pending = q.wal.pending() if q.durability == "wal" else None
            if pending is None:
                continue
            gen, size = pending
            if entry[1] != gen or entry[2] is None:
                if entry[2] is not None:
                    os.close(entry[2])
                    entry[2] = None
                try:
                    entry[2] = os.open(q.wal.path(gen), os.O_RDONLY)
                except FileNotFoundError:
                    continue
                entry[1] = gen
            os.fsync(entry[2])
            if os.fstat(entry[2]).st_nlink == 0:  # deleted under us: its entries are nowhere
                log.error("the log of queue %s was deleted; its puts and acks fail until it is reopened", name)
                q.wal.suspend()
                continue
            q.wal.mark_synced(gen, size)
            synced += 1
        return synced

    def _forget_log(self, name: str) -> None:
        q, _gen, fd = self._logs.pop(name)
        if fd is not None:
            os.close(fd)
        q.close()

    def close(self) -> None:
        """Detach what ``sync_logs`` kept attached and open."""
        for name in list(self._logs):
            self._forget_log(name)

    def open_all_wals(self) -> None:
        for q in self._each_queue():
            self.open_wal(q)
