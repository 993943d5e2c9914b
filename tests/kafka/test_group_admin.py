"""Issue 40: the group coordinator's initial rebalance delay and its quiet when nobody
waits for an answer; the small admin APIs (DeleteGroups, OffsetDelete, DeleteRecords,
DescribeCluster) with confluent-kafka's AdminClient and at the wire; an API not served
answered at once and named in the log."""

import datetime
import struct
import time

import pytest

from shmq.kafka import ErrorCode as E
from tests._wait import wait_for
from tests.kafka.groups_wire import Wire, assignment
from tests.kafka.test_groups import commit, heartbeat, join, sync

pytestmark = pytest.mark.slow

DELETE_GROUPS, OFFSET_DELETE, DELETE_RECORDS, DESCRIBE_CLUSTER = 42, 47, 21, 60


def test_members_starting_together_are_assigned_once(kafka_server, broker):
    srv = kafka_server("--kafka-initial-rebalance-delay-ms", "3000")  # (Kafka's default)
    broker.create_stream("ev", partitions=2)
    with Wire(srv.port, "a") as a, Wire(srv.port, "b") as b:
        t0 = time.monotonic()
        join(a, instance="pod-a", send_only=True)
        join(b, instance="pod-b", send_only=True)  # within the delay: one assignment for both
        ra, rb = a.recv(), b.recv()
        waited = time.monotonic() - t0
        assert (ra.error_code, rb.error_code, ra.generation_id, rb.generation_id) == (E.none, E.none, 1, 1)
        assert sorted(m.member_id for m in ra.members) == sorted([ra.member_id, rb.member_id])
        assert waited >= 2.9, waited
        sync(b, 1, rb.member_id, send_only=True)
        sync(a, 1, ra.member_id, [(ra.member_id, assignment({"ev": [0]})), (rb.member_id, assignment({"ev": [1]}))])
        assert b.recv().assignment == assignment({"ev": [1]})
        # a group that has members rebalances without the delay
        t0 = time.monotonic()
        assert a.call(13, 5, group_id="g", members=[{"member_id": rb.member_id}]).members[0].error_code == E.none
        assert heartbeat(a, 1, ra.member_id) == E.rebalance_in_progress
        assert join(a, ra.member_id, instance="pod-a").generation_id == 2
        assert time.monotonic() - t0 < 2.0  # (well under the delay)
    srv.proc.wait_for_line(lambda x: "first members joining; assigning in 3000 ms" in x)


def test_an_answer_nobody_waits_for_logs_no_error(kafka_server, broker):
    srv = kafka_server()
    broker.create_stream("ev", partitions=2)
    with Wire(srv.port, "a") as a:
        ra = join(a, instance="pod-a")
        sync(a, 1, ra.member_id, [(ra.member_id, b"")])
        b = Wire(srv.port, "b")
        join(b, instance="pod-b", send_only=True)  # waits: a has not joined again
        wait_for(lambda: heartbeat(a, 1, ra.member_id) == E.rebalance_in_progress, what="the rebalance")
        b.close()  # its JoinGroup's connection dies while it waits
        with Wire(srv.port, "b2") as b2:
            join(b2, instance="pod-b", send_only=True)  # the old JoinGroup is answered (fenced): nobody reads it
            srv.proc.wait_for_line(lambda x: "static member pod-b back as" in x)
            assert join(a, ra.member_id, instance="pod-a").generation_id == 2
            assert b2.recv().generation_id == 2
    srv.proc.wait_for_line(lambda x: "generation 2" in x or "rebalancing" in x)
    assert srv.stop() == 0
    log = "".join(srv.proc.log + srv.proc.later)
    assert "never retrieved" not in log and " ERROR " not in log, log[-3000:]


def test_delete_groups_and_offsets(kafka_server, broker):
    from confluent_kafka.admin import AdminClient

    srv = kafka_server()
    s = broker.create_stream("ev", partitions=2)
    t = broker.create_stream("other", partitions=1)
    s.reset("idle", {0: 5, 1: 6})
    t.reset("idle", {0: 1})
    with Wire(srv.port, "a") as a:
        ra = join(a, group="busy", instance="pod")
        sync(a, 1, ra.member_id, [(ra.member_id, b"")], group="busy")
        assert commit(a, 1, ra.member_id, {0: 3}, group="busy") == {0: E.none}
        r = a.call(DELETE_GROUPS, 2, groups_names=["busy", "idle", "nobody"])
        assert [(x.group_id, x.error_code) for x in r.results] == [
            ("busy", E.non_empty_group), ("idle", E.none), ("nobody", E.group_id_not_found)]
        assert s.committed("idle") == {} and t.committed("idle") == {} and s.committed("busy") == {0: 3}
        # OffsetDelete: not on a topic the members subscribe to ("ev"), fine on another
        t.reset("busy", {0: 7})
        r = a.call(OFFSET_DELETE, 0, group_id="busy", topics=[
            {"name": "ev", "partitions": [{"partition_index": 0}]},
            {"name": "other", "partitions": [{"partition_index": 0}, {"partition_index": 9}]}])
        got = {(tp.name, p.partition_index): p.error_code for tp in r.topics for p in tp.partitions}
        assert got == {("ev", 0): E.group_subscribed_to_topic, ("other", 0): E.none,
                       ("other", 9): E.unknown_topic_or_partition}
        assert t.committed("busy") == {} and s.committed("busy") == {0: 3}
        assert a.call(OFFSET_DELETE, 0, group_id="nobody", topics=[]).error_code == E.group_id_not_found
    admin = AdminClient({"bootstrap.servers": srv.bootstrap})
    s.reset("g2", {0: 1})
    futures = admin.delete_consumer_groups(["g2"], request_timeout=30)
    futures["g2"].result(30)
    assert s.committed("g2") == {}
    s.close()
    t.close()


def test_delete_records_and_describe_cluster(kafka_server, broker):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    srv = kafka_server()
    s = broker.create_stream("ev", partitions=2)
    s.append_many([b"r%d" % i for i in range(10)], partition=0)
    s.append_many([b"x"] * 3, partition=1)
    admin = AdminClient({"bootstrap.servers": srv.bootstrap})
    fs = admin.delete_records([TopicPartition("ev", 0, 4), TopicPartition("ev", 1, -1)], request_timeout=30)
    lows = {tp.partition: f.result(30).low_watermark for tp, f in fs.items()}
    assert lows == {0: 4, 1: 3}
    assert s.offsets(0) == (4, 10) and s.offsets(1) == (3, 3)
    assert [r.value for r in s.read(0, 4, 100)] == [b"r%d" % i for i in range(4, 10)]
    with Wire(srv.port) as w:
        r = w.call(DELETE_RECORDS, 2, timeout=datetime.timedelta(seconds=30), topics=[{"name": "ev", "partitions": [
            {"partition_index": 0, "offset": 99}, {"partition_index": 7, "offset": 1}]}, {"name": "nope", "partitions": [
                {"partition_index": 0, "offset": 1}]}])
        got = {(tp.name, p.partition_index): p.error_code for tp in r.topics for p in tp.partitions}
        assert got == {("ev", 0): E.offset_out_of_range, ("ev", 7): E.unknown_topic_or_partition,
                       ("nope", 0): E.unknown_topic_or_partition}
        assert s.offsets(0) == (4, 10)  # nothing moved
    cluster = admin.describe_cluster(request_timeout=30).result(30)
    assert cluster.cluster_id == f"shmq-{broker.namespace}"
    assert [(n.id, n.host, n.port) for n in cluster.nodes] == [(0, "127.0.0.1", srv.port)]
    assert cluster.controller.id == 0 and cluster.authorized_operations is None  # not asked
    from confluent_kafka.admin import AclOperation

    asked = admin.describe_cluster(request_timeout=30, include_authorized_operations=True).result(30)
    assert set(asked.authorized_operations) == {  # no ACLs: who holds the token may do all of them
        AclOperation.ALTER, AclOperation.ALTER_CONFIGS, AclOperation.CLUSTER_ACTION, AclOperation.CREATE,
        AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS, AclOperation.IDEMPOTENT_WRITE}
    s.close()


def test_an_api_not_served_is_answered_at_once_and_named_in_the_log(kafka_server):
    srv = kafka_server()
    with Wire(srv.port) as w:
        # DescribeAcls v1 (not served): answered UNSUPPORTED_VERSION, not a hang nor a close
        body = struct.pack(">hhih", 29, 1, 9, -1) + b"\x01\xff\xff\xff\xff\xff\xff\x01\x03\x03"
        t0 = time.monotonic()
        w.sock.sendall(struct.pack(">i", len(body)) + body)
        head = w._read(4)
        answer = w._read(struct.unpack(">i", head)[0])
        assert answer[:4] == struct.pack(">i", 9) and answer[8:10] == struct.pack(">h", 35)
        assert time.monotonic() - t0 < 1
    srv.proc.wait_for_line(lambda x: "DescribeAcls v1 is not supported here; answered UNSUPPORTED_VERSION" in x)


def test_a_restarted_static_consumer_gets_its_partitions_back_and_the_other_sees_nothing(kafka_server, broker):
    from confluent_kafka import Consumer

    srv = kafka_server()
    broker.create_stream("st", partitions=2)
    events = {"i1": [], "i2": []}

    def consumer(instance):
        c = Consumer({"bootstrap.servers": srv.bootstrap, "group.id": "statics", "group.instance.id": instance,
                      "partition.assignment.strategy": "range", "session.timeout.ms": 30000,
                      "heartbeat.interval.ms": 300, "auto.offset.reset": "earliest"})
        c.subscribe(["st"], on_assign=lambda _c, ps: events[instance].append(("assign", sorted(p.partition for p in ps))),
                    on_revoke=lambda _c, ps: events[instance].append(("revoke", sorted(p.partition for p in ps))))
        return c

    def assigned(c):
        c.poll(0.1)
        return c.assignment()

    def both_one():  # (each polled every round: a consumer not polled never takes its assignment)
        return [len(assigned(i1)), len(assigned(i2))] == [1, 1]

    i1, i2 = consumer("i1"), consumer("i2")
    try:
        wait_for(both_one, 60, "both assigned one partition")
        before = list(events["i1"])
        mine = sorted(p.partition for p in i2.assignment())
        i2.close()  # a static member's close sends no LeaveGroup: its session holds its place
        events["i2"].clear()
        i2 = consumer("i2")
        wait_for(lambda: len(assigned(i2)) == 1, 60, "i2 back")
        assert sorted(p.partition for p in i2.assignment()) == mine
        srv.proc.wait_for_line(lambda x: "static member i2 back as" in x)
        deadline = time.monotonic() + 2  # a few heartbeats of i1: none says "rebalance"
        while time.monotonic() < deadline:
            i1.poll(0.1)
        assert events["i1"] == before, events
        assert events["i2"] == [("assign", mine)]
    finally:
        i1.close()
        i2.close()


def test_a_commits_leader_epoch_comes_back_with_its_offset(kafka_server, broker):
    from tests.kafka.groups_wire import COMMIT, FETCH

    srv = kafka_server()
    s = broker.create_stream("ev", partitions=2)

    def fetched(w):
        r = w.call(FETCH, 9, groups=[{"group_id": "g", "topics": [{"name": "ev", "partition_indexes": [0, 1]}]}],
                   require_stable=False)
        return {p.partition_index: (p.committed_offset, p.committed_leader_epoch, p.metadata)
                for t in r.groups[0].topics for p in t.partitions}

    with Wire(srv.port) as w:
        r = w.call(COMMIT, 9, group_id="g", generation_id_or_member_epoch=-1, member_id="", topics=[
            {"name": "ev", "partitions": [{"partition_index": 0, "committed_offset": 10, "committed_leader_epoch": 5,
                                           "committed_metadata": "m"},
                                          {"partition_index": 1, "committed_offset": 20,
                                           "committed_leader_epoch": -1, "committed_metadata": None}]}])
        assert [p.error_code for p in r.topics[0].partitions] == [E.none, E.none]
        assert fetched(w) == {0: (10, 5, "m"), 1: (20, -1, "")}
        s.reset("g", {0: 11})  # a native move: what came with the old offset goes
        assert fetched(w) == {0: (11, -1, ""), 1: (20, -1, "")}
    s.close()


def test_commit_metadata_rows_of_an_older_server_are_taken_back():
    from shmq.server.kafka.coordinator import Coordinator

    c = Coordinator(None, None)
    assert c.restore_metadata([["g", "t", 0, 3, "old"], ["g", "t", 1, 4, "", 7]]) == 2
    assert (c._meta_of("g", "t", 0, 3), c._meta_of("g", "t", 1, 4), c._meta_of("g", "t", 1, 5)) == (
        ("old", -1), ("", 7), ("", -1))
    assert c.export_metadata() == [["g", "t", 0, 3, "old", -1], ["g", "t", 1, 4, "", 7]]
    with pytest.raises(ValueError):
        c.restore_metadata([["g", "t", 0, 3, "m", "epoch"]])
