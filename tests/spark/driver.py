"""A Spark driver for the fault tests, run as its own process (and session):
``python -m tests.spark.driver CONFIG_JSON``. Runs one availableNow query from a shmq
stream into a shmq stream through the fault-injecting sink (tests.spark.faults), or the JVM
sink ("sink_format": "shmq", its faults through the environment), and the fault-injecting
Python source, or the source that CONFIG's "source_format" names ("shmq": the JVM source),
then prints {"id": query id} on its last line."""

import json
import os
import sys


def main(cfg):
    os.environ["SHMQ_NAMESPACE"] = cfg["namespace"]
    sink_format = cfg.get("sink_format", "shmq_faulty")
    if sink_format == "shmq" and cfg.get("fault"):  # the JVM sink's faults: through its JVM's environment (Faults)
        os.environ["SHMQ_SPARK_SINK_FAULT"] = cfg["fault"]
        os.environ["SHMQ_SPARK_SINK_FAULT_CMD"] = (f"{sys.executable} -c 'from tests.spark.faults import "
                                                    "kill_session; kill_session()'")
    from shmq.spark import local_session
    from tests.spark.faults import FaultyShmq

    # a new Python worker per task: each one's exit would unlink a segment it attached through
    # the resource tracker (CPython issue 82300); shmq's are attached without it
    spark = local_session("shmq-fault-driver", cfg["scratch"], conf={"spark.python.worker.reuse": "false"})
    spark.dataSource.register(FaultyShmq)
    src = (spark.readStream.format(cfg.get("source_format", "shmq_faulty")).option("stream", cfg["source"])
           .option("namespace", cfg["namespace"]).option("startingOffsets", "earliest")
           .option("maxRecordsPerTrigger", cfg["max_records"]))
    if cfg.get("source_format", "shmq_faulty") == "shmq_faulty":  # the fault-injecting Python source
        src = src.option("plans", cfg["plans"]).option("fault", cfg.get("fault", ""))
    src = src.load()
    w = (src.select("key", "value").writeStream.format(sink_format).option("stream", cfg["sink"])
         .option("namespace", cfg["namespace"]).option("checkpointLocation", cfg["checkpoint"]))
    if sink_format == "shmq_faulty":
        w = w.option("fault", cfg.get("fault", ""))
    q = w.trigger(availableNow=True).start()
    q.awaitTermination(cfg["timeout"])
    if q.exception() is not None:
        raise SystemExit(f"query failed: {q.exception()}")
    print(json.dumps({"id": q.id}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
