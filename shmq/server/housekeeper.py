"""Periodic housekeeping of every queue and stream in a namespace.

Strategy: housekeeping never depends on this loop — any process using a queue does
the due work itself — but a broker that runs it keeps leases of dead consumers and
delayed messages moving, and memory going back, even while no client is calling ``get``
or appending. A compacted stream's partitions are looked at more often (``tick``), so
that a run starts before fast appenders fill half a ring and must compact themselves.
"""

import logging
import time

from ..engine import maintenance
from ..engine.broker import Broker
from ..engine.queues.rpc import remove_orphans
from ..errors import QueueNotFound, ShmqError, StreamNotFound

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
    and ``Store.sweep`` on each."""

    def __init__(self, broker: Broker):
        self.broker = broker
        self._queues = {}
        self._streams = {}
        self._stores = {}
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
        for name in remove_orphans(self.broker, sorted(names)):  # reply queues of dead requesters
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
        dropped = self._each("stream", self._streams, set(self.broker.list_streams()), self.broker.stream,
                             _stream_round, StreamNotFound)
        for name, n in dropped.items():
            if n:
                log.info("stream %s: %d record(s) dropped from memory by retention", name, n)
        swept = self._each("store", self._stores, set(self.broker.list_stores()), self._attach_store,
                           lambda kv: kv.sweep(), FileNotFoundError)  # (engine/store.py: expired keys)
        for name, n in swept.items():
            if n:
                log.info("store %s: %d expired key(s) removed", name, n)
        return sum(returned.values())

    def _attach_store(self, name):
        from ..engine.store import Store

        return Store(self.broker.namespace, name, create=False)  # (a store deleted meanwhile stays deleted)

    @staticmethod
    def _each(kind, handles, names, attach, work, gone) -> dict:
        """``work(handle)`` on each of ``names`` (attached once, kept in ``handles``), what it
        returned by name; a handle whose object is gone is let go, a ShmqError logged."""
        for name in list(handles):
            if name not in names:
                handles.pop(name).close()
                log.info("%s %s removed", kind, name)
        out = {}
        for name in sorted(names):
            h = handles.get(name)
            try:
                if h is None:
                    h = handles[name] = attach(name)
                    log.info("%s %s attached", kind, name)
                out[name] = work(h)
            except gone:
                stale = handles.pop(name, None)
                if stale is not None:
                    stale.close()
            except ShmqError as e:
                log.warning("%s %s: %s", kind, name, e)
        return out

    def close(self):
        for h in [*self._queues.values(), *self._streams.values(), *self._stores.values()]:
            h.close()
        self._queues.clear()
        self._streams.clear()
        self._stores.clear()
