"""A data dir's files: their names, what each belongs to, removing them, and setting a
damaged one aside (``.corrupt``) with one line said."""

import logging
import os
import re

from ..formats import dmsq
from ..sharing import fit_to_dir
from ..formats.logfiles import RESERVE_FILE, log_files, parse_wal_name, split_partition_name

log = logging.getLogger("shmq.persistence")

HWM_SUFFIX = ".hwm"
KAFKA_STATE_FILE = "kafka-state.json"  # the Kafka listener's producer sequences and commit metadata (kafka_state.py)
KAFKA_TXNS_FILE = "kafka-txns.log"  # the Kafka listener's transactions (kafka_txns.py)
REGISTRY_FILE = "registry.id"  # which registry of the namespace the server last ran on (recovery.py)


def write_atomically(path: str, data: bytes) -> None:
    """``path`` made of ``data`` (0600; 0660 in a data dir shared with a group) or left as
    it was: a temp file beside it, fsynced, renamed over it. OSError as it comes, with no
    temp file left."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fit_to_dir(fd, path)
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def snapshot_path(data_dir: str, name: str) -> str:
    return os.path.join(data_dir, name + dmsq.SUFFIX)


def wal_files(data_dir: str, name: str) -> list[tuple[int, str]]:
    """(generation, path) of every write-ahead log of queue ``name``, oldest first."""
    return log_files(data_dir, name)


def lanes_of(q) -> list:
    """The lane handles of a queue handle (a plain queue is its own one lane)."""
    return getattr(q, "_lanes", None) or [q]


def owner_of(entry: str) -> str | None:
    """What a data-dir entry (snapshot, log, high-water file) belongs to: a queue's name,
    ``@NAME`` for a stream's, or None."""
    if entry.endswith(dmsq.SUFFIX):
        stem = entry[: -len(dmsq.SUFFIX)]
    elif entry.endswith(HWM_SUFFIX):
        stem = entry[: -len(HWM_SUFFIX)]
    else:
        parsed = parse_wal_name(entry)
        stem = parsed[0] if parsed is not None else None
    if stem is None:
        return None
    part = split_partition_name(stem)
    if part is not None:
        return "@" + part[0]
    if stem.startswith("@") or entry.endswith(HWM_SUFFIX):
        return None
    return stem.rpartition("#")[0] or stem  # a lane's logs are its queue's


def is_data_file(entry: str) -> bool:
    """Whether a data-dir entry is one of shmq's files: a snapshot, a log, a high-water
    file, the exchange table, the Kafka listener's state, the registry's identity, the disk reserve, or one of those set aside
    (``.corrupt``, ``.damaged``) or half-written (``.tmp``)."""
    for name in (KAFKA_STATE_FILE, KAFKA_TXNS_FILE, REGISTRY_FILE, RESERVE_FILE):
        if entry == name or re.fullmatch(re.escape(name) + r"\.(damaged|\d+\.tmp)", entry):
            return True
    stem = entry
    if stem.endswith(dmsq.TMP_SUFFIX):
        stem = stem[:-len(dmsq.TMP_SUFFIX)]
    head, sep, tail = stem.rpartition(dmsq.CORRUPT_SUFFIX)
    if sep and (not tail or (tail[0] == "." and tail[1:].isdigit())):
        stem = head
    return stem == dmsq.EXCHANGES_FILE or owner_of(stem) is not None


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


def set_aside(path, error, replayed, keep=0):
    """A log replayed up to its damage is moved aside as ``.corrupt`` (out of reach of the
    clean-up of old logs) and said in one line; with ``keep``, its first ``keep`` bytes
    (the intact part) are written back under its name."""
    aside = dmsq.quarantine(path)
    if keep:
        _write_prefix(aside, path, keep)
    log.error("%s; replayed %d entries before it; file moved to %s", error, replayed, aside,
              extra={"event": "file_quarantined", "file": path, "moved_to": aside, "error": error,
                     "replayed": replayed})


def read_snapshot_file(path, what):
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


def _write_prefix(src, dest, size):
    """``dest`` := the first ``size`` bytes of ``src``, crash-safely."""
    with open(src, "rb") as f:
        data = f.read(size)
    tmp = dest + dmsq.TMP_SUFFIX
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        fit_to_dir(fd, dest)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, dest)
    dmsq.fsync_dir(dest)
