"""The broker's side of persistence: snapshot rounds, opening and suspending the logs
with the data dir, and the batch fsync rounds' work (``server.logsync`` runs them)."""

import logging
import os
import threading
import time

from ..formats import dmsq
from ..engine.shm import layout as L
from ..engine.broker import Broker
from ..engine.streams.stream import Stream
from ..formats.logfiles import log_files, partition_log_name, reserve_path, wal_path
from ..errors import LayoutMismatch, QueueNotFound, StreamNotFound
from .files import lanes_of, owner_of, snapshot_path
from ..sharing import fit_to_dir
from .queues import snapshot_queue
from .streams import apply_retention, snapshot_stream
from ..model.units import size_text

log = logging.getLogger("shmq.persistence")

# the disk alarm's threshold (--disk-free-limit) unless given: 50 MiB (RabbitMQ's disk_free_limit is 50 MB), or a
# twentieth of the filesystem where that is less (a small one would be in alarm for ever)
DEFAULT_DISK_FREE_LIMIT, DEFAULT_DISK_FREE_SHARE = 50 * 2**20, 20
# the data dir's reserve (``wal.reserve_path``): 4 MiB (about 110,000 logged acks), or a 64th of a smaller filesystem
RESERVE_BYTES, RESERVE_SHARE = 4 * 2**20, 64
_EXCHANGES = "#exchanges"  # the exchange table's key in Snapshotter._failing (no queue has "#" in its name)


class Snapshotter:
    """Snapshots every queue and stream whose durability is not "memory" into
    ``data_dir``, opens the write-ahead log of every "wal" queue and stream partition
    there (and a snapshot stream's high-water file), fsyncs the logs in batch mode, and
    applies the retention of "wal" streams' logs."""

    def __init__(self, broker: Broker, data_dir: str, fsync: bool = True, wal_mode: int = 2, wal_batch_ms: int = 2,
                 disk_free_limit: int | None = 0):
        self.broker = broker
        # the disk alarm: below ``disk_free_limit`` free bytes in the data dir's filesystem, every
        # "wal" log refuses puts and appends (saying why) and logs what settles, until there is room again
        self.disk_free_limit = disk_free_limit
        self.alarm = False
        self.disk_free = None  # the data dir's free bytes at the last look (``check_disk``)
        self._reserved = False  # its reserve was there at the last look (``keep_reserve``)
        self.data_dir = data_dir
        self.fsync = fsync
        self.wal_mode = wal_mode
        self.wal_batch_ms = wal_batch_ms
        # queue name -> [attached queue, generation of fd, fd or None, {lane: [lane, generation, fd]} of lanes 1..]
        self._logs = {}  # for sync_logs
        self._stream_logs = {}  # "@NAME" -> [attached Stream, {partition: [log, generation of fd, fd or None]}]
        self._failing = {}  # name -> the snapshot error last logged
        self._exchanges_saved = None  # the exchange table last written
        self.last_round = {}  # what the last run_once wrote
        # for /metrics (server/metrics.py reads them at each scrape): snapshot writes that failed
        # (a queue's, a stream's, the exchange table's; a round that found the data dir gone: one),
        # and ("queue" | "stream", name) -> when (epoch seconds) its last good snapshot began
        self.failures = 0
        self.last_good = {}
        self._written = {}  # snapshot path -> what it says (``snapshot_queue``): unchanged ones are not rewritten
        self._lost = False  # the data dir vanished
        self._other_layout = set()  # queues and streams of another shmq's layout, seen by the round (``_each``)
        self._unseen = set()  # those listed whose attach found none (``_each``): deleted meanwhile, or half removed
        self.log_dirs = set()  # where the logs were at the last settled sync_logs
        self._dir_lock = threading.Lock()  # one thread at a time handles its coming and going
        # one writer of a snapshot at a time: the rounds' thread and the server's creates
        # (``open_wal``) write the same files, through the same ``.tmp``
        self._write_lock = threading.RLock()
        os.makedirs(data_dir, mode=0o700, exist_ok=True)

    def open_wal(self, x) -> None:
        """Point a "wal" queue's log at our data dir, in a generation after any on disk;
        a Stream goes to ``open_stream``."""
        if isinstance(x, Stream):
            self.open_stream(x)
            return
        if x.durability != "wal":
            return
        with self._write_lock:
            lanes = lanes_of(x)
            if len(lanes) > 1 and not os.path.exists(snapshot_path(self.data_dir, x.name)):
                snapshot_queue(x, self.data_dir, self.fsync)  # first: its lanes' logs alone would not say how many
            for q in lanes:
                self._open_log(q)

    def limit(self, size: int) -> int:
        """The disk alarm's threshold on a filesystem of ``size`` bytes: the one given, else
        the default (``DEFAULT_DISK_FREE_LIMIT``, or a twentieth of ``size`` if less)."""
        if self.disk_free_limit is not None:
            return self.disk_free_limit
        return min(DEFAULT_DISK_FREE_LIMIT, size // DEFAULT_DISK_FREE_SHARE)

    def _log_mode(self) -> int:
        """The mode a log is opened with: the --fsync policy, and the disk alarm's flag while it is on."""
        return self.wal_mode | (L.WAL_ALARM if self.alarm else 0)

    def _open_log(self, q) -> None:
        gen, _mode, _ms, directory = q.wal.config()
        if gen and directory == os.path.abspath(self.data_dir):
            q.wal.configure(self.data_dir, self._log_mode(), self.wal_batch_ms)  # keep its generation
            return
        q.wal.configure(self.data_dir, self._log_mode(), self.wal_batch_ms, generation=self._next_generation(q.wal))

    def _next_generation(self, wal) -> int:
        """A generation for a log (re)opened here: after any on disk, and after the one it
        had when it was suspended (a data dir deleted and made again is empty, and its
        writers' descriptors for the old generation number point into the deleted one)."""
        on_disk = [g for g, _p in log_files(self.data_dir, wal.name)]
        return max(on_disk + [wal.suspended_at()]) + 1

    def _opened(self, s: Stream) -> bool:
        """Whether every partition of a durable stream is configured for our data dir."""
        here = os.path.abspath(self.data_dir)
        return all(c[0] and c[3] == here for c in (s._part(p).log.config() for p in range(s.partitions)))

    def open_stream(self, s: Stream) -> bool:
        """Configure a durable stream's partitions for our data dir (a stream already
        configured keeps its log generations). A "wal" stream is snapshotted first, so
        no log is ever on disk without the settings that rebuild it, then each
        partition's log opens in a generation after any on disk, with its disk tail
        where the oldest log begins; a "snapshot" stream starts its high-water marks,
        then is snapshotted. Files of a deleted stream of the same name go first.
        Returns True if it snapshotted."""
        if s.durability == "memory":
            return False
        with self._write_lock:
            return self._open_stream(s)

    def check_disk(self) -> bool:
        """Look at the data dir's free space; below ``disk_free_limit`` the alarm goes on
        (one ERROR line; every "wal" log refuses puts and appends, saying why, before the
        disk is full, and logs acks and purges, which free it), at or above it off again
        (one INFO line). Returns whether the alarm is on."""
        try:
            st = os.statvfs(self.data_dir)
        except OSError:
            return self.alarm
        self.disk_free = st.f_bavail * st.f_frsize
        limit = self.limit(st.f_blocks * st.f_frsize)
        if self.disk_free_limit != 0:
            self._set_alarm(self.disk_free < limit, limit)
        self.keep_reserve(st.f_blocks * st.f_frsize, limit)
        return self.alarm

    def _set_alarm(self, short: bool, limit: int) -> None:
        if short == self.alarm:
            return
        with self._dir_lock:
            self.alarm = short
            self.open_all_wals()  # (each log told of the alarm as it is opened), then said
            if short:
                log.error("disk alarm: data dir %s has %s free, below --disk-free-limit %s: puts to 'wal' queues "
                          "and appends to 'wal' streams are refused until there is room again (acks go on; a "
                          "purge or delete frees it: docs/OPERATIONS.md, Disk alarm)", self.data_dir,
                          size_text(self.disk_free), size_text(limit),
                          extra={"event": "disk_alarm", "data_dir": self.data_dir, "free_bytes": self.disk_free,
                                 "limit_bytes": limit})
            else:
                log.info("disk alarm lifted: data dir %s has %s free: puts and appends logged again", self.data_dir,
                         size_text(self.disk_free), extra={"event": "disk_alarm_lifted", "data_dir": self.data_dir,
                                                          "free_bytes": self.disk_free})

    def keep_reserve(self, fs_size: int, limit: int) -> None:
        """Keep the data dir's reserve (``wal.reserve_path``: ``RESERVE_BYTES``, or a
        64th of a smaller filesystem), which a log append of what settles removes when
        the disk is full: said at WARNING when found used, made again once there is room
        (twice its size free above the alarm's threshold)."""
        path = reserve_path(self.data_dir)
        if os.path.exists(path):
            self._reserved = True
            return
        if self._reserved:
            self._reserved = False
            log.warning("data dir %s's disk was full: its reserve (%s) was used to log acks or purges; it is made "
                        "again when there is room (docs/OPERATIONS.md, Disk alarm)", self.data_dir,
                        os.path.basename(path), extra={"event": "disk_reserve_used", "data_dir": self.data_dir})
        size = min(RESERVE_BYTES, fs_size // RESERVE_SHARE)
        if not size or self.alarm or self.disk_free < 2 * size + limit:
            return
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError:
            return
        try:
            try:
                fit_to_dir(fd, path)
                os.posix_fallocate(fd, 0, size)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            try:
                os.unlink(path)
            except OSError:
                pass
            return
        self._reserved = True
        self.disk_free -= size

    def _open_stream(self, s: Stream) -> bool:
        if self._opened(s):
            for p in range(s.partitions):
                s._part(p).log.configure(self.data_dir, self._log_mode(), self.wal_batch_ms)
            return False
        self._forget_stale(s)
        if s.durability == "wal":
            snapshot_stream(s, self.data_dir, self.fsync)
        here = os.path.abspath(self.data_dir)
        for p in range(s.partitions):
            part = s._part(p)
            gen, _mode, _ms, directory = part.log.config()
            if gen and directory == here:  # (a stream grown since: its other partitions keep their generations)
                part.log.configure(self.data_dir, self._log_mode(), self.wal_batch_ms)
                continue
            part.log.configure(self.data_dir, self._log_mode(), self.wal_batch_ms,
                               generation=self._next_generation(part.log))
            if s.durability == "wal":
                firsts = [first for _g, first, _path in part.disk_files() if first is not None]
                part.set_disk_first(firsts[0] if firsts else None)
            else:
                part.start_marks()
        if s.durability != "wal":
            snapshot_stream(s, self.data_dir, self.fsync)
        return True

    def _forget_stale(self, s: Stream) -> None:
        """Remove the files of a deleted stream that had this one's name: their snapshot
        says another creation time (a stream rebuilt from them keeps theirs)."""
        created = int(s.created_at * 1e9)
        for p in range(s.partitions):
            path = snapshot_path(self.data_dir, partition_log_name(s.name, p))
            try:
                with dmsq.SnapshotReader(path) as r:
                    theirs = r.header.created_ns if r.header is not None else created
            except FileNotFoundError:
                continue
            if theirs != created:
                for entry in os.listdir(self.data_dir):
                    if owner_of(entry) == "@" + s.name:
                        os.unlink(os.path.join(self.data_dir, entry))
                log.warning("data dir %s: removed the files of an earlier stream %s", self.data_dir, s.name)
                return

    def _each(self, names, attach, gone, prefix=""):
        """Attach to each of ``names`` in turn (closed after use; one deleted meanwhile,
        ``gone``, is passed over; one of another shmq's layout too, said once and added to
        ``_other_layout``, whose files stay). ``prefix``: "@" for streams, as files name them."""
        for name in names:
            try:
                handle = attach(name)
            except LayoutMismatch as e:  # another shmq's, made since the start: said once, passed over
                self._report(prefix + name, str(e))
                self._other_layout.add(prefix + name)
                continue
            except gone:  # deleted meanwhile, or listed with its memory gone: the round's end tells (``_unseen``)
                self._unseen.add(prefix + name)
                continue
            except OSError as e:  # out of descriptors (EMFILE), say: said once, its files stay
                self.failures += 1
                what = "stream" if prefix else "queue"
                self._report(prefix + name, f"cannot attach {what} {name} to snapshot it: {e}")
                continue
            try:
                yield handle
            finally:
                handle.close()

    def _each_queue(self):
        return self._each(self.broker.list_queues(), self.broker.queue, QueueNotFound)

    def _each_stream(self):
        return self._each(self.broker.list_streams(), self.broker.stream, StreamNotFound, "@")

    def _names(self) -> set:
        """The owners (``owner_of``) of every queue and stream there is now."""
        return set(self.broker.list_queues()) | {"@" + name for name in self.broker.list_streams()}

    def run_once(self) -> int:
        """One snapshot of every durable queue and stream; returns how many files were
        written. Then the retention of "wal" streams' logs. Files of queues and streams
        deleted since (or made "memory") are removed. A snapshot that fails (a full disk)
        is logged once, keeps the previous file, and is retried. ``last_round`` says
        what the round wrote: queues, messages, streams, files, and how many writes
        ``failed`` (a data dir gone: one)."""
        self.last_round = {"queues": 0, "messages": 0, "streams": 0, "files": 0, "failed": 0}
        self.check_disk()
        self._other_layout = set()
        self._unseen = set()
        failures = self.failures
        if not self.data_dir_present():
            self.failures += 1
            self.last_round["failed"] = 1
            return 0
        written = 0
        memory = set()  # attached and seen to be "memory": what files they have go
        for q in self._each_queue():
            with self._write_lock:
                began = time.time()
                try:
                    if q.durability == "wal" and not all(lane.wal.config()[0] for lane in lanes_of(q)):
                        self.open_wal(q)
                    if q.durability == "memory":
                        memory.add(q.name)
                    else:
                        _path, n = snapshot_queue(q, self.data_dir, self.fsync, self._written)
                        written += 1
                        self.last_round["queues"] += 1
                        self.last_round["messages"] += n
                        self.last_good[("queue", q.name)] = began
                        self._report(q.name, None)
                except QueueNotFound:
                    pass  # deleted meanwhile
                except OSError as e:
                    self.failures += 1
                    self._report(q.name, f"cannot write the snapshot of queue {q.name} to {self.data_dir}: {e}")
        for s in self._each_stream():
            if s.durability == "memory":
                memory.add("@" + s.name)
                continue
            with self._write_lock:
                began = time.time()
                try:
                    configured = all(s._part(p).log.config()[0] for p in range(s.partitions))
                    if configured or not self.open_stream(s):  # (one configured elsewhere stays so)
                        snapshot_stream(s, self.data_dir, self.fsync, self._written)
                    written += s.partitions
                    self.last_round["streams"] += 1
                    if s.durability == "wal":
                        apply_retention(s)
                    self.last_good[("stream", s.name)] = began
                    self._report("@" + s.name, None)
                except StreamNotFound:
                    pass
                except OSError as e:
                    self.failures += 1
                    self._report("@" + s.name, f"cannot write the snapshot of stream {s.name} to {self.data_dir}: {e}")
        with self._write_lock:
            # Files go only on positive knowledge: their queue or stream is not in the registry any more
            # (deleted), or it was attached and is "memory". Everything listed keeps its files: one created
            # during the round (its create wrote them), one of another layout (an upgrade rebuilds it from
            # them), one this round could not attach (out of descriptors), one whose memory is gone while its
            # entry stays (half removed: a start rebuilds it from them).
            listed = self._names()
            keep = listed - memory
            for owner in sorted(self._unseen & listed):
                what = f"stream {owner[1:]}" if owner.startswith("@") else f"queue {owner}"
                self._report(owner, f"{what} is listed, but its memory was not found (half removed?): its files in "
                                    f"{self.data_dir} are kept, and a start of the server rebuilds it from them")
            for kind, name in [k for k in self.last_good if (k[1] if k[0] == "queue" else "@" + k[1]) not in keep]:
                del self.last_good[(kind, name)]  # deleted, or made "memory"
            for entry in os.listdir(self.data_dir):
                owner = owner_of(entry)
                if owner is not None and owner not in keep:
                    os.unlink(os.path.join(self.data_dir, entry))
                    self._written.pop(os.path.join(self.data_dir, entry), None)
        self._save_exchanges()
        self.last_round["files"] = written
        self.last_round["failed"] = self.failures - failures
        return written

    def failing(self) -> dict:
        """What fails to be snapshotted now: {"queue NAME" | "stream NAME" | "the exchange
        table" | "the data dir": the error last logged}."""
        out = {}
        for name, error in list(self._failing.items()):
            what = "the exchange table" if name == _EXCHANGES else (
                f"stream {name[1:]}" if name.startswith("@") else f"queue {name}")
            out[what] = error
        if self._lost:
            out["the data dir"] = f"{self.data_dir} is gone"
        if self.alarm:
            out["the disk alarm"] = (f"{self.data_dir} has {size_text(self.disk_free or 0)} free, below "
                                     "--disk-free-limit: puts and appends of wal queues and streams refused")
        return out

    def _save_exchanges(self) -> None:
        """Write the exchange table (``dmsq.EXCHANGES_FILE``) when it changed since the
        last write; a namespace without exchanges has no file."""
        path = os.path.join(self.data_dir, dmsq.EXCHANGES_FILE)
        table = self.broker.exchange_table().table()
        if table == self._exchanges_saved and os.path.exists(path) == bool(table):
            return
        try:
            if table:
                dmsq.write_exchanges(path, table, self.fsync)
            elif os.path.exists(path):
                os.unlink(path)
            self._exchanges_saved = table
            self._report(_EXCHANGES, None)
        except OSError as e:
            self.failures += 1
            self._report(_EXCHANGES, f"cannot write the exchange table to {self.data_dir}: {e}")

    def _report(self, name: str, error: str | None) -> None:
        """Log a snapshot failure when it starts or changes, and its end."""
        before = self._failing.get(name)
        if error == before:
            return
        what = f"stream {name[1:]}" if name.startswith("@") else f"queue {name}"
        if name == _EXCHANGES:
            what = "the exchange table"
        if error is None:
            del self._failing[name]
            log.info("snapshot of %s written again", what)
        else:
            self._failing[name] = error
            log.error("%s; retrying every interval", error)

    def data_dir_present(self) -> bool:
        """Whether the data directory is there. When it vanishes, every "wal" queue's and
        durable stream's log config is suspended (logged writes fail); when it is back,
        they are opened again. The snapshot and fsync threads both ask: one makes the
        change, the other waits for it to be complete (else a late reopen could undo a
        rotation the other had snapshotted, and that snapshot would delete a log holding
        puts it does not)."""
        present = os.path.isdir(self.data_dir)
        if present == (not self._lost):
            return present
        with self._dir_lock:
            present = os.path.isdir(self.data_dir)
            if present == (not self._lost):
                return present
            if present:
                log.warning("data dir %s is back: write-ahead logs reopened", self.data_dir)
            else:
                log.error("data dir %s is gone: puts and acks of 'wal' queues and appends to 'wal' streams fail "
                          "until it is back", self.data_dir)
            for q in self._each_queue():
                try:
                    if q.durability == "wal":
                        if present:
                            self.open_wal(q)
                        else:
                            for lane in lanes_of(q):
                                lane.wal.suspend()
                except QueueNotFound:
                    pass
            for s in self._each_stream():
                try:
                    if s.durability == "memory":
                        continue
                    if present:
                        self.open_stream(s)
                    else:
                        for p in range(s.partitions):
                            s._part(p).log.suspend()
                except (StreamNotFound, OSError):
                    pass
            self._lost = not present  # last: until now, the other thread waits above
        return present

    def sync_logs(self, settled: bool = False) -> int:
        """fsync the log of every "wal" queue and stream partition that has entries not
        yet synced (the ``batch:MS`` policy: ``server.logsync.LogSyncer`` calls this while
        logs are written). Queues and streams stay attached and logs open between calls.
        Returns how many logs were synced. ``settled``: also count appends still between
        their write and their size word (``Log.pending``), and note in ``log_dirs`` the
        directories the logs are in."""
        if settled:
            self.log_dirs = set()
        if not self.data_dir_present():
            return 0
        names = set(self.broker.list_queues())
        for name in [n for n, entry in self._logs.items() if n not in names or entry[0].deleted]:
            self._forget_log(name)
        synced = 0
        for name in names:
            entry = self._logs.get(name)
            if entry is None:
                try:
                    entry = self._logs[name] = [self.broker.queue(name), 0, None, {}]
                except QueueNotFound:
                    continue
            if entry[0].durability == "wal":
                for j, lane in enumerate(lanes_of(entry[0])):  # [handle, generation, fd] of lane 0, then of the others
                    synced += self._sync(lane.wal, entry if not j else entry[3].setdefault(j, [lane, 0, None]), settled)
        streams = {"@" + n for n in self.broker.list_streams()}
        for key in [k for k, entry in self._stream_logs.items() if k not in streams or entry[0].deleted]:
            self._forget_stream(key)
        for key in streams:
            entry = self._stream_logs.get(key)
            if entry is None:
                try:
                    s = self.broker.stream(key[1:])
                except StreamNotFound:
                    continue
                entry = self._stream_logs[key] = [s, {}]
            s = entry[0]
            if s.durability != "wal":
                continue
            for p in range(s.partitions):
                try:
                    part = entry[1].setdefault(p, [s._part(p), 0, None])
                    synced += self._sync(part[0].log, part, settled)
                except StreamNotFound:
                    break
        return synced

    def _sync(self, wal, entry, settled=False) -> int:
        """fsync one log if it has entries not yet synced; ``entry`` is [owner, generation
        of fd, fd or None], kept between rounds. Returns 1 if it synced."""
        pending = wal.pending(settled)
        if settled:
            gen, _mode, _ms, directory = wal.config()
            if gen:
                self.log_dirs.add(directory)
        if pending is None:
            return 0
        gen, size = pending
        if entry[1] != gen or entry[2] is None:
            if entry[2] is not None:
                os.close(entry[2])
                entry[2] = None
            try:
                entry[2] = os.open(wal.path(gen), os.O_RDONLY)
            except FileNotFoundError:
                self._deleted(wal, gen)
                return 0
            entry[1] = gen
        os.fsync(entry[2])
        if os.fstat(entry[2]).st_nlink == 0:
            os.close(entry[2])
            entry[2] = None
            self._deleted(wal, gen)
            return 0
        wal.mark_synced(gen, size)
        return 1

    def _deleted(self, wal, gen: int) -> None:
        """Log ``gen``'s file is not there. A snapshot round (its own thread) may have
        rotated the log since ``pending`` said ``gen``, and removed the file once its
        snapshot held the entries: then nothing is wrong. Else it was deleted under us and
        its entries are nowhere: the log is suspended (logged writes fail) until the next
        snapshot round opens a new one -- ``suspend(gen)`` tells the two apart under the
        log's lock, so a new generation is never suspended for its predecessor. (The
        whole data dir gone is ``data_dir_present``'s to say, and to act on.)"""
        if not os.path.isdir(self.data_dir):
            self.data_dir_present()
        elif wal.suspend(gen):
            log.error("the log of %s, %s, was deleted; its logged writes fail until the next snapshot opens a "
                      "new one", wal.what, wal_path(wal.config()[3], wal.name, gen))

    def _forget_log(self, name: str) -> None:
        q, _gen, fd, lanes = self._logs.pop(name)
        for _lane, _g, lane_fd in lanes.values():
            if lane_fd is not None:
                os.close(lane_fd)
        if fd is not None:
            os.close(fd)
        q.close()

    def _forget_stream(self, key: str) -> None:
        s, parts = self._stream_logs.pop(key)
        for _part, _gen, fd in parts.values():
            if fd is not None:
                os.close(fd)
        s.close()

    def close(self) -> None:
        """Detach what ``sync_logs`` kept attached and open."""
        for name in list(self._logs):
            self._forget_log(name)
        for key in list(self._stream_logs):
            self._forget_stream(key)

    def open_all_wals(self) -> None:
        for q in self._each_queue():
            self.open_wal(q)
        for s in self._each_stream():
            try:
                self.open_stream(s)
            except StreamNotFound:
                pass
