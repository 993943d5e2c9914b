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
    """Attaches to every queue and stream of ``broker``'s namespace and calls
    ``Queue._housekeep`` and ``Stream.housekeep`` on each."""

    def __init__(self, broker: Broker):
        self.broker = broker
        self._queues = {}
        self._streams = {}

    def run_once(self) -> int:
        """One pass over all queues; returns how many messages became ready again."""
        names = set(self.broker.list_queues())
        for name in remove_orphans(self.broker, sorted(names)):  # reply queues of dead requesters
            names.discard(name)
            log.info("reply queue %s removed: its requester is gone", name)
        for name in list(self._queues):
            if name not in names:
                self._queues.pop(name).close()
                log.info("queue %s removed", name)
        total = 0
        for name in sorted(names):
            q = self._queues.get(name)
            try:
                if q is None:
                    q = self._queues[name] = self.broker.queue(name)
                    log.info("queue %s attached", name)
                returned = maintenance.housekeep(q)
            except QueueNotFound:
                stale = self._queues.pop(name, None)
                if stale is not None:
                    stale.close()
                continue
            except ShmqError as e:
                log.warning("queue %s: %s", name, e)
                continue
            if returned:
                log.info("queue %s: %d message(s) ready again (expired or dead holder)", name, returned)
            total += returned
        self._streams_once()
        return total

    def _streams_once(self) -> None:
        """Each stream's retention in memory and its memory given back."""
        names = set(self.broker.list_streams())
        for name in list(self._streams):
            if name not in names:
                self._streams.pop(name).close()
        for name in sorted(names):
            s = self._streams.get(name)
            try:
                if s is None or s.deleted:
                    if s is not None:
                        s.close()
                    s = self._streams[name] = self.broker.stream(name)
                dropped, _given = s.housekeep()
            except StreamNotFound:
                stale = self._streams.pop(name, None)
                if stale is not None:
                    stale.close()
                continue
            except ShmqError as e:
                log.warning("stream %s: %s", name, e)
                continue
            if dropped:
                log.info("stream %s: %d record(s) dropped from memory by retention", name, dropped)

    def close(self):
        for h in [*self._queues.values(), *self._streams.values()]:
            h.close()
        self._queues.clear()
        self._streams.clear()
