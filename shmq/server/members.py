"""The consumer-group members one connection holds (``Members``): over TCP the server is
the member on behalf of each connection; a closed connection leaves.

Strategy: as ``leases`` does for deliveries, a JOIN gets a tag (a member id unique in
the server process, never reused) that is valid only on the connection that joined and
only for its stream. Each member is an engine ``Consumer`` on a stream handle of its own,
so deleting the stream, or the server dropping its cached handle, never pulls the
mapping from under a member: the member hears StreamNotFound as a local one would. The
engine takes a member of a dead process for dead; these all live in the server's
process, so they leave when their connection closes (``release``), and only a dead
server leaves them all at once.
"""

import logging

from ..errors import ShmqError
from .leases import Held

__all__ = ["Members"]

log = logging.getLogger("shmq.server")


class Members(Held):
    """tag -> engine Consumer for one connection."""

    __slots__ = ()

    def join(self, broker, stream: str, group: str, auto_offset_reset: str):
        """A new member of ``group`` on ``stream``: (its tag, its Consumer)."""
        s = broker.stream(stream)
        try:
            c = s.consumer(group, auto_offset_reset)
        except BaseException:
            s.close()
            raise
        return self.hold(c), c

    def get(self, stream: str, tag: int):
        """The member ``tag`` of this connection on ``stream``; ValueError if there is none."""
        c = self.held.get(tag)
        if c is None or c.stream.name != stream:
            raise ValueError(f"no member {tag} of stream {stream!r} on this connection")
        return c

    def leave(self, stream: str, tag: int) -> None:
        """The member leaves its group: its partitions go to the others."""
        self.get(stream, tag)
        self._close(self.held.pop(tag))

    def release(self, notify, peer) -> None:
        """Every member leaves (the connection closed); ``notify(name)`` is told of each
        stream whose groups changed."""
        if not self.held:
            return
        log.info("%s: closed holding %d group members: they leave", peer, len(self.held))
        held, self.held = self.held, {}
        for c in held.values():
            self._close(c)
        for name in {c.stream.name for c in held.values()}:
            notify(name)

    @staticmethod
    def _close(c):
        try:
            c.close()
        except ShmqError as e:  # the stream's lock held by a stopped process...: it is dead in the end
            log.warning("could not leave group %r of stream %r: %s", c.group, c.stream.name, e)
        finally:
            c.stream.close()
