"""Snapshots of queues to .dmsq files, and queues rebuilt from them.

Strategy: shared memory survives any process crash, the broker's included, but not a
reboot. A snapshot copies a queue's unsettled messages (the lock is held only for one
copy of the ring) and writes them with ``shmq.dmsq`` (temp file, fsync, rename,
directory fsync), so a crash mid-snapshot leaves the previous file whole. On start, a
queue whose segment is still there is kept as it is (memory is newer than any file);
a queue whose segment is gone is rebuilt from its file. A damaged file is replayed up
to the damage, set aside as ``.corrupt`` and reported in one line; start-up goes on.
"""

import logging
import os
import time

from . import dmsq
from .broker import Broker
from .errors import QueueNotFound
from .queue import Queue

__all__ = ["snapshot_path", "snapshot_queue", "restore_file", "recover", "Snapshotter"]

log = logging.getLogger("shmq.persistence")


def snapshot_path(data_dir: str, name: str) -> str:
    return os.path.join(data_dir, name + dmsq.SUFFIX)


def snapshot_queue(q: Queue, data_dir: str, fsync: bool = True) -> tuple[str, int]:
    """Write ``q``'s unsettled messages to ``<data_dir>/<name>.dmsq``; (path, count)."""
    messages = q.export_messages()
    header = dmsq.SnapshotHeader(queue=q.name, settings=q.settings(), created_ns=int(q.created_at * 1e9),
                                 snapshot_ns=time.time_ns(), version=dmsq.FORMAT_VERSION)
    path = snapshot_path(data_dir, q.name)
    dmsq.write_snapshot(path, header, (dmsq.SnapshotRecord(i, a, e, h, b) for i, a, e, h, b in messages),
                        fsync=fsync)
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


def recover(broker: Broker, data_dir: str) -> list[str]:
    """On start: rebuild every queue whose segment is gone from its snapshot; keep the
    ones still in shared memory. Damaged files are restored up to the damage and moved
    aside (``.corrupt``). Returns the names of the queues rebuilt."""
    rebuilt = []
    live = set(broker.list_queues())
    for entry in sorted(os.listdir(data_dir)):
        if not entry.endswith(dmsq.SUFFIX):
            continue
        path = os.path.join(data_dir, entry)
        name = entry[: -len(dmsq.SUFFIX)]
        if name in live:
            continue  # the host did not reboot: memory is newer than the file
        try:
            queue, n, error = restore_file(broker, path)
        except (ValueError, TypeError, OSError, QueueNotFound) as e:
            error, queue, n = f"{path}: cannot restore: {e}", name, 0
        if error:
            aside = dmsq.quarantine(path)
            log.error("%s; kept %d message(s) before it; file moved to %s", error, n, aside)
        if queue:
            log.info("queue %s rebuilt from %s: %d message(s)", queue, path, n)
            rebuilt.append(queue)
    return rebuilt


class Snapshotter:
    """Snapshots every queue whose durability is not "memory" into ``data_dir``."""

    def __init__(self, broker: Broker, data_dir: str, fsync: bool = True):
        self.broker = broker
        self.data_dir = data_dir
        self.fsync = fsync
        os.makedirs(data_dir, mode=0o700, exist_ok=True)

    def run_once(self) -> int:
        """One snapshot of every durable queue; returns how many files were written.
        Files of queues deleted since (or made "memory") are removed."""
        written = 0
        live = self.broker.list_queues()
        keep = set()
        for name in live:
            try:
                q = self.broker.queue(name)
            except QueueNotFound:
                continue
            try:
                if q.durability != "memory":
                    snapshot_queue(q, self.data_dir, self.fsync)
                    keep.add(name)
                    written += 1
            except QueueNotFound:
                pass
            finally:
                q.close()
        for entry in os.listdir(self.data_dir):
            if entry.endswith(dmsq.SUFFIX) and entry[: -len(dmsq.SUFFIX)] not in keep:
                os.unlink(os.path.join(self.data_dir, entry))
        return written
