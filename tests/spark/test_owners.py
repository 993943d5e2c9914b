"""The Spark sinks as front doors of tests/test_owners.py: what a batch write and a streaming
query make in /dev/shm (the target, the staging streams, the JVM sink's spools) is owned by
a declared kind while it lives and gone after; ``shmq doctor`` calls nothing an orphan and
``--clean`` leaves every record in place."""

import json

from shmq import doctor
from shmq.engine.shm import names
from shmq.engine.shm.segment import namespace_entries
from tests.test_cli import shmq_cli

QUERY_TIMEOUT = 120


def test_what_the_sinks_make_is_owned_and_clean_keeps_it(spark, broker, sink, tmp_path):
    src = broker.create_stream("in", partitions=2)
    out = broker.create_stream("out", partitions=2)
    src.append_many([b"%d" % i for i in range(40)], keys=[b"k%d" % (i % 4) for i in range(40)])
    df = spark.createDataFrame([(b"b%d" % i,) for i in range(10)], "value binary")
    df.write.format(sink).option("stream", "out").option("namespace", broker.namespace).mode("append").save()
    q = (spark.readStream.format("shmq").option("stream", "in").option("namespace", broker.namespace)
         .option("startingOffsets", "earliest").load().select("key", "value")
         .writeStream.format(sink).option("stream", "out").option("namespace", broker.namespace)
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert q.awaitTermination(QUERY_TIMEOUT)
    for e in namespace_entries(broker.namespace):
        assert names.owner(broker.namespace, e) is not None, e
    report = doctor.diagnose([broker.namespace])
    assert report["orphans"] == [] and report["namespaces"][0]["unknown"] == []
    held = [out.offsets(p) for p in range(2)]
    assert sum(end - start for start, end in held) == 50
    cleaned = json.loads(shmq_cli("doctor", "--namespace", broker.namespace, "--clean", "--json").stdout)
    assert cleaned["orphans"] == [] and cleaned["problems"] == []
    assert [out.offsets(p) for p in range(2)] == held and broker.list_streams() == ["in", "out"]
