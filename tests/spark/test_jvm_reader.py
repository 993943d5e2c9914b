"""The JVM source's task path (shmq/spark/jvm): one shared mapping of a stream per JVM
(``ShmStream.shared``), let go once the stream is deleted or its namespace destroyed; threads
reading one partition of it at once; and a task's reader (``ColumnarReader``), whose batches are
its record block itself (``BlockColumn``), read as Spark reads them, with blocks passed from one
reader to the next."""

import subprocess

import pytest

import shmq
from tests.spark.jvm_harness import java_command, run_java


def _fill(broker, name, partitions, values):
    with broker.create_stream(name, partitions=partitions, max_bytes=1 << 16, durability="memory") as s:
        for p, v in values:
            s.append(v, partition=p)


@pytest.mark.parametrize("how", ["delete", "destroy", "grow"])
def test_one_mapping_per_jvm_until_the_stream_is_replaced(classes, broker, how):
    """Readers of one JVM get one mapping; once the stream is deleted (its segments flagged), or
    its namespace destroyed (the files unlinked, no flag), the next reader maps the stream made
    since under that name, not the old records, and a sweep lets go of a removed stream's
    mapping. A stream grown (``add_partitions``) is mapped again, its new partitions too."""
    ns = broker.namespace + "r"  # a namespace of this test's own: "destroy" destroys it
    owner = shmq.connect(namespace=ns)
    proc = None
    try:
        _fill(owner, "ev", 2, [(0, b"a"), (1, b"b"), (0, b"c")])
        proc = subprocess.Popen(java_command(classes, "io.shmq.spark.source.SharedCheck", ns, "ev", how),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def step(expect):
            assert proc.stdout.readline() == expect
            assert proc.stdout.readline() == "ready\n"

        def go():
            proc.stdin.write("go\n")
            proc.stdin.flush()

        def remove():
            nonlocal owner
            if how == "delete":
                owner.delete_stream("ev")
            else:
                owner.close()
                shmq.destroy_namespace(ns)
                owner = shmq.connect(namespace=ns)

        step("first 2: 0/0=a 0/1=c 1/0=b\n")
        if how == "grow":
            with owner.stream("ev") as s:
                s.add_partitions(1)
                s.append_many([b"x", b"y"], partition=2)
        else:
            remove()
            _fill(owner, "ev", 3, [(2, b"x"), (2, b"y")])
        go()
        step("again 3: 0/0=a 0/1=c 1/0=b 2/0=x 2/1=y\n" if how == "grow" else "again 3: 2/0=x 2/1=y\n")
        if how == "grow":
            owner.delete_stream("ev")
        else:
            remove()
        go()
        assert proc.stdout.readline() == "done\n"
        assert proc.wait(60) == 0, proc.stderr.read()
    finally:
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            for f in (proc.stdin, proc.stdout, proc.stderr):
                f.close()
        owner.close()
        shmq.destroy_namespace(ns)


def test_threads_read_one_partition_of_a_shared_mapping_at_once(classes, broker):
    """Reads hold no lock in the JVM either: four threads read the same partition whole, twenty
    times, in reads of different sizes, and every record is its own."""
    n = 3000
    with broker.create_stream("ev", partitions=1, max_bytes=1 << 20, durability="memory") as s:
        s.append_many([str(i).encode() for i in range(n)], partition=0)
    out = run_java(classes, "io.shmq.spark.source.ConcurrentReads", broker.namespace, "ev", 4, 20).stdout
    assert out == f"records {4 * 20 * n} retries 0\n"


def _rows(stream, name) -> list[str]:
    lines = []
    for p in range(stream.partitions):
        first, end = stream.offsets(p)
        rows = []
        while first + len(rows) < end:
            rows += stream.read_raw(p, first + len(rows), 1000)
        for off, ts, key, _headers, value in rows:
            lines.append(f"{name} {p} {off} {ts // 1000} {'-' if key is None else bytes(key).hex()} "
                         f"{bytes(value).hex()}")
    return lines


def test_a_tasks_batches_are_its_records_with_blocks_passed_on(classes, broker):
    """Each stream is read by a reader of its own, one after the other, each taking the block the
    one before gave back: a stream of larger values (the block's arena grows to 8 MiB, the most a
    kept block may hold), one of small values with null and empty keys, then the first again.
    Spark reads exactly the records, in 10,000-record batches."""
    big = broker.create_stream("big", partitions=2, max_bytes=1 << 24, durability="memory")
    small = broker.create_stream("small", partitions=3, max_bytes=1 << 22, durability="memory")
    try:
        big.append_many([bytes([i % 251]) * (300 + i % 300) for i in range(12_000)],
                        keys=[b"K%d" % i for i in range(12_000)], partition=0)
        big.append_many([b"v"] * 3, partition=1)
        for p in range(3):
            small.append_many([b"%d" % i for i in range(5_000)], keys=[None if i % 2 else b"" for i in range(5_000)],
                              partition=p)
        out = run_java(classes, "io.shmq.spark.ReaderCheck", broker.namespace, "big", "small", "big",
                       timeout=300).stdout.splitlines()
        kept = ", blocks kept 1"  # closed twice, given back once
        want = (_rows(big, "big") + ["batches big 3" + kept] + _rows(small, "small") + ["batches small 3" + kept]
                + _rows(big, "big") + ["batches big 3" + kept])
        assert out == want
    finally:
        big.close()
        small.close()
