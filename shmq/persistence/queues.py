"""A queue's snapshot and logs: writing the snapshot (rotating a "wal" queue's log in the
same critical section), restoring files, and rebuilding queues a reboot lost (both make
every queue first, linked to its dead-letter queue, then fill them)."""

import array
import hashlib
import logging
import os
import time
from typing import NamedTuple

from ..formats import dmsq
from ..engine import maintenance
from ..engine.broker import Broker
from ..engine.queues.queue import Queue
from ..engine.shm.names import lane_name
from ..formats.logfiles import split_partition_name
from ..errors import LayoutMismatch, ShmqError
from ..model.settings import QUEUE_SETTINGS
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


# the settings a snapshot keeps that ``create_queue`` takes back (format version 2 adds the work-queue options;
# auto_delete and expires came later, in the same open map)
_CREATE_KEYS = frozenset(QUEUE_SETTINGS)


def _create_settings(settings: dict) -> dict:
    return {k: v for k, v in settings.items() if k in _CREATE_KEYS}


def _targets_first(links: dict) -> list[str]:
    """The names of ``links`` (queue -> its dead-letter queue or None), each dead-letter
    queue among them before the queues that name it (in a cycle, one of them comes first)."""
    order, seen = [], set()
    for name in sorted(links):
        chain = []  # a queue names one dead-letter queue: follow the chain to its end
        while name in links and name not in seen:
            seen.add(name)
            chain.append(name)
            name = links[name]
        order += reversed(chain)
    return order


def create_queues(broker: Broker, wanted: dict, on_error=None) -> list[tuple[str, str]]:
    """Create the queues of ``wanted`` (name -> ``create_queue``'s settings) that are not
    there yet, empty, each linked to its dead-letter queue: those first, and a queue of a
    cycle of them made again (still empty) once the others are there. Fill them after.

    A dead-letter queue that is nowhere cannot be linked (``create_queue`` refuses it): the
    queue is made without it, and the pair is returned, (queue, dead-letter queue), for the
    caller to say. ``on_error(name, exc)``: a queue that cannot be made (default: raise)."""
    there = set(broker.list_queues())
    unlinked = []

    def make(name, settings):
        try:
            broker.create_queue(name, **settings).close()
        except (ValueError, TypeError, OSError, ShmqError) as e:
            if on_error is None:
                raise
            on_error(name, e)
            return False
        there.add(name)
        return True

    for name in _targets_first({n: s.get("dead_letter_queue") for n, s in wanted.items()}):
        dlq = wanted[name].get("dead_letter_queue")
        if name in there:
            continue
        if dlq and dlq != name and dlq not in there:  # (its own: create_queue says why not)
            if make(name, {k: v for k, v in wanted[name].items() if k != "dead_letter_queue"}):
                unlinked.append((name, dlq))
        else:
            make(name, wanted[name])
    for name, dlq in list(unlinked):
        if dlq in there:  # the first of a cycle: made again, linked
            broker.delete_queue(name)
            there.discard(name)
            unlinked.remove((name, dlq))
            make(name, wanted[name])
    return unlinked


def upgraded_note(was: int | None) -> str:
    """What a rebuilt object's line adds when an older layout's memory held it (``upgrade``)."""
    return "" if was is None else f" (upgraded: shared memory held it in an older shmq's layout version {was})"


def dropped_link(name: str, dlq: str, why: str) -> str:
    """The warning for a queue made without its dead-letter queue, because there is none."""
    return (f"queue {name!r} has lost its dead-letter queue {dlq!r}: there is no queue {dlq!r} ({why}); "
            f"messages {name!r} rejects or delivers max_deliveries times are dropped")


def _queue_snapshot_header(path: str):
    """(header, None) of a queue's snapshot to restore, or (None, why it is not one)."""
    with dmsq.SnapshotReader(path) as r:
        header, error = r.header, r.error
    if header is None:
        return None, error or f"{path}: not a snapshot"
    if split_partition_name(header.queue) is not None:
        return None, (f"{path}: a snapshot of a stream partition ({header.queue}); streams are "
                      "rebuilt from their data dir by `shmq server --data-dir`")
    return header, None


RESTORE_MODES = ("replace", "append")


class Restored(NamedTuple):
    """What ``restore_files`` did with one file: the queue it filled ("" if none), the
    messages restored, the one-line error that stopped the file's replay (or None), and,
    into a queue that held messages, ``replaced`` (mode "replace": the ready and delayed
    messages it held, dropped first) and ``skipped`` (the file's messages not restored
    because the queue held their ids: in flight, with "replace"; any, with "append")."""

    queue: str
    messages: int
    error: str | None
    replaced: int = 0
    skipped: int = 0


class QueuesNotEmpty(ValueError):
    """A restore into queues that hold messages, with no mode that says what to do with
    them: nothing was changed. ``held``: {queue: messages it holds}."""

    def __init__(self, held: dict):
        self.held = held
        said = ", ".join(f"{name!r} holds {n} message(s)" for name, n in sorted(held.items()))
        super().__init__(f"queue {said}: restoring would add the file's messages to them (delivered twice where "
                         "they are the same): restore with mode='replace' (emptied first) or mode='append' (the "
                         "ids it holds skipped)")


def _held(broker: Broker, names) -> dict:
    """{queue: messages it holds, ready, in flight or delayed} of the queues of ``names``
    that are there and hold some (one an older shmq's layout holds: ``upgrade``'s)."""
    held = {}
    for name in sorted(set(names) & set(broker.list_queues())):
        try:
            q = broker.queue(name)
        except LayoutMismatch:
            continue
        try:
            s = q.stats()
        finally:
            q.close()
        if s.ready + s.in_flight + s.delayed:
            held[name] = s.ready + s.in_flight + s.delayed
    return held


def restore_files(broker: Broker, paths, into: str | None = None, mode: str | None = None):
    """Load .dmsq files into queues, as ``restore_file`` does each, in two steps: every
    queue is made first (``create_queues``: each linked to its dead-letter queue when
    that is one of them or there already), then filled. ``into`` only with one file.
    Returns ([``Restored``] in the order of ``paths``, [(queue, dead-letter queue)] of the
    links dropped because the dead-letter queue is nowhere). A file that is no queue's
    snapshot restores nothing: ``Restored("", 0, why)``. A queue of ``paths`` that an
    older shmq's layout holds is removed and made again from its file (``upgrade``).

    A queue that holds messages (ready, in flight or delayed) is filled only as ``mode``
    says: "replace" drops its ready and delayed messages first (those in flight stay with
    their consumers, and a file's message of the same id is not restored again), "append"
    restores only the messages whose ids it does not hold. Without a mode, QueuesNotEmpty
    naming each such queue, before anything is changed."""
    if mode is not None and mode not in RESTORE_MODES:
        raise ValueError(f"mode must be one of {', '.join(RESTORE_MODES)} or None, not {mode!r}")
    paths = list(paths)
    if into is not None and len(paths) != 1:
        raise ValueError(f"into={into!r} names one queue: give one file, not {len(paths)}")
    names, refused, wanted = {}, {}, {}
    for path in paths:
        header, refused[path] = _queue_snapshot_header(path)
        if header is not None:
            names[path] = into or header.queue
            wanted.setdefault(names[path], _create_settings(header.settings))
    held = _held(broker, wanted)
    if held and mode is None:
        raise QueuesNotEmpty(held)
    from .upgrade import upgrade_queues  # (it reads snapshots with this module's helpers)

    for name, was in upgrade_queues(broker, wanted).items():  # an older shmq's memory: made again, from the file
        log.warning("queue %s: shared memory held it in an older shmq's layout version %d, which this shmq cannot "
                    "read; removed, and made again from the file", name, was,
                    extra={"event": "queue_upgraded", "queue": name, "upgraded_from": was})
    unlinked = create_queues(broker, wanted)
    results = []
    emptied = set()
    for path in paths:
        if path not in names:
            results.append(Restored("", 0, refused[path]))
            continue
        result = dmsq.read_snapshot(path)
        name, replaced = names[path], 0
        q = broker.queue(name)
        try:
            if mode == "replace" and name in held and name not in emptied:  # (two files into one queue: once)
                replaced = q.purge(delayed=True)
                emptied.add(name)
            n = maintenance.import_messages(
                q, ((r.msg_id, r.attempt, r.enqueued_ns, r.headers, r.body) for r in result.records),
                skip_present=name in held)
        finally:
            q.close()
        results.append(Restored(name, n, result.error, replaced, len(result.records) - n))
    return results, unlinked


def restore_file(broker: Broker, path: str, into: str | None = None,
                 mode: str | None = None) -> tuple[str, int, str | None]:
    """Load a .dmsq file into queue ``into`` (default: the queue it was taken from),
    creating it with the file's settings if needed. Returns (queue, messages, error):
    ``error`` is the one-line description of damage that stopped the replay (the
    records before it are restored), or None. A file that is no queue's snapshot (a
    stream partition's: streams are rebuilt by ``recover``) loads nothing: ("", 0, why).
    A dead-letter queue that is not there is left out, with a warning logged
    (``restore_files`` restores a queue and its dead-letter queue together). A queue that
    holds messages: as ``mode`` says (``restore_files``; None: QueuesNotEmpty)."""
    (result,), unlinked = restore_files(broker, [path], into, mode)
    for name, dlq in unlinked:
        log.warning("%s", dropped_link(name, dlq, "restore both with restore_files, or create it first"),
                    extra={"event": "link_dropped", "queue": name, "dead_letter_queue": dlq})
    return tuple(result[:3])


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


def _rebuild_settings(data_dir: str, name: str) -> dict | None:
    """What queue ``name`` is rebuilt with: its snapshot's settings, or a "wal" queue's
    defaults when it has logs only; None when it has neither (or the header is damaged:
    reading the records says so)."""
    try:
        with dmsq.SnapshotReader(snapshot_path(data_dir, name)) as r:
            if r.header is not None:
                return r.header.settings
    except FileNotFoundError:
        pass
    return {"durability": "wal"} if wal_files(data_dir, name) else None


def recover_queues(broker: Broker, data_dir: str, names, upgraded: dict | None = None) -> list[str]:
    """Rebuild the queues of ``names`` whose segments are gone from their files in
    ``data_dir``: all are made first, each linked to its dead-letter queue
    (``create_queues``; a dead-letter queue that is nowhere is a warning naming both),
    then each is filled from its snapshot and logs. Returns the names rebuilt.
    ``upgraded``: {name: layout version} of those an older shmq's memory held (``upgrade``),
    said in their line."""
    lost = sorted(set(names) - set(broker.list_queues()))  # the live ones: memory is newer than any file
    settings = {name: _rebuild_settings(data_dir, name) for name in lost}
    failed = set()

    def cannot(name, e):
        failed.add(name)
        log.error("%s: cannot rebuild queue %s: %s", data_dir, name, e)

    wanted = {name: _create_settings(s) for name, s in settings.items() if s is not None}
    for name, dlq in create_queues(broker, wanted, cannot):
        log.warning("%s", dropped_link(name, dlq, f"none in shared memory, none rebuilt from {data_dir}"),
                    extra={"event": "link_dropped", "queue": name, "dead_letter_queue": dlq, "data_dir": data_dir})
    rebuilt = []
    for name in lost:
        _header, snapshot = read_snapshot_file(snapshot_path(data_dir, name), "message(s)")
        if settings[name] is None:
            continue
        records = {r.msg_id: (r.msg_id, r.attempt, r.enqueued_ns, r.headers, r.body) for r in snapshot}
        wal_from = settings[name].get("wal_from", 0)
        if not isinstance(wal_from, list):  # (a laned queue's first snapshot, before its logs opened: all of them)
            wal_from = [wal_from] * settings[name].get("lanes", 1)
        for j, first in enumerate(wal_from):
            _replay_logs(data_dir, lane_name(name, j), first, records)
        if name in failed:
            continue
        try:
            q = broker.queue(name)
            try:
                n = maintenance.import_messages(q, records.values())
            finally:
                q.close()
        except (ValueError, TypeError, OSError, ShmqError) as e:
            cannot(name, e)
            continue
        was = (upgraded or {}).get(name)
        log.info("queue %s rebuilt from %s: %d message(s)%s", name, data_dir, n, upgraded_note(was),
                 extra={"event": "queue_rebuilt", "queue": name, "data_dir": data_dir, "messages": n,
                        "upgraded_from": was})
        rebuilt.append(name)
    return rebuilt
