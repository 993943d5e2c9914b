"""Periodic housekeeping of every queue and stream in a namespace.

Strategy: housekeeping never depends on this loop — any process using a queue does
the due work itself — but a broker that runs it keeps leases of dead consumers and
delayed messages moving, and memory going back, even while no client is calling ``get``
or appending.
"""

import logging

from ..engine import maintenance
from ..engine.broker import Broker
from ..engine.queues.rpc import remove_orphans
from ..errors import QueueNotFound, ShmqError, StreamNotFound

__all__ = ["Housekeeper"]

log = logging.getLogger("shmq.server")


class Housekeeper:
    """Attaches to every queue, stream and keyed store of ``broker``'s namespace and calls
    ``Queue._housekeep``, ``Stream.housekeep`` and ``Store.sweep`` on each."""

    def __init__(self, broker: Broker):
        self.broker = broker
        self._queues = {}
        self._streams = {}
        self._stores = {}

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
                             lambda s: s.housekeep()[0], StreamNotFound)
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
