"""Renewing the leases of the deliveries a Dramatiq worker holds.

Strategy: a delivery handed to Dramatiq stays leased until it is settled, however long
its job runs. ``renew(d, visibility_timeout)`` uses the delivery's own ``keepalive()``
where the client has it (the LEASES contract: every transport, one renewal thread or
task per process). INTERIM, until that lands: one daemon thread per process that
extends each registered delivery by the visibility timeout every third of it. A
delivery whose lease is gone (lapsed, or its connection lost) is dropped from the
round; the job goes on and its ack then finds it expired, as on any broker.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from ..errors import DeliveryExpired, ShmqError

__all__ = ["renew"]

log = logging.getLogger(__name__)


def renew(d, visibility_timeout: float):
    """Keep ``d`` leased until the returned handle's ``stop()`` (or ``d`` is settled)."""
    keepalive = getattr(d, "keepalive", None)
    if keepalive is not None:
        return keepalive(visibility_timeout / 3)
    return _renewer().add(d, visibility_timeout)


class _Ticket:
    __slots__ = ("renewer", "key")

    def __init__(self, renewer, key):
        self.renewer, self.key = renewer, key

    def stop(self) -> None:
        self.renewer.remove(self.key)


class _Renewer:
    """INTERIM (until ``Delivery.keepalive``): one thread renewing every held delivery."""

    def __init__(self):
        self._cond = threading.Condition()
        self._held: dict[int, list] = {}  # key: [delivery, lease seconds, next renewal (monotonic)]
        self._keys = iter(range(1, 1 << 62))
        threading.Thread(target=self._run, name="shmq-dramatiq-leases", daemon=True).start()

    def add(self, d, seconds: float) -> _Ticket:
        with self._cond:
            key = next(self._keys)
            self._held[key] = [d, seconds, time.monotonic() + seconds / 3]
            self._cond.notify()
        return _Ticket(self, key)

    def remove(self, key: int) -> None:
        with self._cond:
            self._held.pop(key, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due = [(k, e) for k, e in self._held.items() if e[2] <= now]
                if not due:
                    nearest = min((e[2] for e in self._held.values()), default=now + 60.0)
                    self._cond.wait(nearest - now)
                    continue
                for _, e in due:
                    e[2] = now + e[1] / 3
            for key, (d, seconds, _) in due:
                try:
                    d.extend(seconds)
                except DeliveryExpired:
                    self.remove(key)
                except ShmqError as e:  # a lost connection: its deliveries are given back anyway
                    log.debug("renewing %r failed: %s", d, e)


_state: dict = {}
_state_lock = threading.Lock()


def _renewer() -> _Renewer:
    """This process's renewer (a fork child starts its own: threads do not survive fork)."""
    pid = os.getpid()
    with _state_lock:
        if _state.get("pid") != pid:
            _state["pid"], _state["renewer"] = pid, _Renewer()
        return _state["renewer"]
