"""Remote clients of ``shmq server``: blocking (``remote``) and asyncio (``aio``), two
transports around one sans-IO core (``core``: the connection's state and every call)."""

from .remote import RemoteBroker, RemoteDelivery, RemoteQueue

__all__ = ["RemoteBroker", "RemoteQueue", "RemoteDelivery"]
