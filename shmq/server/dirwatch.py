"""Which files of a directory were written, and whether the directory went away: Linux
inotify, through ctypes.

Strategy: the write-ahead logs are appended to by every process that puts (local
producers write them themselves, the C paths included), so no one process sees every
write; the kernel does. A watch on the data dir lets the log syncer sleep while nothing
is written and hear of the first write at once, without polling. The watch costs each
write a little kernel work, so the syncer holds it only while it is idle (``add`` /
``remove``). A directory's own IN_DELETE_SELF comes only once no file in it is open (a
log's writers keep theirs open), so its removal is watched for in its parent
(``REMOVED``: IN_DELETE or IN_MOVED_FROM naming it), which hears of it at once. Events
are read without blocking; ``fileno`` is for ``select``.
"""

import ctypes
import errno
import os
import struct

__all__ = ["DirWatch", "GONE", "WRITTEN", "REMOVED", "IN_Q_OVERFLOW"]

IN_MODIFY = 0x2
IN_MOVED_FROM = 0x40
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x1000000
IN_MASK_ADD = 0x20000000
GONE = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED  # the watched directory itself is no longer there
WRITTEN = IN_MODIFY | IN_CREATE  # a file in the directory written to, or made
REMOVED = IN_DELETE | IN_MOVED_FROM  # an entry of the directory deleted, or moved away
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name, NUL-padded)

_libc = None


def _lib():
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.inotify_init1.argtypes = [ctypes.c_int]
        lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        lib.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        _libc = lib
    return _libc


def _check(rc: int, what: str) -> int:
    if rc < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return rc


class DirWatch:
    """One inotify instance watching directories for writes and creations in them and
    for their own deletion or move. OSError from the constructor where inotify is not
    to be had (not Linux, or the per-user limit of instances reached)."""

    def __init__(self):
        try:
            lib = _lib()
        except (OSError, AttributeError) as e:
            raise OSError(errno.ENOSYS, f"inotify is not available: {e}") from None
        self._fd = _check(lib.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC), "inotify_init1")
        self._paths = {}  # wd -> path

    def fileno(self) -> int:
        return self._fd

    def add(self, path: str, events: int = WRITTEN) -> int:
        """Watch directory ``path`` for ``events`` (``WRITTEN``, ``REMOVED``; its own going,
        ``GONE``, always); returns its watch descriptor (the same one, its events added
        to, for a path watched already). OSError if it is not there."""
        mask = events | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_MASK_ADD
        wd = _check(_lib().inotify_add_watch(self._fd, os.fsencode(path), mask), f"watching {path}")
        self._paths[wd] = path
        return wd

    def remove(self, wd: int) -> None:
        """Stop watching (its IN_IGNORED event follows); a watch the kernel dropped already is no error."""
        self._paths.pop(wd, None)
        _lib().inotify_rm_watch(self._fd, wd)

    def watching(self) -> list[int]:
        return list(self._paths)

    def read(self) -> list[tuple[int, int, str]]:
        """Every event queued, as (watch descriptor, mask, name of the file in the
        directory or ""), without blocking ([] when none). A watch whose directory went
        (``GONE``) is forgotten."""
        out = []
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return out
            pos = 0
            while pos + _EVENT.size <= len(data):
                wd, mask, _cookie, n = _EVENT.unpack_from(data, pos)
                name = data[pos + _EVENT.size:pos + _EVENT.size + n].rstrip(b"\0")
                pos += _EVENT.size + n
                if mask & IN_IGNORED:
                    self._paths.pop(wd, None)
                out.append((wd, mask, os.fsdecode(name)))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
