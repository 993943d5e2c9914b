"""The faces that stand above the engine and the TCP clients but that a handle below
them hands out: the batching producer (``Stream.producer``, local or over TCP) and a
local broker's transactional producer (``Broker.transactional``, blocking or asyncio;
it talks to the namespace's server). A lower floor never imports a higher one, so the
slots here are filled from the top: ``shmq``'s own ``__init__``, which runs before any
module of the package, puts in each a factory that loads its module on first call.
"""

__all__ = ["producer", "transactional", "transactional_async"]

producer = None  # (stream, linger_ms=, batch_bytes=, compression=) -> shmq.producer.Producer
transactional = None  # (local Broker, transactional_id, timeout) -> shmq.transactional.LocalTransactional
transactional_async = None  # async (namespace, transactional_id, timeout) -> its asyncio twin
