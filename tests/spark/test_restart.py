"""Spark queries over ``url`` ride out a restart of the server (issue 69, item 5): a streaming
query from a stream of a real ``shmq server`` into a stream of it, both over TCP, with no token
option (each part finds the server's by itself), goes on through a SIGKILL of the server and
its restart 10 s later on the same port and data dir, and every record lands in the sink once,
each key's in order. Run on the Python source into the Python sink and on the JVM source into
the JVM sink (whose publisher writes over TCP). The query is busy when the server dies (a
backlog in batches of MAX_RECORDS), records are appended locally while it is down and after it
is back; the outage is the one deliberate sleep. Without riding out, a query dies within
seconds of the kill (tests/spark/test_outage.py holds the pauses and the log line)."""

import os
import socket
import time

import pytest

from tests._wait import wait_for

OUTAGE_S = 10  # the server is down this long
KEYS, PER_KEY = 12, 150
MAX_RECORDS = 200
DONE_TIMEOUT = 240  # s: the query's catching up after the restart, on a loaded 2-core machine


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


@pytest.fixture
def restartable(broker, servers, tmp_path):
    """``start()``: a ``shmq server`` of the test's namespace with a data dir and the per-user
    token, always on one port and data dir."""
    port, data = free_port(), str(tmp_path / "data")

    def start():
        return servers(broker.namespace, "--port", str(port), "--data-dir", data)

    return start


def append(stream, seqs):
    """Records k:seq of every key for each seq of ``seqs`` (key k), in order, locally."""
    for seq in seqs:
        stream.append_many([f"k{k}:{seq}".encode() for k in range(KEYS)], keys=[f"k{k}".encode() for k in range(KEYS)])


def landed(out) -> int:
    return sum(out.offsets(p)[1] for p in range(out.partitions))


def running(q) -> bool:
    """True while the query runs; fails the test with its error once it has stopped."""
    assert q.exception() is None, q.exception()
    assert q.isActive
    return True


@pytest.mark.slow
@pytest.mark.parametrize("side", ["python", "jvm"])
def test_a_query_over_url_rides_out_a_sigkill_and_a_restart_of_the_server(request, spark, broker, restartable,
                                                                           tmp_path, side):
    fmt = "shmq_python" if side == "python" else request.getfixturevalue("jvm")
    assert "SHMQ_TOKEN" not in os.environ
    src = broker.create_stream("in", partitions=4)
    out = broker.create_stream("out", partitions=3)
    third = PER_KEY // 3
    append(src, range(third))
    srv = restartable()
    q = (spark.readStream.format(fmt).option("url", srv.url).option("stream", "in")
         .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", MAX_RECORDS).load()
         .select("key", "value").writeStream.format(fmt).option("url", srv.url).option("stream", "out")
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:  # the first batch is in, most of the backlog still to read
        wait_for(lambda: running(q) and landed(out), DONE_TIMEOUT, "a batch landing")
        assert landed(out) < third * KEYS
        srv.proc.kill()  # SIGKILL
        srv.proc.wait(30)
        append(src, range(third, 2 * third))  # while it is down
        time.sleep(OUTAGE_S)  # the outage (deliberate)
        assert running(q)
        srv = restartable()
        append(src, range(2 * third, PER_KEY))
        wait_for(lambda: running(q) and landed(out) == KEYS * PER_KEY, DONE_TIMEOUT, "every record landing")
        # (the last commit deletes its staging stream after its publish)
        wait_for(lambda: running(q) and sorted(broker.list_streams()) == ["in", "out"], 30, "no staging stream left")
    finally:
        q.stop()
    got = {}
    for p in range(out.partitions):
        for r in out.read(p, 0, max_records=100_000):
            key, seq = r.value.decode().split(":")
            assert r.key == key.encode()
            got.setdefault(key, []).append(int(seq))
    assert got == {f"k{k}": list(range(PER_KEY)) for k in range(KEYS)}  # each record once, per key in order
    assert srv.stop() == 0
