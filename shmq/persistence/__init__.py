"""Snapshots of queues and streams to .dmsq files, and what a reboot lost rebuilt from them.

Strategy: shared memory survives any process crash, the broker's included, but not a
reboot. A snapshot copies a queue's unsettled messages, or each stream partition's
records (the lock is held only for one copy of the ring), and writes them with
``shmq.formats.dmsq`` (temp file, fsync, rename, directory fsync), so a crash mid-snapshot leaves
the previous file whole. On start, a queue or stream whose segments are still there is
kept as it is (memory is newer than any file); one whose segments are gone is rebuilt
from its files. Links never depend on the order of names: the lost queues are all made
(each after its dead-letter queue) before any is filled, the exchanges' bindings are
put back after every queue and stream, and a link whose target is nowhere is a warning
naming both. A damaged file (snapshot or log) is replayed up to the damage, set aside
as ``.corrupt`` and reported in one line; start-up goes on. A full disk or a vanished
data directory is reported, never fatal: snapshots are retried every interval, and while
the directory is gone every logged write fails (``Log.suspend``) rather than return
without a log behind it.

A stream partition's files are named ``@STREAM#P`` (``formats.logfiles.partition_log_name``):
``@STREAM#P.dmsq`` (its snapshot), ``@STREAM#P.wal.N`` (its logs, which stay as the long
tail until retention deletes whole files) and ``@STREAM#P.hwm`` (a snapshot stream's
high-water file). A laned queue's snapshot is one file, its lanes' logs are each lane's
(``NAME.wal.N``, ``NAME#1.wal.N``, ...: ``names.lane_name``). The namespace's exchanges and bindings are one file,
``exchanges.dmsx`` (``dmsq.EXCHANGES_FILE``), written when the table changes and read back
only when shared memory has no table. Layouts: docs/FORMAT.md; the promises:
docs/DESIGN.md, Persistence.

Modules (all above the engine; the formats they write are ``shmq.formats``'s, below it,
and a log's writer is the engine's, ``engine.shm.wal``): ``files`` (a data dir's files,
and damaged ones set aside), ``queues`` (a queue's snapshot, restore, rebuild),
``streams`` (a stream's), ``recovery`` (on start), ``upgrade`` (before it: an older
shmq's memory rebuilt from the files, a newer one's files refused), ``snapshotter`` (the
broker's rounds, the logs opened and suspended with the data dir), ``backup``, and the
Kafka listener's state and the transaction coordinator's journal (``kafka_state``,
``kafka_txns``).
"""

import importlib

# name -> its module: loaded on first use (a process that only reads files, a Spark
# executor's dmsq reader, loads no engine)
_EXPORTS = {"snapshot_path": "files", "is_data_file": "files", "remove_data_dir": "files",
            "snapshot_queue": "queues", "restore_file": "queues", "restore_files": "queues",
            "snapshot_stream": "streams", "apply_retention": "streams",
            "recover": "recovery", "restore_exchanges": "recovery", "Snapshotter": "snapshotter"}

__all__ = list(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
