"""A consumer of several streams (or a pattern) over a connection, written once and
sans-IO: ``broker.consumer(group, streams=[...])`` / ``(group, pattern=...)``, the local
``engine.streams.multiconsumer.MultiConsumer``'s methods and errors.

Strategy: as locally, it is one group member per stream: the server holds one member
per stream for the connection (a JOIN each, through ``ConsumerCalls``), and this object
composes them, partitions being ``TopicPartition(stream, partition)`` pairs. A poll is
one POLL_MANY naming all of them, which waits at the server in every stream's line at
once (docs/PROTOCOL.md), so a record appended to any stream answers it — no poll per
stream, no client-side loop. The per-stream calls (seek, pause, position, commit) are
``ConsumerCalls``' own steps (``_steps``). The streams are listed again every
``refresh_interval`` seconds: new matches are joined, deleted streams let go. After a
reconnect every stream's member joins again (``_come_back``), told as one rebalance.
"""

import logging

from ..errors import BrokerUnavailable, CommitFailed, ShmqError, StreamNotFound
from ..model.checks import check_offset
from ..model.composite import Composite
from ..model.records import TopicPartition, as_tp, by_stream
from ..protocol import MsgType
from ..protocol.payloads import commit_pairs, from_pairs, max_records_field, ms, record_from_fields
from .core import CONSUME_SLICE_MS, Pause, Resuming, Send, deadline, driven, resumable
from .streams import CONSUMER_OPTIONS, ConsumerCalls, StreamCalls

__all__ = ["MultiConsumerCalls", "start"]

log = logging.getLogger("shmq.client")


def _steps(method, obj, *args, **kwargs):
    """The steps of the ``driven`` method ``method`` of ``obj``, run inside another call."""
    return method.__wrapped__(obj, *args, **kwargs)


def start(broker, group, streams, pattern, auto_offset_reset, options):
    """``broker.consumer``'s steps: the transport's consumer of several streams, joined."""
    unknown = sorted(set(options) - set(CONSUMER_OPTIONS) - {"refresh_interval"})
    if unknown:
        raise TypeError(f"consumer() got unexpected keyword arguments {unknown}")
    c = broker._multi_consumer_class(broker, group, streams, pattern, auto_offset_reset, **options)
    try:
        if c.subscribed.streams is not None:  # named streams must be there at the start
            for name in c.subscribed.streams:
                yield from c._join(name)
        yield from c._refresh(force=True)
    except BaseException:
        c._closed = True
        for sub in c._members.values():
            try:
                yield from sub._close_steps()
            except ShmqError:
                pass
        raise
    return c


class MultiConsumerCalls(Composite, Resuming):
    """A member of a consumer group on several streams, held for this connection by the
    server (one member per stream, a ``ConsumerCalls`` with no callbacks of its own):
    the methods of the local ``MultiConsumer``."""

    def __init__(self, broker, *args, **options):
        super().__init__(broker, *args, **options)  # (Composite's arguments)
        self._auto_s = None if self._auto_ns is None else self._auto_ns / 1e9
        self._refresh_s = self._refresh_ns / 1e9
        self._core = broker._core  # the connection its members are held for
        self._owned = set()  # the pairs on_assign was told of and on_revoke was not
        self._clock = broker._clock
        self._first = []  # pairs the JOINs assigned, for on_assign at the next poll
        self._next_auto = None if self._auto_s is None else self._clock() + self._auto_s
        self._next_refresh = 0.0

    def _broker_handle(self):
        return self._broker

    def _drive(self, call):
        return self._broker._drive(self._resumed(call))

    def _resumed(self, call):
        yield from self._come_back()
        return (yield from call)

    def _come_back(self):
        """Once the members' connection has ended and the broker handle reconnected: each
        stream's member joins again (``ConsumerCalls._come_back``), and the move is told
        as one rebalance: on_revoke of every pair owned now, on_assign at the next poll."""
        lost, broker = self._core, self._broker
        if self._closed or broker._core is lost or not resumable(lost, broker):
            return
        self._core = broker._core
        for name, sub in list(self._members.items()):
            try:
                yield from sub._come_back()
            except StreamNotFound:  # deleted meanwhile
                del self._members[name]
                continue
            first, sub._first = sub._first, None
            self._first += [TopicPartition(name, p) for p in first or ()]
        revoked, self._owned = sorted(self._owned), set()
        self._buffer.clear()
        if revoked and self.on_revoke is not None:
            self.on_revoke(revoked)

    # ------------------------------------------------------------------ the streams
    def _join(self, name):
        info = yield Send(MsgType.STREAM_INFO, {"stream": name})
        s = self._broker._stream_class(self._broker, info)
        sub = yield from _steps(StreamCalls.consumer, s, self.group, self.auto_offset_reset,
                                max_poll_interval=self._max_poll_interval)
        first, sub._first = sub._first, None  # told here, with the other streams'
        self._members[name] = sub
        self._first += [TopicPartition(name, p) for p in first]

    def _refresh(self, force=False):
        now = self._clock()
        if not force and now < self._next_refresh:
            return
        self._next_refresh = now + self._refresh_s
        wanted = self.subscribed.wanted((yield Send(MsgType.STREAM_LIST, {}))["streams"])
        gone = sorted(set(self._members) - set(wanted))
        if gone:  # a POLL_MANY of them tells their last positions (their records are left to the group)
            try:
                entries = (yield Send(MsgType.POLL_MANY, {"members": [[n, self._members[n]._fields()["member"]]
                                                                     for n in gone], "max": 1}))["polls"]
            except ShmqError:
                entries = [{}] * len(gone)
            for name, entry in zip(gone, entries):
                yield from self._let_go(name, from_pairs(entry["revoked"]) if entry.get("gone") else None)
        for name in wanted:
            if name not in self._members:
                try:
                    yield from self._join(name)
                except StreamNotFound:  # deleted since the list
                    pass

    def _let_go(self, name, positions):
        """Leave the stream ``name`` (deleted); ``positions`` its partitions' (None: ask)."""
        sub = self._members.pop(name)
        if positions is None:
            try:
                positions = from_pairs((yield Send(MsgType.ASSIGNMENT, sub._fields()))["positions"])
            except ShmqError:
                positions = {}
        try:
            yield Send(MsgType.LEAVE, sub._fields())
        except ShmqError:
            pass  # gone with its stream
        sub._closed = True
        lost = {TopicPartition(name, p): o for p, o in positions.items()}
        self._drop_buffered(set(lost))
        if lost:
            yield from self._tell(lost, [])

    # ------------------------------------------------------------------ positions
    @driven
    def assignment(self):
        """The (stream, partition) pairs this member owns now."""
        self._check_open()
        out = []
        for name, sub in list(self._members.items()):
            out += [TopicPartition(name, p) for p in (yield from _steps(ConsumerCalls.assignment, sub))]
        return sorted(out)

    @driven
    def position(self, tp):
        """The next offset this member reads from ``tp`` (owned, or being revoked in
        on_revoke); KeyError for another."""
        tp = as_tp(tp)
        held = self._held_position(tp)
        if held is not None:
            return held
        return (yield from _steps(ConsumerCalls.position, self._owner(tp), tp.partition))

    @driven
    def seek(self, tp, offset: int):
        """Read ``tp`` (owned) from ``offset`` at the next poll; commits nothing."""
        tp = as_tp(tp)
        yield from _steps(ConsumerCalls.seek, self._member(tp.stream), tp.partition, check_offset(offset))
        self._drop_buffered({tp})

    @driven
    def seek_to_beginning(self, *tps):
        """Read these pairs (default: all owned) from their earliest retained offset."""
        yield from self._seek_to(tps, ConsumerCalls.seek_to_beginning)

    @driven
    def seek_to_end(self, *tps):
        """Read these pairs (default: all owned) from their end: only what comes next."""
        yield from self._seek_to(tps, ConsumerCalls.seek_to_end)

    def _seek_to(self, tps, method):
        for name, ps in self._seek_groups(tps).items():
            yield from _steps(method, self._member(name), *ps)
        self._drop_buffered(set(map(as_tp, tps)) if tps else None)

    @driven
    def pause(self, *tps):
        """Stop reading these owned pairs (they stay this member's) until ``resume``."""
        self._check_open()
        for name, ps in by_stream(tps).items():
            sub = self._member(name)
            held = {}
            for r in self._buffer:  # records polled and not handed out are read again after resume
                if r.stream == name and r.partition in ps:
                    held[r.partition] = min(held.get(r.partition, r.offset), r.offset)
            yield from _steps(ConsumerCalls.pause, sub, *ps)
            for p, o in held.items():
                yield from _steps(ConsumerCalls.seek, sub, p, o)
        self._drop_buffered(set(map(as_tp, tps)))

    @driven
    def resume(self, *tps):
        """Read these paused pairs again."""
        self._check_open()
        for name, ps in by_stream(tps).items():
            yield from _steps(ConsumerCalls.resume, self._member(name), *ps)

    @driven
    def paused(self):
        """The owned pairs paused now."""
        out = []
        for name, sub in list(self._members.items()):
            out += [TopicPartition(name, p) for p in (yield from _steps(ConsumerCalls.paused, sub))]
        return sorted(out)

    # ------------------------------------------------------------------ poll
    @driven
    def poll(self, max_records: int = 500, timeout: float = 1.0):
        """Records from the pairs this member owns and has not paused, of all its streams;
        waits up to ``timeout`` seconds for some (one POLL_MANY, woken by an append to
        any of them), returns [] if none came. Calls on_revoke / on_assign first when the
        assignment moved, and commits when auto-commit is due."""
        self._check_open()
        n = max_records_field(max_records)
        ms(timeout, "timeout")
        if self._buffer:
            return [self._buffer.popleft() for _ in range(min(n, len(self._buffer)))]
        return (yield from self._poll(n, timeout))

    def _poll(self, n, timeout):
        until = deadline(timeout, self._clock)
        if self._next_auto is not None and self._clock() >= self._next_auto:
            self._next_auto = self._clock() + self._auto_s
            yield from self._quietly(self._commit_steps(None))
        while True:
            yield from self._refresh()
            if self._first:  # what the JOINs assigned (at the start, or a stream joined at a refresh)
                first, self._first = self._first, []
                yield from self._tell({}, first)
            wait = CONSUME_SLICE_MS / 1000
            if until is not None:
                wait = max(0.0, min(wait, until - self._clock()))
            wait = max(0.0, min(wait, self._next_refresh - self._clock()))
            names = sorted(self._members)
            if not names:  # nothing to poll: sleep until the next look at the streams
                if wait:
                    yield Pause(wait)
                if until is not None and self._clock() >= until:
                    return []
                continue
            k = self._turn % len(names)
            names = names[k:] + names[:k]  # taking turns: the server reads them in this order
            self._turn += 1
            members = [[name, self._members[name]._fields()["member"]] for name in names]
            try:
                reply = yield Send(MsgType.POLL_MANY, {"members": members, "max": n, "wait_ms": round(wait * 1000)})
            except StreamNotFound:  # one was deleted as the server looked: list them again
                self._next_refresh = 0.0
                continue
            except BrokerUnavailable:
                if resumable(self._core, self._broker) and not self._closed:
                    return []  # the next call joins again on the new connection
                raise
            out, revoked, assigned = [], {}, []
            for name, entry in zip(names, reply["polls"]):
                if entry.get("gone"):
                    yield from self._let_go(name, from_pairs(entry.get("revoked", [])))
                    continue
                out += [record_from_fields(name, m) for m in entry["records"]]
                revoked.update((TopicPartition(name, p), o) for p, o in entry.get("revoked", []))
                assigned += [TopicPartition(name, p) for p in entry.get("assigned", [])]
            if revoked or assigned:
                yield from self._tell(revoked, assigned)
                if not out:  # the server answered before it read: read now
                    continue
            if out or (until is not None and self._clock() >= until):
                return out

    def _tell(self, revoked: dict, assigned: list):
        """The assignment moved (as the local ``MultiConsumer._tell``): auto-commit commits
        the revoked positions, then on_revoke and on_assign are called, once each."""
        self._owned.difference_update(revoked)
        self._owned.update(assigned)
        self._drop_buffered(set(revoked))
        if revoked and self._auto_s is not None:
            for name, ps in by_stream(revoked).items():
                sub = self._members.get(name)
                if sub is not None:
                    yield from self._quietly([Send(MsgType.COMMIT, {
                        **sub._fields(), "offsets": commit_pairs({p: revoked[(name, p)] for p in ps}),
                        "revoked": True})])
        self._call_back(revoked, assigned)

    def _quietly(self, requests):
        """An auto-commit: a refusal is logged, as Kafka's auto-commit does."""
        try:
            for request in requests:
                yield request
        except CommitFailed as e:
            log.warning("group %s: auto-commit refused: %s", self.group, e)

    # ------------------------------------------------------------------ commit, close
    @driven
    def commit(self, offsets: dict | None = None):
        """Commit ``{(stream, partition): next offset to read}`` (default: where this
        member is in every pair it owns, never past a record the iteration has not handed
        out), all or nothing per stream (CommitFailed: poll again). In on_revoke it
        covers the revoked pairs too."""
        self._check_open()
        if offsets is None:
            requests = yield from self._where_it_is()
        else:
            requests = self._commit_steps(offsets)
        for request in requests:
            yield request

    def _commit_steps(self, offsets) -> list:
        """The COMMITs of ``offsets`` ({pair: offset}); None: one per stream, of where it is."""
        if offsets is None:
            return [Send(MsgType.COMMIT, {**sub._fields(), **({"revoked": True} if self._revoking else {})})
                    for sub in self._members.values()]
        pending = {as_tp(tp): check_offset(o) for tp, o in offsets.items()}
        return [Send(MsgType.COMMIT, {**self._member(name)._fields(),
                                      "offsets": commit_pairs({p: pending[(name, p)] for p in ps}),
                                      **({"revoked": True} if self._revoking else {})})
                for name, ps in by_stream(pending).items()]

    def _where_it_is(self):
        """commit()'s requests: where it is, never past a record not yet handed out (and
        in on_revoke the revoked pairs too)."""
        if not self._buffer and self._revoking is None:
            return self._commit_steps(None)
        pending = yield from self._positions(dict(self._revoking or {}))
        return self._commit_steps({tp: o for tp, o in pending.items() if tp.stream in self._members})

    def _positions(self, pending: dict):
        """``pending`` ({pair: offset}) updated with where this member is in every pair
        it owns (an ASSIGNMENT per stream), never past a record not yet handed out."""
        for name, sub in list(self._members.items()):
            positions = from_pairs((yield Send(MsgType.ASSIGNMENT, sub._fields()))["positions"])
            pending.update((TopicPartition(name, p), o) for p, o in positions.items())
        for r in self._buffer:
            tp = TopicPartition(r.stream, r.partition)
            pending[tp] = min(pending.get(tp, r.offset), r.offset)
        return pending

    def _next_record(self):
        """The next record for the iteration, polling (and waiting) as needed."""
        while not self._buffer:
            self._check_open()
            self._buffer.extend((yield from self._poll(500, None)))
        return self._buffer.popleft()

    def close(self):
        """Leave the group on every stream. With auto-commit, commits where it is first
        (and on_revoke is told of the pairs it gives up)."""
        return self._broker._drive(self._close_steps())  # (lost members are not joined again to leave)

    def _close_steps(self):
        if self._closed:
            return
        try:
            if not self._broker._core.failed and (self._auto_s is not None or self.on_revoke is not None):
                owned = yield from self._positions({})
                if owned:
                    yield from self._tell(owned, [])
        finally:
            self._closed = True
            for sub in self._members.values():
                yield from sub._close_steps()
