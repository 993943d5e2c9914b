"""A stream's consumer-group member (``Consumer``): polls the partitions it owns from the
group's committed offsets, commits, seeks, pauses, and follows the assignment as members
come and go (the group table: ``groups``); ``Iterating``, the ``with`` and ``for`` of a
local consumer, shared with the multi-stream one (``multiconsumer``).

Strategy: a member re-reads its group's view (members, generation, owners since) every
``REFRESH_NS`` or when a poll finds its generation moved, and derives its own partitions
from it as every member does (``groups.assign``); see ``groups`` for the rules a commit
is fenced by.
"""

import logging
import time
from collections import deque

from ...errors import CommitFailed, OffsetOutOfRange, ShmqError, StreamNotFound
from ...model.checks import check_auto_commit, check_callback, check_poll_interval, check_reset
from ...model.checks import check_group as _group_name
from ...model.checks import check_offset as _check_offset
from ...model.records import Record
from ..shm import waits

__all__ = ["Consumer", "Iterating", "REFRESH_NS"]

log = logging.getLogger("shmq.stream")

_mono = time.monotonic_ns
REFRESH_NS = 500_000_000  # how often a consumer checks that the other members of its group live


class Iterating:
    """A local consumer's ``with`` (closes it) and ``for record in consumer``: polls
    (``_poll``), waiting as needed, into ``_buffer`` until ``_closed``."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __iter__(self):
        return self

    def __next__(self) -> Record:
        """The next record, polling (and waiting) as needed; StopIteration once closed."""
        while not self._buffer:
            if self._closed:
                raise StopIteration
            self._buffer.extend(self._poll(500, 1.0))
        return self._buffer.popleft()


class Consumer(Iterating):
    """A member of a consumer group: polls the partitions it owns, from the group's
    committed offsets on, and commits what it processed (the next offset to read).

    Kafka's consumer semantics: ``seek`` / ``seek_to_beginning`` / ``seek_to_end`` /
    ``position`` of owned partitions, ``pause`` / ``resume`` (a paused partition stays
    owned, unread), ``on_assign`` / ``on_revoke`` called from ``poll`` as the assignment
    moves (in ``on_revoke`` the revoked partitions' positions are still there, and
    ``commit()`` commits them while their new owner has committed nothing), optional
    auto-commit every ``auto_commit_interval`` seconds (off by default: docs/STREAMS.md
    says why), ``max_poll_interval`` (a member that does not poll for that long is taken
    out of the group; its next poll joins again), and ``for record in consumer``. ``stream``: the
    ``Stream`` handle it reads (``Stream.consumer`` makes one)."""

    def __init__(self, stream, group: str, auto_offset_reset: str = "earliest", *, on_assign=None,
                 on_revoke=None, auto_commit: bool = False, auto_commit_interval: float = 5.0,
                 max_poll_interval: float | None = 300.0):
        self.stream = stream
        self.group = _group_name(group)
        self.auto_offset_reset = check_reset(auto_offset_reset)
        self.on_assign, self.on_revoke = check_callback(on_assign, "on_assign"), check_callback(on_revoke, "on_revoke")
        self._auto_ns = check_auto_commit(auto_commit, auto_commit_interval)
        self._limit_ns = check_poll_interval(max_poll_interval)
        self._owned = []
        self._positions = {}
        self._seen = {}  # {owned partition: the committed offset this member last saw there}
        self._paused = set()
        self._lost = {}  # {revoked partition: (position, committed last seen)}, until the next poll
        self._revoked = {}  # revocations not yet reported (on_revoke): {partition: position}
        self._assigned = []  # assignments not yet reported (on_assign)
        self._revoking = False  # in on_revoke: commit() covers the revoked partitions too
        self._buffer = deque()  # polled by the iteration, not yet handed out
        self._next_reap = 0
        self._turn = 0
        self._closed = False
        self._deadline = self._poll_deadline(0)
        self._member, self._gen = stream.groups_table.join(self.group, self._deadline)
        self._next_auto = None if self._auto_ns is None else _mono() + self._auto_ns
        self._refresh(force=True)

    def __repr__(self):
        return f"<shmq.Consumer {self.stream.name}/{self.group} member={self._member} owns={self._owned}>"

    # ------------------------------------------------------------------ the group's view
    def _poll_deadline(self, wait_ns) -> int:
        """The poll deadline of a member that polls now and may wait ``wait_ns``: 0 for none."""
        return 0 if self._limit_ns is None else _mono() + wait_ns + self._limit_ns

    def _polled(self, wait_ns) -> None:
        """This member polls now (and waits up to ``wait_ns``): its deadline moves on."""
        deadline = self._poll_deadline(wait_ns)
        if deadline > self._deadline + (self._limit_ns or 0) // 16:  # a lock now and then, not every poll
            self._deadline = deadline
            self.stream.groups_table.polled(self.group, self._member, deadline)

    def _refresh(self, force=False):
        """Take the group's current view when its generation moved (or the liveness
        check is due): a partition this member has owned without a break since the view
        it had goes on from its position; any other starts at the committed offset (it is
        new to this member, or someone else owned it in between) and is reported to
        on_assign; lost ones are reported to on_revoke, their positions kept till then."""
        now = _mono()
        reap = now >= self._next_reap
        if not (force or reap or self.stream.groups_table.generation(self.group) != self._gen):
            return
        if reap:
            self._next_reap = now + REFRESH_NS
        table = self.stream.groups_table
        gen, owned, committed, since = table.view(self.group, self._member, reap)
        rejoined = owned is None
        if rejoined:  # we were taken for dead: join again, a new member with nothing of the old one's
            self._deadline = self._poll_deadline(0)
            self._member, gen = table.join(self.group, self._deadline)
            gen, owned, committed, since = table.view(self.group, self._member, False)
        owned = list(owned or [])
        kept = {p for p in owned if not rejoined and p in self._positions and since[p] <= self._gen}
        for p in self._owned:
            if p not in kept:  # where the member is there: before the records the iteration held, dropped below
                at = self.position(p)
                self._revoked[p] = at
                self._lost[p] = (at, self._seen.get(p))
        gained = [p for p in owned if p not in kept]
        self._assigned = sorted(set(self._assigned) | set(gained))
        self._paused &= kept
        if self._buffer and len(kept) < len(self._owned):
            self._buffer = deque(r for r in self._buffer if r.partition in kept)
        self._positions = {p: self._positions[p] if p in kept else self._start(p, committed) for p in owned}
        self._seen = {p: committed.get(p) for p in owned}
        self._gen, self._owned = gen, owned

    def _start(self, p, committed):
        if p in committed:
            return committed[p]
        earliest, end = self.stream.offsets(p)
        if self.auto_offset_reset == "none":
            raise OffsetOutOfRange(f"group {self.group!r} has no committed offset for partition {p} of "
                                   f"stream {self.stream.name!r}", earliest, end)
        return earliest if self.auto_offset_reset == "earliest" else end

    def _report(self) -> bool:
        """Tell the assignment's changes not yet told: ``_changed``; True to answer now."""
        if not (self._revoked or self._assigned):
            return False
        revoked, assigned = self._revoked, self._assigned
        self._revoked, self._assigned = {}, []
        # what an on_revoke commit covers: these, not those told before (close() reports without a poll)
        self._lost = {p: self._lost[p] for p in revoked if p in self._lost}
        if assigned:  # they start at the commit of now: the previous owner's on_revoke may have moved it
            committed = self.stream.groups_table.committed(self.group)
            for p in assigned:
                if p in self._positions and p in committed and committed[p] != self._seen[p]:
                    self._positions[p] = self._seen[p] = committed[p]
        return self._changed(revoked, assigned)

    def _changed(self, revoked: dict, assigned: list) -> bool:
        """The assignment moved: ``revoked`` {partition: position} went, ``assigned`` came.
        Auto-commit commits the revoked positions, then on_revoke and on_assign are
        called. Returns whether the poll answers now, before it reads (a hook: the server
        answers, so that its client calls its own callbacks first)."""
        if revoked and self._auto_ns is not None:
            self._quietly(lambda: self._commit(dict(revoked), revoking=True))
        if revoked and self.on_revoke is not None:
            self._revoking = True
            try:
                self.on_revoke(sorted(revoked))
            finally:
                self._revoking = False
        if assigned and self.on_assign is not None:
            self.on_assign(list(assigned))
        return False

    def _quietly(self, commit) -> None:
        """An auto-commit: a refusal is logged, as Kafka's auto-commit does."""
        try:
            commit()
        except CommitFailed as e:
            log.warning("stream %s group %s: auto-commit refused: %s", self.stream.name, self.group, e)

    # ------------------------------------------------------------------ positions
    def assignment(self) -> list[int]:
        """The partitions this member owns now."""
        self._check_open()
        self._refresh()
        return list(self._owned)

    def position(self, p: int) -> int:
        """The next offset this member reads from partition ``p`` (one it owns, or one
        being revoked, in on_revoke); KeyError for another."""
        if p in self._positions:
            first = next((r.offset for r in self._buffer if r.partition == p), None)
            return self._positions[p] if first is None else first
        if self._revoking and p in self._lost:
            return self._lost[p][0]
        raise KeyError(self._not_owned(p))

    def positions(self) -> dict:
        """{partition: the next offset this member reads} of each partition it owns (what
        ``commit()`` commits)."""
        return {p: self.position(p) for p in self._owned}

    def membership(self) -> tuple[str, int, int, list]:
        """(group, member id, generation, owned partitions) as this member last saw them:
        what a commit of its offsets is fenced by (a transaction's too:
        ``Transactional.commit_offsets``)."""
        self._check_open()
        return self.group, self._member, self._gen, list(self._owned)

    def _not_owned(self, p) -> str:
        return (f"partition {p!r} of stream {self.stream.name!r} is not assigned to this member of group "
                f"{self.group!r} (it owns {self._owned})")

    def _owned_of(self, ps) -> list:
        self._check_open()
        for p in ps:
            if p not in self._positions:
                raise ValueError(self._not_owned(p))
        return list(ps)

    def seek(self, p: int, offset: int) -> None:
        """Read partition ``p`` (owned) from ``offset`` at the next poll; commits nothing.
        An offset no longer retained is read as auto_offset_reset says."""
        offset = _check_offset(offset)
        self._move({p: offset for p in self._owned_of([p])})

    def seek_to_beginning(self, *partitions) -> None:
        """Read these partitions (default: all owned) from their earliest retained offset."""
        ps = self._owned_of(partitions or self._owned)
        self._move({p: self.stream.offsets(p)[0] for p in ps})

    def seek_to_end(self, *partitions) -> None:
        """Read these partitions (default: all owned) from their end: only what comes next."""
        ps = self._owned_of(partitions or self._owned)
        self._move({p: self.stream.stable(p) for p in ps})  # (the last stable offset: an open transaction's come)

    def _move(self, positions: dict) -> None:
        if self._buffer:
            self._buffer = deque(r for r in self._buffer if r.partition not in positions)
        self._positions.update(positions)

    def pause(self, *partitions) -> None:
        """Stop reading these owned partitions (they stay this member's) until ``resume``."""
        ps = self._owned_of(partitions)
        if self._buffer:  # records polled and not handed out are read again after resume
            self._move({p: self.position(p) for p in ps})
        self._paused.update(ps)

    def resume(self, *partitions) -> None:
        """Read these paused partitions again."""
        self._paused.difference_update(self._owned_of(partitions))

    def paused(self) -> list[int]:
        """The owned partitions paused now."""
        return sorted(self._paused)

    # ------------------------------------------------------------------ poll, commit
    def poll(self, max_records: int = 500, timeout: float = 1.0) -> list[Record]:
        """Records from the partitions this member owns and has not paused, from where it
        is on; waits up to ``timeout`` seconds for some, returns [] if none came. Calls
        on_revoke / on_assign first when the assignment moved, and commits when
        auto-commit is due."""
        self._check_open()
        if isinstance(max_records, bool) or not isinstance(max_records, int) or max_records < 1:
            raise ValueError(f"max_records must be a positive int, not {max_records!r}")
        if self._buffer:
            self._polled(0)
            return [self._buffer.popleft() for _ in range(min(max_records, len(self._buffer)))]
        return self._poll(max_records, timeout)

    def _poll(self, max_records, timeout):
        wait_ns = waits.seconds_ns(timeout, "timeout")
        deadline = _mono() + wait_ns
        self._polled(wait_ns)
        self._lost = {p: self._lost[p] for p in self._revoked if p in self._lost}  # told: let go
        if self._next_auto is not None and _mono() >= self._next_auto:
            self._next_auto = _mono() + self._auto_ns
            self._quietly(lambda: self._commit(None))
        s = self.stream
        while True:
            if self._look():
                return []
            out = self._read_round(max_records)
            if out or _mono() >= deadline:
                return out
            positions = {p: o for p, o in self._positions.items() if p not in self._paused}
            s._wait(deadline, lambda: any(s.stable(p) > o for p, o in positions.items()))

    def _look(self) -> bool:
        """Take the group's view (when due) and tell what moved: True when something was
        told, and the poll then answers before it reads."""
        self._refresh()
        return self._report()

    def look(self) -> bool:
        """The first half of a poll, for those that answer for several reads (a server's
        POLL, a member of several streams): the group's view taken (when due) and the
        assignment's changes told, before anything is read; True if there were any. The
        reads that follow (``read_on``) take no view: records read before a rebalance and
        a revocation found after it never go out together, so a revoked partition's
        position (what on_revoke's or auto-commit's commit stores) never covers records
        its member has not been handed yet."""
        self._check_open()
        self._polled(0)
        self._lost = {p: self._lost[p] for p in self._revoked if p in self._lost}  # told: let go
        return self._look()

    def read_on(self, max_records: int) -> list[Record]:
        """Records from where this member is, under the view it has (``look``): no view is
        taken, nothing is told, nothing waits."""
        self._check_open()
        if self._buffer:
            return [self._buffer.popleft() for _ in range(min(max_records, len(self._buffer)))]
        return self._read_round(max_records)

    def _read_round(self, max_records) -> list[Record]:
        """One pass over the owned partitions not paused, taking turns, without waiting."""
        s, out = self.stream, []
        owned = [p for p in self._owned if p not in self._paused]
        for k in range(len(owned)):
            p = owned[(self._turn + k) % len(owned)]
            rows = self._read(p, max_records - len(out))
            if rows:
                out += [s._record(p, row) for row in rows]
            if rows.next > self._positions[p]:  # (past markers and aborted records too)
                self._positions[p] = rows.next
            if len(out) >= max_records:
                break
        self._turn += 1
        return out

    def _read(self, p, n):
        """A reader's records of ``p`` from this member's position (``Partition.read``'s
        ``Rows``: committed transactions' records only, ``next`` where to read on)."""
        try:
            return self.stream._part(p).read(self._positions[p], n, None, True)  # (visible)
        except OffsetOutOfRange as e:
            if self.auto_offset_reset == "none" or self._positions[p] > e.end:
                raise
            log.warning("stream %s partition %d: group %s skips offsets %d..%d, dropped by retention or lost",
                        self.stream.name, p, self.group, self._positions[p], e.earliest - 1)
            self._positions[p] = e.earliest
            return self.stream._part(p).read(e.earliest, n, visible=True)

    def commit(self, offsets: dict | None = None) -> None:
        """Commit ``{partition: next offset to read}`` (default: where this member is in
        every partition it owns, never past a record the iteration has not handed out),
        all or nothing; an explicit offset may be below the committed one (the group
        reads from there again, this member's position stays). CommitFailed, committing
        nothing, if a partition named went to another member since this member's last
        poll (also if it came back since); then poll again: partitions it kept go on
        from its position. In on_revoke it covers the revoked partitions too."""
        self._check_open()
        self._commit(offsets, self._revoking)

    def _commit(self, offsets, revoking=False) -> None:
        """``commit``; with ``revoking``, the partitions being revoked count (the commit
        of an on_revoke, the client's over TCP)."""
        if offsets is None:
            offsets = {p: lost[0] for p, lost in self._lost.items()} if revoking else {}
            offsets.update((p, self.position(p)) for p in self._owned)
        else:
            offsets = {p: _check_offset(o) for p, o in offsets.items()}
        revoked = {p: self._lost[p][1] for p in offsets if p in self._lost and p not in self._positions}
        self.stream.groups_table.commit(self.group, self._member, self._gen, self._owned, offsets,
                                        revoked if revoking else None)
        for p, o in offsets.items():
            if p in self._seen:
                self._seen[p] = o
            elif revoking and p in revoked:  # its commit now: a second one in on_revoke is this member's too
                self._lost[p] = (self._lost[p][0], o)

    def close(self) -> None:
        """Leave the group: this member's partitions go to the others. With auto-commit,
        commits where it is first (and on_revoke is told of the partitions it gives up)."""
        if self._closed:
            return
        try:
            if self._owned and (self._auto_ns is not None or self.on_revoke is not None):
                told = [p for p in self._owned if p not in self._assigned]
                self._assigned = []
                self._revoked.update((p, self.position(p)) for p in told)
                self._lost.update((p, (self.position(p), self._seen.get(p))) for p in told)
                self._report()
        finally:
            self._closed = True
            try:
                self.stream.groups_table.leave(self.group, self._member)
            except StreamNotFound:
                pass

    def _check_open(self):
        if self._closed:
            raise ShmqError(f"consumer of group {self.group!r} is closed")
