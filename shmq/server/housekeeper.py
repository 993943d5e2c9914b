"""Periodic housekeeping of every queue in a namespace.

Strategy: housekeeping never depends on this loop — any process using a queue does
the due work itself — but a broker that runs it keeps leases of dead consumers and
delayed messages moving even while no client is calling ``get``.
"""

import logging

from ..engine import maintenance
from ..engine.broker import Broker
from ..engine.queues.rpc import remove_orphans
from ..errors import QueueNotFound, ShmqError

__all__ = ["Housekeeper"]

log = logging.getLogger("shmq.server")


class Housekeeper:
    """Attaches to every queue of ``broker``'s namespace and calls ``Queue._housekeep`` on each."""

    def __init__(self, broker: Broker):
        self.broker = broker
        self._queues = {}

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
        return total

    def close(self):
        for q in self._queues.values():
            q.close()
        self._queues.clear()
