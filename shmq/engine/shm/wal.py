"""A write-ahead log's writer: one handle's side of the log of a queue (or lane) or a
stream partition, kept in the owner's segment (its WALCFG block and two size words)
and this process's descriptor: opening, appending, cutting back, rotating, suspending.

Strategy: local producers write straight into shared memory, so the process that puts
(or appends to a stream) appends the log entry itself, under the owner's lock, before
its commit; the broker only says where the log is (directory, fsync mode, generation:
a WALCFG block of the owner's segment) and fsyncs it in batch mode. A ``Log`` is given
where that block and its two size words are, so a queue and a partition each own one.
An append is all or nothing: when the disk says no part-way, the log is cut back to
where the append began, so later appends stay readable. A log or data dir deleted under
us suspends the log (generation 0, mode SUSPENDED): appends then fail until the broker
opens a new generation. The entries' bytes are the format's (``shmq.formats.dmsq``; the
C paths write the same, docs/FORMAT.md); the files' names, reading a partition's logs
back (``Tail``) and a snapshot stream's high-water file are ``shmq.formats.logfiles``'s.
"""

import errno
import os

from . import layout as L
from .mutex import unlock as _unlock
from ...errors import ShmqError, StorageError
from ...formats import dmsq
from ...formats.logfiles import release_reserve, wal_path
from ...sharing import fit_to_dir

__all__ = ["Log"]

_ALWAYS = L.WAL_ALWAYS


class Log:
    """One handle's side of a log: the config block and size words in the owner's
    segment, and this process's descriptor ``fd``, (generation, descriptor) or None.

    ``owner`` is the Queue or Partition handle: its ``_mm`` and ``_mq`` (the segment),
    ``_acquire()`` and ``_lockp`` (its lock, let go by ``unlock``). ``name`` makes the file names, ``what``
    names the owner in errors ("queue 'orders'"); both default to a queue's. ``cfg_off`` is the WALCFG block's
    offset, ``words_off`` the offset of the two words (bytes appended to the current
    generation, bytes known fsynced).
    """

    __slots__ = ("_o", "name", "what", "_cfg", "_gen_w", "_mode_w", "_size_w", "_synced_w", "_words", "fd")

    def __init__(self, owner, name: str | None = None, what: str | None = None, cfg_off: int = L.WALCFG_OFF,
                 words_off: int = L.WAL_WORDS_OFF):
        self._o = owner
        self.name = owner.name if name is None else name
        self.what = what or f"queue {self.name!r}"
        self._cfg = cfg_off
        self._gen_w, self._mode_w = cfg_off >> 3, (cfg_off >> 3) + 1  # the generation; the fsync mode (low half)
        self._size_w, self._synced_w = words_off >> 3, (words_off >> 3) + 1
        self._words = (self._gen_w, self._mode_w, self._size_w, self._synced_w)  # for append: one load
        self.fd = None

    # --------------------------------------------------------------- config (the broker's)
    def config(self) -> tuple[int, int, int, str]:
        """(generation, fsync mode, batch ms, directory); generation 0 means no broker has
        opened a log for it yet (or it is suspended)."""
        gen, mode, ms, n, raw = L.WALCFG.unpack_from(self._o._mm, self._cfg)
        return gen, mode, ms, raw[:n].decode()

    def configure(self, directory: str, mode: int, batch_ms: int, generation: int | None = None) -> int:
        """Point the log at ``directory``. Keeps the current generation unless
        ``generation`` is given. Returns the generation."""
        raw = os.path.abspath(directory).encode()
        if len(raw) > 150:
            raise ValueError(f"data dir path is longer than 150 bytes: {directory!r}")
        o = self._o
        o._acquire()
        try:
            gen = o._mq[self._gen_w]
            if generation is not None or not gen:
                gen = generation or 1
                o._mq[self._size_w] = o._mq[self._synced_w] = 0
            L.WALCFG.pack_into(o._mm, self._cfg, gen, mode, batch_ms, len(raw), raw)
        finally:
            _unlock(o._lockp)
        return gen

    def size(self) -> int:
        """Bytes appended to the current generation."""
        return self._o._mq[self._size_w]

    def pending(self, settled: bool = False) -> tuple[int, int] | None:
        """(generation, logged bytes) when the log holds entries not yet fsynced, else None.
        ``settled``: take and let go of the owner's lock first, so an append whose bytes
        are in the file already but whose size word is not yet written (its writer holds
        the lock between the two) counts too."""
        o = self._o
        if settled:
            o._acquire()
            _unlock(o._lockp)
        mq = o._mq
        gen, size = mq[self._gen_w], mq[self._size_w]
        if not gen or size == mq[self._synced_w]:
            return None
        return gen, size

    def mark_synced(self, generation: int, size: int) -> None:
        """Record an fsync that covered the first ``size`` bytes of log ``generation``."""
        o = self._o
        mq = o._mq
        o._acquire()
        try:
            if mq[self._gen_w] == generation and mq[self._synced_w] < size <= mq[self._size_w]:
                mq[self._synced_w] = size
        finally:
            _unlock(o._lockp)

    def path(self, generation: int) -> str:
        return wal_path(self.config()[3], self.name, generation)

    def suspend(self, generation: int | None = None) -> bool:
        """The log or its data directory is gone (the broker found out): every logged put
        and ack fails with StorageError until ``configure`` opens a log again. With
        ``generation``, only if the log is still in it: a generation a snapshot rotated
        away is no longer the log, and its file is removed once the snapshot holds its
        entries. Returns whether it suspended."""
        o = self._o
        o._acquire()
        try:
            if generation is not None and o._mq[self._gen_w] != generation:
                return False
            self._suspend()
            return True
        finally:
            _unlock(o._lockp)

    def _suspend(self):
        """Generation 0, mode SUSPENDED; the batch-ms field keeps the generation the log
        had (``suspended_at``), whoever suspended it: every process's descriptor for it
        points into the file that went, so a reopen must continue after it."""
        gen, mode, ms, n, raw = L.WALCFG.unpack_from(self._o._mm, self._cfg)
        had = ms if not gen and mode == L.WAL_SUSPENDED else min(gen, 0xFFFFFFFF)
        L.WALCFG.pack_into(self._o._mm, self._cfg, 0, L.WAL_SUSPENDED, had, n, raw)

    def set_alarm(self, on: bool) -> None:
        """The server's disk alarm on this log (``WAL_ALARM``, on the mode): puts and appends
        refused (``append(..., grows=True)``), what settles logged as before."""
        o = self._o
        o._acquire()
        try:
            gen, mode, ms, n, raw = L.WALCFG.unpack_from(o._mm, self._cfg)
            new = mode | L.WAL_ALARM if on else mode & ~L.WAL_ALARM
            if new != mode:
                L.WALCFG.pack_into(o._mm, self._cfg, gen, new, ms, n, raw)
        finally:
            _unlock(o._lockp)

    def suspended_at(self) -> int:
        """The generation a suspended log had (0 if it is not suspended)."""
        gen, mode, ms, _n, _raw = L.WALCFG.unpack_from(self._o._mm, self._cfg)
        return ms if not gen and mode == L.WAL_SUSPENDED else 0

    # --------------------------------------------------------------- appending (lock held)
    def append(self, data: bytes, grows: bool = True) -> None:
        """Append log entries, fsync by policy; before the caller commits. All or
        nothing: on failure the log is cut back and StorageError raised. ``grows``: entries
        that add (puts, appends), which the disk alarm refuses; acks and purges do not."""
        mq = self._o._mq
        gen_w, mode_w, size_w, synced_w = self._words
        n = len(data)
        mode = mq[mode_w] & 0xFFFFFFFF
        always = mode & L.WAL_POLICY == _ALWAYS
        if mode & L.WAL_ALARM and grows and mq[gen_w]:
            raise StorageError(f"{self.what}: disk alarm: its data dir {self.config()[3]} has less free space than "
                               "the server's --disk-free-limit: puts and appends are refused until there is room "
                               "again (acks and purges go on); nothing was changed")
        released = False
        while True:
            gen = mq[gen_w]
            fd_gen = self.fd
            start = mq[size_w]
            if not gen:
                raise self._not_open()
            try:
                fd = fd_gen[1] if fd_gen is not None and fd_gen[0] == gen else self._open(gen)
                written = os.write(fd, data)
                if written != n:  # a short write: finish it
                    view = memoryview(data)[written:]
                    while view:
                        view = view[os.write(fd, view):]
                if always:
                    os.fsync(fd)
                    if os.fstat(fd).st_nlink == 0:  # synced into a file no one can find again
                        self._suspend()
                        self.close()  # (never used again, whatever generation comes next)
                        raise FileNotFoundError(errno.ENOENT, "the log file was deleted")
            except OSError as e:
                if mq[gen_w] == gen and self.fd is not None and self.fd[0] == gen:
                    self._cut(self.fd[1], start)
                # what settles frees space once snapshotted: on a full disk it takes the data dir's reserve
                if e.errno == errno.ENOSPC and not grows and not released:
                    released = release_reserve(self.config()[3])
                    if released:
                        continue
                raise self.failed(e, gen) from None
            break
        size = start + n
        mq[size_w] = size
        if always:
            mq[synced_w] = size
        # batch: the broker fsyncs every log each batch interval (``Snapshotter.sync_logs``)

    def failed(self, e: OSError, gen: int | None = None) -> StorageError:
        """The StorageError of an append that failed with ``e`` (the log is as it was)."""
        if gen is None:
            gen = self.fd[0] if self.fd is not None else 0
        directory = self.config()[3]
        if not os.path.isdir(directory):  # (the broker suspends the log when it sees it too)
            return self._dir_gone(directory)
        return StorageError(f"{self.what}: cannot append to its write-ahead log {self.path(gen)}: "
                            f"{e.strerror or e}; nothing was changed")

    def _dir_gone(self, directory: str) -> StorageError:
        return StorageError(f"{self.what}: its data directory {directory} is gone; write-ahead logged writes "
                            "fail until it is back; nothing was changed")

    def _not_open(self) -> ShmqError:
        """Why there is no log to append to (generation 0): suspended because its data
        directory is gone -- looked at now, so as never to say so of one that is there --
        or because its file was deleted; or no broker opened it yet."""
        _gen, mode, had, n, raw = L.WALCFG.unpack_from(self._o._mm, self._cfg)
        directory = raw[:n].decode()
        if mode != L.WAL_SUSPENDED:
            return ShmqError(f"{self.what} is durability='wal' but no shmq server with a --data-dir "
                             "has opened its write-ahead log yet")
        if not os.path.isdir(directory):
            return self._dir_gone(directory)
        return StorageError(f"{self.what}: its write-ahead log {wal_path(directory, self.name, had)} was deleted "
                            "(its data directory is there); write-ahead logged writes fail until the server opens "
                            "a new one, at its next snapshot; nothing was changed")

    def _cut(self, fd, size):
        """Cut the log back to ``size`` bytes after a failed append. If even that fails,
        later appends go to the next generation, so none lands after the damage
        (recovery reads this log up to it, then the next)."""
        try:
            if os.fstat(fd).st_size > size:
                os.ftruncate(fd, size)
        except OSError:
            mq = self._o._mq
            mq[self._gen_w] += 1
            mq[self._size_w] = mq[self._synced_w] = 0

    def _open(self, gen: int) -> int:
        """This process's descriptor for log generation ``gen`` (not 0)."""
        self.close()
        path = self.path(gen)
        try:  # the first appender creates the log, and makes its name durable
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        else:
            fit_to_dir(fd, path)
            dmsq.fsync_dir(path)
        self.fd = (gen, fd)
        return fd

    def rotate(self) -> None:
        """Start a new generation (for a snapshot): the old log is fsynced first, so every
        put that returned is durable either in it or in the snapshot being taken. Lock held."""
        gen, mode, ms, directory = self.config()
        if not gen:
            return
        try:
            fd = os.open(wal_path(directory, self.name, gen), os.O_WRONLY)
        except FileNotFoundError:
            pass
        else:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        raw = directory.encode()
        L.WALCFG.pack_into(self._o._mm, self._cfg, gen + 1, mode, ms, len(raw), raw)
        self._o._mq[self._size_w] = self._o._mq[self._synced_w] = 0

    def repair(self, limit: int | None = None) -> None:
        """After a holder died inside the lock: an append it left half-written is cut off,
        so the log ends where the last complete append ended; with ``limit`` (a stream
        partition's next offset), so are whole entries at or past it, logged by an append
        that never committed. Lock held.

        The size word is trusted only when the file agrees with it: a holder that died
        between starting a generation and zeroing its size word leaves the word stale,
        and then the file's own entries say where the log ends."""
        gen, _mode, _ms, directory = self.config()
        if not gen:
            return
        mq = self._o._mq
        path = wal_path(directory, self.name, gen)
        try:
            actual = os.path.getsize(path)
        except FileNotFoundError:
            mq[self._size_w] = mq[self._synced_w] = 0  # the generation's first append makes it
            return
        size = mq[self._size_w]
        if limit is None and actual >= size:
            self.cut_back(size)
            return
        end = 0
        try:
            for pos, entry in dmsq.scan_log(path):
                if limit is not None and entry.msg_id >= limit:
                    break
                end = pos + dmsq.RECORD_OVERHEAD + len(entry.headers) + len(entry.body)
        except OSError:
            return
        self.cut_back(end)

    def cut_back(self, size: int) -> None:
        """Cut the current generation back to ``size`` bytes (entries past it were never
        committed). Lock held."""
        gen, _mode, _ms, directory = self.config()
        if not gen:
            return
        mq = self._o._mq
        try:
            if os.path.getsize(wal_path(directory, self.name, gen)) > size:
                os.truncate(wal_path(directory, self.name, gen), size)
        except FileNotFoundError:
            pass
        mq[self._size_w] = size
        mq[self._synced_w] = min(mq[self._synced_w], size)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd[1])
            self.fd = None
