"""A stream's snapshot and logs: each partition's snapshot, log rolls and retention, and
rebuilding a stream a reboot lost from its files (docs/STREAMS.md, Durability)."""

import logging
import os
import time

from ..formats import dmsq
from ..engine.broker import STREAM_SETTINGS, Broker, stream_settings
from ..engine.streams.stream import Stream
from ..formats.logfiles import hwm_path, log_files, partition_log_name, split_partition_name
from .files import owner_of, read_snapshot_file, set_aside, snapshot_path
from .queues import logs_from, snapshot_digest, upgraded_note

log = logging.getLogger("shmq.persistence")


_ROLL_MIN_BYTES = 4096


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
    groups = committed_offsets(s)  # before the copies: no commit is past their end
    settings = stream_settings(s)
    roll_bytes, roll_ns = _roll(s)
    records = 0
    for p in range(s.partitions):
        image = s._part(p).export(roll_bytes, roll_ns)
        extra = partition_extra(s, p, image, groups)
        name = partition_log_name(s.name, p)
        path = snapshot_path(data_dir, name)
        records += len(image.rows)
        digest = None
        if written is not None and image.hwm_epoch is None:  # a record's offset says all of it
            digest = snapshot_digest(name, int(s.created_at * 1e9), sorted(settings.items()), extra,
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


def committed_offsets(s: Stream) -> dict:
    """{group: {partition: offset}} of ``s``'s groups: read before a snapshot's copies of
    the partitions, so that no committed offset it keeps is past the records it keeps."""
    return {g: s.committed(g) for g in s.groups()}


def partition_extra(s: Stream, p: int, image, groups: dict) -> dict:
    """What a partition's snapshot keeps besides the stream's settings (docs/FORMAT.md,
    Streams): its index, next offset, groups' committed offsets (``committed_offsets``),
    first log generation not covered ("wal"), high-water epoch ("snapshot"), publishers."""
    extra = {"stream": s.name, "partition": p, "next_offset": image.next_offset,
             "committed": {g: c.get(p) for g, c in groups.items()}}
    if image.wal_from is not None:
        extra["wal_from"] = image.wal_from
    if image.hwm_epoch is not None:
        extra["hwm_epoch"] = image.hwm_epoch
    if image.txns:
        extra["published"] = [[tid.hex(), batch, end] for tid, batch, end in image.txns]
    return extra


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
    for path, entries, error, error_offset in logs_from(data_dir, name, wal_from):
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
            set_aside(path, error, len(entries), error_offset)
    return end


def _stream_files(data_dir: str, name: str) -> set[int]:
    """The partitions of stream ``name`` that have a file in ``data_dir``."""
    parts = set()
    for entry in os.listdir(data_dir):
        if owner_of(entry) == "@" + name:
            stem = entry.split(".wal.")[0] if ".wal." in entry else entry.rsplit(".", 1)[0]
            parts.add(split_partition_name(stem)[1])
    return parts


def rebuild_stream(broker: Broker, data_dir: str, name: str, upgraded_from: int | None = None) -> bool:
    """Create stream ``name`` from its files: per partition, the snapshot's records and
    the logs after it, the next offset (past every offset a log or the high-water file
    says was handed out), and the groups' committed offsets. False if the files say too
    little (no snapshot header and no log). ``upgraded_from``: the layout version of the
    older shmq's memory that held it (``upgrade``), said in its line."""
    parts = _stream_files(data_dir, name)
    images, settings, created = {}, None, None
    for p in sorted(parts):
        header, records = read_snapshot_file(snapshot_path(data_dir, partition_log_name(name, p)), "record(s)")
        images[p] = (header.settings if header is not None else None, {r.msg_id: _stream_row(r) for r in records})
        if header is not None and settings is None:
            settings, created = header.settings, header.created_ns
    logged = any(log_files(data_dir, partition_log_name(name, p)) for p in parts)
    if settings is None:
        if not logged:
            log.error("%s: stream %s has no readable snapshot and no log; not rebuilt", data_dir, name)
            return False
        settings = {"durability": "wal", "partitions": max(parts) + 1}  # the rest: the defaults
    create = {k: settings[k] for k in STREAM_SETTINGS if k in settings}  # (an older snapshot: the others' defaults)
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
            total += s._part(p).restore([rows[o] for o in sorted(rows)], end, epoch, table, compacted=s.compact)
            for group, offset in st.get("committed", {}).items():
                offsets = committed.setdefault(group, {})
                if offset is not None:
                    offsets[p] = offset
        for group, offsets in committed.items():
            s.groups_table.set_offsets(group, offsets)
    finally:
        s.close()
    log.info("stream %s rebuilt from %s: %d record(s) in memory, %d group(s)%s", name, data_dir, total,
             len(committed), upgraded_note(upgraded_from),
             extra={"event": "stream_rebuilt", "stream": name, "data_dir": data_dir, "records": total,
                    "groups": len(committed), "upgraded_from": upgraded_from})
    return True


# ------------------------------------------------------------------------------ the broker's side
