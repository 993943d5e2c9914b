"""Snapshots of queues and streams to .dmsq files, and what a reboot lost rebuilt from them.

Strategy: shared memory survives any process crash, the broker's included, but not a
reboot. A snapshot copies a queue's unsettled messages, or each stream partition's
records (the lock is held only for one copy of the ring), and writes them with
``shmq.dmsq`` (temp file, fsync, rename, directory fsync), so a crash mid-snapshot leaves
the previous file whole. On start, a queue or stream whose segments are still there is
kept as it is (memory is newer than any file); one whose segments are gone is rebuilt
from its files. A damaged file (snapshot or log) is replayed up to the damage, set aside
as ``.corrupt`` and reported in one line; start-up goes on. A full disk or a vanished
data directory is reported, never fatal: snapshots are retried every interval, and while
the directory is gone every logged write fails (``Log.suspend``) rather than return
without a log behind it.

A stream partition's files are named ``@STREAM#P`` (``wal.partition_log_name``):
``@STREAM#P.dmsq`` (its snapshot), ``@STREAM#P.wal.N`` (its logs, which stay as the long
tail until retention deletes whole files) and ``@STREAM#P.hwm`` (a snapshot stream's
high-water file). A laned queue's snapshot is one file, its lanes' logs are each lane's
(``NAME.wal.N``, ``NAME#1.wal.N``, ...: ``segment.lane_name``). The namespace's exchanges and bindings are one file,
``exchanges.dmsx`` (``dmsq.EXCHANGES_FILE``), written when the table changes and read back
only when shared memory has no table. Layouts: docs/FORMAT.md; the promises:
docs/DESIGN.md, Persistence.
"""

import array
import hashlib
import logging
import os
import threading
import time

from . import dmsq
from .engine import maintenance
from .engine.broker import Broker
from .engine.queue import Queue
from .engine.segment import lane_name
from .engine.stream import Stream
from .engine.wal import hwm_path, log_files, parse_wal_name, partition_log_name, split_partition_name
from .errors import QueueNotFound, ShmqError, StreamNotFound

__all__ = ["snapshot_path", "snapshot_queue", "snapshot_stream", "apply_retention", "restore_file", "recover",
           "Snapshotter", "is_data_file", "remove_data_dir"]

log = logging.getLogger("shmq.persistence")

_HWM_SUFFIX = ".hwm"
_EXCHANGES = "#exchanges"  # the exchange table's key in Snapshotter._failing (no queue has "#" in its name)


def snapshot_path(data_dir: str, name: str) -> str:
    return os.path.join(data_dir, name + dmsq.SUFFIX)


def wal_files(data_dir: str, name: str) -> list[tuple[int, str]]:
    """(generation, path) of every write-ahead log of queue ``name``, oldest first."""
    return log_files(data_dir, name)


def lanes_of(q) -> list:
    """The lane handles of a queue handle (a plain queue is its own one lane)."""
    return getattr(q, "_lanes", None) or [q]


def _owner(entry: str) -> str | None:
    """What a data-dir entry (snapshot, log, high-water file) belongs to: a queue's name,
    ``@NAME`` for a stream's, or None."""
    if entry.endswith(dmsq.SUFFIX):
        stem = entry[: -len(dmsq.SUFFIX)]
    elif entry.endswith(_HWM_SUFFIX):
        stem = entry[: -len(_HWM_SUFFIX)]
    else:
        parsed = parse_wal_name(entry)
        stem = parsed[0] if parsed is not None else None
    if stem is None:
        return None
    part = split_partition_name(stem)
    if part is not None:
        return "@" + part[0]
    if stem.startswith("@") or entry.endswith(_HWM_SUFFIX):
        return None
    return stem.rpartition("#")[0] or stem  # a lane's logs are its queue's


def is_data_file(entry: str) -> bool:
    """Whether a data-dir entry is one of shmq's files: a snapshot, a log, a high-water
    file, the exchange table, or one of those set aside (``.corrupt``) or half-written (``.tmp``)."""
    stem = entry
    if stem.endswith(dmsq.TMP_SUFFIX):
        stem = stem[:-len(dmsq.TMP_SUFFIX)]
    head, sep, tail = stem.rpartition(dmsq.CORRUPT_SUFFIX)
    if sep and (not tail or (tail[0] == "." and tail[1:].isdigit())):
        stem = head
    return stem == dmsq.EXCHANGES_FILE or _owner(stem) is not None


def remove_data_dir(path: str) -> tuple[int, list[str]]:
    """Delete shmq's files in data dir ``path`` (``is_data_file``), then the directory if
    that emptied it; returns (files removed, the entries kept: not shmq's). (0, []) if
    there is no such directory."""
    try:
        entries = sorted(os.listdir(path))
    except FileNotFoundError:
        return 0, []
    removed, kept = 0, []
    for entry in entries:
        full = os.path.join(path, entry)
        if is_data_file(entry) and os.path.isfile(full) and not os.path.islink(full):
            os.unlink(full)
            removed += 1
        else:
            kept.append(entry)
    if not kept:
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass
    return removed, kept


# ------------------------------------------------------------------------------ queues


def _digest(*parts) -> bytes:
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
        digest = _digest(q.name, created_ns, sorted((k, v) for k, v in settings.items() if k != "wal_from"),
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


def _logs_from(data_dir, name, wal_from):
    """(path, entries, error, error_offset) of each log of ``name`` from generation
    ``wal_from`` on, oldest first: what recovery replays."""
    for gen, path in wal_files(data_dir, name):
        if gen >= wal_from:
            yield (path, *dmsq.read_log(path))


def _set_aside(path, error, replayed, keep=0):
    """A log replayed up to its damage is moved aside as ``.corrupt`` (out of reach of the
    clean-up of old logs) and said in one line; with ``keep``, its first ``keep`` bytes
    (the intact part) are written back under its name."""
    aside = dmsq.quarantine(path)
    if keep:
        _write_prefix(aside, path, keep)
    log.error("%s; replayed %d entries before it; file moved to %s", error, replayed, aside,
              extra={"event": "file_quarantined", "file": path, "moved_to": aside, "error": error,
                     "replayed": replayed})


def _replay_logs(data_dir, name, wal_from, records):
    """Apply the logs of ``name`` from generation ``wal_from`` on to ``records`` (an id ->
    message dict, in order). Damage stops a log there (what precedes it is kept)."""
    for path, entries, error, _offset in _logs_from(data_dir, name, wal_from):
        for e in entries:
            if e.op == dmsq.PUT:
                records[e.msg_id] = (e.msg_id, e.attempt, e.enqueued_ns, e.headers, e.body)
            elif e.op == dmsq.ACK:
                records.pop(e.msg_id, None)
        if error:
            _set_aside(path, error, len(entries))


def _read_snapshot_file(path, what):
    """(header or None, records) of a snapshot; a damaged one is moved aside (and said)."""
    if not os.path.exists(path):
        return None, []
    result = dmsq.read_snapshot(path)
    if result.error:
        aside = dmsq.quarantine(path)
        log.error("%s; kept %d %s before it; file moved to %s", result.error, len(result.records), what, aside,
                  extra={"event": "file_quarantined", "file": path, "moved_to": aside, "error": result.error,
                         "replayed": len(result.records)})
    return result.header, result.records


def _recover_queues(broker: Broker, data_dir: str, names) -> list[str]:
    rebuilt = []
    live = set(broker.list_queues())
    for name in sorted(set(names) - live):  # the live ones: memory is newer than any file
        header, snapshot = _read_snapshot_file(snapshot_path(data_dir, name), "message(s)")
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


def recover(broker: Broker, data_dir: str) -> list[str]:
    """On start: rebuild every queue and stream whose segments are gone from its
    snapshots and its write-ahead logs; keep the ones still in shared memory. Damaged
    files are replayed up to the damage and moved aside (``.corrupt``). Returns the names
    rebuilt: queues by name, streams as ``@NAME``."""
    owners = {owner for owner in map(_owner, os.listdir(data_dir)) if owner is not None}
    rebuilt = _recover_queues(broker, data_dir, [o for o in owners if not o.startswith("@")])
    live = set(broker.list_streams())
    for name in sorted({o[1:] for o in owners if o.startswith("@")} - live):
        try:
            if _rebuild_stream(broker, data_dir, name):
                rebuilt.append("@" + name)
        except (ValueError, TypeError, OSError, ShmqError) as e:
            log.error("%s: cannot rebuild stream %s: %s", data_dir, name, e)
    _recover_exchanges(broker, data_dir)
    return rebuilt


# ------------------------------------------------------------------------------ exchanges


def _recover_exchanges(broker: Broker, data_dir: str) -> None:
    """Put back the exchanges and bindings saved in the data dir's exchange file, when
    the namespace has no exchange table in shared memory (memory is newer than the file).
    Bindings to a queue or stream that is not there (a "memory" one) are dropped. A
    damaged file is moved aside and said in one line; start-up goes on."""
    path = os.path.join(data_dir, dmsq.EXCHANGES_FILE)
    exchanges = broker.exchange_table()
    if not os.path.exists(path) or exchanges.exists():
        return
    try:
        table = dmsq.read_exchanges(path)
    except ValueError as e:
        aside = dmsq.quarantine(path)
        log.error("%s; no exchanges restored; file moved to %s", e, aside,
                  extra={"event": "file_quarantined", "file": path, "moved_to": aside, "error": str(e),
                         "replayed": 0})
        return
    except OSError as e:
        log.error("%s: cannot read the exchange table: %s", path, e)
        return
    there = {"q": set(broker.list_queues()), "s": set(broker.list_streams())}
    bindings = dropped = 0
    for x in table.values():
        kept = [b for b in x["bindings"] if b[1] in there[b[0]]]
        dropped += len(x["bindings"]) - len(kept)
        bindings += len(kept)
        x["bindings"] = kept
    try:
        exchanges.restore(table)
    except (ValueError, OSError, ShmqError) as e:
        log.error("%s: cannot restore the exchanges: %s", path, e)
        return
    log.info("exchanges restored from %s: %d exchange(s), %d binding(s)%s", path, len(table), bindings,
             f" ({dropped} to queues or streams not there dropped)" if dropped else "",
             extra={"event": "exchanges_restored", "data_dir": data_dir, "exchanges": len(table),
                    "bindings": bindings, "dropped": dropped})


# ------------------------------------------------------------------------------ streams

_STREAM_KEYS = ("partitions", "max_bytes", "max_message_bytes", "retention", "retention_bytes", "retention_seconds",
                "group_idle_timeout", "durability")
_ROLL_MIN_BYTES = 4096


def stream_settings(s: Stream) -> dict:
    """A stream's settings, as ``create_stream`` takes them."""
    return {k: getattr(s, k) for k in _STREAM_KEYS}


def _roll(s: Stream) -> tuple[int, int | None]:
    """When a partition's log generation is full (bytes, ns): it holds about one ring
    (``max_bytes``), or a quarter of ``retention_bytes`` / ``retention_seconds``, so
    retention, which deletes whole files, keeps within a quarter of its bound."""
    roll_bytes = s.max_bytes
    if s.retention_bytes:
        roll_bytes = min(roll_bytes, max(_ROLL_MIN_BYTES, int(s.retention_bytes) // 4))
    return roll_bytes, (int(s.retention_seconds * 1e9) // 4 if s.retention_seconds else None)


def snapshot_stream(s: Stream, data_dir: str, fsync: bool = True, written: dict | None = None) -> tuple[int, int]:
    """Write each partition of ``s`` to ``<data_dir>/@NAME#P.dmsq``: its records, the next
    offset, every group's committed offset for it, its publishers' table (the batches
    published exactly once, ``Stream.publish``), and (wal) the first log generation
    the records do not cover, or (snapshot) the high-water epoch it begins. A "wal"
    partition's log moves to a new generation when the current one is full (``_roll``).
    ``written``: as for ``snapshot_queue`` (a "snapshot" stream's partitions, which begin
    a high-water epoch each time, are always written). Returns (files, records)."""
    groups = {g: s.committed(g) for g in s.groups()}  # before the copies: no commit is past their end
    settings = stream_settings(s)
    roll_bytes, roll_ns = _roll(s)
    records = 0
    for p in range(s.partitions):
        image = s._part(p).export(roll_bytes, roll_ns)
        extra = {"stream": s.name, "partition": p, "next_offset": image.next_offset,
                 "committed": {g: c.get(p) for g, c in groups.items()}}
        if image.wal_from is not None:
            extra["wal_from"] = image.wal_from
        if image.hwm_epoch is not None:
            extra["hwm_epoch"] = image.hwm_epoch
        if image.txns:
            extra["published"] = [[tid.hex(), batch, end] for tid, batch, end in image.txns]
        name = partition_log_name(s.name, p)
        path = snapshot_path(data_dir, name)
        records += len(image.rows)
        digest = None
        if written is not None and image.hwm_epoch is None:  # a record's offset says all of it
            digest = _digest(name, int(s.created_at * 1e9), sorted(settings.items()), extra,
                             [image.rows[0][0], len(image.rows)] if image.rows else [])
            if written.get(path) == digest and os.path.exists(path):
                continue
        if written is not None:
            written.pop(path, None)
        header = dmsq.SnapshotHeader(queue=name, settings={**settings, **extra}, created_ns=int(s.created_at * 1e9),
                                     snapshot_ns=time.time_ns())
        dmsq.write_snapshot(path, header, (dmsq.stream_record(*row) for row in image.rows), fsync=fsync)
        if digest is not None:
            written[path] = digest
    return s.partitions, records


def apply_retention(s: Stream, now_ns: int | None = None) -> int:
    """Delete the oldest whole log files of each partition of a "wal" stream while the
    logs hold more than ``retention_bytes`` or the file's last write is older than
    ``retention_seconds`` (never the generation being appended to); the partition then
    says its disk tail begins at the oldest file left. Returns how many were deleted."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    deleted = 0
    for p in range(s.partitions):
        part = s._part(p)
        files = part.disk_files()
        current = part.log.config()[0]
        sizes = {path: os.path.getsize(path) for _g, _f, path in files}
        total, gone = sum(sizes.values()), 0
        for gen, _first, path in files:
            if gen >= current:
                break
            too_big = s.retention_bytes and total > s.retention_bytes
            too_old = s.retention_seconds and os.stat(path).st_mtime_ns < now_ns - s.retention_seconds * 1e9
            if not (too_big or too_old):
                break
            total -= sizes[path]
            gone += 1
        left = [first for _g, first, _path in files[gone:] if first is not None]
        part.set_disk_first(left[0] if left else None)  # first: no reader is sent to a file being deleted
        for _gen, _first, path in files[:gone]:
            os.unlink(path)
        deleted += gone
    return deleted


def _stream_row(r):
    return dmsq.stream_row(r.msg_id, r.attempt, r.enqueued_ns, r.headers, r.body)


def _replay_stream_logs(data_dir, name, wal_from, rows, end, published):
    """Add the records of ``name``'s logs from generation ``wal_from`` on to ``rows``
    (offset -> row), and their publish notes to ``published`` (publisher id -> (batch,
    end offset, ns): the newest batch of each). A damaged log is replayed to the damage
    and set aside; its intact part stays under its name, so the disk tail keeps it.
    Returns the offset after the last one logged (past ``end``), counting intact entries
    found after damage."""
    for path, entries, error, error_offset in _logs_from(data_dir, name, wal_from):
        for e in entries:
            if e.op == dmsq.PUT:
                end = max(end, e.msg_id + 1)
                rows.setdefault(e.msg_id, _stream_row(e))
            elif e.op == dmsq.PUBLISH:  # after its append's PUTs, in the same write: they are in
                txn_id, batch, txn_end = dmsq.publish_note(e)
                if batch > published.get(txn_id, (-1,))[0]:
                    published[txn_id] = (batch, txn_end, e.enqueued_ns)
        if error:
            hidden = [e.msg_id + 1 for e in dmsq.salvage_log(path, error_offset) if e.op == dmsq.PUT]
            end = max([end] + hidden)  # offsets the damage hid were handed out: never again
            _set_aside(path, error, len(entries), error_offset)
    return end


def _write_prefix(src, dest, size):
    """``dest`` := the first ``size`` bytes of ``src``, crash-safely."""
    with open(src, "rb") as f:
        data = f.read(size)
    tmp = dest + dmsq.TMP_SUFFIX
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, dest)
    dmsq.fsync_dir(dest)


def _stream_files(data_dir: str, name: str) -> set[int]:
    """The partitions of stream ``name`` that have a file in ``data_dir``."""
    parts = set()
    for entry in os.listdir(data_dir):
        if _owner(entry) == "@" + name:
            stem = entry.split(".wal.")[0] if ".wal." in entry else entry.rsplit(".", 1)[0]
            parts.add(split_partition_name(stem)[1])
    return parts


def _rebuild_stream(broker: Broker, data_dir: str, name: str) -> bool:
    """Create stream ``name`` from its files: per partition, the snapshot's records and
    the logs after it, the next offset (past every offset a log or the high-water file
    says was handed out), and the groups' committed offsets. False if the files say too
    little (no snapshot header and no log)."""
    parts = _stream_files(data_dir, name)
    images, settings, created = {}, None, None
    for p in sorted(parts):
        header, records = _read_snapshot_file(snapshot_path(data_dir, partition_log_name(name, p)), "record(s)")
        images[p] = (header.settings if header is not None else None, {r.msg_id: _stream_row(r) for r in records})
        if header is not None and settings is None:
            settings, created = header.settings, header.created_ns
    logged = any(log_files(data_dir, partition_log_name(name, p)) for p in parts)
    if settings is None:
        if not logged:
            log.error("%s: stream %s has no readable snapshot and no log; not rebuilt", data_dir, name)
            return False
        settings = {"durability": "wal", "partitions": max(parts) + 1}  # the rest: the defaults
    create = {k: settings[k] for k in _STREAM_KEYS if k in settings}
    s = broker.create_stream(name, exist_ok=True, **create)
    try:
        if created is not None:
            s._restore_created(created)
        committed = {}
        total = 0
        for p in range(s.partitions):
            st, rows = images.get(p, (None, {}))
            st = st or {}
            end = max([st.get("next_offset", 0)] + [o + 1 for o in rows])
            fname = partition_log_name(name, p)
            published = {bytes.fromhex(t): (b, e, 0) for t, b, e in st.get("published", [])}
            if logged:  # the logs' publish notes too: a batch published after the snapshot stays published
                end = _replay_stream_logs(data_dir, fname, st.get("wal_from", 0), rows, end, published)
            epoch = st.get("hwm_epoch") or 0
            if os.path.exists(hwm_path(data_dir, fname)):
                mark = dmsq.read_hwm(hwm_path(data_dir, fname))
                if mark is not None and mark[0] >= epoch:  # written after that snapshot: past it, offsets may
                    end = max(end, mark[1])                # have been handed out that no file holds
                    epoch = max(epoch, mark[0])
            table = sorted(((t, b, e, ns) for t, (b, e, ns) in published.items()), key=lambda x: x[3])
            total += s._part(p).restore([rows[o] for o in sorted(rows)], end, epoch, table)
            for group, offset in st.get("committed", {}).items():
                offsets = committed.setdefault(group, {})
                if offset is not None:
                    offsets[p] = offset
        for group, offsets in committed.items():
            s.groups_table.set_offsets(group, offsets)
    finally:
        s.close()
    log.info("stream %s rebuilt from %s: %d record(s) in memory, %d group(s)", name, data_dir, total, len(committed),
             extra={"event": "stream_rebuilt", "stream": name, "data_dir": data_dir, "records": total,
                    "groups": len(committed)})
    return True


# ------------------------------------------------------------------------------ the broker's side


class Snapshotter:
    """Snapshots every queue and stream whose durability is not "memory" into
    ``data_dir``, opens the write-ahead log of every "wal" queue and stream partition
    there (and a snapshot stream's high-water file), fsyncs the logs in batch mode, and
    applies the retention of "wal" streams' logs."""

    def __init__(self, broker: Broker, data_dir: str, fsync: bool = True, wal_mode: int = 2, wal_batch_ms: int = 2):
        self.broker = broker
        self.data_dir = data_dir
        self.fsync = fsync
        self.wal_mode = wal_mode
        self.wal_batch_ms = wal_batch_ms
        # queue name -> [attached queue, generation of fd, fd or None, {lane: [lane, generation, fd]} of lanes 1..]
        self._logs = {}  # for sync_logs
        self._stream_logs = {}  # "@NAME" -> [attached Stream, {partition: [log, generation of fd, fd or None]}]
        self._failing = {}  # name -> the snapshot error last logged
        self._exchanges_saved = None  # the exchange table last written
        self.last_round = {}  # what the last run_once wrote
        self._written = {}  # snapshot path -> what it says (``snapshot_queue``): unchanged ones are not rewritten
        self._lost = False  # the data dir vanished
        self.log_dirs = set()  # where the logs were at the last settled sync_logs
        self._dir_lock = threading.Lock()  # one thread at a time handles its coming and going
        os.makedirs(data_dir, mode=0o700, exist_ok=True)

    def open_wal(self, x) -> None:
        """Point a "wal" queue's log at our data dir, in a generation after any on disk;
        a Stream goes to ``open_stream``."""
        if isinstance(x, Stream):
            self.open_stream(x)
            return
        if x.durability != "wal":
            return
        lanes = lanes_of(x)
        if len(lanes) > 1 and not os.path.exists(snapshot_path(self.data_dir, x.name)):
            snapshot_queue(x, self.data_dir, self.fsync)  # first: its lanes' logs alone would not say how many
        for q in lanes:
            self._open_log(q)

    def _open_log(self, q) -> None:
        gen, _mode, _ms, directory = q.wal.config()
        if gen and directory == os.path.abspath(self.data_dir):
            q.wal.configure(self.data_dir, self.wal_mode, self.wal_batch_ms)  # keep its generation
            return
        q.wal.configure(self.data_dir, self.wal_mode, self.wal_batch_ms, generation=self._next_generation(q.wal))

    def _next_generation(self, wal) -> int:
        """A generation for a log (re)opened here: after any on disk, and after the one it
        had when it was suspended (a data dir deleted and made again is empty, and its
        writers' descriptors for the old generation number point into the deleted one)."""
        on_disk = [g for g, _p in log_files(self.data_dir, wal.name)]
        return max(on_disk + [wal.suspended_at()]) + 1

    def _opened(self, s: Stream) -> bool:
        """Whether every partition of a durable stream is configured for our data dir."""
        here = os.path.abspath(self.data_dir)
        return all(c[0] and c[3] == here for c in (s._part(p).log.config() for p in range(s.partitions)))

    def open_stream(self, s: Stream) -> bool:
        """Configure a durable stream's partitions for our data dir (a stream already
        configured keeps its log generations). A "wal" stream is snapshotted first, so
        no log is ever on disk without the settings that rebuild it, then each
        partition's log opens in a generation after any on disk, with its disk tail
        where the oldest log begins; a "snapshot" stream starts its high-water marks,
        then is snapshotted. Files of a deleted stream of the same name go first.
        Returns True if it snapshotted."""
        if s.durability == "memory":
            return False
        if self._opened(s):
            for p in range(s.partitions):
                s._part(p).log.configure(self.data_dir, self.wal_mode, self.wal_batch_ms)
            return False
        self._forget_stale(s)
        if s.durability == "wal":
            snapshot_stream(s, self.data_dir, self.fsync)
        for p in range(s.partitions):
            part = s._part(p)
            part.log.configure(self.data_dir, self.wal_mode, self.wal_batch_ms, generation=self._next_generation(part.log))
            if s.durability == "wal":
                firsts = [first for _g, first, _path in part.disk_files() if first is not None]
                part.set_disk_first(firsts[0] if firsts else None)
            else:
                part.start_marks()
        if s.durability != "wal":
            snapshot_stream(s, self.data_dir, self.fsync)
        return True

    def _forget_stale(self, s: Stream) -> None:
        """Remove the files of a deleted stream that had this one's name: their snapshot
        says another creation time (a stream rebuilt from them keeps theirs)."""
        created = int(s.created_at * 1e9)
        for p in range(s.partitions):
            path = snapshot_path(self.data_dir, partition_log_name(s.name, p))
            try:
                with dmsq.SnapshotReader(path) as r:
                    theirs = r.header.created_ns if r.header is not None else created
            except FileNotFoundError:
                continue
            if theirs != created:
                for entry in os.listdir(self.data_dir):
                    if _owner(entry) == "@" + s.name:
                        os.unlink(os.path.join(self.data_dir, entry))
                log.warning("data dir %s: removed the files of an earlier stream %s", self.data_dir, s.name)
                return

    def _each(self, names, attach, gone):
        """Attach to each of ``names`` in turn (closed after use; one deleted meanwhile,
        ``gone``, is passed over)."""
        for name in names:
            try:
                handle = attach(name)
            except gone:
                continue
            try:
                yield handle
            finally:
                handle.close()

    def _each_queue(self):
        return self._each(self.broker.list_queues(), self.broker.queue, QueueNotFound)

    def _each_stream(self):
        return self._each(self.broker.list_streams(), self.broker.stream, StreamNotFound)

    def run_once(self) -> int:
        """One snapshot of every durable queue and stream; returns how many files were
        written. Then the retention of "wal" streams' logs. Files of queues and streams
        deleted since (or made "memory") are removed. A snapshot that fails (a full disk)
        is logged once, keeps the previous file, and is retried. ``last_round`` says
        what the round wrote: queues, messages, streams, files."""
        self.last_round = {"queues": 0, "messages": 0, "streams": 0, "files": 0}
        if not self.data_dir_present():
            return 0
        written = 0
        keep = set()
        for q in self._each_queue():
            try:
                if q.durability == "wal" and not all(lane.wal.config()[0] for lane in lanes_of(q)):
                    self.open_wal(q)
                if q.durability != "memory":
                    keep.add(q.name)
                    _path, n = snapshot_queue(q, self.data_dir, self.fsync, self._written)
                    written += 1
                    self.last_round["queues"] += 1
                    self.last_round["messages"] += n
                    self._report(q.name, None)
            except QueueNotFound:
                pass  # deleted meanwhile
            except OSError as e:
                self._report(q.name, f"cannot write the snapshot of queue {q.name} to {self.data_dir}: {e}")
        for s in self._each_stream():
            if s.durability == "memory":
                continue
            keep.add("@" + s.name)
            try:
                configured = all(s._part(p).log.config()[0] for p in range(s.partitions))
                if configured or not self.open_stream(s):  # (one configured elsewhere stays so)
                    snapshot_stream(s, self.data_dir, self.fsync, self._written)
                written += s.partitions
                self.last_round["streams"] += 1
                if s.durability == "wal":
                    apply_retention(s)
                self._report("@" + s.name, None)
            except StreamNotFound:
                pass
            except OSError as e:
                self._report("@" + s.name, f"cannot write the snapshot of stream {s.name} to {self.data_dir}: {e}")
        for entry in os.listdir(self.data_dir):
            owner = _owner(entry)
            if owner is not None and owner not in keep:
                os.unlink(os.path.join(self.data_dir, entry))
                self._written.pop(os.path.join(self.data_dir, entry), None)
        self._save_exchanges()
        self.last_round["files"] = written
        return written

    def _save_exchanges(self) -> None:
        """Write the exchange table (``dmsq.EXCHANGES_FILE``) when it changed since the
        last write; a namespace without exchanges has no file."""
        path = os.path.join(self.data_dir, dmsq.EXCHANGES_FILE)
        table = self.broker.exchange_table().table()
        if table == self._exchanges_saved and os.path.exists(path) == bool(table):
            return
        try:
            if table:
                dmsq.write_exchanges(path, table, self.fsync)
            elif os.path.exists(path):
                os.unlink(path)
            self._exchanges_saved = table
            self._report(_EXCHANGES, None)
        except OSError as e:
            self._report(_EXCHANGES, f"cannot write the exchange table to {self.data_dir}: {e}")

    def _report(self, name: str, error: str | None) -> None:
        """Log a snapshot failure when it starts or changes, and its end."""
        before = self._failing.get(name)
        if error == before:
            return
        what = f"stream {name[1:]}" if name.startswith("@") else f"queue {name}"
        if name == _EXCHANGES:
            what = "the exchange table"
        if error is None:
            del self._failing[name]
            log.info("snapshot of %s written again", what)
        else:
            self._failing[name] = error
            log.error("%s; retrying every interval", error)

    def data_dir_present(self) -> bool:
        """Whether the data directory is there. When it vanishes, every "wal" queue's and
        durable stream's log config is suspended (logged writes fail); when it is back,
        they are opened again. The snapshot and fsync threads both ask: one makes the
        change, the other waits for it to be complete (else a late reopen could undo a
        rotation the other had snapshotted, and that snapshot would delete a log holding
        puts it does not)."""
        present = os.path.isdir(self.data_dir)
        if present == (not self._lost):
            return present
        with self._dir_lock:
            present = os.path.isdir(self.data_dir)
            if present == (not self._lost):
                return present
            if present:
                log.warning("data dir %s is back: write-ahead logs reopened", self.data_dir)
            else:
                log.error("data dir %s is gone: puts and acks of 'wal' queues and appends to 'wal' streams fail "
                          "until it is back", self.data_dir)
            for q in self._each_queue():
                try:
                    if q.durability == "wal":
                        if present:
                            self.open_wal(q)
                        else:
                            for lane in lanes_of(q):
                                lane.wal.suspend()
                except QueueNotFound:
                    pass
            for s in self._each_stream():
                try:
                    if s.durability == "memory":
                        continue
                    if present:
                        self.open_stream(s)
                    else:
                        for p in range(s.partitions):
                            s._part(p).log.suspend()
                except (StreamNotFound, OSError):
                    pass
            self._lost = not present  # last: until now, the other thread waits above
        return present

    def sync_logs(self, settled: bool = False) -> int:
        """fsync the log of every "wal" queue and stream partition that has entries not
        yet synced (the ``batch:MS`` policy: ``server.logsync.LogSyncer`` calls this while
        logs are written). Queues and streams stay attached and logs open between calls.
        Returns how many logs were synced. ``settled``: also count appends still between
        their write and their size word (``Log.pending``), and note in ``log_dirs`` the
        directories the logs are in."""
        if settled:
            self.log_dirs = set()
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
                    entry = self._logs[name] = [self.broker.queue(name), 0, None, {}]
                except QueueNotFound:
                    continue
            if entry[0].durability == "wal":
                for j, lane in enumerate(lanes_of(entry[0])):  # [handle, generation, fd] of lane 0, then of the others
                    synced += self._sync(lane.wal, entry if not j else entry[3].setdefault(j, [lane, 0, None]), settled)
        streams = {"@" + n for n in self.broker.list_streams()}
        for key in [k for k, entry in self._stream_logs.items() if k not in streams or entry[0].deleted]:
            self._forget_stream(key)
        for key in streams:
            entry = self._stream_logs.get(key)
            if entry is None:
                try:
                    s = self.broker.stream(key[1:])
                except StreamNotFound:
                    continue
                entry = self._stream_logs[key] = [s, {}]
            s = entry[0]
            if s.durability != "wal":
                continue
            for p in range(s.partitions):
                try:
                    part = entry[1].setdefault(p, [s._part(p), 0, None])
                    synced += self._sync(part[0].log, part, settled)
                except StreamNotFound:
                    break
        return synced

    def _sync(self, wal, entry, settled=False) -> int:
        """fsync one log if it has entries not yet synced; ``entry`` is [owner, generation
        of fd, fd or None], kept between rounds. Returns 1 if it synced."""
        pending = wal.pending(settled)
        if settled:
            gen, _mode, _ms, directory = wal.config()
            if gen:
                self.log_dirs.add(directory)
        if pending is None:
            return 0
        gen, size = pending
        if entry[1] != gen or entry[2] is None:
            if entry[2] is not None:
                os.close(entry[2])
                entry[2] = None
            try:
                entry[2] = os.open(wal.path(gen), os.O_RDONLY)
            except FileNotFoundError:
                return 0
            entry[1] = gen
        os.fsync(entry[2])
        if os.fstat(entry[2]).st_nlink == 0:  # deleted under us: its entries are nowhere
            log.error("the log of %s was deleted; its logged writes fail until it is reopened", wal.what)
            wal.suspend()
            return 0
        wal.mark_synced(gen, size)
        return 1

    def _forget_log(self, name: str) -> None:
        q, _gen, fd, lanes = self._logs.pop(name)
        for _lane, _g, lane_fd in lanes.values():
            if lane_fd is not None:
                os.close(lane_fd)
        if fd is not None:
            os.close(fd)
        q.close()

    def _forget_stream(self, key: str) -> None:
        s, parts = self._stream_logs.pop(key)
        for _part, _gen, fd in parts.values():
            if fd is not None:
                os.close(fd)
        s.close()

    def close(self) -> None:
        """Detach what ``sync_logs`` kept attached and open."""
        for name in list(self._logs):
            self._forget_log(name)
        for key in list(self._stream_logs):
            self._forget_stream(key)

    def open_all_wals(self) -> None:
        for q in self._each_queue():
            self.open_wal(q)
        for s in self._each_stream():
            try:
                self.open_stream(s)
            except StreamNotFound:
                pass
