"""Periodic housekeeping of every queue and stream in a namespace.

Strategy: housekeeping never depends on this loop — any process using a queue does
the due work itself — but a broker that runs it keeps leases of dead consumers and
delayed messages moving, and memory going back, even while no client is calling ``get``
or appending. A compacted stream's partitions are looked at more often (``tick``), so
that a run starts before fast appenders fill half a ring and must compact themselves.
"""

import logging
import sqlite3
import time

from ..engine import maintenance
from ..engine.broker import Broker
from ..engine.queues.rpc import remove_orphans
from ..errors import QueueNotFound, ShmqError, StreamNotFound
from .limits import Census, object_fds

__all__ = ["Housekeeper"]

log = logging.getLogger("shmq.server")


ROUND_S = 0.25  # the whole round's period
TICK_S = 0.05  # how often compacted streams are looked at (``tick``)


def _compact(s) -> None:
    """A compacted stream's partitions that ask for a run (``Stream.compact_now``) compacted."""
    if s.compact:
        records, taken = s.compact_now(force=False)
        if records:
            log.debug("stream %s: compaction took %d record(s), %d bytes back", s.name, records, taken,
                      extra={"event": "stream_compacted", "stream": s.name, "records": records, "bytes": taken})


def _stream_round(s) -> int:
    """A stream's round: retention and memory back, then its compaction (``_compact``).
    Returns the records retention dropped."""
    dropped = s.housekeep()[0]
    _compact(s)
    return dropped


class Housekeeper:
    """Attaches to every queue, stream and keyed store of ``broker``'s namespace and calls
    ``Queue._housekeep``, ``Stream.housekeep`` (and a compacted stream's ``compact_now``)
    and ``Store.sweep`` on each. Each round also counts what it attached (``census``,
    handed to ``on_census`` when it changed: the server's descriptors follow it). One
    that cannot be attached or worked on (out of descriptors, say) is said once, until
    it works again, and is neither let go nor taken for deleted."""

    def __init__(self, broker: Broker, on_census=None):
        self.broker = broker
        self.on_census = on_census
        self.census = None  # what the last round found (``limits.Census``)
        self._queues = {}
        self._streams = {}
        self._stores = {}
        self._failing = {}  # (kind, name) -> the error last said
        self._round_due = 0.0

    def tick(self) -> float | None:
        """What a server runs every TICK_S: the whole round (``run_once``) every ROUND_S,
        and between rounds the compaction of the compacted streams it has attached.
        Returns None while it has one (the next tick is due), else the seconds to the next
        round (``periodic.Periodic`` sleeps that long: an idle server wakes for rounds only)."""
        now = time.monotonic()
        if now >= self._round_due:
            self._round_due = now + ROUND_S
            self.run_once()
        else:
            for name, s in list(self._streams.items()):
                try:
                    _compact(s)
                except StreamNotFound:
                    self._streams.pop(name).close()
                except ShmqError as e:
                    log.warning("stream %s: %s", name, e)
        for s in self._streams.values():
            try:
                if s.compact:
                    return None
            except ShmqError:  # (gone: the next round lets it go)
                return None
        return max(self._round_due - time.monotonic(), 0.0)

    def run_once(self) -> int:
        """One pass over all queues and streams; returns how many messages became ready again."""
        names = set(self.broker.list_queues())
        try:
            orphans = remove_orphans(self.broker, sorted(names))  # reply queues of dead requesters
        except OSError as e:  # (a requester's liveness unread: out of descriptors, say; none is taken for dead)
            self._said(("reply queues", ""), f"cannot look for the reply queues of dead requesters: {e}")
            orphans = []
        else:
            self._said(("reply queues", ""), None)
        for name in orphans:
            names.discard(name)
            log.info("reply queue %s removed: its requester is gone", name)
        for name, why in maintenance.sweep_unused(self.broker, [self._queues[n] for n in sorted(names)
                                                                if n in self._queues]):  # (lifetime.py)
            names.discard(name)
            log.info("queue %s deleted: %s", name, "its last consumer went" if why == "auto-delete" else
                     "unused for its expires")
        returned = self._each("queue", self._queues, names, self.broker.queue, maintenance.housekeep, QueueNotFound)
        for name, n in returned.items():
            if n:
                log.info("queue %s: %d message(s) ready again (expired or dead holder)", name, n)
        streams = set(self.broker.list_streams())
        dropped = self._each("stream", self._streams, streams, self.broker.stream, _stream_round, StreamNotFound)
        for name, n in dropped.items():
            if n:
                log.info("stream %s: %d record(s) dropped from memory by retention", name, n)
        stores = set(self.broker.list_stores())
        swept = self._each("store", self._stores, stores, self._attach_store,
                           lambda kv: kv.sweep(), FileNotFoundError)  # (engine/store.py: expired keys)
        for name, n in swept.items():
            if n:
                log.info("store %s: %d expired key(s) removed", name, n)
        self._count(names, streams, stores)
        return sum(returned.values())

    def survey(self) -> Census:
        """Attach to every queue, stream and store and count them (``census``), doing no
        housekeeping: what the server fits its descriptors to at start, before serving."""
        queues, streams, stores = set(self.broker.list_queues()), set(self.broker.list_streams()), \
            set(self.broker.list_stores())
        for kind, handles, names, attach, gone in (
                ("queue", self._queues, queues, self.broker.queue, QueueNotFound),
                ("stream", self._streams, streams, self.broker.stream, StreamNotFound),
                ("store", self._stores, stores, self._attach_store, FileNotFoundError)):
            self._each(kind, handles, names, attach, lambda h: None, gone, logging.DEBUG)  # (before the start line)
        self._count(queues, streams, stores)
        return self.census

    def _count(self, queues, streams_listed, stores) -> None:
        """The census of what this round attached (one listed but not attached: a lane, or
        a stream of one partition), handed to ``on_census`` when it changed."""
        lanes = logged = streams = parts = filed = largest = 0
        for name in queues:
            q = self._queues.get(name)
            k, wal = 1, False
            if q is not None:
                try:
                    k, wal = max(q.settings()["lanes"], 1), q.durability == "wal"
                except ShmqError:
                    pass
            lanes += k
            logged += k if wal else 0
            largest = max(largest, object_fds(lanes=k, logged_lanes=k if wal else 0))
        for name in streams_listed:
            s = self._streams.get(name)
            n, durable = 1, True
            if s is not None:
                try:
                    n, durable = s.partitions, s.durability != "memory"
                except ShmqError:
                    pass
            streams += 1
            parts += n
            filed += n if durable else 0
            largest = max(largest, object_fds(streams=1, partitions=n, filed_partitions=n if durable else 0))
        census = Census(len(queues), lanes, logged, streams, parts, filed, len(stores), largest)
        if census != self.census:
            self.census = census
            if self.on_census is not None:
                self.on_census(census)

    def _said(self, key, error) -> None:
        """Say a failure of ``key`` ((kind, name)) once, until it works again (then said too)."""
        before = self._failing.get(key)
        if error == before:
            return
        what = " ".join(x for x in key if x)
        if error is None:
            del self._failing[key]
            log.info("housekeeping of %s works again", what)
        else:
            self._failing[key] = error
            log.warning("%s (housekeeping tries again every round; said once until it works)", error)

    def _attach_store(self, name):
        from ..engine.store import Store

        return Store(self.broker.namespace, name, create=False)  # (a store deleted meanwhile stays deleted)

    def _each(self, kind, handles, names, attach, work, gone, level=logging.INFO) -> dict:
        """``work(handle)`` on each of ``names`` (attached once, kept in ``handles``), what it
        returned by name; a handle whose object is gone is let go; a ShmqError, an OSError
        (out of descriptors: EMFILE) or SQLite's error said once (``_said``), nothing let go."""
        for name in list(handles):
            if name not in names:
                handles.pop(name).close()
                self._failing.pop((kind, name), None)
                log.info("%s %s removed", kind, name)
        out = {}
        for name in sorted(names):
            h = handles.get(name)
            try:
                if h is None:
                    h = attach(name)
                    handles[name] = h
                    log.log(level, "%s %s attached", kind, name)
                out[name] = work(h)
            except gone:
                stale = handles.pop(name, None)
                if stale is not None:
                    stale.close()
                continue
            except (ShmqError, OSError, sqlite3.Error) as e:
                self._said((kind, name), f"{kind} {name}: {e}")
                continue
            if self._failing:
                self._said((kind, name), None)
        return out

    def close(self):
        for h in [*self._queues.values(), *self._streams.values(), *self._stores.values()]:
            h.close()
        self._queues.clear()
        self._streams.clear()
        self._stores.clear()
