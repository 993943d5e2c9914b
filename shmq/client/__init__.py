"""Remote clients of ``shmq server``: blocking (``remote``) and asyncio (``aio``), two
transports around one sans-IO core (``core``: the connection's state and every call;
``streams``: the stream and consumer-group calls; ``options``: the url, timeouts and
reconnecting; ``forks``: handles across fork())."""

from .remote import RemoteBroker, RemoteConsumer, RemoteDelivery, RemoteQueue, RemoteStream

__all__ = ["RemoteBroker", "RemoteQueue", "RemoteDelivery", "RemoteStream", "RemoteConsumer"]
