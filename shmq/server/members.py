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

from ..engine.streams.consumer import Consumer
from ..errors import ShmqError
from .leases import Held

__all__ = ["Members", "HeldConsumer"]

log = logging.getLogger("shmq.server")


class Members(Held):
    """tag -> engine Consumer for one connection."""

    __slots__ = ()

    def join(self, broker, stream: str, group: str, auto_offset_reset: str, **options):
        """A new member of ``group`` on ``stream``: (its tag, its Consumer). ``options``:
        the Consumer's keywords (max_poll_interval)."""
        s = broker.stream(stream)
        try:
            c = HeldConsumer(s, group, auto_offset_reset, **options)
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


class HeldConsumer(Consumer):
    """The engine Consumer of a member held for a client: a poll that finds the
    assignment moved notes the changes (``told``) and answers at once, before it reads,
    so that the client calls its on_revoke / on_assign first (a seek there counts); the
    revoked partitions' positions stay for the client's on_revoke commit till its next
    poll. Auto-commit and the callbacks are the client's."""

    def __init__(self, *args, **options):
        self.told = ({}, [])  # (revoked {partition: position}, assigned) for the next POLL reply
        super().__init__(*args, **options)
        self.joined = list(self._assigned)  # the first assignment: told with the JOIN reply

    def _changed(self, revoked, assigned) -> bool:
        if self.joined is not None:
            assigned, self.joined = [p for p in assigned if p not in self.joined], None
        if not (revoked or assigned):
            return False
        self.told[0].update(revoked)
        self.told[1].extend(p for p in assigned if p not in self.told[1])
        return True

    def polling(self, wait: float) -> None:
        """The client polls now and may wait ``wait`` seconds: its poll deadline moves on."""
        self._polled(int(wait * 1e9))

    def commit_for_client(self, offsets: dict | None, revoked: bool) -> None:
        """The client's ``commit``: with ``revoked``, its on_revoke's (the partitions the
        last POLL reply revoked count)."""
        self._check_open()
        self._commit(offsets, revoking=revoked)

    def positions(self) -> dict:
        """{owned partition: this member's position} (what a POLL_MANY tells of a member
        whose stream went)."""
        return dict(self._positions)

    def take_told(self) -> dict:
        """The changes for a POLL reply (none: {}), told once."""
        revoked, assigned = self.told
        if not (revoked or assigned):
            return {}
        self.told = ({}, [])
        out = {"assigned": sorted(assigned)} if assigned else {}
        if revoked:
            out["revoked"] = [[p, o] for p, o in sorted(revoked.items())]
        return out
