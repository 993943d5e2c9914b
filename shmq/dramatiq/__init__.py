"""Dramatiq on shmq (docs/JOBS.md)::

    import dramatiq
    from shmq.dramatiq import ShmqBroker
    dramatiq.set_broker(ShmqBroker())                    # local attach: $SHMQ_NAMESPACE or namespace=
    dramatiq.set_broker(ShmqBroker("tcp://host:7878"))   # a shmq server

Results: ``broker.add_middleware(Results(backend=ShmqResultBackend()))``.
"""

from .broker import DEAD_LETTER_SUFFIX, PRIORITY_OPTION, ShmqBroker
from .results import ShmqResultBackend

__all__ = ["ShmqBroker", "ShmqResultBackend", "DEAD_LETTER_SUFFIX", "PRIORITY_OPTION"]
