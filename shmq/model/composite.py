"""What a member of a consumer group on several streams is, whichever transport it
uses: ``Subscription`` (the streams it wants: names or a pattern) and ``Composite`` (its
arguments checked, its members by stream, the records its iteration holds, the calls
that need no more than these). ``engine.streams.multiconsumer.MultiConsumer`` and
``client.multiconsumer.MultiConsumerCalls`` build on it."""

import re
from collections import deque

from ..errors import ShmqError
from .checks import check_auto_commit, check_callback, check_group, check_poll_interval, check_refresh, check_reset
from .records import TopicPartition, by_stream

__all__ = ["Subscription", "check_subscription", "Composite"]


class Subscription:
    """Which streams a consumer of several wants: ``streams`` (names) or ``pattern`` (a
    regular expression matched against the whole name, as Kafka's), checked."""

    def __init__(self, streams=None, pattern=None):
        if streams is not None and pattern is not None:
            raise ValueError("give streams or pattern, not both")
        if streams is None and pattern is None:
            raise ValueError("give streams (a list of names) or pattern (a regular expression)")
        self.pattern = None
        self.streams = None
        if pattern is not None:
            if isinstance(pattern, re.Pattern):
                self.pattern = pattern
            elif not isinstance(pattern, str):
                raise TypeError(f"pattern must be a str or a compiled regular expression, not "
                                f"{type(pattern).__name__}")
            else:
                try:
                    self.pattern = re.compile(pattern)
                except re.error as e:
                    raise ValueError(f"pattern {pattern!r} is not a regular expression: {e}") from None
            return
        if isinstance(streams, (str, bytes)) or not all(isinstance(n, str) for n in streams):
            raise TypeError(f"streams must be a list of stream names, not {streams!r:.80}")
        self.streams = list(dict.fromkeys(streams))
        if not self.streams:
            raise ValueError("streams must name at least one stream")

    def __repr__(self):
        return f"pattern={self.pattern.pattern!r}" if self.pattern is not None else f"streams={self.streams!r}"

    def wanted(self, existing) -> list[str]:
        """The streams of ``existing`` (the namespace's names) this subscription takes, sorted."""
        if self.pattern is not None:
            return sorted(n for n in existing if self.pattern.fullmatch(n))
        have = set(existing)
        return sorted(n for n in self.streams if n in have)


def check_subscription(streams, pattern) -> Subscription:
    return Subscription(streams, pattern)


class Composite:
    """What a member of a group on several streams is, locally (``MultiConsumer``) or
    over a connection (``client.multiconsumer.MultiConsumerCalls``): its arguments
    checked, its members by stream name, the records the iteration holds, the pairs
    being revoked (in on_revoke), and the calls that need no more than these."""

    def __init__(self, broker, group: str, streams=None, pattern=None, auto_offset_reset: str = "earliest", *,
                 on_assign=None, on_revoke=None, auto_commit: bool = False, auto_commit_interval: float = 5.0,
                 max_poll_interval: float | None = 300.0, refresh_interval: float = 5.0):
        self.subscribed = check_subscription(streams, pattern)
        self.group = check_group(group)
        self.auto_offset_reset = check_reset(auto_offset_reset)
        self.on_assign, self.on_revoke = check_callback(on_assign, "on_assign"), check_callback(on_revoke, "on_revoke")
        self._auto_ns = check_auto_commit(auto_commit, auto_commit_interval)
        self._refresh_ns = check_refresh(refresh_interval)
        check_poll_interval(max_poll_interval)
        self._max_poll_interval = max_poll_interval
        self._broker = broker
        self._members = {}  # stream name -> its member
        self._buffer = deque()  # polled by the iteration, not yet handed out
        self._revoking = None  # in on_revoke: {TopicPartition: position}
        self._turn = 0
        self._closed = False

    def __repr__(self):
        return f"<shmq.{type(self).__name__} {self.group} {self.subscribed} streams={sorted(self._members)}>"

    def _check_open(self):
        if self._closed:
            raise ShmqError(f"consumer of group {self.group!r} is closed")

    def subscription(self) -> list[str]:
        """The streams this member is on now (for a pattern: those matching it at the last refresh)."""
        return sorted(self._members)

    def _member(self, stream: str):
        """The member on ``stream``; ValueError for a stream this one is not on."""
        m = self._members.get(stream)
        if m is None:
            raise ValueError(f"stream {stream!r} is not one of this member's {sorted(self._members)} (group "
                             f"{self.group!r})")
        return m

    def _held_position(self, tp: TopicPartition):
        """``position(tp)`` where it is known here: ``tp`` being revoked (in on_revoke),
        or the offset of its first record the iteration holds; else None."""
        if self._revoking is not None and tp in self._revoking:
            return self._revoking[tp]
        return next((r.offset for r in self._buffer if (r.stream, r.partition) == tp), None)

    def _owner(self, tp: TopicPartition):
        """The member that owns ``tp``; KeyError for another stream's."""
        m = self._members.get(tp.stream)
        if m is None:
            raise KeyError(f"{tp} is not assigned to this member of group {self.group!r} (its streams: "
                           f"{sorted(self._members)})")
        return m

    def _seek_groups(self, tps) -> dict:
        """{stream: [partition, ...]} of the pairs ``tps`` (none: every stream, all its own)."""
        self._check_open()
        return by_stream(tps) if tps else {n: [] for n in self._members}

    def _drop_buffered(self, tps) -> None:
        """Forget the records the iteration holds of ``tps`` (None: all)."""
        if self._buffer:
            self._buffer = deque(r for r in self._buffer
                                 if tps is not None and (r.stream, r.partition) not in tps)

    def _call_back(self, revoked: dict, assigned: list) -> None:
        """on_revoke (``position`` answering for the revoked pairs meanwhile), then
        on_assign, each called once with the pairs of every stream, sorted."""
        if revoked and self.on_revoke is not None:
            self._revoking = revoked
            try:
                self.on_revoke(sorted(revoked))
            finally:
                self._revoking = None
        if assigned and self.on_assign is not None:
            self.on_assign(sorted(assigned))
