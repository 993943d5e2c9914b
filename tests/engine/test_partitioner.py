"""Key routing as Kafka's default partitioner (shmq.engine.streams.partitioner): murmur2 on the
known vectors of Kafka's Java client and of librdkafka, the C twin equal to the Python
reference, and native appends (local, over TCP, from a pure-Python process) landing in
the partition kafka-python's partitioner computes for the key."""

import array
import json
import os
import subprocess
import sys
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmq.engine.shm import cpaths
from shmq.engine.streams import partitioner
from shmq.engine.streams import paths as stream_paths
from shmq.engine.streams.partitioner import murmur2, murmur2_python, partition_of

with warnings.catch_warnings():  # kafka-python's import loads its schemas with a deprecated importlib call
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.partitioner.default import murmur2 as kafka_python_murmur2

# Kafka's UtilsTest.testMurmur2: Utils.murmur2 (a Java int)
JAVA = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829,
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, b"abc": 479470107}
# librdkafka's rdmurmur2.c unittest_murmur2 (java_murmur2_results, as uint32): aligned and not
_UNALIGNED = b"PreAmbleWillBeRemoved,ThePrePartThatIs"
LIBRDKAFKA = {b"kafka": 0xD067CF64, b"giberish123456789": 0x8F552B0C, b"1234": 0x9FC97B14, b"234": 0xE7C009CA,
              b"34": 0x873930DA, b"4": 0x5A4B5CA1, _UNALIGNED: 0x78424F1C, _UNALIGNED[1:]: 0x4A62B377,
              _UNALIGNED[2:]: 0xE0E4E09E, _UNALIGNED[3:]: 0x62B8B43F, b"": 0x106E08D9}
# partitions picked: librdkafka's 0048-partitioner test (murmur2_random, 17 partitions) and
# kafka-python's test_murmur2_java_compatibility (1000 partitions)
PICKED = [(b"", 17, 0x106E08D9 % 17), (b"23456", 17, 0x058D780F % 17),
          (b"this is another string with more length to it perhaps", 17, 0x4F7703DA % 17),
          (b"hejsan", 17, 0x5EC19395 % 17),
          (b"", 1000, 681), (b"a", 1000, 524), (b"ab", 1000, 434), (b"abc", 1000, 107), (b"123456789", 1000, 566),
          (b"\x00 ", 1000, 742)]

IMPLS = [pytest.param(murmur2_python, id="python"),
         pytest.param(stream_paths.C and stream_paths.C.murmur2, id="c",
                      marks=pytest.mark.skipif(stream_paths.C is None, reason="the C extension is not in use"))]


def _kafka_partition(key: bytes, n: int) -> int:
    """The partition kafka-python's DefaultPartitioner gives a key among n."""
    return (kafka_python_murmur2(key) & 0x7FFFFFFF) % n


@pytest.mark.parametrize("impl", IMPLS)
def test_murmur2_gives_kafkas_java_and_librdkafkas_known_hashes(impl):
    assert {k: impl(k) for k in JAVA} == JAVA
    assert {k: impl(k) & 0xFFFFFFFF for k in LIBRDKAFKA} == LIBRDKAFKA
    assert impl(bytearray(b"foobar")) == impl(memoryview(b"xfoobar")[1:]) == JAVA[b"foobar"]


def test_partition_of_picks_the_partitions_kafka_clients_pick():
    assert [partition_of(k, n) for k, n, _ in PICKED] == [p for _, _, p in PICKED]
    assert partition_of(b"21", 1) == 0
    assert partition_of(b"21", 7) == (0x100000000 - 973932308) % 2**31 % 7  # the sign bit cleared, not abs()


def test_the_c_twin_is_chosen_where_it_is_built():
    assert partitioner.murmur2 is (cpaths.C.murmur2 if cpaths.C is not None else murmur2_python)
    assert murmur2 is partitioner.murmur2
    assert stream_paths.PYTHON.murmur2 is murmur2_python
    assert stream_paths.C is None or stream_paths.C.murmur2 is cpaths.C.murmur2


@pytest.mark.skipif(stream_paths.C is None, reason="the C extension is not in use")
@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_c_and_python_and_kafka_python_agree(key):
    assert stream_paths.C.murmur2(key) == murmur2_python(key)
    assert murmur2_python(key) & 0xFFFFFFFF == kafka_python_murmur2(key)


@pytest.mark.skipif(stream_paths.C is None, reason="the C extension is not in use")
@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=60), st.integers(1, 300))
def test_the_sinks_bulk_routing_in_c_is_partition_of(keys, partitions):
    offsets, data, valid = array.array("i", [0]), bytearray(), bytearray((len(keys) + 7) // 8)
    for i, k in enumerate(keys):
        if k is not None:
            data += k
            valid[i >> 3] |= 1 << (i & 7)
        offsets.append(len(data))
    own = partitions // 2
    raw = stream_paths.C.key_partitions(offsets.tobytes(), bytes(data), bytes(valid), len(keys), partitions, own)
    assert list(array.array("i", raw)) == [own if k is None else partition_of(k, partitions) for k in keys]


def test_native_appends_land_where_kafkas_partitioner_puts_the_key(any_broker):
    """append and append_many, locally and over TCP: each key in kafka-python's partition,
    read back there in append order."""
    s = any_broker.create_stream("routed", partitions=7)
    keys = [b"user-%d" % i for i in range(40)] + [b"", "ключ".encode(), bytes(range(256))]
    metas = [s.append(b"one:%d" % i, key=k) for i, k in enumerate(keys)]
    assert [m.partition for m in metas] == [_kafka_partition(k, 7) for k in keys]
    batch = s.append_many([b"many:%d" % i for i in range(len(keys))], keys=keys)
    assert [m.partition for m in batch] == [m.partition for m in metas]
    for p in range(7):
        got = [(r.key, r.value) for r in s.read(p, 0, max_records=1000)]
        mine = [i for i, k in enumerate(keys) if _kafka_partition(k, 7) == p]
        assert got == [(keys[i], b"one:%d" % i) for i in mine] + [(keys[i], b"many:%d" % i) for i in mine]
    s.close()


def test_a_pure_python_process_routes_keys_as_this_one(broker):
    """Another process without the C extension (SHMQ_PURE_PYTHON=1) appends keyed records
    to the same stream: each key lands where this process's C routing puts it."""
    broker.create_stream("mixed", partitions=5).close()
    keys = [b"k%d" % i for i in range(30)]
    code = ("import json, sys, shmq\n"
            "from shmq.engine.streams import partitioner\n"
            "assert partitioner.murmur2 is partitioner.murmur2_python\n"
            "b = shmq.connect(namespace=sys.argv[1])\n"
            "s = b.stream('mixed')\n"
            "print(json.dumps([s.append(b'v', key=b'k%d' % i).partition for i in range(30)]))\n"
            "s.close(); b.close()\n")
    env = {**os.environ, "SHMQ_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code, broker.namespace], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [partition_of(k, 5) for k in keys] == [_kafka_partition(k, 5) for k in keys]
    with broker.stream("mixed") as s:
        assert sorted(r.key for p in range(5) for r in s.read(p, 0, max_records=100)
                      if partition_of(r.key, 5) == p) == sorted(keys)
