"""The hot paths a queue handle runs, bound when it attaches: C's (``_fast.c``), or
Python's, whose entries are None ("take the Python path").

Strategy: aiokafka's ``_crecords`` or its pure-Python twin, picked once; here once per
handle, from ``cpaths``' default (``chosen``), so the tests and the benchmark run both in
one process. A handle reads ``self.paths.put`` where it would read a module global; the
Python paths need no entry, only the ``Delivery`` class they build.
"""

from ..shm import cpaths
from .delivery import CDelivery, PythonDelivery

__all__ = ["QueuePaths", "C", "PYTHON", "chosen"]

_CALLS = ("put", "put_many", "take", "take_many", "take_next", "ack", "ack_many", "nack_many", "reserve", "publish",
          "Loan", "Reservation", "Reservations")


class QueuePaths:
    """``kind`` ("c" or "python"); the C calls (None each on the Python paths): ``put``,
    ``put_many``, ``take``, ``take_many``, ``take_next`` (the consume loop's step),
    ``ack``, ``ack_many``, ``nack_many``, ``reserve`` and ``publish`` (a record placed at
    the tail, the lock kept; its commit), ``Loan`` (a writable window of a mapping that
    counts its views), ``Reservation`` (``reserve``'s object for a small body, claimed and
    published in C), ``Reservations`` (``reserve_many``'s, small bodies claimed together and
    published together); and ``Delivery``, the class every path of the handle builds."""

    __slots__ = ("kind", "Delivery", *_CALLS)

    def __init__(self, kind: str, delivery_class, calls=None):
        self.kind = kind
        self.Delivery = delivery_class
        for name in _CALLS:
            setattr(self, name, getattr(calls, name) if calls is not None else None)

    @property
    def uses_c(self) -> bool:
        return self.kind == "c"

    def __repr__(self):
        return f"<QueuePaths {self.kind}>"


PYTHON = QueuePaths("python", PythonDelivery)
C = QueuePaths("c", CDelivery, cpaths.C) if cpaths.C is not None else None


def chosen() -> QueuePaths:
    """The paths of a handle attached now (``cpaths.set_enabled``)."""
    return C if cpaths.enabled() else PYTHON
