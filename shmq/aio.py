"""The asyncio client, as ``shmq.aio``: ``broker = await shmq.aio.connect("tcp://host:port")``,
or ``await shmq.aio.connect()`` for a local attach (docs/CLIENTS.md).

Its names are ``shmq.client.aio``'s, re-exported here so that ``import shmq.aio`` and
``from shmq.aio import connect`` work as the docs write them. ``import shmq`` alone loads
no asyncio: this module is imported on first use of ``shmq.aio``.
"""

from .client.aio import (
    AsyncBroker,
    AsyncConsumer,
    AsyncDelivery,
    AsyncMultiConsumer,
    AsyncQueue,
    AsyncStore,
    AsyncStream,
    AsyncSubscription,
    connect,
)

__all__ = ["connect", "AsyncBroker", "AsyncQueue", "AsyncDelivery", "AsyncSubscription", "AsyncStream",
           "AsyncConsumer", "AsyncMultiConsumer", "AsyncStore"]
