"""Kafka's classic consumer-group coordinator, in the server's event loop (issue 30, item 4).

Strategy: one ``Coordinator`` per Kafka listener keeps the groups in memory, as Kafka's
classic ``GroupCoordinator`` does (states Empty, PreparingRebalance, CompletingRebalance,
Stable): members join, the coordinator waits up to the rebalance timeout for every
known member to join again, picks a protocol (assignor) all of them support, elects a
leader and hands it the members' subscriptions; the leader's SyncGroup brings the
assignment, which each member takes. Timers on the loop (no thread) expire a member
whose heartbeats stop for its session timeout and end a rebalance whose members do not
all come back. Generations fence: a stale member's heartbeat, sync or commit gets
ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID. A group with no members waits the initial
rebalance delay before its first assignment (members starting together are assigned
once); a static member (KIP-345) that comes back in a stable group takes its old place
and assignment with no rebalance. A request whose connection died while it waited is
still answered (its future's error read), so nothing logs an error nobody waits for.

The offsets are not the coordinator's: a Kafka group *is* the shmq group of the same
name on each stream (topic), so a commit writes the stream's group table and a fetch
reads it (``stream.committed(group)``, the ``shmq`` CLI, metrics and Spark see one
thing). While a Kafka group has members, the listener holds a stand-in member in the
shmq group of each stream it reads (``Groups.join_proxy``), so the two kinds never share
a group: a native consumer is refused while Kafka members are there, and a Kafka
JoinGroup is refused (INCONSISTENT_GROUP_PROTOCOL) while native members are.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import struct
import uuid
from typing import Any

from ...errors import ShmqError, StreamNotFound
from ...kafka import ErrorCode as E

__all__ = ["Coordinator", "GroupError", "CONSUMER", "subscription_topics", "assignment_topics"]

log = logging.getLogger("shmq.server.kafka")

EMPTY, PREPARING, COMPLETING, STABLE = "Empty", "PreparingRebalance", "CompletingRebalance", "Stable"
MIN_SESSION_MS, MAX_SESSION_MS = 6_000, 1_800_000  # Kafka's group.min/max.session.timeout.ms
MAX_METADATA_BYTES = 4096  # Kafka's offset.metadata.max.bytes
MAX_GROUP_BYTES = 126  # a shmq group name's limit (stream.py)
CONSUMER = "consumer"  # the protocol type of Kafka's consumers, whose subscriptions name topics


class GroupError(Exception):
    """A request refused with a Kafka error code (``code``)."""

    def __init__(self, code: E, message: str | None = None):
        super().__init__(message or code.name)
        self.code = code


@dataclasses.dataclass(eq=False)
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_ms: int
    rebalance_ms: int
    protocols: list  # [(name, metadata)], in the member's order of preference
    assignment: bytes = b""
    joining: asyncio.Future | None = None  # its JoinGroup, waiting for the rebalance to end
    syncing: asyncio.Future | None = None  # its SyncGroup, waiting for the leader's
    deadline: float = 0.0  # loop time its session ends unless it heartbeats
    timer: asyncio.TimerHandle | None = None

    def metadata(self, protocol: str) -> bytes:
        return next(meta for name, meta in self.protocols if name == protocol)


@dataclasses.dataclass(eq=False)
class Group:
    name: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict = dataclasses.field(default_factory=dict)  # member id -> Member, in join order
    pending: dict = dataclasses.field(default_factory=dict)  # member ids told MEMBER_ID_REQUIRED -> timer
    statics: dict = dataclasses.field(default_factory=dict)  # group.instance.id -> member id
    proxies: dict = dataclasses.field(default_factory=dict)  # stream -> its stand-in member id
    join_timer: asyncio.TimerHandle | None = None
    initial_left_ms: int | None = None  # in the initial delay: how much longer it may grow (else None)
    newcomer: bool = False  # a member joined during this stretch of the initial delay

    def candidates(self) -> set:
        """The protocols every member supports."""
        sets = [{name for name, _m in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()


class Coordinator:
    """The group coordinator of one Kafka listener: groups in memory, timers on ``loop``,
    committed offsets in the streams of ``broker`` (a local Broker of the namespace)."""

    min_session_ms, max_session_ms = MIN_SESSION_MS, MAX_SESSION_MS

    def __init__(self, broker: Any, loop: asyncio.AbstractEventLoop, initial_delay_ms: int = 0) -> None:
        self.broker = broker
        self.loop = loop
        self.initial_delay_ms = initial_delay_ms  # Kafka's group.initial.rebalance.delay.ms
        self.groups: dict[str, Group] = {}
        self._streams: dict[str, Any] = {}  # attached stream handles, by name
        # (group, topic, partition) -> (offset, commit metadata, leader epoch): what came with the offset; a
        # negative offset (no position: the stream's group has none) is kept here alone
        self._metadata: dict[tuple, tuple] = {}

    def close(self) -> None:
        """Stop: answer what waits with COORDINATOR_NOT_AVAILABLE, give back the stand-ins."""
        for g in self.groups.values():
            self._cancel(g.join_timer)
            for m in g.members.values():
                self._cancel(m.timer)
                self._answer(m.joining, GroupError(E.coordinator_not_available))
                self._answer(m.syncing, GroupError(E.coordinator_not_available))
            for t in g.pending.values():
                self._cancel(t)
            self._release(g)
        self.groups.clear()
        for s in self._streams.values():
            s.close()
        self._streams.clear()

    # ------------------------------------------------------------------ streams
    def stream(self, name: str):
        """The attached stream ``name`` (StreamNotFound)."""
        s = self._streams.get(name)
        if s is None or s.deleted:
            if s is not None:  # deleted (natively, perhaps): what its commits left here goes with it
                s.close()
                del self._streams[name]
                self.forget_topic(name)
            s = self._streams[name] = self.broker.stream(name)
        return s

    def _hold(self, g: Group, topics) -> None:
        """Hold a stand-in in group ``g`` of each stream named (those that exist);
        GroupError(INCONSISTENT_GROUP_PROTOCOL) where native members are."""
        for topic in topics:
            if topic in g.proxies:
                continue
            try:
                g.proxies[topic] = self.stream(topic).groups_table.join_proxy(g.name)
            except StreamNotFound:
                continue
            except ShmqError as e:
                log.warning("Kafka group %s: %s", g.name, e)
                raise GroupError(E.inconsistent_group_protocol, str(e)) from None

    def _release(self, g: Group) -> None:
        for topic, mid in g.proxies.items():
            try:
                self.stream(topic).groups_table.leave(g.name, mid)
            except ShmqError:  # the stream was deleted
                pass
        g.proxies.clear()

    # ------------------------------------------------------------------ timers and futures
    @staticmethod
    def _cancel(timer) -> None:
        if timer is not None:
            timer.cancel()

    def _future(self) -> asyncio.Future:
        """A future a request waits on; its error is read even when that request is gone
        (its connection died), so an answer nobody waits for logs nothing."""
        fut = self.loop.create_future()
        fut.add_done_callback(_consume)
        return fut

    @staticmethod
    def _answer(fut, result) -> None:
        if fut is not None and not fut.done():
            if isinstance(result, BaseException):
                fut.set_exception(result)
            else:
                fut.set_result(result)

    def _touch(self, g: Group, m: Member) -> None:
        """A sign of life from ``m``: its session runs from now."""
        m.deadline = self.loop.time() + m.session_ms / 1000
        if m.timer is None:
            m.timer = self.loop.call_at(m.deadline, self._expire, g, m)

    def _expire(self, g: Group, m: Member) -> None:
        m.timer = None
        if g.members.get(m.member_id) is not m:
            return
        now = self.loop.time()
        waiting = (m.joining is not None and g.state == PREPARING) or (m.syncing is not None and g.state == COMPLETING)
        if waiting or now < m.deadline:  # a member that waits for the group is alive; one that heartbeat is
            m.timer = self.loop.call_at(max(m.deadline, now + m.session_ms / 1000) if waiting else m.deadline,
                                        self._expire, g, m)
            return
        log.info("Kafka group %s: member %s left (no heartbeat for %d ms)", g.name, m.member_id, m.session_ms)
        self._remove(g, m)
        self._after_removal(g)

    # ------------------------------------------------------------------ membership
    def _group(self, name: str) -> Group | None:
        return self.groups.get(name)

    def _member(self, g: Group | None, member_id: str, instance_id: str | None) -> Member:
        """The member named, or GroupError: UNKNOWN_MEMBER_ID, or FENCED_INSTANCE_ID for a
        static member whose instance id now belongs to another member id."""
        if g is None:
            raise GroupError(E.unknown_member_id)
        if instance_id is not None and instance_id in g.statics and g.statics[instance_id] != member_id:
            raise GroupError(E.fenced_instance_id)
        m = g.members.get(member_id)
        if m is None:
            raise GroupError(E.unknown_member_id)
        return m

    def _remove(self, g: Group, m: Member) -> None:
        del g.members[m.member_id]
        self._cancel(m.timer)
        m.timer = None
        if m.instance_id is not None and g.statics.get(m.instance_id) == m.member_id:
            del g.statics[m.instance_id]
        self._answer(m.joining, GroupError(E.unknown_member_id))
        self._answer(m.syncing, GroupError(E.unknown_member_id))
        m.joining = m.syncing = None
        if g.leader == m.member_id:
            g.leader = None

    def _after_removal(self, g: Group) -> None:
        if g.state in (STABLE, COMPLETING):
            self._prepare(g)
        elif g.state == PREPARING:
            self._try_complete(g)

    def _prepare(self, g: Group) -> None:
        """Start a rebalance: members learn it from their heartbeats and join again. A
        group with no members waits ``initial_delay_ms`` first (longer while members keep
        coming, up to the rebalance timeout), so members starting together are assigned
        once, as Kafka's InitialDelayedJoin."""
        was_empty = g.state == EMPTY
        if g.state == COMPLETING:  # the assignment being handed out is void
            for m in g.members.values():
                self._answer(m.syncing, GroupError(E.rebalance_in_progress))
                m.syncing = None
        for m in g.members.values():
            m.assignment = b""
        g.state = PREPARING
        self._cancel(g.join_timer)
        wait_ms = max((m.rebalance_ms for m in g.members.values()), default=0)
        if was_empty and self.initial_delay_ms > 0:
            delay = min(self.initial_delay_ms, wait_ms)
            g.initial_left_ms, g.newcomer = wait_ms - delay, False
            g.join_timer = self.loop.call_later(delay / 1000, self._initial_done, g)
            log.info("Kafka group %s: first members joining; assigning in %d ms", g.name, delay)
            return
        g.join_timer = self.loop.call_later(wait_ms / 1000, self._complete_join, g)
        log.info("Kafka group %s: rebalancing (generation %d, %d members)", g.name, g.generation, len(g.members))
        self._try_complete(g)

    def _initial_done(self, g: Group) -> None:
        """The initial delay ran out: again if members came meanwhile and the rebalance
        timeout leaves room, else the rebalance ends."""
        if g.state != PREPARING or g.initial_left_ms is None:
            return
        if g.newcomer and g.initial_left_ms > 0:
            delay = min(self.initial_delay_ms, g.initial_left_ms)
            g.initial_left_ms, g.newcomer = g.initial_left_ms - delay, False
            g.join_timer = self.loop.call_later(delay / 1000, self._initial_done, g)
            return
        g.initial_left_ms = None
        self._complete_join(g)

    def _try_complete(self, g: Group) -> None:
        if g.initial_left_ms is not None:  # the initial delay ends it
            return
        if g.state == PREPARING and not g.pending and all(m.joining is not None for m in g.members.values()):
            self._complete_join(g)

    def _complete_join(self, g: Group) -> None:
        """End the rebalance: members that did not join again are out; a new generation,
        its protocol and leader; every waiting JoinGroup answered."""
        if g.state != PREPARING:
            return
        self._cancel(g.join_timer)
        g.join_timer, g.initial_left_ms = None, None
        for m in [m for m in g.members.values() if m.joining is None]:
            log.info("Kafka group %s: member %s left (did not join the rebalance in time)", g.name, m.member_id)
            self._remove(g, m)
        for t in g.pending.values():
            self._cancel(t)
        g.pending.clear()
        g.generation += 1
        if not g.members:
            g.state, g.protocol, g.leader, g.protocol_type = EMPTY, None, None, None
            self._release(g)
            return
        g.protocol = self._vote(g)
        if g.leader not in g.members:
            g.leader = next(iter(g.members))
        g.state = COMPLETING
        for m in g.members.values():
            self._answer(m.joining, self._join_answer(g, m))
            m.joining = None
            self._touch(g, m)

    @staticmethod
    def _join_answer(g: Group, m: Member) -> dict:
        """The JoinGroup answer of member ``m`` in the current generation: the leader's
        names every member with its subscription in the chosen protocol."""
        everyone = [(o.member_id, o.instance_id, o.metadata(g.protocol)) for o in g.members.values()]
        return {"generation_id": g.generation, "protocol_type": g.protocol_type, "protocol_name": g.protocol,
                "leader": g.leader, "member_id": m.member_id, "members": everyone if m.member_id == g.leader else []}

    @staticmethod
    def _vote(g: Group) -> str:
        """The protocol most members prefer among those all support (Kafka's vote)."""
        candidates = g.candidates()
        votes: dict[str, int] = {}
        for m in g.members.values():
            choice = next(name for name, _meta in m.protocols if name in candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return max(votes, key=votes.get)

    async def join(self, group_id: str, member_id: str, instance_id: str | None, protocol_type: str,
                   protocols: list, session_ms: int, rebalance_ms: int, client_id: str, client_host: str,
                   require_known_member: bool) -> dict:
        """JoinGroup: the JoinGroup response's fields once the rebalance ends (GroupError)."""
        if not group_id or len(group_id.encode()) > MAX_GROUP_BYTES:
            raise GroupError(E.invalid_group_id)
        if not self.min_session_ms <= session_ms <= self.max_session_ms:
            raise GroupError(E.invalid_session_timeout)
        if not protocol_type or not protocols:
            raise GroupError(E.inconsistent_group_protocol)
        g = self.groups.get(group_id)
        if g is None:
            g = self.groups[group_id] = Group(group_id)
        names = {name for name, _meta in protocols}
        if g.members and (protocol_type != g.protocol_type or not names & g.candidates()):
            raise GroupError(E.inconsistent_group_protocol)
        try:
            member = self._admit(g, member_id, instance_id, protocol_type, protocols, session_ms, rebalance_ms,
                                 client_id, client_host, require_known_member)
        except GroupError as e:
            if e.code != E.member_id_required:  # a refused member is not waited for, nor anything held for it
                self._cancel(g.pending.pop(member_id, None))
                if not g.members:
                    self._release(g)
                self._try_complete(g)
            raise
        if isinstance(member, dict):  # nothing changed: the current generation as it is
            return member
        self._answer(member.joining, GroupError(E.rebalance_in_progress))  # a JoinGroup sent again
        fut = member.joining = self._future()
        if g.state != PREPARING:
            self._prepare(g)
        else:
            self._try_complete(g)
        return await asyncio.shield(fut)

    def _admit(self, g: Group, member_id, instance_id, protocol_type, protocols, session_ms, rebalance_ms, client_id,
               client_host, require_known_member) -> Member | dict:
        """The member a JoinGroup joins as (new, or known and updated), holding the
        stand-ins of the streams it subscribes to; or the answer of a member whose join
        changes nothing; GroupError for a join refused."""
        member = g.members.get(member_id) if member_id else None
        if not member_id or member_id in g.pending:
            if not member_id and require_known_member and instance_id is None:
                new_id = f"{client_id}-{uuid.uuid4()}"
                g.pending[new_id] = self.loop.call_later(session_ms / 1000, self._forget_pending, g, new_id)
                raise GroupError(E.member_id_required, new_id)
            self._hold_topics(g, protocol_type, protocols)
            if instance_id is not None and instance_id in g.statics:  # a static member back: it takes its place
                return self._replace_static(g, g.members[g.statics[instance_id]], protocols, session_ms,
                                            rebalance_ms, client_id, client_host)
            new_id = member_id or f"{instance_id or client_id}-{uuid.uuid4()}"
            self._cancel(g.pending.pop(new_id, None))
            member = Member(new_id, instance_id, client_id, client_host, session_ms, rebalance_ms, list(protocols))
            g.members[new_id] = member
            g.newcomer = True
            if instance_id is not None:
                g.statics[instance_id] = new_id
            g.protocol_type = protocol_type
        elif member is None:
            raise GroupError(E.unknown_member_id)
        elif instance_id is not None and g.statics.get(instance_id) != member_id:
            raise GroupError(E.fenced_instance_id)
        else:
            self._hold_topics(g, protocol_type, protocols)
            same = list(protocols) == member.protocols
            member.protocols, member.session_ms, member.rebalance_ms = list(protocols), session_ms, rebalance_ms
            if g.state == COMPLETING and same or g.state == STABLE and same and member_id != g.leader:
                self._touch(g, member)
                return self._join_answer(g, member)
        return member

    def _replace_static(self, g: Group, m: Member, protocols, session_ms, rebalance_ms, client_id,
                        client_host) -> Member | dict:
        """A static member (KIP-345) joins again under a new member id: the old id is
        fenced, the member keeps its place and its assignment. In a stable group whose
        protocol it does not change, nothing else happens (the others see no rebalance):
        the answer names the leader as before, so the member does not assign. Otherwise
        the rebalance goes on, or starts, as for any join."""
        old_id, new_id = m.member_id, f"{m.instance_id}-{uuid.uuid4()}"
        self._answer(m.joining, GroupError(E.fenced_instance_id))
        self._answer(m.syncing, GroupError(E.fenced_instance_id))
        m.joining = m.syncing = None
        g.members = {(new_id if k == old_id else k): v for k, v in g.members.items()}
        g.statics[m.instance_id] = m.member_id = new_id
        leader = g.leader
        if g.leader == old_id:
            g.leader = new_id
        m.protocols, m.session_ms, m.rebalance_ms = list(protocols), session_ms, rebalance_ms
        m.client_id, m.client_host = client_id, client_host
        log.info("Kafka group %s: static member %s back as %s", g.name, m.instance_id, new_id)
        if g.state == STABLE and self._vote(g) == g.protocol:
            self._touch(g, m)
            return {"generation_id": g.generation, "protocol_type": g.protocol_type, "protocol_name": g.protocol,
                    "leader": leader, "member_id": new_id, "members": []}
        return m

    def _hold_topics(self, g: Group, protocol_type: str, protocols: list) -> None:
        if protocol_type == CONSUMER:
            self._hold(g, {t for _name, meta in protocols for t in subscription_topics(meta)})

    def _forget_pending(self, g: Group, member_id: str) -> None:
        if g.pending.pop(member_id, None) is not None:
            self._try_complete(g)

    async def sync(self, group_id: str, generation: int, member_id: str, instance_id: str | None,
                   protocol_type: str | None, protocol: str | None, assignments: dict) -> bytes:
        """SyncGroup: this member's assignment, once the leader has sent them (GroupError)."""
        g = self.groups.get(group_id)
        m = self._member(g, member_id, instance_id)
        if generation != g.generation:
            raise GroupError(E.illegal_generation)
        if protocol_type is not None and protocol_type != g.protocol_type or \
                protocol is not None and protocol != g.protocol:
            raise GroupError(E.inconsistent_group_protocol)
        if g.state == PREPARING:
            raise GroupError(E.rebalance_in_progress)
        self._touch(g, m)
        if g.state == STABLE:
            return m.assignment
        self._answer(m.syncing, GroupError(E.rebalance_in_progress))
        fut = m.syncing = self._future()
        if member_id == g.leader:
            for other in g.members.values():
                other.assignment = assignments.get(other.member_id, b"")
            if g.protocol_type == CONSUMER:
                try:
                    self._hold(g, {t for a in assignments.values() for t in assignment_topics(a)})
                except GroupError as e:  # native members took a stream meanwhile: the leader's error
                    self._answer(fut, e)
            g.state = STABLE
            log.info("Kafka group %s: generation %d stable, %d members, protocol %s", g.name, g.generation,
                     len(g.members), g.protocol)
            for other in g.members.values():
                self._answer(other.syncing, other.assignment)
                other.syncing = None
        return await asyncio.shield(fut)

    def heartbeat(self, group_id: str, generation: int, member_id: str, instance_id: str | None) -> None:
        """Heartbeat: None, or GroupError (REBALANCE_IN_PROGRESS: join again)."""
        g = self.groups.get(group_id)
        if g is not None and g.state == EMPTY:
            raise GroupError(E.unknown_member_id)
        m = self._member(g, member_id, instance_id)
        if generation != g.generation:
            raise GroupError(E.illegal_generation)
        self._touch(g, m)
        if g.state == PREPARING:
            raise GroupError(E.rebalance_in_progress)

    def leave(self, group_id: str, leaving: list) -> list:
        """LeaveGroup of [(member id, instance id)]: an error code for each."""
        g = self.groups.get(group_id)
        codes, removed = [], False
        for member_id, instance_id in leaving:
            try:
                if g is None:
                    raise GroupError(E.unknown_member_id)
                if instance_id is not None:
                    if instance_id not in g.statics:
                        raise GroupError(E.unknown_member_id)
                    if member_id and g.statics[instance_id] != member_id:
                        raise GroupError(E.fenced_instance_id)
                    member_id = g.statics[instance_id]
                if member_id in g.pending:
                    self._cancel(g.pending.pop(member_id))
                else:
                    self._remove(g, self._member(g, member_id, None))
                log.info("Kafka group %s: member %s left", g.name, member_id)
                removed = True
                codes.append(E.none)
            except GroupError as e:
                codes.append(e.code)
        if removed:
            self._after_removal(g)
        return codes

    # ------------------------------------------------------------------ offsets
    def commit(self, group_id: str, generation: int, member_id: str, instance_id: str | None,
               topics: dict) -> dict:
        """OffsetCommit of {topic: [(partition, offset, metadata, leader epoch)]}: {topic:
        [(partition, error code)]}. A member commits in its generation; generation -1 without a member
        is a manual commit, for a group with no Kafka member. Each partition refused is logged
        (``_refused``)."""
        why: dict = {}
        got = self._commit(group_id, generation, member_id, instance_id, topics, why)
        self._refused(group_id, topics, got, why)
        return got

    def _commit(self, group_id, generation, member_id, instance_id, topics, why) -> dict:
        g = self.groups.get(group_id)
        try:
            if not group_id or len(group_id.encode()) > MAX_GROUP_BYTES:
                raise GroupError(E.invalid_group_id)
            if g is None or g.state == EMPTY and not g.members:
                if generation >= 0:
                    raise GroupError(E.illegal_generation if g is None else E.unknown_member_id)
            else:
                m = self._member(g, member_id, instance_id)
                if generation != g.generation:
                    raise GroupError(E.illegal_generation)
                if g.state == COMPLETING:
                    raise GroupError(E.rebalance_in_progress)
                self._touch(g, m)
        except GroupError as e:
            return {t: [(p, e.code) for p, *_ in parts] for t, parts in topics.items()}
        return {t: self._store(g, group_id, t, parts, why) for t, parts in topics.items()}

    def check_member(self, group_id: str, generation: int, member_id: str, instance_id: str | None) -> None:
        """A transactional commit's member (TxnOffsetCommit, KIP-447): GroupError unless it
        is one of the group's in its generation; a commit without one (generation -1, no
        member id) passes, as a manual commit does."""
        g = self.groups.get(group_id)
        if not member_id and generation < 0:
            return
        if g is None or g.state == EMPTY and not g.members:
            raise GroupError(E.illegal_generation if g is None else E.unknown_member_id)
        self._member(g, member_id, instance_id)
        if generation != g.generation:
            raise GroupError(E.illegal_generation)

    def store_committed(self, group_id: str, topics: dict) -> dict:
        """The offsets a committed transaction carried, {topic: [(partition, offset,
        metadata, leader epoch)]}, made the group's: {topic: [(partition, code)]}."""
        g, why = self.groups.get(group_id), {}
        got = {t: self._store(g, group_id, t, parts, why) for t, parts in topics.items()}
        self._refused(group_id, topics, got, why, "a transaction's commit")
        return got

    def _store(self, g: Group | None, group_id: str, topic: str, parts: list, why: dict) -> list:
        """Write one topic's committed offsets into its stream's group. Any offset is
        taken, as Kafka's coordinator takes it (it checks the metadata's size only): a
        negative one (-1, or a client's -2 to reset: KafkaJS's ``setDefaultOffset``) is no
        position, so the stream's group has no committed offset there (its readers start
        as their reset says) and OffsetFetch answers it as it came. Where the engine
        refuses it, ``why[topic]`` says why."""
        try:
            s = self.stream(topic)
        except StreamNotFound:
            return [(p, E.unknown_topic_or_partition) for p, *_ in parts]
        codes, offsets, unset = {}, {}, []
        for p, offset, meta, _epoch in parts:
            if not 0 <= p < s.partitions:
                codes[p] = E.unknown_topic_or_partition
            elif meta is not None and len(meta.encode()) > MAX_METADATA_BYTES:
                codes[p] = E.offset_metadata_too_large
            elif offset < 0:
                unset.append(p)
            else:
                offsets[p] = offset
        if offsets or unset:
            try:
                holder = 0
                if g is not None and g.members:
                    self._hold(g, [topic])
                    holder = g.proxies.get(topic, 0)
                s.groups_table.set_offsets(group_id, offsets, holder)  # (none: the group is made, as Kafka's)
                if unset:
                    s.groups_table.forget(group_id, unset, holder)
            except GroupError as e:  # native members came (INCONSISTENT_GROUP_PROTOCOL, logged)
                why[topic] = str(e)
                return [(p, codes.get(p, E.unknown_member_id)) for p, *_ in parts]
            except StreamNotFound:
                return [(p, E.unknown_topic_or_partition) for p, *_ in parts]
            except ShmqError as e:  # native members, or no room for another group
                why[topic] = str(e)
                return [(p, codes.get(p, E.unknown_member_id)) for p, *_ in parts]
            for p, offset, meta, epoch in parts:
                if p in offsets or p in unset:
                    self._metadata[(group_id, topic, p)] = (offset, meta or "", epoch)
        return [(p, codes.get(p, E.none)) for p, *_ in parts]

    @staticmethod
    def _refused(group_id: str, topics: dict, got: dict, why: dict, what: str = "commit") -> None:
        """One WARNING line for each partition whose commit was refused: the group, topic,
        partition, offset, and why (Kafka's error, and the engine's reason where it gave one:
        ``why``, by topic)."""
        for topic, parts in topics.items():
            for (p, offset, *_rest), (_p, code) in zip(parts, got.get(topic, ())):
                if code == E.none:
                    continue
                reason = code.name.upper() + (f": {why[topic]}" if topic in why else "")
                log.warning("Kafka group %s: %s of topic %s partition %d offset %d refused: %s", group_id, what,
                            topic, p, offset, reason,
                            extra={"event": "kafka_commit_refused", "group": group_id, "topic": topic,
                                   "partition": p, "offset": offset, "reason": reason})

    def fetch(self, group_id: str, topics: list | None) -> dict:
        """OffsetFetch of [(topic, [partition])] or None (every topic the group has offsets
        in): {topic: [(partition, offset or -1, metadata, leader epoch or -1)]}."""
        out = {}
        if topics is None:
            unset = {}  # the negative offsets committed, by topic: Kafka answers them too
            for (g, t, p), (o, _m, _e) in self._metadata.items():
                if g == group_id and o < 0:
                    unset.setdefault(t, {})[p] = o
            for name in self.broker.list_streams():
                committed = {**unset.get(name, {}), **self._committed(name, group_id)}
                if committed:
                    out[name] = sorted(committed.items())
        else:
            for name, partitions in topics:
                committed = self._committed(name, group_id)
                out[name] = [(p, committed[p] if p in committed else self._unset(group_id, name, p))
                             for p in partitions]
        return {t: [(p, o, *self._meta_of(group_id, t, p, o)) for p, o in parts] for t, parts in out.items()}

    def _unset(self, group_id: str, topic: str, p: int) -> int:
        """The negative offset last committed at ``p`` (the stream's group has none there),
        or -1: none."""
        kept = self._metadata.get((group_id, topic, p))
        return kept[0] if kept is not None and kept[0] < 0 else -1

    def _committed(self, topic: str, group_id: str) -> dict:
        try:
            return self.stream(topic).committed(group_id)
        except (StreamNotFound, ValueError):
            return {}

    def forget_topic(self, topic: str) -> None:
        """A topic was deleted: what its commits left here goes (Kafka deletes a topic's
        committed offsets with it), so that a topic made again under its name starts bare."""
        for key in [k for k in self._metadata if k[1] == topic]:
            del self._metadata[key]

    def export_metadata(self) -> list:
        """The commit metadata and leader epochs held, as JSON-able rows [group, topic,
        partition, offset, metadata, leader epoch] (``state.keep``)."""
        return [[g, t, p, o, m, e] for (g, t, p), (o, m, e) in self._metadata.items() if m or e >= 0 or o < 0]

    def restore_metadata(self, rows) -> int:
        """Take back ``export_metadata``'s rows (an older server's have no leader epoch);
        returns how many. ValueError for rows not of that shape."""
        for g, t, p, o, m, *rest in rows:
            e = rest[0] if rest else -1
            if not (isinstance(g, str) and isinstance(t, str) and isinstance(m, str) and type(p) is int
                    and type(o) is int and type(e) is int and len(rest) <= 1):
                raise ValueError(f"a commit metadata row {[g, t, p, o]!r}")
            self._metadata[(g, t, p)] = (o, m, e)
        return len(rows)

    def _meta_of(self, group_id, topic, p, offset) -> tuple[str, int]:
        """(metadata, leader epoch) committed with ``offset``, if it is still the committed
        one, else ("", -1) (held in memory, kept over a clean restart where the server
        persists: ``state``; a native commit forgets them)."""
        kept = self._metadata.get((group_id, topic, p))
        return kept[1:] if kept is not None and kept[0] == offset else ("", -1)

    # ------------------------------------------------------------------ admin
    def native_groups(self) -> dict:
        """{group: live members} of the shmq groups of every stream that the coordinator
        does not run (native groups; a group on several streams counts its largest)."""
        out: dict[str, int] = {}
        for name in self.broker.list_streams():
            try:
                table = self.stream(name).groups_table
                for group in table.names():
                    if group not in self.groups or self.groups[group].state == EMPTY:
                        out[group] = max(out.get(group, 0), table.members(group))
            except StreamNotFound:
                continue
        return out

    def describe(self, group_id: str, native: dict) -> dict:
        g = self.groups.get(group_id)
        if g is None or g.state == EMPTY and not g.members:
            if group_id in native:  # a shmq group: Kafka members may join it when it has no native ones
                busy = native[group_id] > 0
                return {"group_state": STABLE if busy else EMPTY, "protocol_type": "shmq" if busy else CONSUMER,
                        "protocol_data": "", "members": []}
            return {"group_state": "Dead", "protocol_type": "", "protocol_data": "", "members": []}
        stable = g.state == STABLE
        members = [{"member_id": m.member_id, "group_instance_id": m.instance_id, "client_id": m.client_id,
                    "client_host": m.client_host,
                    "member_metadata": m.metadata(g.protocol) if stable else b"",
                    "member_assignment": m.assignment if stable else b""} for m in g.members.values()]
        return {"group_state": g.state, "protocol_type": g.protocol_type or "",
                "protocol_data": g.protocol if g.state in (STABLE, COMPLETING) else "", "members": members}

    def delete(self, group_id: str) -> E:
        """DeleteGroups of one group: its committed offsets on every stream gone (the shmq
        group's too: they are one). NON_EMPTY_GROUP while it has members, Kafka or
        native; GROUP_ID_NOT_FOUND if no stream has it."""
        g = self.groups.get(group_id)
        if g is not None and g.members:
            return E.non_empty_group
        tables = []
        for name in self.broker.list_streams():
            try:
                table = self.stream(name).groups_table
            except StreamNotFound:
                continue
            if group_id in table.names():
                if table.members(group_id):
                    return E.non_empty_group
                tables.append(table)
        found = g is not None
        for table in tables:
            try:
                found = table.forget(group_id) or found
            except ShmqError:  # a native member came meanwhile
                return E.non_empty_group
        if not found:
            return E.group_id_not_found
        self.groups.pop(group_id, None)
        for key in [k for k in self._metadata if k[0] == group_id]:
            del self._metadata[key]
        log.info("Kafka group %s deleted", group_id)
        return E.none

    def delete_offsets(self, group_id: str, topics: dict) -> tuple[E, dict]:
        """OffsetDelete of {topic: [partition]}: (the group's error, {topic: [(partition,
        error)]}). A topic the group's members subscribe to keeps its offsets
        (GROUP_SUBSCRIBED_TO_TOPIC)."""
        g = self.groups.get(group_id)
        subscribed = set()
        if g is not None and g.members and g.protocol_type == CONSUMER and g.protocol is not None:
            subscribed = {t for m in g.members.values() for t in subscription_topics(m.metadata(g.protocol))}
        out, known = {}, g is not None
        for topic, parts in topics.items():
            try:
                s = self.stream(topic)
            except StreamNotFound:
                out[topic] = [(p, E.unknown_topic_or_partition) for p in parts]
                continue
            known = known or group_id in s.groups_table.names()
            if topic in subscribed:
                out[topic] = [(p, E.group_subscribed_to_topic) for p in parts]
                continue
            mine = [p for p in parts if 0 <= p < s.partitions]
            try:
                s.groups_table.forget(group_id, mine, g.proxies.get(topic, 0) if g is not None else 0)
            except ShmqError:  # native members read it
                out[topic] = [(p, E.group_subscribed_to_topic) for p in parts]
                continue
            for p in mine:
                self._metadata.pop((group_id, topic, p), None)
            out[topic] = [(p, E.none if p in mine else E.unknown_topic_or_partition) for p in parts]
        return (E.none if known else E.group_id_not_found), out

    def listing(self) -> list:
        """[(group, protocol type, state)] of the Kafka groups and the native ones."""
        native = self.native_groups()
        out = [(g.name, g.protocol_type or CONSUMER, g.state) for g in self.groups.values()
               if g.members or g.name not in native]
        out += [(name, "shmq" if n else CONSUMER, STABLE if n else EMPTY) for name, n in native.items()]
        return sorted(out)


def _consume(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()


# ---------------------------------------------------------------------- consumer protocol bytes
def _string(data: bytes, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from(">h", data, pos)
    if n < 0 or pos + 2 + n > len(data):
        raise ValueError("a string past the end")
    return data[pos + 2:pos + 2 + n].decode(), pos + 2 + n


def _topics(data: bytes, with_partitions: bool) -> list[str]:
    """The topics that come first after the version in a consumer protocol's bytes, each
    followed by its partitions (int32 array) ``with_partitions``; [] for bytes that are
    not such."""
    out: list[str] = []
    try:
        _version, n = struct.unpack_from(">hi", data, 0)
        pos = 6
        for _ in range(min(n, len(data))):
            topic, pos = _string(data, pos)
            if with_partitions:
                (parts,) = struct.unpack_from(">i", data, pos)
                pos += 4 + 4 * max(parts, 0)
            out.append(topic)
    except (struct.error, ValueError, UnicodeDecodeError):
        pass
    return out


def subscription_topics(metadata: bytes) -> list[str]:
    """The topics of a ConsumerProtocolSubscription (any version: they come first after
    the version); [] for bytes that are not one."""
    return _topics(metadata, with_partitions=False)


def assignment_topics(assignment: bytes) -> list[str]:
    """The topics of a ConsumerProtocolAssignment; [] for bytes that are not one."""
    return _topics(assignment, with_partitions=True)
