"""Remote clients of ``shmq server``: blocking (``remote``) and asyncio (``aio``)."""

from .remote import RemoteBroker, RemoteDelivery, RemoteQueue

__all__ = ["RemoteBroker", "RemoteQueue", "RemoteDelivery"]
