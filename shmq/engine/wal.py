"""A queue's write-ahead log: the one owner of log file names, and of opening,
appending to, cutting back, rotating and suspending a log.

Strategy: local producers write straight into shared memory, so the process that puts
appends the log entry itself, under the queue's lock, before its commit; the broker
only says where the log is (directory, fsync mode, generation: the WALCFG words of the
segment) and fsyncs it in batch mode. An append is all or nothing: when the disk says
no part-way, the log is cut back to where the append began, so later appends stay
readable. A log or data dir deleted under us suspends the log (generation 0, mode
SUSPENDED): appends then fail until the broker opens a new generation. The entries'
bytes are the format's (``shmq.dmsq``; the C paths write the same, docs/FORMAT.md).
"""

import errno
import os

from .. import dmsq
from ..errors import ShmqError, StorageError
from . import layout as L

__all__ = ["wal_path", "parse_wal_name", "Log"]

I_WAL_GEN, I_WAL_MODE, I_WAL_SIZE, I_WAL_SYNCED = L.I_WAL_GEN, L.I_WAL_MODE, L.I_WAL_SIZE, L.I_WAL_SYNCED
_ALWAYS = L.WAL_ALWAYS


def wal_path(directory: str, queue: str, generation: int) -> str:
    """``DIR/QUEUE.wal.NNNNNNNN``: the one place a log's file name is made."""
    return os.path.join(directory, f"{queue}.wal.{generation:08d}")


def parse_wal_name(entry: str) -> tuple[str, int] | None:
    """(queue, generation) of a log's file name, or None if ``entry`` is not one."""
    name, sep, gen = entry.rpartition(".wal.")
    if not sep or not name or not gen.isdigit():
        return None
    return name, int(gen)


class Log:
    """One queue handle's side of the queue's log: the config words in the segment, and
    this process's descriptor ``fd``, (generation, descriptor) or None."""

    __slots__ = ("_q", "fd")

    def __init__(self, q):
        self._q = q
        self.fd = None

    # --------------------------------------------------------------- config (the broker's)
    def config(self) -> tuple[int, int, int, str]:
        """(generation, fsync mode, batch ms, directory); generation 0 means no broker has
        opened a log for it yet (or it is suspended)."""
        gen, mode, ms, n, raw = L.WALCFG.unpack_from(self._q._mm, L.WALCFG_OFF)
        return gen, mode, ms, raw[:n].decode()

    def configure(self, directory: str, mode: int, batch_ms: int, generation: int | None = None) -> int:
        """Point the log at ``directory``. Keeps the current generation unless
        ``generation`` is given. Returns the generation."""
        raw = os.path.abspath(directory).encode()
        if len(raw) > 150:
            raise ValueError(f"data dir path is longer than 150 bytes: {directory!r}")
        q = self._q
        q._acquire()
        try:
            gen = L.WALCFG.unpack_from(q._mm, L.WALCFG_OFF)[0]
            if generation is not None or not gen:
                gen = generation or 1
                q._mq[I_WAL_SIZE] = q._mq[I_WAL_SYNCED] = 0
            L.WALCFG.pack_into(q._mm, L.WALCFG_OFF, gen, mode, batch_ms, len(raw), raw)
        finally:
            q._release()
        return gen

    def pending(self) -> tuple[int, int] | None:
        """(generation, logged bytes) when the log holds entries not yet fsynced, else None."""
        mq = self._q._mq
        gen, size = mq[I_WAL_GEN], mq[I_WAL_SIZE]
        if not gen or size == mq[I_WAL_SYNCED]:
            return None
        return gen, size

    def mark_synced(self, generation: int, size: int) -> None:
        """Record an fsync that covered the first ``size`` bytes of log ``generation``."""
        q = self._q
        mq = q._mq
        q._acquire()
        try:
            if mq[I_WAL_GEN] == generation and mq[I_WAL_SYNCED] < size <= mq[I_WAL_SIZE]:
                mq[I_WAL_SYNCED] = size
        finally:
            q._release()

    def path(self, generation: int) -> str:
        return wal_path(self.config()[3], self._q.name, generation)

    def suspend(self) -> None:
        """The log or its data directory is gone (the broker found out): every logged put
        and ack fails with StorageError until ``configure`` opens a log again."""
        q = self._q
        q._acquire()
        try:
            self._suspend()
        finally:
            q._release()

    def _suspend(self):
        _gen, _mode, _ms, n, raw = L.WALCFG.unpack_from(self._q._mm, L.WALCFG_OFF)
        L.WALCFG.pack_into(self._q._mm, L.WALCFG_OFF, 0, L.WAL_SUSPENDED, 0, n, raw)

    # --------------------------------------------------------------- appending (lock held)
    def append(self, data: bytes) -> None:
        """Append log entries, fsync by policy; before the caller commits. All or
        nothing: on failure the log is cut back and StorageError raised."""
        mq = self._q._mq
        gen = mq[I_WAL_GEN]
        fd_gen = self.fd
        start = mq[I_WAL_SIZE]
        n = len(data)
        try:
            fd = fd_gen[1] if fd_gen is not None and fd_gen[0] == gen else self._open(gen)
            written = os.write(fd, data)
            if written != n:  # a short write: finish it
                view = memoryview(data)[written:]
                while view:
                    view = view[os.write(fd, view):]
            if mq[I_WAL_MODE] & 0xFFFFFFFF == _ALWAYS:
                os.fsync(fd)
                if os.fstat(fd).st_nlink == 0:  # synced into a file no one can find again
                    self._suspend()
                    raise FileNotFoundError(errno.ENOENT, "the log file was deleted (is the data directory gone?)")
        except OSError as e:
            if mq[I_WAL_GEN] == gen and self.fd is not None and self.fd[0] == gen:
                self._cut(self.fd[1], start)
            raise self.failed(e, gen) from None
        size = start + n
        mq[I_WAL_SIZE] = size
        if mq[I_WAL_MODE] & 0xFFFFFFFF == _ALWAYS:
            mq[I_WAL_SYNCED] = size
        # batch: the broker fsyncs every log each batch interval (``Snapshotter.sync_logs``)

    def failed(self, e: OSError, gen: int | None = None) -> StorageError:
        """The StorageError of an append that failed with ``e`` (the log is as it was)."""
        if gen is None:
            gen = self.fd[0] if self.fd is not None else 0
        return StorageError(f"queue {self._q.name!r}: cannot append to its write-ahead log {self.path(gen)}: "
                            f"{e.strerror or e}; nothing was changed")

    def _cut(self, fd, size):
        """Cut the log back to ``size`` bytes after a failed append. If even that fails,
        later appends go to the next generation, so none lands after the damage
        (recovery reads this log up to it, then the next)."""
        try:
            if os.fstat(fd).st_size > size:
                os.ftruncate(fd, size)
        except OSError:
            mq = self._q._mq
            mq[I_WAL_GEN] += 1
            mq[I_WAL_SIZE] = mq[I_WAL_SYNCED] = 0

    def _open(self, gen: int) -> int:
        """This process's descriptor for log generation ``gen``."""
        q = self._q
        if not gen:
            directory = self.config()[3]
            if q._mq[I_WAL_MODE] & 0xFFFFFFFF == L.WAL_SUSPENDED:
                raise StorageError(f"queue {q.name!r}: its data directory {directory} is gone; write-ahead "
                                   "logged puts and acks fail until it is back")
            raise ShmqError(f"queue {q.name!r} is durability='wal' but no shmq server with a --data-dir "
                            "has opened its write-ahead log yet")
        self.close()
        path = self.path(gen)
        try:  # the first appender creates the log, and makes its name durable
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        else:
            dmsq.fsync_dir(path)
        self.fd = (gen, fd)
        return fd

    def rotate(self) -> None:
        """Start a new generation (for a snapshot): the old log is fsynced first, so every
        put that returned is durable either in it or in the snapshot being taken."""
        gen, mode, ms, directory = self.config()
        if not gen:
            return
        try:
            fd = os.open(wal_path(directory, self._q.name, gen), os.O_WRONLY)
        except FileNotFoundError:
            pass
        else:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        raw = directory.encode()
        L.WALCFG.pack_into(self._q._mm, L.WALCFG_OFF, gen + 1, mode, ms, len(raw), raw)
        self._q._mq[I_WAL_SIZE] = self._q._mq[I_WAL_SYNCED] = 0

    def repair(self) -> None:
        """After a holder died inside the lock: an append it left half-written is cut off,
        so the log ends where the last complete append ended."""
        gen, _mode, _ms, directory = self.config()
        if not gen:
            return
        path, size = wal_path(directory, self._q.name, gen), self._q._mq[I_WAL_SIZE]
        try:
            if os.path.getsize(path) > size:
                os.truncate(path, size)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd[1])
            self.fd = None
