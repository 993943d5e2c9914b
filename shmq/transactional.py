"""Native transactions for a local broker handle (``shmq.connect()``'s ``Broker``, and the
local asyncio one): ``Broker.transactional`` builds a ``LocalTransactional``.

Strategy: a transaction needs its coordinator, and the coordinator is the namespace's
server (``server/transactions``): it writes a transaction's records and markers and holds
its groups' offsets, so that every reader, native or Kafka's, sees it whole or not at all.
A local handle's transactional producer is therefore the TCP one (``client/transactions``)
on a connection of its own to that server, found in the namespace's lock file (where
``shmq status`` finds it) and closed with the producer; the producer's process still
reads and consumes in shared memory, and a local consumer's offsets go into the
transaction fenced by its membership as its own commit is. This module stands above the
engine and plugs into it, as ``shmq.producer`` does (the engine knows no wire).
"""

from .client.aio import AsyncTransactional
from .client.aio import connect as aio_connect
from .client.remote import RemoteBroker, RemoteTransactional
from .engine.broker import Broker
from .errors import ShmqError
from .server.lock import holder

__all__ = ["LocalTransactional", "LocalAsyncTransactional", "server_url", "local", "local_async"]


def server_url(namespace: str) -> str:
    """The url of ``namespace``'s running server (``tcp://host:port``); ShmqError, in one
    line, when none runs or it speaks TLS (then connect with ``tcps://`` and its CA)."""
    info = holder(namespace)
    if info is None or not info.get("alive") or not info.get("port"):
        raise ShmqError(f"transactions need namespace {namespace!r}'s server, its coordinator, and none runs (start "
                        f"one: shmq server --namespace {namespace})")
    if info.get("tls"):
        raise ShmqError(f"namespace {namespace!r}'s server speaks TLS: take the transactional producer from "
                        f"shmq.connect('tcps://...', ssl=...).transactional(...)")
    host = info.get("host") or "127.0.0.1"
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"tcp://[{host}]:{info['port']}" if ":" in host else f"tcp://{host}:{info['port']}"


class LocalTransactional(RemoteTransactional):
    """A local handle's transactional producer: the TCP one on a connection of its own to
    the namespace's server, closed with it."""

    def close(self) -> None:
        super().close()
        self._broker.close()


class LocalAsyncTransactional(AsyncTransactional):
    """The same for the local asyncio broker (``shmq.aio.connect()`` with no url)."""

    def close(self) -> None:
        super().close()
        self._closer = self._broker.close()  # (a coroutine: ``aclose`` awaits it)

    async def aclose(self) -> None:
        self.close()
        await self._closer

    async def __aexit__(self, *exc):
        await self.aclose()


def local(broker: Broker, transactional_id: str, timeout: float = 60.0) -> LocalTransactional:
    """``Broker.transactional``: the id taken (init) over a new connection to the server."""
    remote = RemoteBroker(server_url(broker.namespace))
    try:
        t = LocalTransactional(remote, transactional_id, timeout)
        t.init()
    except BaseException:
        remote.close()
        raise
    return t


async def local_async(namespace: str, transactional_id: str, timeout: float = 60.0) -> LocalAsyncTransactional:
    """The local asyncio broker's ``transactional``."""
    remote = await aio_connect(server_url(namespace))
    try:
        t = LocalAsyncTransactional(remote, transactional_id, timeout)
        await t.init()
    except BaseException:
        await remote.close()
        raise
    return t


