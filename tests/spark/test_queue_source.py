"""A work queue as a Spark source: its messages moved into the stream that stages it,
each once, even when the mover is SIGKILLed between its append and its ack."""

import time

from shmq.spark.stager import ID_HEADER, Stager, stage_name
from tests import _workers as w
from tests._processes import WORKERS

QUERY_TIMEOUT = 120


def run(spark, broker, checkpoint, queue="orders"):
    """One availableNow query over the queue to its end: the values it read, in order."""
    got = []
    q = (spark.readStream.format("shmq").option("queue", queue).option("namespace", broker.namespace)
         .option("includeHeaders", "true").load()
         .writeStream.foreachBatch(lambda df, _bid: got.extend(
             (r.value, r.headers[ID_HEADER]) for r in df.orderBy("offset").collect()))
         .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        assert q.awaitTermination(QUERY_TIMEOUT), "the availableNow query did not finish"
    finally:
        q.stop()
    return got


def test_a_queue_is_read_once_through_its_stage_and_acked(spark, broker, tmp_path):
    q = broker.create_queue("orders")
    q.put_many([b"o%d" % i for i in range(300)])
    got = run(spark, broker, tmp_path / "ck")
    assert [v for v, _ in got] == [b"o%d" % i for i in range(300)]
    st = q.stats()
    assert (st.ready, st.in_flight, st.acked_total) == (0, 0, 300)
    q.put_many([b"p%d" % i for i in range(5)])
    assert [v for v, _ in run(spark, broker, tmp_path / "ck")] == [b"p%d" % i for i in range(5)]  # resumes
    assert run(spark, broker, tmp_path / "ck") == []
    assert broker.stream(stage_name("orders")).offsets(0) == (0, 305)


def test_a_stager_killed_between_append_and_ack_stages_nothing_twice(spark, broker, tmp_path):
    q = broker.create_queue("orders", visibility_timeout=60)  # a dead holder, not the timeout, frees them
    q.put_many([b"o%d" % i for i in range(50)])
    p = WORKERS.Process(target=w.stager_dying_before_its_ack, args=(broker.namespace, "orders"))
    p.start()
    p.join(30)
    assert p.exitcode == -9
    stage = broker.stream(stage_name("orders"))
    assert stage.offsets(0) == (0, 50)  # appended, never acked: all 50 still leased by the dead stager
    assert q.stats().in_flight == 50
    q.put_many([b"n%d" % i for i in range(10)])
    got, deadline = [], time.monotonic() + 60
    # the dead stager's leases come back at the queue's next liveness check (0.5 s at most after
    # the last): a move before it takes only the new ten, a move after it finds the 50 staged
    while len(got) < 60 or q.stats().acked_total < 60:
        assert time.monotonic() < deadline, f"only {len(got)} of 60 read"
        got += run(spark, broker, tmp_path / "ck")
    assert sorted(v for v, _ in got) == sorted([b"o%d" % i for i in range(50)] + [b"n%d" % i for i in range(10)])
    assert len({i for _, i in got}) == 60  # each queue message once
    assert stage.offsets(0) == (0, 60)
    st = q.stats()
    assert (st.ready, st.in_flight, st.acked_total) == (0, 0, 60)


def test_the_stager_dedups_only_what_it_staged(broker):
    q = broker.create_queue("orders")
    q.put_many([b"a", b"b"])
    stager = Stager(broker, "orders")
    q.nack_many(q.get_many(2))  # delivered and given back: attempt 2 next, never staged
    assert stager.move() == 2
    assert [r.value for r in stager.stage.read(0, 0)] == [b"a", b"b"]


def test_the_stage_is_made_of_queue_stage_max_bytes(broker):
    from shmq.spark.options import Options
    from shmq.spark.reader import StreamReader

    broker.create_queue("orders").put(b"o")
    r = StreamReader(Options({"queue": "orders", "namespace": broker.namespace, "queueStageMaxBytes": "65536"}), None)
    assert r.initialOffset() == {"0": 0}
    assert r.latestOffset({"0": 0}, r.getDefaultReadLimit()) == {"0": 1}  # moved into the stage
    r.stop()
    assert broker.stream(stage_name("orders")).max_bytes == 65536
