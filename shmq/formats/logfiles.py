"""The write-ahead logs' files: the one owner of their names (a queue's or lane's
``NAME.wal.N``, a stream partition's ``@STREAM#P.wal.N``, a snapshot stream's high-water
file ``@STREAM#P.hwm``), the data dir's disk reserve, a high-water file's writes, and the
reading back of a partition's records from its logs by offset (``Tail``: a stream's long
tail). Below the engine: it knows files and the entries' format (``dmsq``), nothing of
shared memory; the writer of a log, ``engine.shm.wal.Log``, stands on it. docs/FORMAT.md.
"""

import bisect
import os

from . import dmsq
from ..errors import StorageError
from ..sharing import fit_to_dir

__all__ = ["wal_path", "parse_wal_name", "partition_log_name", "split_partition_name", "hwm_path", "log_files",
           "HighWater", "Tail", "LOG_FDS", "RESERVE_FILE", "reserve_path", "release_reserve"]

_PUT = dmsq.PUT
_MARK_EVERY = 64  # Tail: remember the position of every 64th entry of a file it scanned
LOG_FDS = 1  # descriptors a handle holds for a lane's or partition's file once it wrote: its log (a Log's ``fd``) or
# a snapshot stream's high-water file (a HighWater's); an fsync round holds one more of its own per log


RESERVE_FILE = "disk-reserve"  # a data dir's spare room, made by the server (``Snapshotter.keep_reserve``)


def reserve_path(directory: str) -> str:
    """``DIR/disk-reserve``: room the server sets aside in its data dir, so that what
    settles (acks, nacks, purges: entries that let the next snapshot free space) can be
    logged on a disk something filled to the last byte."""
    return os.path.join(directory, RESERVE_FILE)


def release_reserve(directory: str) -> bool:
    """Remove the data dir's reserve (the disk is full); False if there was none."""
    try:
        os.unlink(reserve_path(directory))
    except OSError:
        return False
    return True


def wal_path(directory: str, name: str, generation: int) -> str:
    """``DIR/NAME.wal.NNNNNNNN``: the one place a log's file name is made (``NAME``: a
    queue's name, or ``partition_log_name``)."""
    return os.path.join(directory, f"{name}.wal.{generation:08d}")


def parse_wal_name(entry: str) -> tuple[str, int] | None:
    """(name, generation) of a log's file name, or None if ``entry`` is not one."""
    name, sep, gen = entry.rpartition(".wal.")
    if not sep or not name or not gen.isdigit():
        return None
    return name, int(gen)


def partition_log_name(stream: str, partition: int) -> str:
    """``@STREAM#P``, the name of a stream partition's files (its logs, snapshot and
    high-water file): ``@`` and ``#`` never appear in a queue's or a stream's name, so it
    cannot be taken for a queue's, nor for another partition's."""
    return f"@{stream}#{partition}"


def split_partition_name(name: str) -> tuple[str, int] | None:
    """(stream, partition) of a ``partition_log_name``, or None if ``name`` is not one."""
    if not name.startswith("@"):
        return None
    stream, sep, p = name[1:].rpartition("#")
    if not sep or not stream or not p.isdigit():
        return None
    return stream, int(p)


def hwm_path(directory: str, name: str) -> str:
    """``DIR/@STREAM#P.hwm``: a snapshot stream partition's high-water file."""
    return os.path.join(directory, name + ".hwm")


def log_files(directory: str, name: str) -> list[tuple[int, str]]:
    """(generation, path) of every log of ``name`` in ``directory``, oldest first."""
    out = []
    for entry in os.listdir(directory):
        parsed = parse_wal_name(entry)
        if parsed is not None and parsed[0] == name:
            out.append((parsed[1], os.path.join(directory, entry)))
    return sorted(out)


class HighWater:
    """A snapshot stream partition's high-water file, as one handle writes it: each write
    says "no offset at or above this one was handed out" (as of an epoch: the count of
    snapshots of the partition), fsynced unless the broker's policy is ``never``. The
    appender that needs offsets past the mark writes it, under the partition's lock,
    before its commit (docs/FORMAT.md, "Streams")."""

    __slots__ = ("name", "what", "fd")

    def __init__(self, name: str, what: str):
        self.name = name
        self.what = what
        self.fd = None  # (path, descriptor)

    def write(self, directory: str, writes: int, epoch: int, offset: int, sync: bool) -> None:
        """Write slot ``writes % 2``; StorageError (nothing written that counts) on failure."""
        path = hwm_path(directory, self.name)
        try:
            if self.fd is None or self.fd[0] != path:
                self.close()
                try:
                    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                except FileExistsError:
                    fd = os.open(path, os.O_RDWR)
                else:
                    fit_to_dir(fd, path)
                    dmsq.fsync_dir(path)
                self.fd = (path, fd)
            os.pwrite(self.fd[1], dmsq.encode_hwm(writes, epoch, offset), (writes % 2) * dmsq.HWM_SLOT.size)
            if sync:
                os.fdatasync(self.fd[1])
        except OSError as e:
            raise StorageError(f"{self.what}: cannot write its high-water file {path}: {e.strerror or e}; "
                               "nothing was appended") from None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd[1])
            self.fd = None


class Tail:
    """The log files of one partition read back by offset: the long tail below what
    shared memory holds. Files are found by listing the directory; each file's first
    offset (the index "an index per file of its first offset is enough" asks for) and the
    position of every 64th entry scanned are remembered, so a reader going through a
    file never rescans it from its start. Reads take no lock: a file is only ever
    appended to, and a torn entry at the end of the one being written ends the read."""

    def __init__(self, name: str):
        self.name = name
        self._files = {}  # path -> (inode, first offset or None when empty)
        self._marks = {}  # path -> ([offsets], [positions]) of entries seen, sorted

    def first_offset(self, path: str) -> int | None:
        """The offset of the first entry of a log file, None if it has none (or is gone)."""
        try:
            ino = os.stat(path).st_ino
        except FileNotFoundError:
            return None
        known = self._files.get(path)
        if known is not None and known[0] == ino and known[1] is not None:
            return known[1]
        first = None
        try:
            for _pos, entry in dmsq.scan_log(path):
                if entry.op == _PUT:
                    first = entry.msg_id
                    break
        except FileNotFoundError:
            return None
        self._files[path] = (ino, first)
        self._marks.pop(path, None)
        return first

    def files(self, directory: str) -> list[tuple[int, str]]:
        """[(first offset, path)] of the files that hold entries, oldest first; forgets
        what it knew of files that are gone."""
        out = []
        listed = log_files(directory, self.name)
        for gone in set(self._files) - {path for _g, path in listed}:
            del self._files[gone]
            self._marks.pop(gone, None)
        for _gen, path in listed:
            first = self.first_offset(path)
            if first is not None:
                out.append((first, path))
        return out

    def read(self, directory: str, offset: int, max_records: int, stop: int, max_bytes: int | None = None):
        """(rows, resume): up to ``max_records`` records from ``offset`` on, below ``stop``,
        as (offset, timestamp_ns, key, headers, value or None). ``rows`` is empty when ``offset``
        is not on disk; ``resume`` is then the first offset after it that is (None: none
        below ``stop``): the offsets between were lost (a damaged or deleted file). A read
        stops where the files stop running on without a hole."""
        files = self.files(directory)
        firsts = [f for f, _p in files]
        i = bisect.bisect_right(firsts, offset) - 1
        if i < 0:
            return [], (firsts[0] if files and firsts[0] < stop else None)
        rows, budget, want = [], max_bytes, offset
        for first, path in files[i:]:
            if first > want:  # a hole between files
                break
            for pos, e in self._scan(path, want):
                if e.msg_id < want:
                    continue
                if e.msg_id >= stop or e.msg_id != want:  # memory from here, or a hole
                    break
                row = dmsq.stream_row(e.msg_id, e.attempt, e.enqueued_ns, e.headers, e.body)
                if budget is not None:
                    size = len(row[4]) if row[4] is not None else 0  # (None: a tombstone)
                    if rows and size > budget:
                        return rows, None
                    budget -= size
                rows.append(row)
                want += 1
                if len(rows) >= max_records:
                    return rows, None
            else:
                continue
            break
        if rows:
            return rows, None
        later = [f for f in firsts[i + 1:] if f > offset]
        resume = self._next_after(files[i][1], offset)
        if resume is None and later:
            resume = later[0]
        return [], (resume if resume is not None and resume < stop else None)

    def _scan(self, path, offset):
        """(position, entry) of a file's entries from the last remembered one at or
        before ``offset`` on; remembers every 64th."""
        offs, poss = self._marks.setdefault(path, ([], []))
        k = bisect.bisect_right(offs, offset) - 1
        start, seen = (poss[k], k * _MARK_EVERY) if k >= 0 else (0, 0)
        try:
            for pos, e in dmsq.scan_log(path, start):
                if e.op != _PUT:  # a publish note (dmsq.PUBLISH): no record of its own
                    continue
                if pos == start and k >= 0 and e.msg_id != offs[k]:  # the file was cut back since: rescan
                    del offs[:], poss[:]
                    yield from self._scan(path, offset)
                    return
                if seen % _MARK_EVERY == 0 and seen // _MARK_EVERY == len(offs):
                    offs.append(e.msg_id)
                    poss.append(pos)
                seen += 1
                yield pos, e
        except FileNotFoundError:  # deleted by retention meanwhile
            return

    def _next_after(self, path, offset):
        for _pos, e in self._scan(path, offset):
            if e.msg_id > offset:
                return e.msg_id
        return None
