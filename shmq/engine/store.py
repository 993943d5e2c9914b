"""The keyed store: named SQLite databases in /dev/shm, one per store, for values, counters
and sets that many processes read and change at once (``Broker.store``).

Strategy: a store holds keys, not messages, so it is not a ring: it is a SQLite file
named ``shmq.<namespace>.kv.<name>.db`` beside the namespace's segments (its ``-wal`` and
``-shm`` with it), 0600 (0660 with the group of a namespace shared with one). SQLite
gives what a store needs without new shared-memory code: atomic read-modify-write across
processes (an incr or a set-add is one ``BEGIN IMMEDIATE`` transaction), locks the kernel
releases when a holder is SIGKILLed, a journal that keeps a killed writer's half-done
write invisible, rows that take what they hold (no page per key), and the stdlib. On a
tmpfs there is nothing to sync (``synchronous=OFF``). A store is memory only: gone at
reboot or ``shmq namespace destroy``.

Expiry is wall-clock: a key past its time reads as absent everywhere, and its row goes at
the next write to it, or at a sweep (``sweep``: the server's housekeeping rounds, and each
handle's writes at most once a ``SWEEP_EVERY_S``), which also gives the freed pages back.
A waiting ``get`` looks at the store's ``stamp`` (``PRAGMA data_version``, which moves when
another connection commits, and this handle's own writes) each time a watch of its -wal
file rings (``walwatch``: inotify, any process's commit), or where there is no watch, after
a growing pause, between ``POLL_MIN_S`` and ``POLL_MAX_S``.

A handle is thread-safe (one connection, one lock; a waiting get lets go of the lock
while it pauses) and fork-safe (a child opens its own connection; the parent's is never
closed there). A store deleted or made anew under a handle is seen at its next call (the
file's inode): the handle opens the new one.
"""

import os
import re
import sqlite3
import threading
import time
import urllib.parse

from ..errors import LockTimeout, ShmqError, StorageError, WrongType
from ..model.checks import MAX_STORE_KEY_CHARS as MAX_KEY_CHARS
from ..model.checks import check_incr, check_ttl, check_wait
from ..model.checks import check_store_key as check_key
from ..model.checks import check_store_value as _check_value
from ..sharing import check_deletable, share_fd
from . import walwatch
from .shm.names import STORE_SUFFIX, store_file, store_prefix
from .shm.segment import SHM_DIR, check_namespace, check_queue_name

__all__ = ["Store", "store_path", "store_names", "unlink_store", "MAX_KEY_CHARS", "SWEEP_EVERY_S", "STORE_FDS"]

SWEEP_EVERY_S = 1.0  # a handle's writes sweep the expired rows at most this often
STORE_FDS = 3  # descriptors an open Store holds: SQLite's database file, its -wal and its -shm
BUSY_TIMEOUT_S = 10.0  # the longest a write waits for another writer's transaction
POLL_MIN_S, POLL_MAX_S = 0.0005, 0.02  # a waiting get's pauses where it cannot watch: from, doubling up to
WATCHED_S = 0.1  # the longest a waiting get that watches the store sleeps between looks
_SUFFIX = STORE_SUFFIX
_SIDECARS = ("-wal", "-shm", "-journal")
_VALUE, _SET = 0, 1
_INT = re.compile(rb"-?[0-9]{1,19}")  # an incr's value: ASCII decimal
_MAX_INT = 2**63 - 1
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY NOT NULL, kind INTEGER NOT NULL, "
    "value BLOB, size INTEGER NOT NULL DEFAULT 0, expires REAL)",
    "CREATE INDEX IF NOT EXISTS kv_expires ON kv (expires) WHERE expires IS NOT NULL",
    "CREATE TABLE IF NOT EXISTS members (key TEXT NOT NULL, member TEXT NOT NULL, "
    "PRIMARY KEY (key, member)) WITHOUT ROWID",
)
_LIVE = "(expires IS NULL OR expires > ?)"
_pause = time.sleep  # (a test's hook: what a retried switch to WAL waits with)
_abandoned = []  # connections a fork left in a child: never closed there (SQLite: not across fork)


def store_path(namespace: str, name: str) -> str:
    """The file of store ``name`` of ``namespace`` in /dev/shm."""
    return os.path.join(SHM_DIR, store_file(namespace, name))


def store_names(namespace: str) -> list[str]:
    """The names of ``namespace``'s stores, sorted (their files in /dev/shm)."""
    prefix = store_prefix(namespace)
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    return sorted(n[len(prefix):-len(_SUFFIX)] for n in names
                  if n.startswith(prefix) and n.endswith(_SUFFIX) and len(n) > len(prefix) + len(_SUFFIX))


def unlink_store(namespace: str, name: str, shared: bool = False) -> bool:
    """Remove store ``name``'s files; False if it had none. Handles elsewhere open a new,
    empty store at their next call. ``shared``: Unauthorized, before anything goes, unless
    the file is this user's (a shared namespace's rule)."""
    path = store_path(namespace, name)
    if shared:
        check_deletable(f"store {name!r}", path)
    found = False
    for p in (path, *(path + s for s in _SIDECARS)):
        try:
            os.unlink(p)
            found = found or p == path
        except FileNotFoundError:
            pass
    return found


def _wrong(key, kind) -> WrongType:
    have, want = ("a set", "a value") if kind == _SET else ("a value", "a set")
    return WrongType(f"key {key!r:.80} holds {have}, not {want}")


class Store:
    """One keyed store of a namespace (``broker.store(name)``): values (bytes), counters
    and sets of strings under str keys, each with an optional expiry. Every method is
    atomic across threads and processes."""

    def __init__(self, namespace: str, name: str = "default", group: int | None = None, create: bool = True):
        """Open store ``name`` of ``namespace``, made if it has no file yet. ``group``: a
        gid, for a file made here 0660 with that group (a shared namespace's).
        ``create=False``: never make it (FileNotFoundError, now or at a call after its
        delete: what housekeeping wants)."""
        self.namespace = check_namespace(namespace)
        self.name = check_queue_name(name)
        self.path = store_path(namespace, name)
        self._group = group
        self._create = create
        self._lock = threading.Lock()
        self._conn = None
        self._ino = None
        self._pid = None
        self._writes = 0  # commits by this handle (data_version counts other connections' only)
        self._next_sweep = 0.0
        self._busy_s = BUSY_TIMEOUT_S
        self._closed = False
        with self._lock:
            self._connection()

    def __repr__(self):
        return f"<shmq.Store namespace={self.namespace!r} name={self.name!r}>"

    def __reduce__(self):
        return (Store, (self.namespace, self.name, self._group, self._create))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        """Close this handle (the store stays). Its calls raise ShmqError after."""
        with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
            if conn is not None and self._pid == os.getpid():
                conn.close()

    @property
    def lock_timeout(self) -> float:
        """The longest a write waits for another process's write to end (then LockTimeout)."""
        return self._busy_s

    @lock_timeout.setter
    def lock_timeout(self, seconds: float) -> None:
        with self._lock:
            self._busy_s = float(seconds)
            if self._conn is not None and self._pid == os.getpid():
                self._conn.execute(f"PRAGMA busy_timeout={int(self._busy_s * 1000)}")

    # ---------------------------------------------------------------- the connection
    def _connection(self) -> sqlite3.Connection:
        """This process's connection to the store's current file (under ``_lock``)."""
        if self._closed:
            raise ShmqError(f"store {self.name!r} of namespace {self.namespace!r} is closed")
        conn = self._conn
        if conn is not None:
            if self._pid != os.getpid():
                _abandoned.append(conn)  # the parent's: closing it here could undo the parent's locks
            else:
                try:
                    if os.stat(self.path).st_ino == self._ino:
                        return conn
                except FileNotFoundError:
                    pass
                conn.close()  # the store was deleted (and perhaps made again): open what is there now
            self._conn = None
        self._conn = conn = self._open()
        self._pid = os.getpid()
        return conn

    def _open(self) -> sqlite3.Connection:
        fd = None
        try:
            if self._create:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            elif not os.path.exists(self.path):
                raise FileNotFoundError(f"no store {self.name!r} in namespace {self.namespace!r}")
        except FileExistsError:
            pass
        except PermissionError:
            raise _refused(self) from None
        if fd is not None:
            try:
                if self._group is not None:
                    share_fd(fd, self._group)
            finally:
                os.close(fd)
        if self._group is not None:
            self._share_sidecars()
        try:
            where = self.path if self._create else f"file:{urllib.parse.quote(self.path)}?mode=rw"  # (rw: never made)
            conn = sqlite3.connect(where, timeout=self._busy_s, isolation_level=None, check_same_thread=False,
                                   uri=not self._create)
        except sqlite3.Error as e:
            if not self._create and not os.path.exists(self.path):
                raise FileNotFoundError(f"no store {self.name!r} in namespace {self.namespace!r}") from None
            raise _translated(e, self) from None
        try:
            self._ino = os.stat(self.path).st_ino
            conn.execute("PRAGMA synchronous=OFF")  # a tmpfs: nothing to sync
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")  # (takes effect on a new file only)
            self._use_wal(conn)
            conn.execute("PRAGMA journal_size_limit=1048576")  # a burst's -wal is cut back after
            conn.execute("BEGIN IMMEDIATE")
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.execute("COMMIT")
        except sqlite3.Error as e:
            conn.close()
            raise _translated(e, self) from None
        except BaseException:
            conn.close()
            raise
        return conn

    def _use_wal(self, conn):
        """Switch the file to WAL if it is not yet. SQLite refuses the switch at once (BUSY,
        without waiting its busy timeout) while another connection holds the file's write
        lock in rollback mode: another process's first open, making the schema or switching
        too. So it is tried again, after growing pauses, until the lock timeout."""
        deadline = time.monotonic() + self._busy_s
        pause = POLL_MIN_S
        while conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            try:
                conn.execute("PRAGMA journal_mode=WAL")
            except sqlite3.OperationalError as e:
                if not _busy(e) or time.monotonic() >= deadline:
                    raise
                _pause(pause)
                pause = min(2 * pause, POLL_MAX_S)

    def _share_sidecars(self):
        """In a shared namespace, the -wal and -shm files made here 0660 with its group
        (SQLite gives them the db's mode, but its maker's group)."""
        for suffix in ("-wal", "-shm"):
            try:
                fd = os.open(self.path + suffix, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            except (FileExistsError, PermissionError):
                continue
            try:
                share_fd(fd, self._group)
            finally:
                os.close(fd)

    def _read(self, fn):
        """``fn(conn, now)`` in one read transaction."""
        with self._lock:
            conn = self._connection()
            try:
                conn.execute("BEGIN")
                try:
                    return fn(conn, time.time())
                finally:
                    conn.execute("COMMIT")
            except sqlite3.Error as e:
                raise _translated(e, self) from None

    def _write(self, fn):
        """``fn(conn, now)`` in one write transaction (BEGIN IMMEDIATE: the write lock first,
        so no read turns into a write that must start again); an error rolls it back."""
        with self._lock:
            conn = self._connection()
            now = time.time()
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    out = fn(conn, now)
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            except sqlite3.Error as e:
                raise _translated(e, self) from None
            self._writes += 1
            if now >= self._next_sweep:
                self._next_sweep = now + SWEEP_EVERY_S
                try:
                    self._sweep(conn, now)
                except sqlite3.Error:  # (the write is done: its sweep is best effort, the next one tries again)
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
            return out

    # ---------------------------------------------------------------- rows
    @staticmethod
    def _row(conn, key, now):
        """(kind, value, size) of ``key`` if it is there and not expired, else None."""
        return conn.execute(f"SELECT kind, value, size FROM kv WHERE key = ? AND {_LIVE}", (key, now)).fetchone()

    @staticmethod
    def _drop(conn, key):
        """Remove ``key``'s row and members; whether it had a row (expired or not)."""
        conn.execute("DELETE FROM members WHERE key = ?", (key,))
        return conn.execute("DELETE FROM kv WHERE key = ?", (key,)).rowcount > 0

    def _fresh(self, conn, key, now):
        """``_row``, after an expired row of ``key`` is removed (a write's first step)."""
        row = self._row(conn, key, now)
        if row is None:
            self._drop(conn, key)
        return row

    # ---------------------------------------------------------------- values
    def set(self, key: str, value: bytes, ttl: float | None = None, only_new: bool = False) -> bool:
        """Store ``value`` under ``key`` (replacing what it held, a set too), expiring in
        ``ttl`` seconds (None: never). ``only_new``: only if ``key`` is absent. Returns
        whether it was stored."""
        check_key(key)
        value = _check_value(value)
        ttl = check_ttl(ttl)

        def run(conn, now):
            row = self._fresh(conn, key, now)
            if row is not None:
                if only_new:
                    return False
                if row[0] == _SET:
                    conn.execute("DELETE FROM members WHERE key = ?", (key,))
            conn.execute("INSERT OR REPLACE INTO kv (key, kind, value, size, expires) VALUES (?, ?, ?, 0, ?)",
                         (key, _VALUE, value, None if ttl is None else now + ttl))
            return True

        return self._write(run)

    def get(self, key: str, timeout: float = 0.0) -> bytes | None:
        """The value of ``key``, or None if it has none. ``timeout`` > 0: wait up to that
        many seconds for it to be there. WrongType if it holds a set."""
        check_key(key)
        timeout = check_wait(timeout)

        def run(conn, now):
            row = self._row(conn, key, now)
            if row is not None and row[0] == _SET:
                raise _wrong(key, _SET)
            return None if row is None else row[1]

        value = self._read(run)
        if value is not None or timeout <= 0:
            return value
        return self._wait(key, run, time.monotonic() + timeout)

    def stamp(self) -> tuple:
        """What changes whenever the store is written, by anyone: its ``data_version`` (the
        commits of other connections), this handle's own writes, its file (made anew)."""
        with self._lock:
            conn = self._connection()
            try:
                return self._ino, conn.execute("PRAGMA data_version").fetchone()[0], self._writes
            except sqlite3.Error as e:
                raise _translated(e, self) from None

    def _wait(self, key, run, deadline):
        """``get``'s wait: look again whenever the store's ``stamp`` moved. Between looks it
        sleeps on a watch of the store's -wal (``walwatch``: any commit rings it), up to a
        pause from POLL_MIN_S after a ring (the commit's -wal write comes before the
        index says it is done, so a look right after a ring may be early) doubling up to
        WATCHED_S while all is quiet; where there is no watch, the pause doubles from
        POLL_MIN_S up to POLL_MAX_S."""
        bell = walwatch.watch(self.path + "-wal")  # before the first look: whatever comes after rings
        pause, seen = POLL_MIN_S, None
        try:
            while True:
                version = self.stamp()
                if version != seen:
                    if seen is not None and version[0] != seen[0] and bell is not None:  # a new file: watch it
                        bell.close()
                        bell = walwatch.watch(self.path + "-wal")
                    seen = version
                    value = self._read(run)
                    if value is not None:
                        return value
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                if bell is None:
                    time.sleep(min(pause, left))
                    pause = min(pause * 2, POLL_MAX_S)
                elif bell.wait(min(pause, left)):
                    pause = POLL_MIN_S
                else:
                    pause = min(pause * 2, WATCHED_S)
        finally:
            if bell is not None:
                bell.close()

    def get_many(self, keys) -> list[bytes | None]:
        """The values of ``keys``, in order (None for each absent one), read at one instant."""
        keys = [check_key(k) for k in keys]

        def run(conn, now):
            out = []
            for key in keys:
                row = self._row(conn, key, now)
                if row is not None and row[0] == _SET:
                    raise _wrong(key, _SET)
                out.append(None if row is None else row[1])
            return out

        return self._read(run) if keys else []

    def delete(self, *keys: str) -> int:
        """Remove ``keys`` (values or sets); returns how many of them were there."""
        for k in keys:
            check_key(k)

        def run(conn, now):
            there = 0
            for key in dict.fromkeys(keys):
                there += self._row(conn, key, now) is not None
                self._drop(conn, key)
            return there

        return self._write(run) if keys else 0

    def incr(self, key: str, by: int = 1, ttl: float | None = None) -> int:
        """Add ``by`` to the integer under ``key`` (absent: 0) and return the sum, atomically;
        the value is kept as ASCII decimal (``get`` returns b"3"). ``ttl``: the key then
        expires in that many seconds (None: its expiry stays as it was). WrongType if the
        key holds a set or a value that is not an integer; ValueError past 64 bits."""
        check_key(key)
        check_incr(by)
        ttl = check_ttl(ttl)

        def run(conn, now):
            row = self._fresh(conn, key, now)
            if row is None:
                n = by
            elif row[0] == _SET:
                raise _wrong(key, _SET)
            elif not _INT.fullmatch(row[1]):
                raise WrongType(f"key {key!r:.80} holds {row[1]!r:.40}, not an integer")
            else:
                n = int(row[1]) + by
            if not -_MAX_INT - 1 <= n <= _MAX_INT:
                raise ValueError(f"incr of key {key!r:.80} by {by} would leave 64 bits")
            value = str(n).encode()
            if row is None:
                conn.execute("INSERT INTO kv (key, kind, value, expires) VALUES (?, ?, ?, ?)",
                             (key, _VALUE, value, None if ttl is None else now + ttl))
            elif ttl is None:
                conn.execute("UPDATE kv SET value = ? WHERE key = ?", (value, key))
            else:
                conn.execute("UPDATE kv SET value = ?, expires = ? WHERE key = ?", (value, now + ttl, key))
            return n

        return self._write(run)

    # ---------------------------------------------------------------- sets
    def add(self, key: str, member: str, ttl: float | None = None) -> int:
        """Add ``member`` to the set under ``key`` (made if absent), atomically; returns the
        set's size after. A member already there changes nothing (so a repeated add counts
        once). ``ttl``: the set then expires in that many seconds (None: as it was).
        WrongType if the key holds a value."""
        check_key(key)
        check_key(member, "member")
        ttl = check_ttl(ttl)

        def run(conn, now):
            row = self._fresh(conn, key, now)
            if row is None:
                conn.execute("INSERT INTO kv (key, kind, value, size, expires) VALUES (?, ?, NULL, 0, ?)",
                             (key, _SET, None if ttl is None else now + ttl))
                size = 0
            elif row[0] != _SET:
                raise _wrong(key, _VALUE)
            else:
                size = row[2]
                if ttl is not None:
                    conn.execute("UPDATE kv SET expires = ? WHERE key = ?", (now + ttl, key))
            if conn.execute("INSERT OR IGNORE INTO members (key, member) VALUES (?, ?)", (key, member)).rowcount:
                size += 1
                conn.execute("UPDATE kv SET size = ? WHERE key = ?", (size, key))
            return size

        return self._write(run)

    def members(self, key: str) -> "set[str]":
        """The members of the set under ``key`` (empty if absent). WrongType if it holds a value."""
        check_key(key)

        def run(conn, now):
            row = self._row(conn, key, now)
            if row is None:
                return set()
            if row[0] != _SET:
                raise _wrong(key, _VALUE)
            return {m for (m,) in conn.execute("SELECT member FROM members WHERE key = ?", (key,))}

        return self._read(run)

    # ---------------------------------------------------------------- expiry
    def expire(self, key: str, ttl: float | None) -> bool:
        """Make ``key`` expire in ``ttl`` seconds (None: never); whether it was there."""
        check_key(key)
        ttl = check_ttl(ttl)

        def run(conn, now):
            return conn.execute(f"UPDATE kv SET expires = ? WHERE key = ? AND {_LIVE}",
                                (None if ttl is None else now + ttl, key, now)).rowcount > 0

        return self._write(run)

    def ttl(self, key: str) -> float | None:
        """Seconds until ``key`` expires; None if it never does or is not there."""
        check_key(key)

        def run(conn, now):
            row = conn.execute(f"SELECT expires FROM kv WHERE key = ? AND {_LIVE}", (key, now)).fetchone()
            return None if row is None or row[0] is None else max(row[0] - now, 0.0)

        return self._read(run)

    # ---------------------------------------------------------------- the whole store
    def keys(self, prefix: str = "") -> list[str]:
        """The keys there (not expired) that start with ``prefix``, sorted."""
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        if prefix:
            check_key(prefix, "prefix")

        def run(conn, now):
            if not prefix:
                rows = conn.execute(f"SELECT key FROM kv WHERE {_LIVE} ORDER BY key", (now,))
            elif prefix[-1] != "\U0010ffff":  # the keys in [prefix, the next string of its length)
                upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
                rows = conn.execute(f"SELECT key FROM kv WHERE key >= ? AND key < ? AND {_LIVE} ORDER BY key",
                                    (prefix, upper, now))
            else:
                rows = conn.execute(f"SELECT key FROM kv WHERE substr(key, 1, ?) = ? AND {_LIVE} ORDER BY key",
                                    (len(prefix), prefix, now))
            return [k for (k,) in rows if k.startswith(prefix)]

        return self._read(run)

    def clear(self) -> int:
        """Remove every key; returns how many were there (not expired)."""

        def run(conn, now):
            n = conn.execute(f"SELECT count(*) FROM kv WHERE {_LIVE}", (now,)).fetchone()[0]
            conn.execute("DELETE FROM members")
            conn.execute("DELETE FROM kv")
            return n

        n = self._write(run)
        self.sweep()  # the pages back
        return n

    def sweep(self) -> int:
        """Remove the expired keys and give their memory back; returns how many went."""
        with self._lock:
            conn = self._connection()
            try:
                self._next_sweep = time.time() + SWEEP_EVERY_S
                return self._sweep(conn, time.time())
            except sqlite3.Error as e:
                raise _translated(e, self) from None

    def _sweep(self, conn, now) -> int:
        conn.execute("BEGIN IMMEDIATE")
        try:
            gone = [k for (k,) in conn.execute("SELECT key FROM kv WHERE expires <= ?", (now,))]
            for key in gone:
                self._drop(conn, key)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        if conn.execute("PRAGMA freelist_count").fetchone()[0]:
            conn.executescript("PRAGMA incremental_vacuum;")  # (a plain execute steps it once: one page)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()  # both files cut back now
        return len(gone)

def _refused(store):
    from ..sharing import refused

    return refused(f"store {store.name!r} of namespace {store.namespace!r}", store.path)


def _busy(e: sqlite3.Error) -> bool:
    """Whether ``e`` says another connection holds a lock this one wanted."""
    return getattr(e, "sqlite_errorname", "") in ("SQLITE_BUSY", "SQLITE_LOCKED") or "locked" in str(e)


def _translated(e: sqlite3.Error, store) -> ShmqError:
    """An SQLite error as one of ours, naming the store."""
    what = f"store {store.name!r} of namespace {store.namespace!r}"
    code = getattr(e, "sqlite_errorname", "")
    if _busy(e):
        return LockTimeout(f"{what}: another process held its write lock for {store.lock_timeout:g}s: retry later")
    if code == "SQLITE_FULL" or "full" in str(e):
        return StorageError(f"{what}: {SHM_DIR} is full: free space there, or enlarge it (Docker: --shm-size)")
    if code in ("SQLITE_READONLY", "SQLITE_PERM", "SQLITE_CANTOPEN") and not os.access(store.path, os.W_OK):
        return _refused(store)
    return ShmqError(f"{what}: {e}")
