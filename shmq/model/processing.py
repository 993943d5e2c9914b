"""``with d.process(): ...``: a delivery settled as its block ends, for the local,
blocking TCP and asyncio deliveries alike (it calls only their own ack / nack / reject
and keepalive)."""

import logging

__all__ = ["Processing"]

_log = logging.getLogger("shmq")


class Processing:
    """``Delivery.process()``: settles the delivery as its block ends (aio-pika's
    ``message.process``). ``with`` for the local and blocking deliveries, ``async with``
    for the asyncio client's. If the settling fails after the block raised (a lost
    connection), the block's exception goes on and the lease lapses: nothing is lost.
    With ``renew``, the delivery's ``keepalive()`` runs while the block does."""

    __slots__ = ("_d", "_requeue", "_renew", "_kept")

    def __init__(self, d, requeue: bool, renew: bool = False):
        self._d = d
        self._requeue = requeue
        self._renew = renew
        self._kept = None

    def _keep(self):
        if self._renew:
            self._kept = self._d.keepalive()
        return self._d

    def _unkeep(self):
        if self._kept is not None:
            self._kept.stop()  # (the settle stopped it already, unless it raised first)

    def _settle(self, failed: bool):
        d = self._d
        if not failed:
            return d.ack()
        return d.nack() if self._requeue else d.reject()

    def __enter__(self):
        return self._keep()

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self._settle(False)
                return False
            try:
                self._settle(True)
            except Exception as e:  # the block's exception matters more; the lease will lapse
                _log.warning("could not give back %r after its block raised: %s", self._d, e)
            return False
        finally:
            self._unkeep()

    async def __aenter__(self):
        return self._keep()

    async def __aexit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                await self._settle(False)
                return False
            try:
                await self._settle(True)
            except Exception as e:
                _log.warning("could not give back %r after its block raised: %s", self._d, e)
            return False
        finally:
            self._unkeep()
