"""The JVM sink (io.shmq.spark.sink, issue 46) beyond what test_sink.py runs on both sinks: its
spools (owner-only, the namespace's own, gone once published; a killed driver's swept), its
publisher (started again when it died), the options and modes it refuses as the Python sink
does, and the readers its rows wake."""

import os
import stat
import threading
import time

import psutil
import pytest

from shmq.engine.shm.segment import namespace_entries

QUERY_TIMEOUT = 120


def _cmdline(p) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:  # (a worker gone, or a zombie)
        return ""


def _spools(namespace):
    return [e for e in namespace_entries(namespace) if ".spark-spool." in e]


def test_a_task_spools_owner_only_beside_the_namespace_and_the_commit_deletes_it(spark, jvm, broker, tmp_path):
    out = broker.create_stream("out", partitions=2)
    release, seen = tmp_path / "release", {}

    def watch():  # the spool exists while the task runs; the UDF below holds the task until it is looked at
        deadline = time.monotonic() + QUERY_TIMEOUT
        while time.monotonic() < deadline and not seen:
            for e in _spools(broker.namespace):
                seen[e] = stat.S_IMODE(os.stat(f"/dev/shm/{e}").st_mode)
        release.touch()

    from pyspark.sql.functions import udf

    path = str(release)

    @udf("string")
    def held(v):
        import os as _os
        import time as _time

        deadline = _time.monotonic() + 120
        while not _os.path.exists(path) and _time.monotonic() < deadline:  # (a bounded wait on a real condition)
            _time.sleep(0.01)
        return v

    t = threading.Thread(target=watch)
    t.start()
    df = spark.createDataFrame([("a",), ("b",)], "value string").repartition(1).select(held("value").alias("value"))
    df.write.format(jvm).option("stream", "out").option("namespace", broker.namespace).mode("append").save()
    t.join(QUERY_TIMEOUT)
    assert seen and set(seen.values()) == {0o600}, seen
    assert _spools(broker.namespace) == []  # published, then deleted
    assert sorted(r.value for p in range(2) for r in out.read(p, 0, max_records=10)) == [b"a", b"b"]


def test_a_killed_drivers_spools_are_swept_by_the_next_write(spark, jvm, broker):
    broker.create_stream("out")
    dead = psutil.Popen(["true"])
    dead.wait()
    left = f"/dev/shm/shmq.{broker.namespace}.spark-spool.{dead.pid}.9f0c2b1a-0000-4000-8000-000000000000.3.0.7"
    with open(os.open(left, os.O_CREAT | os.O_WRONLY, 0o600), "wb") as f:
        f.write(b"a spool its driver never published")
    spark.createDataFrame([("v",)], "value string").write.format(jvm).option("stream", "out") \
        .option("namespace", broker.namespace).mode("append").save()
    assert not os.path.exists(left) and _spools(broker.namespace) == []


def test_a_spool_no_commit_message_names_is_swept_as_its_batch_ends(spark, jvm, broker):
    """Each task attempt commits its own spool (no commit coordinator): one that Spark did not
    keep (a speculative or zombie attempt of a partition another attempt committed; here one
    the task makes beside its own) is deleted as the batch is published, and nothing of it is."""
    out = broker.create_stream("out", partitions=1)
    from pyspark.sql.functions import udf

    prefix = f"shmq.{broker.namespace}.spark-spool."

    @udf("string")
    def twin(v):
        import os as _os

        mine = [e for e in _os.listdir("/dev/shm") if e.startswith(prefix)]
        assert len(mine) == 1, mine  # (this task's, open while it runs)
        other = "/dev/shm/" + mine[0].rsplit(".", 1)[0] + ".999999"  # the same batch and partition, another attempt
        with open(_os.open(other, _os.O_CREAT | _os.O_WRONLY, 0o600), "wb") as f:
            f.write(b"rows of an attempt Spark did not keep")
        return v

    df = spark.createDataFrame([("a",)], "value string").repartition(1).select(twin("value").alias("value"))
    df.write.format(jvm).option("stream", "out").option("namespace", broker.namespace).mode("append").save()
    assert _spools(broker.namespace) == []
    assert [r.value for r in out.read(0, 0, max_records=10)] == [b"a"]


def test_a_publisher_that_died_is_started_again(spark, jvm, broker):
    out = broker.create_stream("out", partitions=2)

    def write(v):
        spark.createDataFrame([(v,)], "value string").write.format(jvm).option("stream", "out") \
            .option("namespace", broker.namespace).mode("append").save()

    write("first")
    jvm_proc = psutil.Process(spark.sparkContext._gateway.proc.pid)
    publishers = [p for p in jvm_proc.children(recursive=True) if "shmq.spark.publisher" in _cmdline(p)]
    assert len(publishers) == 1
    publishers[0].kill()
    publishers[0].wait(30)
    write("second")
    assert sorted(r.value for p in range(out.partitions) for r in out.read(p, 0, max_records=10)) == [b"first",
                                                                                                       b"second"]


@pytest.mark.parametrize("fmt", ["shmq_python", "jvm"])
def test_an_unknown_option_and_overwrite_are_refused_as_the_python_sink_refuses_them(spark, broker, fmt, request):
    fmt = request.getfixturevalue("jvm") if fmt == "jvm" else fmt
    broker.create_stream("out")
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception, match=r"the shmq sink has no option stagingbytes \(did you mean "
                                        r"sinkStagingMaxBytes\?\); its options are stream, queue"):
        df.write.format(fmt).option("stream", "out").option("namespace", broker.namespace) \
            .option("stagingBytes", "1").mode("append").save()
    with pytest.raises(Exception, match=r"the shmq sink appends: use mode\('append'\)"):
        df.write.format(fmt).option("stream", "out").option("namespace", broker.namespace).mode("overwrite").save()


@pytest.mark.timing
def test_its_rows_wake_a_reader_waiting_on_the_stream(spark, jvm, broker):
    """A group member polling the stream is woken by the publisher's append (the stream's
    doorbell), not by the end of a sleep slice."""
    s = broker.create_stream("out", partitions=1)
    got, woke = [], []
    member = s.consumer("g")
    member.poll(timeout=0)  # (joined: assigned partition 0 before the write)

    def wait():
        got.extend(member.poll(timeout=60))
        woke.append(time.monotonic())

    t = threading.Thread(target=wait)
    t.start()
    spark.createDataFrame([("v",)], "value string").write.format(jvm).option("stream", "out") \
        .option("namespace", broker.namespace).mode("append").save()
    done = time.monotonic()
    t.join(60)
    member.close()
    assert [r.value for r in got] == [b"v"]
    assert woke[0] - done < 0.2, woke[0] - done
