"""lazyfs: a FUSE filesystem that forgets, at a power loss, everything not fsynced.

Strategy: shared memory dies with a reboot, but the page cache dies with the power, and
deleting /dev/shm in a test keeps every written byte: ``always``, ``batch:MS`` and
``never`` look the same. Like Jepsen's LazyFS, this filesystem keeps two states of
everything, in memory: a file's *volatile* content (what ``write``/``truncate`` made
it) and its *durable* content (what it was at its last ``fsync``/``fdatasync``); a
directory's volatile entries (after ``create``/``rename``/``unlink``/``link``/``mkdir``)
and its durable ones (at its last ``fsync`` of the directory, ``fsyncdir``). A power
loss puts every file and directory back to its durable state (a new file whose name
was never made durable is gone; one whose data was never synced is empty) and then
refuses every change and every sync with EIO until the power is back, so processes
still running cannot write after the loss. Modes, owners and times are not modelled;
``fstat`` of an open file that was unlinked fails (ESTALE: libfuse's path-based API
cannot name it), and files cannot be mmap'd (``direct_io``).

It runs as its own process (``python -m tests.lazyfs MOUNTPOINT [--journal FILE]``),
single-threaded, so requests are handled one at a time in the order the kernel queued
them: a control request sent after the killed processes were reaped comes after
everything they had sent. The kernel caches nothing (``direct_io``, zero entry and
attribute timeouts), so after a loss every process sees the durable state. Control is
through extended attributes of the mount's root:

- ``setxattr(root, "user.lazyfs.power", b"off")``: the power goes now; ``b"on"``: back;
- ``setxattr(root, "user.lazyfs.arm", b"OP GLOB N")``: the power goes just before the
  N-th next OP (create, rename, unlink, write, fsync, fsyncdir) on a path matching
  GLOB (fnmatch, paths from the root, e.g. ``/q.dmsq.tmp``); that OP fails;
- ``setxattr(root, "user.lazyfs.slow", b"OP GLOB SECONDS")``: a slow disk, each such OP
  takes that long (the whole filesystem waits, as behind one device queue);
- ``getxattr(root, "user.lazyfs.stats")``: JSON counters.

At each loss the process writes ``lost <monotonic time>`` on its stdout (``ready`` once
mounted). With ``--journal`` it appends ``<monotonic time> <op> <path> <path or ->``
for every namespace change and every sync. ``main`` exits with ``SKIP`` (77) when FUSE
cannot be used here: no /dev/fuse, no libfuse 3 or mfusepy, the mount refused.
``Mount`` starts and drives it from a test (``Unavailable``: FUSE cannot be used).
"""

import argparse
import errno
import fnmatch
import json
import os
import select
import shutil
import stat
import subprocess
import sys
import time

__all__ = ["LazyFS", "Mount", "Unavailable", "SKIP", "main"]

SKIP = 77
CONTROL = "user.lazyfs."
_WRITE_MODES = os.O_WRONLY | os.O_RDWR


class Node:
    """A file or a directory: its volatile state, and what of it is durable."""

    def __init__(self, ino, mode, uid, gid):
        self.ino, self.mode, self.uid, self.gid = ino, mode, uid, gid
        self.nlink = 0
        self.mtime_ns = time.time_ns()
        if stat.S_ISDIR(mode):
            self.entries, self.durable_entries = {}, {}
        else:
            self.data, self.durable = bytearray(), b""

    @property
    def is_dir(self):
        return stat.S_ISDIR(self.mode)


class Handle:
    """An open file or directory, and the path it was opened by (for arming and the journal)."""

    def __init__(self, node, path, flags):
        self.node, self.path, self.flags = node, path, flags


def _err(code):
    return OSError(code, os.strerror(code))


class LazyFS:
    """The mfusepy operations (single-threaded: no locking)."""

    use_ns = True

    def __init__(self, journal=None, out=1):
        self.out = out
        self.journal = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600) if journal else None
        self.next_ino = 1
        self.root = self._new_node(stat.S_IFDIR | 0o755)
        self.root.nlink = 2
        self.handles = {}
        self.next_fh = 1
        self.dead = False
        self.armed = None  # [op, glob, remaining]
        self.slow = {}  # (op, glob) -> seconds each such op takes
        self.counts = {k: 0 for k in ("write", "fsync", "fsyncdir", "create", "rename", "unlink", "losses")}

    # ------------------------------------------------------------------ the model
    def _new_node(self, mode):
        uid, gid = os.getuid(), os.getgid()
        node = Node(self.next_ino, mode, uid, gid)
        self.next_ino += 1
        return node

    def _resolve(self, path):
        node = self.root
        for part in path.strip("/").split("/") if path.strip("/") else ():
            if not node.is_dir or part not in node.entries:
                raise _err(errno.ENOENT)
            node = node.entries[part]
        return node

    def _parent(self, path):
        head, _, name = path.rstrip("/").rpartition("/")
        parent = self._resolve(head or "/")
        if not parent.is_dir:
            raise _err(errno.ENOTDIR)
        return parent, name

    def _handle(self, fh):
        h = self.handles.get(fh)
        if h is None:  # opened before a power loss
            raise _err(errno.EIO)
        return h

    def _open_handle(self, node, path, flags):
        fh = self.next_fh  # never reused: a descriptor from before a loss stays invalid
        self.next_fh += 1
        self.handles[fh] = Handle(node, path, flags)
        return fh

    def _change(self, op, path, path2=None):
        """Before a change or a sync: refuse it without power; lose power if armed for it."""
        if self.dead:
            raise _err(errno.EIO)
        if op in self.counts:
            self.counts[op] += 1
        if self.armed and self.armed[0] == op and fnmatch.fnmatchcase(path or "", self.armed[1]):
            self.armed[2] -= 1
            if self.armed[2] == 0:
                self.armed = None
                self.power_off()
                raise _err(errno.EIO)
        if op != "write":
            self._log(op, path, path2)
        for (slow_op, glob), seconds in self.slow.items():
            if slow_op == op and fnmatch.fnmatchcase(path or "", glob):
                time.sleep(seconds)  # a slow disk: nothing else is served meanwhile

    def _log(self, *words):
        if self.journal is not None:
            line = " ".join([f"{time.monotonic():.6f}"] + [w or "-" for w in words if w is not False])
            os.write(self.journal, (line + "\n").encode())

    def power_off(self):
        """Every file and directory goes back to its durable state; then no changes."""
        t = time.monotonic()
        self._revert(self.root, set())
        self.handles.clear()
        self.dead = True
        self.counts["losses"] += 1
        self._log("power-off", "/")
        os.write(self.out, f"lost {t!r}\n".encode())

    def _revert(self, node, seen):
        """Put ``node`` and all that is durably reachable from it back to its durable
        state, recounting links; nothing else is reachable any more."""
        seen.add(node.ino)
        if not node.is_dir:
            node.data, node.nlink = bytearray(node.durable), 0
            return
        node.entries = dict(node.durable_entries)
        node.nlink = 2 if node is self.root else 1
        for child in node.entries.values():
            if child.ino not in seen:
                self._revert(child, seen)
            child.nlink += 1
            node.nlink += child.is_dir

    def power_on(self):
        self.dead = False
        self._log("power-on", "/")

    def _link(self, parent, name, node):
        old = parent.entries.get(name)
        if old is not None:
            old.nlink -= 1
        parent.entries[name] = node
        node.nlink += 1

    # ------------------------------------------------------------------ FUSE operations
    def init_with_config(self, conn, config):
        if config is not None:  # libfuse 3: no kernel caching; unlinked open files stay usable
            config.entry_timeout = config.attr_timeout = config.negative_timeout = 0
            config.direct_io = config.hard_remove = config.use_ino = config.nullpath_ok = 1
        os.write(self.out, b"ready\n")

    def destroy(self, path):
        pass

    def getattr(self, path, fh=None):
        node = self._handle(fh).node if fh is not None else self._resolve(path)
        size = 4096 if node.is_dir else len(node.data)
        return {"st_mode": node.mode, "st_ino": node.ino, "st_nlink": node.nlink, "st_uid": node.uid,
                "st_gid": node.gid, "st_size": size, "st_blocks": (size + 511) // 512, "st_blksize": 4096,
                "st_atime": node.mtime_ns, "st_mtime": node.mtime_ns, "st_ctime": node.mtime_ns}

    def access(self, path, amode):
        self._resolve(path)
        return 0

    def statfs(self, path):
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": 1 << 22, "f_bfree": 1 << 22, "f_bavail": 1 << 22,
                "f_files": 1 << 20, "f_ffree": 1 << 20, "f_favail": 1 << 20, "f_namemax": 255}

    def opendir(self, path):
        node = self._resolve(path)
        if not node.is_dir:
            raise _err(errno.ENOTDIR)
        return self._open_handle(node, path, os.O_RDONLY)

    def readdir(self, path, fh):
        node = self._handle(fh).node
        entries = [(".", node), ("..", node)] + list(node.entries.items())
        return [(name, {"st_mode": n.mode, "st_ino": n.ino}, 0) for name, n in entries]

    def releasedir(self, path, fh):
        self.handles.pop(fh, None)
        return 0

    def fsyncdir(self, path, datasync, fh):
        h = self._handle(fh)
        self._change("fsyncdir", h.path)
        h.node.durable_entries = dict(h.node.entries)
        return 0

    def mkdir(self, path, mode):
        self._change("mkdir", path)
        parent, name = self._parent(path)
        if name in parent.entries:
            raise _err(errno.EEXIST)
        node = self._new_node(stat.S_IFDIR | (mode & 0o7777))
        node.nlink = 1
        self._link(parent, name, node)
        parent.nlink += 1
        return 0

    def rmdir(self, path):
        self._change("rmdir", path)
        parent, name = self._parent(path)
        node = self._resolve(path)
        if not node.is_dir:
            raise _err(errno.ENOTDIR)
        if node.entries:
            raise _err(errno.ENOTEMPTY)
        del parent.entries[name]
        parent.nlink -= 1
        return 0

    def create(self, path, mode, flags):
        self._change("create", path)
        parent, name = self._parent(path)
        node = parent.entries.get(name)
        if node is None:
            node = self._new_node(stat.S_IFREG | (mode & 0o7777))
            self._link(parent, name, node)
        elif flags & os.O_EXCL:
            raise _err(errno.EEXIST)
        return self._open_handle(node, path, flags)

    def open(self, path, flags):
        node = self._resolve(path)
        if flags & os.O_TRUNC:
            self._change("truncate", path)
            node.data = bytearray()
        elif flags & _WRITE_MODES and self.dead:
            raise _err(errno.EIO)
        return self._open_handle(node, path, flags)

    def read(self, path, size, offset, fh):
        return bytes(self._handle(fh).node.data[offset:offset + size])

    def write(self, path, data, offset, fh):
        h = self._handle(fh)
        self._change("write", h.path)
        buf = h.node.data
        if h.flags & os.O_APPEND:
            offset = len(buf)
        if offset > len(buf):
            buf.extend(bytes(offset - len(buf)))
        buf[offset:offset + len(data)] = data
        h.node.mtime_ns = time.time_ns()
        return len(data)

    def truncate(self, path, length, fh=None):
        h = self._handle(fh) if fh is not None else Handle(self._resolve(path), path, 0)
        self._change("truncate", h.path)
        node = h.node
        if length <= len(node.data):
            del node.data[length:]
        else:
            node.data.extend(bytes(length - len(node.data)))
        return 0

    def flush(self, path, fh):
        return 0

    def release(self, path, fh):
        self.handles.pop(fh, None)
        return 0

    def fsync(self, path, datasync, fh):
        h = self._handle(fh)
        self._change("fsync", h.path)
        if not h.node.is_dir:
            h.node.durable = bytes(h.node.data)
        return 0

    def unlink(self, path):
        self._change("unlink", path)
        parent, name = self._parent(path)
        node = self._resolve(path)
        if node.is_dir:
            raise _err(errno.EISDIR)
        del parent.entries[name]
        node.nlink -= 1
        return 0

    def rename(self, old, new):
        self._change("rename", old, new)
        src_parent, src_name = self._parent(old)
        node = self._resolve(old)
        dst_parent, dst_name = self._parent(new)
        target = dst_parent.entries.get(dst_name)
        if target is node:
            return 0
        if target is not None and target.is_dir and (not node.is_dir or target.entries):
            raise _err(errno.EISDIR if not node.is_dir else errno.ENOTEMPTY)
        if target is not None and node.is_dir and not target.is_dir:
            raise _err(errno.ENOTDIR)
        del src_parent.entries[src_name]
        node.nlink -= 1
        if node.is_dir:  # its ".." moves
            src_parent.nlink -= 1
            dst_parent.nlink += 1 - (target is not None)
        self._link(dst_parent, dst_name, node)
        return 0

    def link(self, target, source):
        self._change("link", source, target)
        node = self._resolve(source)
        parent, name = self._parent(target)
        if name in parent.entries:
            raise _err(errno.EEXIST)
        self._link(parent, name, node)
        return 0

    def chmod(self, path, mode):
        node = self._resolve(path)
        node.mode = (node.mode & ~0o7777) | (mode & 0o7777)
        return 0

    def chown(self, path, uid, gid):
        node = self._resolve(path)
        node.uid = node.uid if uid == -1 else uid
        node.gid = node.gid if gid == -1 else gid
        return 0

    def utimens(self, path, times=None):
        self._resolve(path).mtime_ns = times[1] if times else time.time_ns()
        return 0

    # ------------------------------------------------------------------ control
    def setxattr(self, path, name, value, options, position=0):
        if path != "/" or not name.startswith(CONTROL):
            raise _err(errno.ENOTSUP)
        what, value = name[len(CONTROL):], value.decode(errors="replace")
        words = value.split()
        try:
            if what == "power" and value in ("off", "on"):
                self.power_off() if value == "off" else self.power_on()
            elif what == "arm" and len(words) == 3 and int(words[2]) > 0:
                self.armed = [words[0], words[1], int(words[2])]
            elif what == "slow" and len(words) == 3:
                self.slow[words[0], words[1]] = float(words[2])
            else:
                raise ValueError(value)
        except ValueError:
            raise _err(errno.EINVAL) from None
        return 0

    def getxattr(self, path, name, position=0):
        if path == "/" and name == CONTROL + "stats":
            return json.dumps({"dead": self.dead, "armed": self.armed, **self.counts}).encode()
        raise _err(errno.ENODATA)

    def listxattr(self, path):
        return []


class Unavailable(Exception):
    """FUSE cannot be used on this machine (the reason is the message)."""


class Mount:
    """A lazyfs process mounted at ``path`` (created if needed), driven from outside."""

    def __init__(self, path, journal=None, timeout=30.0):
        if shutil.which("fusermount3") is None:
            raise Unavailable("no fusermount3 (Debian: apt-get install fuse3)")
        os.makedirs(path, exist_ok=True)
        self.path = os.path.abspath(path)
        self.errors = self.path.rstrip("/") + ".lazyfs-stderr"
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        cmd = [sys.executable, "-m", "tests.lazyfs", self.path] + (["--journal", journal] if journal else [])
        with open(self.errors, "w") as err:  # a file, not a pipe: the filesystem must never block on it
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, cwd=repo,
                                         env={**os.environ, "PYTHONPATH": repo})
        self._buf = b""
        try:
            line = self._line(timeout)
        except TimeoutError:
            line = ""
        if line != "ready":
            self._failed_start(timeout)

    def _failed_start(self, timeout):
        """Reap a process that did not mount; say why (Unavailable: FUSE cannot be used)."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.proc.stdout.close()
        if self.mounted():
            subprocess.run(["fusermount3", "-u", "-z", self.path], capture_output=True)
        with open(self.errors) as f:
            reason = f.read().strip() or f"exit status {rc}"
        if rc == SKIP:
            raise Unavailable(reason)
        raise RuntimeError(f"lazyfs did not start: {reason}")

    def _line(self, timeout):
        """The next line the filesystem prints ("" if it exits first)."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError(f"lazyfs at {self.path} said nothing for {timeout}s")
            chunk = os.read(fd, 4096)
            if not chunk:
                return ""
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()

    def _control(self, what, value):
        os.setxattr(self.path, CONTROL + what, value.encode())

    def power_off(self) -> float:
        """The power goes now; returns when (time.monotonic())."""
        self._control("power", "off")
        return self.wait_lost(10)

    def arm(self, op, glob, n=1):
        """The power goes just before the ``n``-th next ``op`` on a path matching ``glob``."""
        self._control("arm", f"{op} {glob} {n}")

    def slow(self, op, glob, seconds):
        """From now on each ``op`` on a path matching ``glob`` takes ``seconds``."""
        self._control("slow", f"{op} {glob} {seconds}")

    def wait_lost(self, timeout) -> float:
        """Wait for a power loss (armed, or asked); returns when it happened."""
        line = self._line(timeout)
        assert line.startswith("lost "), line
        return float(line.split()[1])

    def power_on(self):
        self._control("power", "on")

    def stats(self) -> dict:
        return json.loads(os.getxattr(self.path, CONTROL + "stats"))

    def mounted(self) -> bool:
        with open("/proc/self/mounts") as f:
            return any(line.split()[1] == self.path for line in f)

    def unmount(self, timeout=10.0):
        """Unmount and end the process. Raises if the mount is left behind (then unmounts
        it lazily), or if the filesystem failed: it died, or an operation raised."""
        r = subprocess.run(["fusermount3", "-u", self.path], capture_output=True, text=True)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.proc.stdout.close()
        problems = [] if r.returncode == 0 else [f"fusermount3 -u: {r.stderr.strip()}"]
        if self.mounted():
            subprocess.run(["fusermount3", "-u", "-z", self.path], capture_output=True)
            problems.append("the mount was left behind")
        if rc != 0:
            problems.append(f"lazyfs exited with status {rc}")
        with open(self.errors) as f:
            errors = f.read()
        if "Traceback" in errors:  # an operation raised: mfusepy logged it and answered EINVAL
            problems.append(errors.strip())
        if problems:
            raise RuntimeError(f"lazyfs at {self.path}: " + "; ".join(problems))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tests.lazyfs", description=__doc__.split("\n")[0])
    ap.add_argument("mountpoint")
    ap.add_argument("--journal", help="append namespace changes and syncs here (outside the mount)")
    args = ap.parse_args(argv)
    if not os.path.exists("/dev/fuse"):
        print("lazyfs: no /dev/fuse on this machine", file=sys.stderr)
        return SKIP
    try:
        import mfusepy
    except (ImportError, OSError) as e:  # not installed, or no libfuse found
        print(f"lazyfs: mfusepy cannot be used: {e}", file=sys.stderr)
        return SKIP
    if mfusepy.fuse_version_major != 3:
        print(f"lazyfs: needs libfuse 3, found {mfusepy.fuse_version_major}", file=sys.stderr)
        return SKIP

    class Fuse(mfusepy.FUSE):
        def truncate_fuse_3(self, path, length, fip):  # mfusepy drops the handle of ftruncate
            fh = fip.contents.fh if fip else None
            return self.operations.truncate(None if path is None else path.decode(), length, fh)

    try:
        Fuse(LazyFS(args.journal), args.mountpoint, foreground=True, nothreads=True, default_permissions=True,
             auto_unmount=True, fsname="lazyfs")
    except RuntimeError as e:  # fuse_main failed: the mount was refused
        print(f"lazyfs: cannot mount {args.mountpoint}: {e}", file=sys.stderr)
        return SKIP
    return 0


if __name__ == "__main__":
    sys.exit(main())
