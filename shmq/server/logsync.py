"""The ``--fsync batch:MS`` policy: fsync rounds over the write-ahead logs, run only while
logs are written.

Strategy: a round (``Snapshotter.sync_logs``) fsyncs every log with bytes not yet
synced. While logs are written, rounds run every MS milliseconds, start to start, so a
power loss costs at most MS ms of answered writes plus one round. A round that finds
nothing to sync arms a watch on the logs' directories and their parents (``DirWatch``), then makes one
more round that takes each log's lock first (an append whose bytes are in the file but
whose size word is not yet written is counted): nothing written before the watch is
missed, and whatever is written after it wakes the syncer. Then the thread sleeps until
a log file is written or created, or the data dir goes away (the round that follows
suspends the logs: ``Snapshotter.data_dir_present``): an idle broker wakes for nothing.
While the data dir is gone the syncer looks again every ``retry_s``; where inotify cannot
be had (the per-user limit of instances) it falls back to a round every MS ms, and asks
for it again every ``retry_s``.
"""

import logging
import os
import select
import threading
import time

from ..formats.logfiles import parse_wal_name
from .dirwatch import GONE, IN_Q_OVERFLOW, REMOVED, WRITTEN, DirWatch

__all__ = ["LogSyncer"]

log = logging.getLogger("shmq.server")


class LogSyncer:
    """A thread that keeps ``snapshotter``'s logs fsynced within ``batch_ms``; ``start``,
    then ``stop`` (one last round after the stop: every write answered before it is synced)."""

    def __init__(self, snapshotter, batch_ms: int, retry_s: float = 1.0):
        self.snapshotter = snapshotter
        self.period = batch_ms / 1000
        self.retry_s = retry_s
        self.rounds = 0  # rounds run
        self.idle = False  # asleep on the watch: no rounds until a log is written
        self.polling = False  # no inotify to be had: a round every period
        self._asked = 0.0  # when a DirWatch was last asked for
        self._stopping = False
        self._failing = None  # the error the last round failed with
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._dirs = {os.path.abspath(snapshotter.data_dir)}  # where logs are: watched while idle
        self._thread = threading.Thread(target=self._run, name="shmq-log-sync", daemon=True)

    def start(self) -> "LogSyncer":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop after one last round; returns when it is done."""
        self._stopping = True
        os.write(self._wake_w, b"x")
        self._thread.join()
        os.close(self._wake_r)
        os.close(self._wake_w)

    # ------------------------------------------------------------------ the loop
    def _watch(self):
        """A DirWatch, or None while inotify cannot be had (the per-user limit of
        instances, fs.inotify.max_user_instances, is shared by every process of the user):
        asked for again every ``retry_s``, said when it starts and when it ends."""
        self._asked = time.monotonic()
        try:
            watch = DirWatch()
        except OSError as e:
            if not self.polling:
                self.polling = True
                log.warning("no inotify (%s): the write-ahead logs are looked at every %g ms, written or not, "
                            "until it can be had", e, self.period * 1000)
            return None
        if self.polling:
            self.polling = False
            log.info("inotify can be had again: the write-ahead logs are looked at only while written")
        return watch

    def _run(self):
        watch = self._watch()
        last = float("-inf")
        try:
            while not self._stopping:
                self._sleep(last + self.period - time.monotonic())
                if self._stopping:
                    break
                last = time.monotonic()
                if watch is None and last - self._asked >= self.retry_s:
                    watch = self._watch()
                if self._round() or watch is None:
                    continue  # written to: the next round in one period
                armed = self._arm(watch)
                if armed is None:  # a directory of the logs is not there
                    self._sleep(self.retry_s)
                    continue
                if not self._round(settled=True) and self.snapshotter.log_dirs <= self._dirs:
                    self._idle(watch)
                for wd in watch.watching():
                    watch.remove(wd)
                watch.read()  # (what woke it, and the watches' IN_IGNORED)
        finally:
            self._round(settled=True)
            if watch is not None:
                watch.close()

    def _round(self, settled=False) -> int:
        """One sync_logs; a failure (a disk error) is logged and counts as work left."""
        self.rounds += 1
        try:
            synced = self.snapshotter.sync_logs(settled)
        except Exception as e:
            if repr(e) != self._failing:  # logged when it starts or changes, not every round
                self._failing = repr(e)
                log.exception("log fsync failed; trying again every %g ms", self.period * 1000)
            return 1
        if self._failing is not None:
            self._failing = None
            log.info("log fsync works again")
        if settled:
            self._dirs |= self.snapshotter.log_dirs
        return synced

    def _arm(self, watch):
        """Watch every directory logs are in, and their parents for their removal; None
        (nothing watched) if one is not there."""
        try:
            for d in sorted(self._dirs):
                watch.add(os.path.dirname(d), REMOVED)
                watch.add(d, WRITTEN)
            return watch.watching()
        except OSError:
            for wd in watch.watching():
                watch.remove(wd)
            watch.read()
            self._dirs = {os.path.abspath(self.snapshotter.data_dir)}  # (a gone directory of old logs is forgotten)
            return None

    def _idle(self, watch):
        """Sleep until a log file is written or created, a watched directory goes away
        (or the kernel's event queue overflowed), or the stop."""
        self.idle = True
        try:
            names = {os.path.basename(d) for d in self._dirs}
            while not self._stopping:
                ready, _w, _x = select.select([watch, self._wake_r], [], [])
                if self._wake_r in ready:
                    return
                for _wd, mask, name in watch.read():
                    if (mask & (GONE | IN_Q_OVERFLOW) or (mask & REMOVED and name in names)
                            or (mask & WRITTEN and parse_wal_name(name) is not None)):
                        return
        finally:
            self.idle = False

    def _sleep(self, seconds):
        if seconds > 0 and not self._stopping:
            select.select([self._wake_r], [], [], seconds)
