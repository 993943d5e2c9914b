"""Records appended with their own timestamps (``Stream.append_columns(timestamps_ns=)``:
a Kafka producer's CreateTime), on the C paths and the pure-Python ones: read back, in
the partitions' logs, and refused when malformed; without, the time of the append."""

import array

import pytest

PAST_NS = 1_600_000_000_000 * 10**6


def _stamps(s, p):
    return [(o, ts) for o, ts, _k, _h, _v in s.read_raw(p, 0, 1000)]


def _chunk(values):
    offs = array.array("i", [0])
    for v in values:
        offs.append(offs[-1] + len(v))
    return (len(values), offs, b"".join(values), None, None, None, None, None)


def test_append_columns_cut_into_runs_of_one_time(broker, impl):
    """(Tombstones among them: the values' validity bitmap is cut with the keys'.)"""
    s = broker.create_stream("c", partitions=1)
    values = [None if i in (2, 5) else b"v%d" % i for i in range(7)]
    keys = [b"k%d" % i if i % 3 else None for i in range(7)]
    voffs = array.array("i", [0])
    for v in values:
        voffs.append(voffs[-1] + len(v or b""))
    koffs = array.array("i", [0])
    for k in keys:
        koffs.append(koffs[-1] + len(k or b""))
    valid = bytes([sum(1 << i for i, k in enumerate(keys) if k is not None)])
    stamps = [PAST_NS, PAST_NS, PAST_NS + 7, PAST_NS + 7, PAST_NS + 7, PAST_NS + 2, PAST_NS]
    vvalid = bytes([sum(1 << i for i, v in enumerate(values) if v is not None)])
    chunk = (7, voffs, b"".join(v or b"" for v in values), koffs, b"".join(k or b"" for k in keys), valid, None, None,
             vvalid)
    assert s.append_columns(chunk, 0, timestamps_ns=stamps) == 0
    assert [(r.offset, r.key, r.value) for r in s.read(0, 0, 100)] == list(zip(range(7), keys, values))
    assert _stamps(s, 0) == list(enumerate(stamps))
    assert [r.timestamp for r in s.read(0, 0, 100)] == [t / 1e9 for t in stamps]
    assert s.append_columns(_chunk([b"now"]), 0) == 7  # without: the time of the append, as before
    assert _stamps(s, 0)[7][1] > PAST_NS + 10**17


def test_timestamps_are_in_the_partitions_logs(broker, impl, tmp_path):
    from shmq.persistence import Snapshotter, recover

    s = broker.create_stream("w", partitions=1, durability="wal")
    snap = Snapshotter(broker, str(tmp_path), wal_mode=0)
    snap.open_wal(s)
    s.append_columns(_chunk([b"a", b"b"]), 0, timestamps_ns=[PAST_NS + 3, PAST_NS + 1])
    s.append_columns(_chunk([b"x", b"y", b"z"]), 0, timestamps_ns=[PAST_NS + 8, PAST_NS + 8, PAST_NS])
    want = _stamps(s, 0)
    assert want == [(0, PAST_NS + 3), (1, PAST_NS + 1), (2, PAST_NS + 8), (3, PAST_NS + 8), (4, PAST_NS)]
    snap.close()
    s.close()
    broker.delete_stream("w")  # a reboot: the logs alone
    assert recover(broker, str(tmp_path)) == ["@w"]
    s = broker.stream("w")
    assert _stamps(s, 0) == want
    s.close()


def test_malformed_timestamps_are_refused_and_nothing_is_appended(broker):
    s = broker.create_stream("bad", partitions=1)
    with pytest.raises(ValueError, match=r"timestamps_ns must be as many as the records \(2\), not 1"):
        s.append_columns(_chunk([b"a", b"b"]), 0, timestamps_ns=[PAST_NS])
    with pytest.raises(TypeError, match="a timestamp is an int of ns since the epoch, not float"):
        s.append_columns(_chunk([b"a"]), 0, timestamps_ns=[1.5])
    with pytest.raises(ValueError, match=r"timestamp -1 ns is out of range \(0 to 2\*\*63 - 1\)"):
        s.append_columns(_chunk([b"a"]), 0, timestamps_ns=[-1])
    assert s.offsets(0) == (0, 0)
