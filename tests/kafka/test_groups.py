"""Issue 30, item 4: Kafka consumer groups through shmq's Kafka listener are shmq's groups.

Against a real ``shmq server --kafka-port 0`` process: the classic protocol at the wire
(``groups_wire``: member ids, generations, fencing, timeouts, static members, mixing with
native members), then real clients (kafka-python, aiokafka, confluent-kafka): offsets one
thing both ways, each assignor, and a two-member group that rebalances when a member
joins, leaves and is SIGKILLed, with exact accounting of what was delivered.
"""

import collections
import datetime
import json
import re
import signal
import subprocess
import sys
import threading

import pytest

from shmq.errors import ShmqError
from shmq.kafka import ErrorCode as E
from tests._wait import wait_for
from tests.kafka.clients import Talker, kafka_python_subscribed
from tests.kafka.groups_wire import (COMMIT, DESCRIBE, FETCH, FIND, HEARTBEAT, JOIN, LEAVE, LIST, SYNC, Wire,
                                     assignment, subscription)


def ms(n):
    return datetime.timedelta(milliseconds=n)


def kafka_port(srv) -> int:
    """The Kafka listener's port, from the server's start-up lines."""
    for line in srv.log:
        m = re.search(r"kafka listener on \S+:(\d+)", line)
        if m:
            return int(m.group(1))
    raise AssertionError(f"no Kafka port in the server's log: {srv.log}")


@pytest.fixture
def kafka(broker, servers):
    """A ``shmq server`` with its Kafka listener open (no SASL), and its port."""
    srv = servers(broker.namespace, "--no-persist", "--no-auth", "--kafka-port", "0",
                  "--kafka-initial-rebalance-delay-ms", "0")
    srv.kafka_port = kafka_port(srv)
    yield srv
    assert srv.stop() == 0


def join(w, member_id="", group="g", topics=("ev",), protocols=("range",), session=30_000, rebalance=30_000,
         instance=None, version=9, send_only=False):
    fields = dict(group_id=group, session_timeout=ms(session), rebalance_timeout=ms(rebalance), member_id=member_id,
                  group_instance_id=instance, protocol_type="consumer",
                  protocols=[{"name": p, "metadata": subscription(*topics)} for p in protocols])
    if send_only:
        return w.send(JOIN, version, **fields)
    return w.call(JOIN, version, **fields)


def joined(w, group="g", **kw):
    """A new member, through MEMBER_ID_REQUIRED as a v4+ client does: the JoinGroup answer."""
    first = join(w, group=group, **kw)
    assert first.error_code == E.member_id_required and first.member_id.startswith(w.client_id + "-")
    return join(w, first.member_id, group=group, **kw)


def sync(w, generation, member_id, assignments=(), group="g", send_only=False):
    fields = dict(group_id=group, generation_id=generation, member_id=member_id, protocol_type="consumer",
                  protocol_name="range", assignments=[{"member_id": m, "assignment": a} for m, a in assignments])
    if send_only:
        return w.send(SYNC, 5, **fields)
    return w.call(SYNC, 5, **fields)


def heartbeat(w, generation, member_id, group="g", instance=None):
    return w.call(HEARTBEAT, 4, group_id=group, generation_id=generation, member_id=member_id,
                  group_instance_id=instance).error_code


def commit(w, generation, member_id, offsets, group="g", topic="ev", metadata=None):
    r = w.call(COMMIT, 9, group_id=group, generation_id_or_member_epoch=generation, member_id=member_id,
               topics=[{"name": topic, "partitions": [{"partition_index": p, "committed_offset": o,
                                                       "committed_leader_epoch": -1, "committed_metadata": metadata}
                                                      for p, o in offsets.items()]}])
    return {p.partition_index: p.error_code for t in r.topics for p in t.partitions}


def fetch(w, group="g", topic="ev", partitions=(0, 1)):
    r = w.call(FETCH, 9, groups=[{"group_id": group, "topics": [{"name": topic, "partition_indexes": partitions}]}],
               require_stable=False)
    (g,) = r.groups
    return {p.partition_index: (p.committed_offset, p.metadata) for t in g.topics for p in t.partitions}


def describe(w, group="g"):
    (g,) = w.call(DESCRIBE, 5, groups=[group], include_authorized_operations=False).groups
    return g


# ------------------------------------------------------------------------------------ the protocol
def test_find_coordinator_names_the_listener(broker, kafka):
    with Wire(kafka.kafka_port) as w:
        r = w.call(FIND, 4, key_type=0, coordinator_keys=["g", "h"])
        assert [(c.key, c.node_id, c.host, c.port, c.error_code) for c in r.coordinators] == [
            ("g", 0, "127.0.0.1", kafka.kafka_port, E.none), ("h", 0, "127.0.0.1", kafka.kafka_port, E.none)]
        r = w.call(FIND, 3, key="g", key_type=0)
        assert (r.error_code, r.node_id, r.port) == (E.none, 0, kafka.kafka_port)
        r = w.call(FIND, 3, key="txn", key_type=1)  # a transactional id's: here too
        assert (r.error_code, r.node_id, r.port) == (E.none, 0, kafka.kafka_port)
        r = w.call(FIND, 3, key="x", key_type=2)  # (a share group's: not here, and it says so)
        assert r.error_code == E.invalid_request and "key type 2: 0 (a group) or 1" in r.error_message


def test_join_sync_heartbeat_leave_and_the_fence_of_a_stale_generation(broker, kafka):
    s = broker.create_stream("ev", partitions=2)
    with Wire(kafka.kafka_port, "a") as a, Wire(kafka.kafka_port, "b") as b:
        r = joined(a)
        ida = r.member_id
        assert (r.error_code, r.generation_id, r.leader, r.protocol_type, r.protocol_name) == (
            E.none, 1, ida, "consumer", "range")
        assert [(m.member_id, m.metadata) for m in r.members] == [(ida, subscription("ev"))]
        assert sync(a, 1, ida, [(ida, assignment({"ev": [0, 1]}))]).assignment == assignment({"ev": [0, 1]})
        assert heartbeat(a, 1, ida) == E.none
        assert describe(a).group_state == "Stable"

        # b joins: its JoinGroup waits while a learns of the rebalance from its heartbeat and joins again
        first = join(b)
        idb = first.member_id
        join(b, idb, send_only=True)
        wait_for(lambda: heartbeat(a, 1, ida) == E.rebalance_in_progress, what="a told to rejoin")
        assert commit(a, 1, ida, {0: 3}) == {0: E.none}  # Kafka takes a commit of the old generation meanwhile
        ra = join(a, ida)
        rb = b.recv()
        assert (ra.generation_id, ra.leader, rb.generation_id, rb.leader) == (2, ida, 2, ida)
        assert sorted(m.member_id for m in ra.members) == sorted([ida, idb]) and rb.members == ()
        assert commit(a, 2, ida, {0: 4}) == {0: E.rebalance_in_progress}  # between join and sync
        sync(b, 2, idb, send_only=True)  # the follower waits for the leader's assignment
        ra = sync(a, 2, ida, [(ida, assignment({"ev": [0]})), (idb, assignment({"ev": [1]}))])
        assert (ra.error_code, ra.assignment, b.recv().assignment) == (
            E.none, assignment({"ev": [0]}), assignment({"ev": [1]}))

        # a stale generation and a stranger are fenced; nothing of theirs is committed
        assert heartbeat(a, 1, ida) == E.illegal_generation
        assert commit(a, 1, ida, {0: 99}) == {0: E.illegal_generation}
        assert commit(a, 2, "someone", {0: 99}) == {0: E.unknown_member_id}
        assert commit(a, -1, "", {0: 99}) == {0: E.unknown_member_id}  # a manual commit, while members are there
        assert heartbeat(a, 2, "someone") == E.unknown_member_id
        assert sync(a, 1, ida).error_code == E.illegal_generation
        assert s.committed("g") == {0: 3}
        assert commit(b, 2, idb, {1: 7}, metadata="b's") == {1: E.none}
        assert s.committed("g") == {0: 3, 1: 7}
        assert fetch(a) == {0: (3, ""), 1: (7, "b's")}
        assert commit(b, 2, idb, {5: 1, 1: 8}) == {5: E.unknown_topic_or_partition, 1: E.none}
        assert commit(b, 2, idb, {0: 1}, topic="nope") == {0: E.unknown_topic_or_partition}

        # b leaves (v3+: a batch of members): a rejoins alone, in generation 3
        r = b.call(LEAVE, 5, group_id="g", members=[{"member_id": idb}, {"member_id": "stranger"}])
        assert [(m.member_id, m.error_code) for m in r.members] == [(idb, E.none), ("stranger", E.unknown_member_id)]
        assert heartbeat(a, 2, ida) == E.rebalance_in_progress
        r = join(a, ida)
        assert (r.generation_id, [m.member_id for m in r.members]) == (3, [ida])
        assert heartbeat(b, 3, idb) == E.unknown_member_id
        assert a.call(LEAVE, 2, group_id="g", member_id=ida).error_code == E.none
        assert describe(a).group_state == "Empty"
        assert s.committed("g") == {0: 3, 1: 8}  # the group is gone from Kafka's side, its offsets stay
    s.close()


def test_a_member_that_does_not_rejoin_within_the_rebalance_timeout_is_removed(broker, kafka):
    s = broker.create_stream("ev", partitions=2)
    with Wire(kafka.kafka_port, "a") as a, Wire(kafka.kafka_port, "b") as b:
        ida = joined(a, rebalance=300).member_id
        assert sync(a, 1, ida, [(ida, b"")]).error_code == E.none
        idb = join(b, rebalance=300).member_id
        r = join(b, idb, rebalance=300)  # a never joins again: after its 0.3 s, the rebalance ends without it
        assert (r.error_code, r.generation_id, r.leader, [m.member_id for m in r.members]) == (E.none, 2, idb, [idb])
        assert heartbeat(a, 1, ida) == E.unknown_member_id
        assert sync(a, 2, ida).error_code == E.unknown_member_id
    s.close()


@pytest.mark.slow
def test_a_member_whose_heartbeats_stop_leaves_after_its_session_timeout(broker, kafka):
    s = broker.create_stream("ev", partitions=2)
    with Wire(kafka.kafka_port, "a") as a, Wire(kafka.kafka_port, "admin") as admin:
        ida = joined(a, session=6_000).member_id  # Kafka's least session timeout
        sync(a, 1, ida, [(ida, assignment({"ev": [0, 1]}))])
        assert s.groups_table.members("g") == 1  # the listener's stand-in
        wait_for(lambda: describe(admin).group_state == "Empty", timeout=30, what="the session to end")
        assert heartbeat(a, 1, ida) == E.unknown_member_id
        assert s.groups_table.members("g") == 0
        assert join(a, session=5_999).error_code == E.invalid_session_timeout
    s.close()


def test_a_static_member_that_comes_back_fences_its_old_self_and_rebalances_nobody(broker, kafka):
    s = broker.create_stream("ev", partitions=2)
    with Wire(kafka.kafka_port, "a") as a, Wire(kafka.kafka_port, "b") as b, Wire(kafka.kafka_port, "a2") as a2:
        r = join(a, instance="pod-1")  # a static member gets its id at once (no MEMBER_ID_REQUIRED)
        old = r.member_id
        assert (r.error_code, r.generation_id) == (E.none, 1)
        sync(a, 1, old, [(old, assignment({"ev": [0, 1]}))])
        assert heartbeat(a, 1, old, instance="pod-1") == E.none
        join(b, instance="pod-2", send_only=True)  # a second member: generation 2, a the leader still
        wait_for(lambda: describe(a2).group_state == "PreparingRebalance", timeout=30,
                 what="b's join to start the rebalance (before a joins again)")
        assert join(a, old, instance="pod-1").generation_id == 2
        rb = b.recv()
        assert (rb.error_code, rb.generation_id) == (E.none, 2)
        sync(b, 2, rb.member_id, send_only=True)
        assert sync(a, 2, old, [(old, assignment({"ev": [0]})), (rb.member_id, assignment({"ev": [1]}))]
                    ).assignment == assignment({"ev": [0]})
        assert b.recv().assignment == assignment({"ev": [1]})
        r = join(a2, instance="pod-1")  # pod-1 restarted: it takes its place, in the same generation
        assert (r.error_code, r.generation_id, r.leader) == (E.none, 2, old) and r.member_id != old
        assert r.members == ()  # not told to assign: the leader it sees is its old self
        assert sync(a2, 2, r.member_id).assignment == assignment({"ev": [0]})  # its assignment, as before
        assert heartbeat(a2, 2, r.member_id, instance="pod-1") == E.none
        assert heartbeat(b, 2, rb.member_id, instance="pod-2") == E.none  # the other member saw nothing
        assert heartbeat(a, 2, old, instance="pod-1") == E.fenced_instance_id
        assert commit(a, 2, old, {0: 1}) == {0: E.unknown_member_id}
        assert commit(a2, 2, r.member_id, {0: 1}) == {0: E.none}
        r3 = join(a, instance="pod-1", protocols=("roundrobin",))  # back with another assignor: a rebalance
        assert r3.error_code == E.inconsistent_group_protocol  # (the group's members share none)
    s.close()


def test_manual_commits_and_native_resets_are_one_thing(broker, kafka):
    s = broker.create_stream("ev", partitions=2)
    s.append_many([b"x"] * 10, partition=0)
    with Wire(kafka.kafka_port, "m") as w:
        assert commit(w, -1, "", {0: 4}, metadata="from kafka") == {0: E.none}  # no member: a manual commit
        assert s.committed("g") == {0: 4} and s.lag("g")[0] == 6
        assert fetch(w) == {0: (4, "from kafka"), 1: (-1, "")}
        s.reset("g", to={0: 2, 1: 0})  # natively: Kafka sees it (the metadata was of another offset)
        assert fetch(w) == {0: (2, ""), 1: (0, "")}
        assert commit(w, 5, "", {0: 4}, group="nobody") == {0: E.illegal_generation}
        with s.consumer("native") as c:  # a group with a live native member takes no manual commit
            c.poll(timeout=0)
            assert commit(w, -1, "", {0: 1}, group="native") == {0: E.unknown_member_id}
        r = w.call(FETCH, 7, group_id="g", topics=None, require_stable=False)  # every topic with offsets
        assert [(t.name, [(p.partition_index, p.committed_offset) for p in t.partitions]) for t in r.topics] == [
            ("ev", [(0, 2), (1, 0)])]
        listed = {(g.group_id, g.protocol_type, g.group_state) for g in w.call(LIST, 4, states_filter=[]).groups}
        assert listed == {("g", "consumer", "Empty"), ("native", "consumer", "Empty")}
    s.close()


def _refusals(srv) -> list:
    return [x for x in srv.later if "refused:" in x and "commit of topic" in x]


def test_negative_commits_are_taken_as_kafka_takes_them_and_each_refusal_is_logged(broker, kafka):
    """Kafka's coordinator takes any offset in an OffsetCommit (it checks the metadata's
    size only: OffsetMetadataManager.commitOffset) and OffsetFetch answers it as stored;
    a negative one is no position. KafkaJS resets so (``setDefaultOffset``: -1 for the
    latest, -2 with fromBeginning): taken, the shmq group has no committed offset there
    (its readers start as their reset says), a later commit or a native reset replaces it.
    Every partition whose commit is refused is one WARNING line naming the group, topic,
    partition, offset and why."""
    s = broker.create_stream("ev", partitions=2)
    s.append_many([b"x"] * 10, partition=0)
    with Wire(kafka.kafka_port, "m") as w:
        assert commit(w, -1, "", {0: 4, 1: 0}) == {0: E.none, 1: E.none}
        assert commit(w, -1, "", {0: -1, 1: -2}) == {0: E.none, 1: E.none}
        assert fetch(w) == {0: (-1, ""), 1: (-2, "")}
        assert s.committed("g") == {}
        with s.consumer("g", auto_offset_reset="latest") as c:  # natively: nothing committed, so the reset's
            c.poll(timeout=0)
            assert c.position(0) == 10
        r = w.call(COMMIT, 2, group_id="g", generation_id_or_member_epoch=-1, member_id="",
                   retention_time=datetime.timedelta(milliseconds=-1),
                   topics=[{"name": "ev", "partitions": [{"partition_index": 0, "committed_offset": -2,
                                                          "committed_metadata": None}]}])
        assert [(p.partition_index, p.error_code) for t in r.topics for p in t.partitions] == [(0, E.none)]
        r = w.call(FETCH, 7, group_id="g", topics=None, require_stable=False)  # every topic with offsets
        assert [(t.name, [(p.partition_index, p.committed_offset) for p in t.partitions]) for t in r.topics] == [
            ("ev", [(0, -2), (1, -2)])]
        assert commit(w, -1, "", {1: 3}) == {1: E.none}
        s.reset("g", to={0: 7})  # natively: the stream's offset, not the negative one
        assert fetch(w) == {0: (7, ""), 1: (3, "")} and s.committed("g") == {0: 7, 1: 3}
        assert _refusals(kafka) == []
        # refused: a stale generation, a partition the topic has not, metadata too big, a group with native members
        assert commit(w, 5, "", {0: 9}, group="nobody") == {0: E.illegal_generation}
        assert commit(w, -1, "", {0: 1, 9: 2}) == {0: E.none, 9: E.unknown_topic_or_partition}
        assert commit(w, -1, "", {1: -1}, metadata="m" * 5000) == {1: E.offset_metadata_too_large}
        with s.consumer("native") as c:
            c.poll(timeout=0)
            assert commit(w, -1, "", {0: 1}, group="native") == {0: E.unknown_member_id}
        assert fetch(w) == {0: (1, ""), 1: (3, "")}  # (the refused ones changed nothing)
    want = ["Kafka group nobody: commit of topic ev partition 0 offset 9 refused: ILLEGAL_GENERATION",
            "Kafka group g: commit of topic ev partition 9 offset 2 refused: UNKNOWN_TOPIC_OR_PARTITION",
            "Kafka group g: commit of topic ev partition 1 offset -1 refused: OFFSET_METADATA_TOO_LARGE",
            "Kafka group native: commit of topic ev partition 0 offset 1 refused: UNKNOWN_MEMBER_ID: group 'native' "
            "of stream 'ev' has live members: close them first"]
    kafka.wait_for_line(lambda x: want[-1] in x)
    got = _refusals(kafka)
    assert len(got) == len(want) and all(x in line and "WARNING" in line for x, line in zip(want, got)), got
    with Wire(kafka.kafka_port, "m") as w:  # a topic deleted (natively here) and made again: no commit of before
        assert commit(w, -1, "", {0: -2}) == {0: E.none} and fetch(w) == {0: (-2, ""), 1: (3, "")}
        s.close()
        broker.delete_stream("ev")
        broker.create_stream("ev", partitions=2).close()
        assert fetch(w) == {0: (-1, ""), 1: (-1, "")}


def test_native_and_kafka_members_never_share_a_group(broker, kafka):
    s = broker.create_stream("ev", partitions=2)
    with Wire(kafka.kafka_port, "k") as w:
        with s.consumer("mixed") as c:
            c.poll(timeout=0)
            first = join(w, group="mixed")
            r = join(w, first.member_id, group="mixed")  # refused at join, with Kafka's code for another kind
            assert r.error_code == E.inconsistent_group_protocol
            assert join(w, group="mixed", instance="static").error_code == E.inconsistent_group_protocol
            kafka.wait_for_line(lambda x: "group 'mixed' of stream 'ev' has 1 native shmq member(s): Kafka consumers "
                                          "cannot join it until they close" in x)
            d = describe(w, "mixed")
            assert (d.group_state, d.protocol_type, d.members) == ("Stable", "shmq", ())
        r = joined(w, group="mixed")  # the native member closed: Kafka members may join
        assert r.error_code == E.none
        with pytest.raises(ShmqError, match="group 'mixed' of stream 'ev' has Kafka members .* a native consumer "
                                            "cannot join it until they leave"):
            s.consumer("mixed").poll(timeout=0)
        with pytest.raises(ShmqError, match="has live members: close them first"):
            s.reset("mixed", to="earliest")
        assert w.call(LEAVE, 5, group_id="mixed", members=[{"member_id": r.member_id}]).error_code == E.none
        with s.consumer("mixed") as c:  # gone: native members may join
            assert c.assignment() == [0, 1]
    s.close()


# ------------------------------------------------------------------------------------ real clients
class Member(Talker):
    """A Kafka consumer in a process of its own (``groups_member``), and what it said."""

    def __init__(self, lib, port, group="g", topic="ev"):
        super().__init__("tests.kafka.groups_member", lib, port, topic, group)

    def assigned(self) -> list | None:
        return next((x["assigned"] for x in reversed(self.said) if "assigned" in x), None)

    def got(self) -> list:
        return [tuple(r) for x in list(self.said) if "got" in x for r in x["got"]]

    def commits(self) -> list:
        return [{int(p): o for p, o in x["committed"].items()} for x in list(self.said) if "committed" in x]


@pytest.fixture
def members():
    """``start(lib, port)``: a consumer process; any left running at the end is killed."""
    started = []

    def start(lib, port):
        m = Member(lib, port)
        started.append(m)
        return m

    yield start
    for m in started:
        if m.proc.poll() is None:
            m.kill()
        m.proc.stdout.close()


@pytest.mark.slow
def test_a_group_rebalances_on_join_leave_and_sigkill_and_delivers_each_record_once_past_the_last_commit(
        broker, kafka, members):
    """Records appended natively and produced through Kafka; a kafka-python member, then a
    confluent-kafka one that joins and leaves, then one that joins, stops committing and
    is SIGKILLed. Each event comes once everything before it is committed, so the exact
    outcome is known: every record delivered once, except the ones the killed member got
    and never committed, which its successor gets once more, from the last commit on."""
    from kafka import KafkaProducer

    s = broker.create_stream("ev", partitions=4)
    everything = set(range(4))
    produced = []
    producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{kafka.kafka_port}", linger_ms=0)
    group = []

    def produce(n):
        """n records appended natively and n produced through Kafka, with keys: all partitions get some."""
        values = [f"r{len(produced) + i}" for i in range(2 * n)]
        s.append_many([v.encode() for v in values[:n]], keys=[v.encode() for v in values[:n]])
        for v in values[n:]:
            producer.send("ev", key=v.encode(), value=v.encode())
        producer.flush()
        produced.extend(values)

    def delivered():
        return {v for m in group for _p, _o, v in m.got()}

    def settled(*live):
        """The live members' assignments split the partitions among them."""
        owned = [m.assigned() for m in live]
        return all(owned) and sorted(p for o in owned for p in o) == sorted(everything)

    def quiet():
        """Everything produced is delivered and committed (natively, the shmq group's offsets)."""
        wait_for(lambda: delivered() >= set(produced), timeout=60, what="every record delivered")
        ends = {p: s.offsets(p)[1] for p in everything}
        wait_for(lambda: s.committed("g") == ends, timeout=60, what=f"the group's commits to reach {ends}")

    produce(20)
    a = members("kafka-python", kafka.kafka_port)
    group.append(a)
    quiet()

    b = members("confluent", kafka.kafka_port)  # joins: a gives up some partitions
    group.append(b)
    wait_for(lambda: settled(a, b), timeout=60, what="a and b to split the partitions")
    produce(20)
    quiet()
    assert b.got(), "b owned partitions and got none of their records"
    assert b.stop() == 0  # leaves: a takes everything back
    wait_for(lambda: settled(a) and a.assigned() == sorted(everything), timeout=60, what="a to own everything")
    produce(20)
    quiet()

    c = members("confluent", kafka.kafka_port)
    group.append(c)
    wait_for(lambda: settled(a, c), timeout=60, what="a and c to split the partitions")
    c_parts = set(c.assigned())
    c.proc.send_signal(signal.SIGUSR1)  # c commits nothing from here on
    committed_before = s.committed("g")
    c_seen = len(c.got())
    produce(20)
    wait_for(lambda: delivered() >= set(produced), timeout=60, what="every record delivered (c's uncommitted)")
    held = set(c.got()[c_seen:])
    assert held and {p for p, _o, _v in held} <= c_parts
    c.kill()
    wait_for(lambda: a.assigned() == sorted(everything), timeout=60, what="a to take the killed member's partitions")
    produce(20)
    quiet()
    assert a.stop() == 0

    # the exact accounting, over the offsets of every partition
    ends = {p: s.offsets(p)[1] for p in everything}
    assert s.committed("g") == ends and sum(ends.values()) == len(produced) == 200
    deliveries = [r for m in group for r in m.got()]
    counts = collections.Counter(deliveries)
    assert {(p, o) for p, o, _v in counts} == {(p, o) for p in everything for o in range(ends[p])}  # nothing lost
    assert sorted(v for _p, _o, v in counts) == sorted(produced)  # and each record is the one produced
    redelivered = {r for r, n in counts.items() if n > 1}
    assert redelivered == held and all(counts[r] == 2 for r in held)  # the killed member's uncommitted records
    for p in c_parts:  # its successor read them again from the last commit on, no earlier
        again = sorted(o for q, o, _v in held if q == p)
        if again:
            assert again[0] == committed_before.get(p, 0)
    producer.close()
    s.close()
    assert kafka.stop() == 0  # and the server said nothing an operator alerts on (no unread answer's ERROR)
    errors = [x for x in kafka.log + kafka.later if " ERROR " in x]
    assert not errors, errors


def test_kafka_commits_are_the_shmq_groups_offsets_and_native_ones_are_kafkas(broker, kafka):
    """kafka-python commits in its generation, aiokafka commits by hand (no member);
    stream.committed, the CLI and lag see both; a native reset is what each client's
    OffsetFetch finds, and where a new member starts."""
    import asyncio

    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as AioTP
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as CTP
    from kafka import TopicPartition

    s = broker.create_stream("ev", partitions=2)
    s.append_many([b"v%d" % i for i in range(10)], partition=0)
    bootstrap = f"127.0.0.1:{kafka.kafka_port}"

    def kp_consumer():
        return kafka_python_subscribed(["ev"], bootstrap_servers=bootstrap, group_id="g",
                                       auto_offset_reset="earliest", enable_auto_commit=False,
                                       consumer_timeout_ms=20_000)

    c = kp_consumer()
    got = [next(c) for _ in range(10)]
    assert [(r.partition, r.offset) for r in got] == [(0, i) for i in range(10)]
    c.commit()
    assert s.committed("g")[0] == 10 and s.lag("g") == {0: 0, 1: 0}
    c.close()

    s.reset("g", to={0: 3, 1: 0})  # natively: every client's OffsetFetch finds it, and a member starts there
    c = kp_consumer()
    assert c.committed(TopicPartition("ev", 0)) == 3
    assert next(c).offset == 3
    c.close()
    cc = Consumer({"bootstrap.servers": bootstrap, "group.id": "g"})
    assert [tp.offset for tp in cc.committed([CTP("ev", 0), CTP("ev", 1)], timeout=20)] == [3, 0]
    cc.close()

    async def by_hand():
        a = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id="g", enable_auto_commit=False)
        await a.start()
        try:
            tp = AioTP("ev", 0)
            a.assign([tp])
            assert await a.committed(tp) == 3
            await a.commit({tp: 7})  # a manual commit: generation -1, no member
        finally:
            await a.stop()

    asyncio.run(by_hand())
    assert s.committed("g") == {0: 7, 1: 0}
    out = subprocess.run([sys.executable, "-m", "shmq.cli", "group", "lag", "ev", "g", "--json", "--namespace",
                          broker.namespace], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"g": {"committed": {"0": 7, "1": 0}, "lag": {"0": 3, "1": 0}}}
    s.close()


def _assignments(lib, bootstrap, client_id, assignor, topics, stop, out):
    """A consumer of ``lib`` in group "g" that polls until ``stop``, keeping its current
    assignment in ``out[client_id]`` as [(topic, partition)]."""
    if lib == "confluent":
        from confluent_kafka import Consumer
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "g", "client.id": client_id,
                      "partition.assignment.strategy": assignor, "session.timeout.ms": 6000,
                      "heartbeat.interval.ms": 500})
        c.subscribe(topics)
        while not stop.is_set():
            c.poll(0.1)
            out[client_id] = sorted((tp.topic, tp.partition) for tp in c.assignment())
    else:
        from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
        from kafka.coordinator.assignors.range import RangePartitionAssignor
        from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
        kind = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor,
                "cooperative-sticky": CooperativeStickyAssignor}[assignor]
        c = kafka_python_subscribed(topics, bootstrap_servers=bootstrap, group_id="g", client_id=client_id,
                                    partition_assignment_strategy=[kind], session_timeout_ms=6000,
                                    heartbeat_interval_ms=500)
        while not stop.is_set():
            c.poll(timeout_ms=100)
            out[client_id] = sorted((tp.topic, tp.partition) for tp in c.assignment())
    c.close()


T = [("t1", p) for p in range(3)] + [("t2", p) for p in range(3)]
EXPECTED = {  # member "a" sorts before member "b": what each assignor gives each
    "range": ([("t1", 0), ("t1", 1), ("t2", 0), ("t2", 1)], [("t1", 2), ("t2", 2)]),
    "roundrobin": ([("t1", 0), ("t1", 2), ("t2", 1)], [("t1", 1), ("t2", 0), ("t2", 2)]),
}


@pytest.mark.parametrize("lib", ["confluent", "kafka-python"])
@pytest.mark.parametrize("assignor", ["range", "roundrobin", "cooperative-sticky"])
def test_each_assignor_splits_the_partitions_of_a_two_member_group(broker, kafka, lib, assignor):
    for t in ("t1", "t2"):
        broker.create_stream(t, partitions=3).close()
    bootstrap = f"127.0.0.1:{kafka.kafka_port}"
    stop, out, threads = threading.Event(), {}, []

    def start(client_id):
        t = threading.Thread(target=_assignments, args=(lib, bootstrap, client_id, assignor, ["t1", "t2"], stop, out))
        t.start()
        threads.append(t)

    try:
        start("a")
        wait_for(lambda: out.get("a") == T, timeout=60, what="a alone to own every partition")
        start("b")
        if assignor in EXPECTED:
            want_a, want_b = EXPECTED[assignor]
            wait_for(lambda: (out.get("a"), out.get("b")) == (want_a, want_b), timeout=60,
                     what=f"the {assignor} split: {want_a} / {want_b}")
        else:  # sticky: a keeps what it had of the split, b gets the rest, half each
            wait_for(lambda: len(out.get("a", ())) == len(out.get("b", ())) == 3 and
                     sorted(out["a"] + out["b"]) == T, timeout=60, what="a cooperative split, 3 and 3")
        with Wire(kafka.kafka_port) as w:  # a client may rejoin once more (a cooperative round, a metadata change)
            wait_for(lambda: (lambda d: (d.group_state, d.protocol_type, d.protocol_data, len(d.members)))(
                describe(w)) == ("Stable", "consumer", assignor, 2), timeout=60, what="the group stable, 2 members")
    finally:
        stop.set()
        for t in threads:
            t.join(30)


def test_a_kafka_client_joining_a_group_with_native_members_gets_a_clear_error(broker, kafka):
    from kafka import KafkaConsumer
    from kafka.errors import InconsistentGroupProtocolError

    s = broker.create_stream("ev", partitions=2)
    with s.consumer("billing") as native:
        native.poll(timeout=0)
        c = KafkaConsumer("ev", bootstrap_servers=f"127.0.0.1:{kafka.kafka_port}", group_id="billing")
        try:
            with pytest.raises(InconsistentGroupProtocolError):
                c.poll(timeout_ms=10_000)
        finally:
            c.close()
        assert native.assignment() == [0, 1]  # the native member goes on as it was
    s.close()
