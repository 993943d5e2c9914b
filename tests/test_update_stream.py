"""A live stream grows partitions (``Stream.add_partitions``, ``update_stream(partitions=)``,
``shmq stream set --partitions``) and changes settings (``update_stream``): another
process's handle and consumer see the change; keys hash over the new count; a stream
never shrinks; a crash's leftover partition is cleaned; the count and settings outlive a
rebuild from the data dir; a new retention bound holds at the housekeeper's next round."""

import array
import itertools
import json
import time

import pytest

import shmq
from shmq import SettingsMismatch, StreamNotFound
from shmq.engine.broker import stream_settings
from shmq.engine.shm import layout as L
from shmq.engine.shm.segment import namespace_entries
from shmq.engine.streams.partition import create_partition
from shmq.engine.streams.partitioner import partition_of
from shmq.persistence import Snapshotter, recover
from shmq.server.housekeeper import Housekeeper
from tests._observer import observers
from tests.test_cli import shmq_cli

# another process attached to the stream before the change: runs the commands it reads, says what it saw
OBSERVER = """
import json, sys, time, shmq
from shmq.engine.broker import stream_settings
s = shmq.connect(namespace=sys.argv[1]).stream(sys.argv[2])
c = None
print("attached", flush=True)
for line in sys.stdin:
    cmd, *args = line.split()
    if cmd == "settings":
        print(json.dumps(stream_settings(s)), flush=True)
    elif cmd == "append":
        metas = s.append_many([k.encode() for k in args], keys=[k.encode() for k in args])
        print(json.dumps([m.partition for m in metas]), flush=True)
    elif cmd == "join":
        c = s.consumer("g")
        print(json.dumps(c.assignment()), flush=True)
    elif cmd == "assignment":
        print(json.dumps(c.assignment()), flush=True)
    elif cmd == "poll":
        got, deadline = [], time.monotonic() + 30
        while len(got) < int(args[0]) and time.monotonic() < deadline:
            got += [[r.partition, r.value.decode()] for r in c.poll(timeout=0.5)]
        print(json.dumps(got), flush=True)
"""


observer = observers(OBSERVER)


def asked(observer, cmd):
    """The observer's JSON answer to ``cmd``."""
    return json.loads(observer.ask(cmd))


def _chunk(values):
    """One chunk of ``Stream.append_columns``: values only."""
    offsets = array.array("i", itertools.accumulate(map(len, values), initial=0))
    return (len(values), offsets, b"".join(values), None, None, None, None, None)


def test_another_process_sees_the_new_partitions_hashes_keys_over_them_and_its_consumer_gets_them(broker,
                                                                                                  observer):
    s = broker.create_stream("events", partitions=2, max_bytes=1 << 16)
    other = observer("events")
    assert asked(other, "join") == [0, 1]
    assert s.add_partitions(3) == 5
    assert s.partitions == 5 and asked(other, "settings")["partitions"] == 5
    keys = ["key-%d" % i for i in range(40)]
    placed = asked(other, "append " + " ".join(keys))
    assert placed == [partition_of(k.encode(), 5) for k in keys] and max(placed) >= 2  # murmur2 over 5
    assert asked(other, "assignment") == [0, 1, 2, 3, 4]  # its group's only member: every partition, the new ones too
    got = asked(other, "poll 40")
    assert sorted(got) == sorted([p, k] for p, k in zip(placed, keys))
    assert [s.offsets(p)[1] for p in range(5)] == [placed.count(p) for p in range(5)]
    assert s.committed("g") == {}  # nothing committed: the new partitions start with none
    other.close()
    s.close()


def test_a_group_of_two_keeps_its_partitions_and_splits_the_new_ones(broker):
    s = broker.create_stream("events", partitions=2, max_bytes=1 << 16)
    a, b = s.consumer("g"), s.consumer("g")
    assert (a.assignment(), b.assignment()) == ([0], [1])
    s.append(b"x", partition=0)
    assert [r.value for r in a.poll(timeout=5)] == [b"x"]
    a.commit()
    broker.update_stream("events", partitions=4)
    assert (a.assignment(), b.assignment()) == ([0, 2], [1, 3])
    assert a.position(0) == 1  # kept without a break: goes on from its position
    a.commit({0: 1, 2: 0})  # the fence lets the owner commit both (its partition 0 never moved)
    assert s.committed("g") == {0: 1, 2: 0}
    a.close()
    b.close()
    s.close()


def test_a_stream_never_shrinks_and_the_count_is_bounded(broker):
    s = broker.create_stream("events", partitions=3, max_bytes=1 << 16)
    with pytest.raises(ValueError, match=r"^stream 'events' has 3 partitions: a stream never shrinks \(asked 2\)$"):
        broker.update_stream("events", partitions=2)
    assert broker.update_stream("events", partitions=3)["partitions"] == 3  # its own count: no change
    with pytest.raises(ValueError, match="n must be positive"):
        s.add_partitions(0)
    with pytest.raises(TypeError, match="n must be an int"):
        s.add_partitions(1.5)
    with pytest.raises(ValueError, match=f"{L.MAX_PARTITIONS - 2} more would pass the most, {L.MAX_PARTITIONS}"):
        s.add_partitions(L.MAX_PARTITIONS - 2)
    assert s.partitions == 3
    with pytest.raises(ValueError, match="has partitions 0..2, not 3"):
        s.append(b"x", partition=3)
    with pytest.raises(StreamNotFound):
        broker.update_stream("nope", partitions=4)
    s.close()


def test_a_crashs_leftover_partition_is_replaced_and_delete_removes_every_one(broker):
    """A growth killed after making its segments, before publishing the count, leaves a
    segment no count names: the next growth makes it anew (empty), a delete removes it."""
    s = broker.create_stream("events", partitions=1, max_bytes=1 << 16)
    create_partition(s._base, 1, s.max_bytes, s.max_message_bytes, 0)  # the leftover
    assert s.partitions == 1
    assert s.add_partitions(1) == 2
    assert s.offsets(1) == (0, 0) and s.append(b"x", partition=1).offset == 0
    create_partition(s._base, 2, s.max_bytes, s.max_message_bytes, 0)  # another leftover, past the count
    s.close()
    broker.delete_stream("events")
    assert [e for e in namespace_entries(broker.namespace) if ".s.events" in e] == []


def test_a_growth_that_fails_half_way_adds_nothing_and_leaves_nothing(broker, monkeypatch):
    from shmq.engine.streams import stream as stream_mod

    s = broker.create_stream("events", partitions=1, max_bytes=1 << 16)
    made = stream_mod.create_partition

    def second_fails(base, index, *args):
        if index == 2:
            raise shmq.StorageError("/dev/shm is full (a test's)")
        made(base, index, *args)

    monkeypatch.setattr(stream_mod, "create_partition", second_fails)
    with pytest.raises(shmq.StorageError, match="a test's"):
        s.add_partitions(2)
    assert s.partitions == 1 and not [e for e in namespace_entries(broker.namespace) if ".s.events#1" in e]
    monkeypatch.undo()
    assert s.add_partitions(2) == 3
    s.close()


def test_mutable_settings_reach_another_process_and_fixed_ones_are_refused(broker, observer):
    s = broker.create_stream("events", partitions=1, max_bytes=1 << 16)
    other = observer("events")
    before = asked(other, "settings")
    changed = {"max_message_bytes": 1000, "retention_bytes": 30000, "retention_seconds": 60.0,
               "timestamp_type": "log_append_time", "compression": "zstd", "segment_bytes": 4096}
    after = broker.update_stream("events", **changed)
    assert after == {**before, **changed}
    assert asked(other, "settings") == after
    assert (s.max_message_bytes, s.retention_seconds, s.compression) == (1000, 60.0, "zstd")  # this process: at once
    with pytest.raises(shmq.MessageTooLarge, match="takes at most 1000"):
        s.append(b"x" * 1001)
    assert broker.update_stream("events", retention_bytes=None, retention_seconds=None, segment_bytes=None) == {
        **after, "retention_bytes": None, "retention_seconds": None, "segment_bytes": None}
    with pytest.raises(SettingsMismatch, match=r"^stream 'events' in namespace '\w+' cannot change retention 'drop' "
                                               r"\(asked 'block'\): not on a live stream"):
        broker.update_stream("events", retention="block", retention_seconds=5)
    for bad, why in (({"compression": "brotli"}, "compression must be one of producer, uncompressed"),
                     ({"timestamp_type": "now"}, "timestamp_type must be 'create_time' or 'log_append_time'"),
                     ({"retention_seconds": -1}, "retention_seconds must be a positive number or None")):
        with pytest.raises(ValueError, match=why):
            broker.update_stream("events", **bad)
    with pytest.raises(TypeError, match="unexpected keyword arguments: color"):
        broker.update_stream("events", color="red")
    assert asked(other, "settings")["retention_seconds"] is None  # nothing the refusals asked was made
    other.close()
    s.close()


def test_a_new_retention_bound_holds_at_the_housekeepers_next_round(broker):
    s = broker.create_stream("events", partitions=1, max_bytes=1 << 16)
    hour_ago = time.time_ns() - 3600 * 10**9
    s.append_columns(_chunk([b"old-%d" % i for i in range(10)]), 0, timestamps_ns=[hour_ago] * 10)
    s.append_many([b"new-%d" % i for i in range(5)], partition=0)
    hk = Housekeeper(broker)  # its handle attached before the change
    try:
        hk.run_once()
        assert s.offsets(0) == (0, 15)  # no bound yet
        broker.update_stream("events", retention_seconds=60)  # (Kafka's retention.ms=60000)
        hk.run_once()
        assert s.offsets(0) == (10, 15)
        assert [r.value for r in s.read(0, 10)] == [b"new-%d" % i for i in range(5)]
    finally:
        hk.close()
    s.close()


def test_the_count_and_the_settings_outlive_a_rebuild_from_the_data_dir(broker, tmp_path):
    data = str(tmp_path)
    s = broker.create_stream("events", partitions=2, max_bytes=1 << 16, durability="snapshot")
    snap = Snapshotter(broker, data)
    snap.open_stream(s)
    s.add_partitions(2)
    broker.update_stream("events", retention_bytes=50000, timestamp_type="log_append_time", compression="lz4",
                         segment_bytes=2**20, max_message_bytes=2000)
    metas = s.append_many([b"v%d" % i for i in range(20)], keys=[b"k%d" % i for i in range(20)])
    snap.run_once()
    snap.close()
    held = stream_settings(s)
    s.close()
    broker.delete_stream("events")  # the reboot: the files stay
    assert recover(broker, data) == ["@events"]
    s = broker.stream("events")
    assert stream_settings(s) == held and s.partitions == 4
    assert sorted((r.partition, r.value) for p in range(4) for r in s.read(p, 0)) == sorted(
        (m.partition, b"v%d" % i) for i, m in enumerate(metas))
    s.close()


def test_a_wal_stream_grown_logs_its_new_partitions_once_the_server_opens_them(broker, tmp_path):
    data = str(tmp_path)
    s = broker.create_stream("events", partitions=1, max_bytes=1 << 16, durability="wal")
    snap = Snapshotter(broker, data)
    snap.open_stream(s)
    gen0 = s._part(0).log.config()[0]
    s.add_partitions(1)
    snap.open_stream(s)  # what CreatePartitions does at once, and a snapshot round later for a native growth
    assert s._part(0).log.config()[0] == gen0  # the partition it had keeps its log generation
    s.append(b"on one", partition=1)
    snap.close()
    s.close()
    broker.delete_stream("events")
    assert recover(broker, data) == ["@events"]
    s = broker.stream("events")
    assert (s.partitions, [r.value for r in s.read(1, 0)]) == (2, [b"on one"])
    s.close()


def test_cli_stream_set(broker):
    broker.create_stream("events", partitions=2, max_bytes=1 << 16).close()
    ns = ["--namespace", broker.namespace]
    r = shmq_cli("stream", "set", "events", "--partitions", "3", "--retention-seconds", "30", *ns)
    assert (r.returncode, r.stdout, r.stderr) == (0, "set events: partitions 3, retention_seconds 30.0\n", "")
    r = shmq_cli("stream", "set", "events", "--retention-seconds", "0", "--compression", "gzip",
                 "--timestamp-type", "log_append_time", "--max-message-bytes", "2KiB", "--json", *ns)
    assert r.returncode == 0, r.stderr
    with broker.stream("events") as s:
        assert json.loads(r.stdout) == stream_settings(s)
        assert (s.partitions, s.retention_seconds, s.compression, s.timestamp_type, s.max_message_bytes) == (
            3, None, "gzip", "log_append_time", 2048)
    for args, why in ((["events", "--partitions", "3"], "stream 'events' has 3 partitions: --partitions must be "
                                                         "more (a stream never shrinks), not 3"),
                      (["events", "--partitions", "1"], "not 1"),
                      (["nope", "--partitions", "4"], "no stream 'nope'"),
                      (["events"], "nothing to set")):
        r = shmq_cli("stream", "set", *args, *ns)
        assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
        assert why in r.stderr
    with broker.stream("events") as s:
        assert s.partitions == 3


def test_a_stream_made_over_tcp_takes_the_kafka_settings(broker, tcp_server):
    with shmq.connect(tcp_server.url) as remote:
        remote.create_stream("events", partitions=1, compression="lz4", timestamp_type="log_append_time",
                             segment_bytes=4096)
        with pytest.raises(ValueError, match="compression must be one of producer"):
            remote.create_stream("other", compression="brotli")
        assert not hasattr(remote, "update_stream")  # (local only, for now)
    with broker.stream("events") as s:
        assert (s.compression, s.timestamp_type, s.segment_bytes) == ("lz4", "log_append_time", 4096)
