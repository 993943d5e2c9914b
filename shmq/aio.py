"""The asyncio client, as ``shmq.aio``: ``broker = await shmq.aio.connect("tcp://host:port")``,
or ``await shmq.aio.connect()`` for a local attach (docs/CLIENTS.md).

Its names are ``shmq.client.aio``'s (the TCP client) and ``connect``, which chooses
between it and the engine's asyncio face (``shmq.engine.aio``), as ``shmq.connect``
chooses between the TCP client and the engine's ``Broker``. ``import shmq`` alone loads
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
)
from .client.aio import connect as _remote

__all__ = ["connect", "AsyncBroker", "AsyncQueue", "AsyncDelivery", "AsyncSubscription", "AsyncStream",
           "AsyncConsumer", "AsyncMultiConsumer", "AsyncStore"]


async def connect(url: str | None = None, token: str | None = None, *, namespace: str | None = None,
                  create: bool = True, **options):
    """Open a connection to ``shmq server`` at ``url`` and say HELLO (with ``token``, else
    the url's, else $SHMQ_TOKEN, else your own server's token on this host: see
    shmq.auth); ``options``: ``shmq.connect``'s (timeouts, reconnecting:
    ``client.options.ConnectOptions``). With no url: attach locally to ``namespace``
    (default: $SHMQ_NAMESPACE, else "shmq"), as ``shmq.connect()`` does, with this API
    (``engine.aio.LocalAsyncBroker``)."""
    if url is None:
        from .engine import aio

        return await aio.connect(namespace, create, token, **options)
    if namespace is not None:
        raise ValueError("namespace= is for a local attach (no url); a server's namespace is its own")
    return await _remote(url, token, **options)
