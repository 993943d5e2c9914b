"""One group member over several streams, or over every stream whose name matches a
pattern: ``broker.consumer(group, streams=[...])`` / ``broker.consumer(group,
pattern=...)``, Kafka's ``subscribe(topics)`` and ``subscribe(pattern=...)``.

Strategy: shmq's groups are per stream, so a member of group G on streams A and B is a
member of G on A and one on B: one engine ``Consumer`` per stream (``_Member``, which
notes the assignment's changes instead of calling back), composed here. Partitions are
``TopicPartition(stream, partition)`` pairs. A poll reads the members without waiting,
taking turns; finding nothing, it sleeps until an append or a rebalance on any of their
streams (``watch.StreamsWatch``), in slices, so that a dead member elsewhere is noticed.
The streams are listed again every ``refresh_interval`` seconds: a new stream matching
the pattern (or a named one made again) is joined, a deleted one let go.
"""

import time

from ...errors import CommitFailed, ShmqError, StreamNotFound
from ...model.checks import check_offset as _check_offset
from ...model.composite import Composite, Subscription, check_subscription
from ...model.records import TopicPartition, as_tp, by_stream
from ..shm import waits
from .consumer import REFRESH_NS, Consumer, Iterating, log
from .stream import Stream
from .watch import Armed, StreamsWatch

__all__ = ["TopicPartition", "MultiConsumer", "Composite", "Subscription", "check_subscription", "by_stream"]

_mono = time.monotonic_ns


class _Member(Consumer):
    """A member on one stream of a ``MultiConsumer``: a poll that finds the assignment
    moved notes the changes (``told``) and returns before it reads; the composite tells
    them, for all its streams at once."""

    def __init__(self, *args, **options):
        self.told = ({}, [])  # (revoked {partition: position}, assigned)
        super().__init__(*args, **options)

    def _changed(self, revoked, assigned) -> bool:
        self.told[0].update(revoked)
        self.told[1].extend(p for p in assigned if p not in self.told[1])
        return bool(revoked or assigned)

    def take_told(self) -> tuple[dict, list]:
        told, self.told = self.told, ({}, [])
        return told


class MultiConsumer(Iterating, Composite):
    """A member of a consumer group on several streams (``Broker.consumer``), with the
    ``Consumer``'s methods where a partition is a ``TopicPartition(stream, partition)``:
    ``assignment``, ``position``, ``seek*``, ``pause`` / ``resume`` / ``paused``,
    ``commit({(stream, p): offset})`` (all or nothing per stream), ``poll`` (records
    of every stream, each saying its ``stream``), on_assign / on_revoke called once per
    change with the pairs of all streams, auto-commit, max_poll_interval (per stream's
    group), ``for record in consumer``, and ``subscription()``: the streams it is on."""

    def __init__(self, *args, **options):
        super().__init__(*args, **options)  # (Composite's arguments)
        self._watch = StreamsWatch(self._broker.namespace)
        self._next_auto = None if self._auto_ns is None else _mono() + self._auto_ns
        self._next_refresh = 0
        try:
            if self.subscribed.streams is not None:  # named streams must be there at the start
                for name in self.subscribed.streams:
                    self._join(name)
            self._refresh(force=True)
        except BaseException:
            self._leave_all()
            raise

    # ------------------------------------------------------------------ the streams
    def _join(self, name: str) -> None:
        s = Stream(self._broker.namespace, name)
        try:
            self._members[name] = _Member(s, self.group, self.auto_offset_reset,
                                          max_poll_interval=self._max_poll_interval)
        except BaseException:
            s.close()
            raise

    def _refresh(self, force=False) -> None:
        """List the streams again (when due): join those newly wanted, let go of those gone."""
        now = _mono()
        if not force and now < self._next_refresh:
            return
        self._next_refresh = now + self._refresh_ns
        wanted = self.subscribed.wanted(self._broker.list_streams())
        for name in sorted(set(self._members) - set(wanted)):
            self._let_go(name)
        for name in wanted:
            if name not in self._members:
                try:
                    self._join(name)
                except StreamNotFound:  # deleted since the list
                    pass

    def _let_go(self, name: str) -> dict:
        """Leave the stream ``name`` (deleted, or no longer wanted); its partitions'
        positions are returned, for on_revoke."""
        m = self._members.pop(name)
        self._watch.forget(name)
        lost = {TopicPartition(name, p): o for p, o in m._positions.items()}
        self._drop_buffered(lost)
        try:
            m.close()
        except ShmqError:
            pass  # deleted: nothing to leave
        finally:
            m.stream.close()
        if lost:
            self._tell(lost, [])
        return lost

    def _leave_all(self) -> None:
        for name in list(self._members):
            m = self._members.pop(name)
            try:
                m.close()
            except ShmqError:
                pass
            finally:
                m.stream.close()
        self._watch.close()

    # ------------------------------------------------------------------ positions
    def assignment(self) -> list[TopicPartition]:
        """The (stream, partition) pairs this member owns now."""
        self._check_open()
        return sorted(TopicPartition(n, p) for n, m in self._members.items() for p in m.assignment())

    def position(self, tp) -> int:
        """The next offset this member reads from ``tp`` (owned, or being revoked in
        on_revoke); KeyError for another."""
        tp = as_tp(tp)
        held = self._held_position(tp)
        return self._owner(tp).position(tp.partition) if held is None else held

    def seek(self, tp, offset: int) -> None:
        """Read ``tp`` (owned) from ``offset`` at the next poll; commits nothing."""
        tp = as_tp(tp)
        self._member(tp.stream).seek(tp.partition, _check_offset(offset))
        self._drop_buffered({tp})

    def seek_to_beginning(self, *tps) -> None:
        """Read these pairs (default: all owned) from their earliest retained offset."""
        self._seek_to(tps, "seek_to_beginning")

    def seek_to_end(self, *tps) -> None:
        """Read these pairs (default: all owned) from their end: only what comes next."""
        self._seek_to(tps, "seek_to_end")

    def _seek_to(self, tps, how):
        for name, ps in self._seek_groups(tps).items():
            getattr(self._member(name), how)(*ps)
        self._drop_buffered(set(map(as_tp, tps)) if tps else None)

    def pause(self, *tps) -> None:
        """Stop reading these owned pairs (they stay this member's) until ``resume``."""
        self._check_open()
        groups = by_stream(tps)
        for name, ps in groups.items():
            m = self._member(name)
            for p in ps:  # records polled and not handed out are read again after resume
                m.seek(p, self.position((name, p)))
            m.pause(*ps)
        self._drop_buffered(set(map(as_tp, tps)))

    def resume(self, *tps) -> None:
        """Read these paused pairs again."""
        self._check_open()
        for name, ps in by_stream(tps).items():
            self._member(name).resume(*ps)

    def paused(self) -> list[TopicPartition]:
        """The owned pairs paused now."""
        return sorted(TopicPartition(n, p) for n, m in self._members.items() for p in m.paused())

    # ------------------------------------------------------------------ poll
    def poll(self, max_records: int = 500, timeout: float = 1.0) -> list:
        """Records from the pairs this member owns and has not paused, of all its streams,
        from where it is on; waits up to ``timeout`` seconds for some (woken by an append
        to any of its streams), returns [] if none came. Calls on_revoke / on_assign first
        when the assignment moved, and commits when auto-commit is due."""
        self._check_open()
        if isinstance(max_records, bool) or not isinstance(max_records, int) or max_records < 1:
            raise ValueError(f"max_records must be a positive int, not {max_records!r}")
        if self._buffer:
            for m in self._members.values():
                m._polled(0)
            return [self._buffer.popleft() for _ in range(min(max_records, len(self._buffer)))]
        return self._poll(max_records, timeout)

    def _poll(self, max_records, timeout):
        wait_ns = waits.seconds_ns(timeout, "timeout")
        deadline = _mono() + wait_ns
        for m in self._members.values():
            m._polled(wait_ns)
        if self._next_auto is not None and _mono() >= self._next_auto:
            self._next_auto = _mono() + self._auto_ns
            self._quietly(lambda: self._commit(None))
        while True:
            self._refresh()
            out = self._read_round(max_records)
            if out is None:  # the assignment moved, and was told: read now
                continue
            now = _mono()
            if out or now >= deadline:
                return out
            armed, handles = {}, {}
            for name, m in self._members.items():
                positions = {p: o for p, o in m._positions.items() if p not in m._paused}
                armed[name], handles[name] = Armed(m.group, m._gen, positions), m.stream
            until = min(deadline, now + REFRESH_NS, self._next_refresh)  # a dead member elsewhere, new streams
            try:
                self._watch.wait(armed, handles, until)
            except StreamNotFound:
                pass  # the read finds which, and lets it go

    def _read_round(self, max_records):
        """One pass over the members, taking turns, without waiting; None when the
        assignment moved (then on_revoke / on_assign were called). Every member's changes
        are looked for first, and told before anything is read: a commit in on_revoke
        covers the positions of every stream, which must not be past records of this
        round that the caller has not been handed yet."""
        revoked, assigned = {}, []
        for name in list(self._members):
            m = self._members[name]
            try:
                m.look()
            except StreamNotFound:
                self._let_go(name)
                continue
            gone, came = m.take_told()
            revoked.update((TopicPartition(name, p), o) for p, o in gone.items())
            assigned += [TopicPartition(name, p) for p in came]
        if revoked or assigned:
            self._tell(revoked, assigned)
            return None
        out = []
        names = list(self._members)
        for k in range(len(names)):
            name = names[(self._turn + k) % len(names)]
            try:
                if len(out) < max_records:
                    out += self._members[name].read_on(max_records - len(out))
            except StreamNotFound:
                pass  # deleted since its look: the next round's lets it go (on_revoke), before it reads
        self._turn += 1
        return out

    def _tell(self, revoked: dict, assigned: list) -> None:
        """The assignment moved: auto-commit commits the revoked positions, then on_revoke
        and on_assign are called, each once with the pairs of every stream."""
        if revoked and self._auto_ns is not None:
            for name, ps in by_stream(revoked).items():
                m = self._members.get(name)
                if m is not None:
                    self._quietly(lambda m=m, ps=ps, name=name: m._commit(
                        {p: revoked[(name, p)] for p in ps}, revoking=True))
        self._call_back(revoked, assigned)

    def _quietly(self, commit) -> None:
        """An auto-commit: a refusal is logged, as Kafka's auto-commit does."""
        try:
            commit()
        except CommitFailed as e:
            log.warning("group %s: auto-commit refused: %s", self.group, e)

    # ------------------------------------------------------------------ commit, close
    def commit(self, offsets: dict | None = None) -> None:
        """Commit ``{(stream, partition): next offset to read}`` (default: where this
        member is in every pair it owns, never past a record the iteration has not handed
        out), all or nothing per stream, as ``Consumer.commit`` does per stream
        (CommitFailed: poll again). In on_revoke it covers the revoked pairs too."""
        self._check_open()
        self._commit(offsets)

    def _commit(self, offsets) -> None:
        revoking = self._revoking is not None
        if offsets is None:
            pending = dict(self._revoking or {})
            pending.update((TopicPartition(n, p), self.position((n, p))) for n, m in self._members.items()
                           for p in m._owned)
        else:
            pending = {as_tp(tp): _check_offset(o) for tp, o in offsets.items()}
        for name, ps in by_stream(pending).items():
            m = self._members.get(name) if offsets is None else self._member(name)
            if m is not None:
                m._commit({p: pending[(name, p)] for p in ps}, revoking)

    def close(self) -> None:
        """Leave the group on every stream: this member's pairs go to the others. With
        auto-commit, commits where it is first (and on_revoke is told of the pairs it
        gives up)."""
        if self._closed:
            return
        try:
            if self._auto_ns is not None or self.on_revoke is not None:
                owned = {TopicPartition(n, p): self.position((n, p)) for n, m in self._members.items()
                         for p in m._owned}
                if owned:
                    self._tell(owned, [])
        finally:
            self._closed = True
            self._leave_all()
