"""Keyed stores reached over a connection, written once and sans-IO like the rest of the
core: ``StoreCalls``, the local ``Store``'s methods (``remote`` and ``aio`` only move the
bytes). Arguments are checked with the local engine's words before a byte is sent
(``model.checks``); the server's engine checks the rest (the store's name), and its errors
come back through the one status table, so both transports fail alike. A ``get`` with a
timeout waits at the server, in slices (``core.waiting_until``).
"""

from ..model.checks import (
    check_incr,
    check_store_key,
    check_store_value,
    check_ttl,
    check_wait,
)
from ..protocol import MsgType
from .core import Send, driven, waiting_until

__all__ = ["StoreCalls"]


class StoreCalls:
    """A keyed store reached over a connection: the methods and errors of the local ``Store``."""

    def __init__(self, broker, name: str):
        self._broker = broker
        self.name = name

    def __repr__(self):
        return f"<shmq store {self.name!r} at {self._broker.url}>"

    def _drive(self, call):
        return self._broker._drive(call)

    def _fields(self, key, **more) -> dict:
        return {"store": self.name, "key": check_store_key(key), **more}

    @driven
    def set(self, key: str, value: bytes, ttl: float | None = None, only_new: bool = False):
        """Store ``value`` under ``key`` (expiring in ``ttl`` seconds; ``only_new``: only if
        absent); whether it was stored."""
        fields = self._fields(key, value=check_store_value(value), only_new=bool(only_new))
        if check_ttl(ttl) is not None:
            fields["ttl"] = ttl
        return (yield Send(MsgType.KV_SET, fields))["set"]

    @driven
    def get(self, key: str, timeout: float = 0.0):
        """The value of ``key`` or None; ``timeout`` > 0: wait up to that long for it."""
        fields = self._fields(key)
        if not check_wait(timeout):
            return (yield Send(MsgType.KV_GET, fields))["value"]
        reply = yield from waiting_until(MsgType.KV_GET, fields, lambda r: r["value"] is not None, timeout,
                                         self._broker._clock)
        return reply["value"]

    @driven
    def get_many(self, keys):
        """The values of ``keys``, in order (None for each absent one)."""
        keys = [check_store_key(k) for k in keys]
        if not keys:
            return []
        return (yield Send(MsgType.KV_GET_MANY, {"store": self.name, "keys": keys}))["values"]

    @driven
    def delete(self, *keys: str):
        """Remove ``keys``; how many were there."""
        keys = [check_store_key(k) for k in keys]
        if not keys:
            return 0
        return (yield Send(MsgType.KV_DELETE, {"store": self.name, "keys": keys}))["deleted"]

    @driven
    def incr(self, key: str, by: int = 1, ttl: float | None = None):
        """Add ``by`` to the integer under ``key`` (absent: 0); the sum."""
        fields = self._fields(key, by=check_incr(by))
        if check_ttl(ttl) is not None:
            fields["ttl"] = ttl
        return (yield Send(MsgType.KV_INCR, fields))["value"]

    @driven
    def add(self, key: str, member: str, ttl: float | None = None):
        """Add ``member`` to the set under ``key``; the set's size after."""
        fields = self._fields(key, member=check_store_key(member, "member"))
        if check_ttl(ttl) is not None:
            fields["ttl"] = ttl
        return (yield Send(MsgType.KV_ADD, fields))["size"]

    @driven
    def members(self, key: str):
        """The members of the set under ``key`` (empty if absent)."""
        return set((yield Send(MsgType.KV_MEMBERS, self._fields(key)))["members"])

    @driven
    def expire(self, key: str, ttl: float | None):
        """Make ``key`` expire in ``ttl`` seconds (None: never); whether it was there."""
        return (yield Send(MsgType.KV_EXPIRE, self._fields(key, ttl=check_ttl(ttl))))["found"]

    @driven
    def ttl(self, key: str):
        """Seconds until ``key`` expires; None if it never does or is not there."""
        return (yield Send(MsgType.KV_TTL, self._fields(key)))["ttl"]

    @driven
    def keys(self, prefix: str = ""):
        """The keys that start with ``prefix``, sorted."""
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        if prefix:
            check_store_key(prefix, "prefix")
        return (yield Send(MsgType.KV_KEYS, {"store": self.name, "prefix": prefix}))["keys"]

    @driven
    def clear(self):
        """Remove every key; how many were there."""
        return (yield Send(MsgType.KV_CLEAR, {"store": self.name}))["cleared"]

    @driven
    def sweep(self):
        """Remove the expired keys and give their memory back; how many went."""
        return (yield Send(MsgType.KV_SWEEP, {"store": self.name}))["swept"]
