"""One broker per namespace: ``BrokerLock``, an ``flock`` on ``/dev/shm/shmq.NS.broker``.

Strategy: two brokers on one namespace fight over it — the second takes over the
write-ahead logs of the ``wal`` queues (its own data dir, its own fsync policy) — so
``shmq server`` takes this lock before anything else and refuses to start without it.
The lock file sits with the namespace it guards, in /dev/shm: whatever $SHMQ_HOME or
data dir each server was given, two brokers of one namespace meet on the same file,
and a reboot clears it with the namespace. ``flock`` is held by the open file, so the
kernel releases it when the broker dies, SIGKILL included: a stale file never stops
the next start. The holder writes who it is into the file (pid, start time, address,
data dir) for the refusal and for ``shmq doctor``; a clean stop unlinks the file (it is
one of the namespace's entries, and the test suite's leak checks see it). Because
the file can be unlinked, a locker checks, once it holds the lock, that the file it
locked is still the one under the name, else it starts over.
"""

import errno
import fcntl
import json
import os
import time

from ..engine.shm.names import broker_lock_entry
from ..engine.shm.process import current_identity, is_alive
from ..engine.shm.segment import SHM_DIR, check_namespace
from ..errors import ShmqError
from ..sharing import share_fd

__all__ = ["BrokerLock", "BrokerRunning", "lock_name", "lock_path", "read_holder", "holder"]

_HOLDER_WAIT_S = 2.0  # how long a starter waits for the holder to say who it is (or let go)


class BrokerRunning(ShmqError):
    """Another broker holds the namespace."""


def lock_name(namespace: str) -> str:
    """The lock file's name in /dev/shm (one of the namespace's entries)."""
    return broker_lock_entry(namespace)


def lock_path(namespace: str) -> str:
    return os.path.join(SHM_DIR, lock_name(check_namespace(namespace)))


def read_holder(path: str) -> dict | None:
    """What the holder of the lock file ``path`` wrote about itself, with ``alive`` (its
    process still runs); None if the file is missing, empty or being written."""
    try:
        with open(path, "rb") as f:
            info = json.loads(f.read() or b"null")
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or not isinstance(info.get("pid"), int):
        return None
    info["alive"] = isinstance(info.get("start_ms"), int) and is_alive(info["pid"], info["start_ms"])
    return info


def holder(namespace: str) -> dict | None:
    """The broker that holds (or last held) ``namespace``, as ``read_holder``."""
    return read_holder(lock_path(namespace))


def describe(info: dict) -> str:
    """``pid 1234 (tcp 127.0.0.1:7878, data dir /x)``."""
    where = []
    if info.get("port"):
        where.append(f"tcp {info.get('host')}:{info['port']}")
    if info.get("kafka_port"):
        where.append(f"kafka {info.get('kafka_host')}:{info['kafka_port']}")
    if info.get("data_dir"):
        where.append(f"data dir {info['data_dir']}")
    return f"pid {info['pid']}" + (f" ({', '.join(where)})" if where else "")


class BrokerLock:
    """The lock of one namespace's broker: ``acquire`` (BrokerRunning if another broker
    holds it), ``update`` what the file says, ``release``. A context manager."""

    def __init__(self, namespace: str, group: int | None = None):
        """``group`` (a gid): the file is 0660 with that group (a namespace shared with
        it: its members' ``shmq doctor`` and brokers read and take it), not 0600."""
        self.namespace = check_namespace(namespace)
        self.group = group
        self.path = lock_path(namespace)
        self.fd = None
        self.info = {}

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()

    def acquire(self, wait_s: float = _HOLDER_WAIT_S):
        """Take the lock. If a live broker holds it, BrokerRunning naming its pid at once;
        a holder that has not said who it is yet (starting, or ``shmq doctor`` checking
        a stale file) gets ``wait_s`` seconds to say so or to let go."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            except PermissionError:
                raise BrokerRunning(f"namespace {self.namespace!r} belongs to another user: {self.path} is "
                                    f"uid {_owner(self.path)}'s; use another --namespace") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
                info = read_holder(self.path)
                if (info is not None and info["alive"] and info.get("role", "broker") == "broker") \
                        or time.monotonic() > deadline:
                    who = describe(info) if info is not None else "a process that has not said which"
                    raise BrokerRunning(f"namespace {self.namespace!r} already has a broker: {who}; stop it "
                                        f"first, or give this one another --namespace") from None
                time.sleep(0.02)  # the holder is starting or stopping: a few ms
                continue
            try:
                st, now = os.fstat(fd), os.stat(self.path)
                same = (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino)
            except FileNotFoundError:
                same = False
            if not same:  # unlinked (a clean stop) between our open and our lock: start over
                os.close(fd)
                continue
            if self.group is not None and st.st_uid == os.geteuid():
                share_fd(fd, self.group)
            self.fd = fd
            pid, start_ms = current_identity()
            self.update(role="broker", pid=pid, start_ms=start_ms, namespace=self.namespace)
            return self

    def update(self, **info) -> None:
        """Add ``info`` to what the lock file says about its holder."""
        self.info.update(info)
        data = json.dumps(self.info).encode()
        os.pwrite(self.fd, data, 0)
        os.ftruncate(self.fd, len(data))

    def release(self) -> None:
        """Unlink the file (still ours: we hold the lock) and let go."""
        if self.fd is None:
            return
        try:
            st, now = os.fstat(self.fd), os.stat(self.path)
            if (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino):
                os.unlink(self.path)
        except FileNotFoundError:
            pass  # removed with the namespace (destroy_namespace)
        finally:
            os.close(self.fd)
            self.fd = None


def _owner(path):
    try:
        return os.stat(path).st_uid
    except OSError:
        return "?"
