"""A queue's snapshot and logs: writing the snapshot (rotating a "wal" queue's log in the
same critical section), restoring a file, and rebuilding queues a reboot lost."""

import array
import hashlib
import logging
import os
import time

from .. import dmsq
from ..engine import maintenance
from ..engine.broker import Broker
from ..engine.queue import Queue
from ..engine.segment import lane_name
from ..engine.wal import split_partition_name
from ..errors import ShmqError
from .files import lanes_of, read_snapshot_file, set_aside, snapshot_path, wal_files

log = logging.getLogger("shmq.persistence")

def snapshot_digest(*parts) -> bytes:
    """What a snapshot file says, apart from when it was taken: equal digests, equal files."""
    h = hashlib.blake2b(repr(parts[:-1]).encode(), digest_size=16)
    h.update(array.array("Q", parts[-1]).tobytes())
    return h.digest()


def snapshot_queue(q: Queue, data_dir: str, fsync: bool = True, written: dict | None = None) -> tuple[str, int]:
    """Write ``q``'s unsettled messages to ``<data_dir>/<name>.dmsq``; (path, count).

    For a "wal" queue the log is rotated in the same critical section as the copy, the
    snapshot records the first generation it does not cover, and older logs are
    removed once the snapshot is on disk. ``written`` (the caller's, kept between
    calls): what the file on disk says; a snapshot that would say the same again is not
    rewritten (an idle broker writes and fsyncs nothing), unless older logs are there
    to be removed.
    """
    lanes = lanes_of(q)
    wal = q.durability == "wal" and all(lane.wal.config()[0] > 0 for lane in lanes)
    messages = maintenance.export_messages(q, rotate_wal=wal)
    settings = q.settings()
    created_ns = int(q.created_at * 1e9)
    path = snapshot_path(data_dir, q.name)
    old_logs = []
    if wal:  # the first generation of each lane's log the snapshot does not cover
        gens = [lane.wal.config()[0] for lane in lanes]
        settings["wal_from"] = gens[0] if len(gens) == 1 else gens
        old_logs = [log_path for j, first in enumerate(gens)
                    for gen, log_path in wal_files(data_dir, lane_name(q.name, j)) if gen < first]
    if written is not None:  # a message's id and attempt say all of it: bodies never change
        digest = snapshot_digest(q.name, created_ns, sorted((k, v) for k, v in settings.items() if k != "wal_from"),
                         [x for i, a, e, _h, _b in messages for x in (i, a, e)])
        if not old_logs and written.get(path) == digest and os.path.exists(path):
            return path, len(messages)
        written.pop(path, None)
    header = dmsq.SnapshotHeader(queue=q.name, settings=settings, created_ns=created_ns,
                                 snapshot_ns=time.time_ns(), version=dmsq.FORMAT_VERSION)
    dmsq.write_snapshot(path, header, (dmsq.SnapshotRecord(i, a, e, h, b) for i, a, e, h, b in messages),
                        fsync=fsync)
    for log_path in old_logs:
        os.unlink(log_path)
    if written is not None:
        written[path] = digest
    return path, len(messages)


# the settings a snapshot keeps that ``create_queue`` takes back (format version 2 adds the work-queue options)
_CREATE_KEYS = ("max_bytes", "max_message_bytes", "visibility_timeout", "max_deliveries", "dead_letter_queue",
                "durability", "priorities", "message_ttl", "dedup_window", "retry_delay", "retry_backoff",
                "retry_delay_max", "priority_aging", "lanes")


def restore_file(broker: Broker, path: str, into: str | None = None) -> tuple[str, int, str | None]:
    """Load a .dmsq file into queue ``into`` (default: the queue it was taken from),
    creating it with the file's settings if needed. Returns (queue, messages, error):
    ``error`` is the one-line description of damage that stopped the replay (the
    records before it are restored), or None. A stream partition's snapshot is not
    loaded (streams are rebuilt by ``recover``): its error says so."""
    result = dmsq.read_snapshot(path)
    if result.header is None:
        return into or "", 0, result.error or f"{path}: not a snapshot"
    if split_partition_name(result.header.queue) is not None:
        return into or "", 0, (f"{path}: a snapshot of a stream partition ({result.header.queue}); streams are "
                               "rebuilt from their data dir by `shmq server --data-dir`")
    name = into or result.header.queue
    settings = {k: v for k, v in result.header.settings.items() if k in _CREATE_KEYS}
    if settings.get("dead_letter_queue") and settings["dead_letter_queue"] not in broker.list_queues():
        settings.pop("dead_letter_queue")  # restored without its DLQ rather than not at all
    q = broker.create_queue(name, exist_ok=True, **settings)
    try:
        n = maintenance.import_messages(
            q, ((r.msg_id, r.attempt, r.enqueued_ns, r.headers, r.body) for r in result.records))
    finally:
        q.close()
    return name, n, result.error


def logs_from(data_dir, name, wal_from):
    """(path, entries, error, error_offset) of each log of ``name`` from generation
    ``wal_from`` on, oldest first: what recovery replays."""
    for gen, path in wal_files(data_dir, name):
        if gen >= wal_from:
            yield (path, *dmsq.read_log(path))


def _replay_logs(data_dir, name, wal_from, records):
    """Apply the logs of ``name`` from generation ``wal_from`` on to ``records`` (an id ->
    message dict, in order). Damage stops a log there (what precedes it is kept)."""
    for path, entries, error, _offset in logs_from(data_dir, name, wal_from):
        for e in entries:
            if e.op == dmsq.PUT:
                records[e.msg_id] = (e.msg_id, e.attempt, e.enqueued_ns, e.headers, e.body)
            elif e.op == dmsq.ACK:
                records.pop(e.msg_id, None)
        if error:
            set_aside(path, error, len(entries))


def recover_queues(broker: Broker, data_dir: str, names) -> list[str]:
    rebuilt = []
    live = set(broker.list_queues())
    for name in sorted(set(names) - live):  # the live ones: memory is newer than any file
        header, snapshot = read_snapshot_file(snapshot_path(data_dir, name), "message(s)")
        records = {r.msg_id: (r.msg_id, r.attempt, r.enqueued_ns, r.headers, r.body) for r in snapshot}
        settings = header.settings if header is not None else None
        if settings is None:
            settings = {"durability": "wal"} if wal_files(data_dir, name) else None
        if settings is None:
            continue
        wal_from = settings.get("wal_from", 0)
        if not isinstance(wal_from, list):  # (a laned queue's first snapshot, before its logs opened: all of them)
            wal_from = [wal_from] * settings.get("lanes", 1)
        for j, first in enumerate(wal_from):
            _replay_logs(data_dir, lane_name(name, j), first, records)
        create = {k: v for k, v in settings.items() if k in _CREATE_KEYS}
        if create.get("dead_letter_queue") and create["dead_letter_queue"] not in broker.list_queues():
            create.pop("dead_letter_queue")
        try:
            q = broker.create_queue(name, exist_ok=True, **create)
            try:
                n = maintenance.import_messages(q, records.values())
            finally:
                q.close()
        except (ValueError, TypeError, OSError, ShmqError) as e:
            log.error("%s: cannot rebuild queue %s: %s", data_dir, name, e)
            continue
        log.info("queue %s rebuilt from %s: %d message(s)", name, data_dir, n,
                 extra={"event": "queue_rebuilt", "queue": name, "data_dir": data_dir, "messages": n})
        rebuilt.append(name)
    return rebuilt
