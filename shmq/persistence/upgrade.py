"""A namespace an older shmq made, brought to this one's layouts: its queues and streams
removed from shared memory and rebuilt from the data dir's files, or the start refused in
one line that says what to run; and a data dir written by a newer shmq refused whole.

Strategy: another layout's memory is never read (its version word is all this shmq knows
of it), so nothing is copied from it: the objects come back from their snapshots and
logs, the formats every version reads back to version 1 (docs/FORMAT.md). Every check
comes first, so a refusal changes nothing: an object of a newer layout, one with no files
to come back from, or a process still mapping the namespace's memory. Only then are the
old segments removed (``recover`` next finds them gone and rebuilds them, saying so in
one line each, with the version they had).
"""

import logging
import os

from ..formats import dmsq
from ..auth import default_data_dir
from ..engine.shm.registry import DELETING, LIVE
from ..engine.shm.names import queue_segment, stream_base
from ..engine.shm.versions import Outdated, outdated
from ..errors import ShmqError
from .files import owner_of
from .queues import _rebuild_settings

__all__ = ["check_files", "upgrade", "upgrade_queues", "mapped_by"]

log = logging.getLogger("shmq.persistence")


def check_files(data_dir: str) -> None:
    """ShmqError, in one line, if a snapshot or the exchange table in ``data_dir`` is of a
    format version newer than this shmq reads: it is left as it is, for that shmq (a
    reader would otherwise take it for damage and set it aside)."""
    try:
        entries = sorted(os.listdir(data_dir))
    except FileNotFoundError:
        return
    for entry in entries:
        path = os.path.join(data_dir, entry)
        why = None
        try:
            if entry.endswith(dmsq.SUFFIX):
                with dmsq.SnapshotReader(path) as r:
                    why = r.error if r.unsupported else None
            elif entry == dmsq.EXCHANGES_FILE:
                why = _newer_exchanges(path)
        except OSError:
            continue  # unreadable: recovery says so
        if why:
            raise ShmqError(f"{why}: written by a newer shmq; run that one on {data_dir} (or move the file out of "
                            "it and start again)")


def _newer_exchanges(path: str) -> str | None:
    """What is newer about an exchange table file, if its version is past this shmq's."""
    with open(path, "rb") as f:
        prefix = f.read(dmsq.PREFIX.size)
    if len(prefix) < dmsq.PREFIX.size:
        return None  # damaged: read_exchanges says so
    magic, version, _reserved, _n = dmsq.PREFIX.unpack(prefix)
    if magic != dmsq.EXCHANGES_MAGIC or version <= dmsq.EXCHANGES_VERSION:
        return None
    return f"{path}: unsupported exchange table version {version} (this shmq reads version {dmsq.EXCHANGES_VERSION})"


def upgrade(broker, data_dir: str | None) -> dict[str, int]:
    """Before ``recover``: remove from shared memory the namespace's queues and streams of
    an older layout, each of which ``data_dir`` has files to rebuild it from. Returns
    {name (a stream's as ``@NAME``): the layout version it had} for ``recover`` to say.
    ShmqError, in one line and with nothing removed, if one is of a newer layout, if one
    has no files (``data_dir`` None: the server runs without one), or if a process
    still maps the namespace's memory."""
    found = outdated(broker)
    if not found:
        return {}
    _refuse_newer(broker.namespace, found)
    missing = [o for o in found if data_dir is None or not _has_files(data_dir, o)]
    if missing:
        raise ShmqError(_no_files(broker.namespace, missing, data_dir))
    _refuse_mapped(broker.namespace, found)
    return _remove(broker, found)


def upgrade_queues(broker, names) -> dict[str, int]:
    """``shmq restore``'s part: remove the queues of ``names`` (those its files fill) that
    have an older layout, so they are made again with this one's; the namespace's other
    objects are left as they are. Returns {name: the layout version it had}; ShmqError
    as ``upgrade``'s."""
    names = set(names)
    found = [o for o in outdated(broker) if o.kind == "queue" and o.name in names]
    if not found:
        return {}
    _refuse_newer(broker.namespace, found)
    _refuse_mapped(broker.namespace, found)
    return _remove(broker, found)


def _remove(broker, found: list[Outdated]) -> dict[str, int]:
    """Unlink each one's segments and free its registry entry, as a delete does (a delete
    would attach first, which another layout refuses)."""
    reg = broker._reg()
    gone = {}
    with reg:
        for o in found:
            entry = o.name if o.kind == "queue" else "@" + o.name
            index, state = reg.find(entry)
            if state != LIVE:
                continue
            reg.set_state(index, DELETING, entry)  # a crash from here on: the next locker finishes it
            (broker._unlink_queue_files if o.kind == "queue" else broker._unlink_stream_files)(o.name)
            reg.free(index)
            gone[entry] = o.found
    return gone


def _has_files(data_dir: str, o: Outdated) -> bool:
    """Whether ``data_dir`` holds what rebuilds ``o``: a queue's readable snapshot or its
    logs; any file of a stream's partitions."""
    try:
        if o.kind == "queue":
            return _rebuild_settings(data_dir, o.name) is not None
        return any(owner_of(entry) == "@" + o.name for entry in os.listdir(data_dir))
    except OSError:
        return False


def _what(found: list[Outdated]) -> str:
    """``queue(s) 'a', 'b' (layout version 3) and stream(s) 's' (layout version 4)``"""
    parts = []
    for kind in ("queue", "stream"):
        these = [o for o in found if o.kind == kind]
        if these:
            versions = ", ".join(str(v) for v in sorted({o.found for o in these}))
            parts.append(f"{kind}(s) {', '.join(repr(o.name) for o in these)} (layout version {versions}; "
                         f"this shmq's is {these[0].expected})")
    return " and ".join(parts)


def _refuse_newer(namespace: str, found: list[Outdated]) -> None:
    newer = [o for o in found if not o.older]
    if newer:
        raise ShmqError(f"namespace {namespace!r} holds {_what(newer)}, made by a newer shmq: run that one on it")


def _no_files(namespace: str, missing: list[Outdated], data_dir: str | None) -> str:
    """The one-line refusal when an older object has nothing to be rebuilt from: the two
    commands to run."""
    where = f"no files in {data_dir}" if data_dir is not None else "no --data-dir (--no-persist)"
    data_dir = data_dir or default_data_dir(namespace)
    return (f"namespace {namespace!r} holds {_what(missing)}, made by an older shmq, and {where} to rebuild "
            f"them from: stop every process using it, then run `shmq snapshot --namespace {namespace} --data-dir "
            f"{data_dir}` with the older shmq and `shmq server --namespace {namespace} --data-dir {data_dir}` with "
            f"this one (or drop them: `shmq namespace destroy {namespace}`)")


def mapped_by(namespace: str, found: list[Outdated]) -> list[int]:
    """The other processes (this user's: /proc shows no more) that map a segment of one
    of ``found``: those would go on using the old memory after it is removed."""
    shm = "/dev/shm"
    wanted = {shm + (queue_segment if o.kind == "queue" else stream_base)(namespace, o.name)
              for o in found}  # a lane's or partition's: then "#N"
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/maps") as f:
                paths = {line.split(maxsplit=5)[-1].strip().partition("#")[0] for line in f if shm in line}
        except OSError:
            continue  # gone, or another user's
        if paths & wanted:
            pids.append(int(entry))
    return sorted(pids)


def _refuse_mapped(namespace: str, found: list[Outdated]) -> None:
    pids = mapped_by(namespace, found)
    if pids:
        raise ShmqError(f"namespace {namespace!r} holds {_what(found)}, and process(es) {', '.join(map(str, pids))} "
                        "still use it: stop every process using the namespace, then start again")
