"""The JVM source (shmq/spark/jvm: io.shmq.spark) beside the Python source it twins: its
planning and its option checks held to reader.py's answers on the same inputs (through the
Java program PlanTwin), its columns to schema.py's, the jar that ``shmq.spark.jar`` builds
(once, again when a source changes, never without a JDK), a checkpoint handed from one
source to the other and back mid-stream with exact contents and the same offsets JSON, and
which source serves "shmq" with the jar (the JVM one, handing queues and the sink to
"shmq_python") and without it (the Python one)."""

import json
import logging
import os
import random
import re
import subprocess
import sys

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows, ReadMinRows

from shmq.spark.jar import SOURCES, build
from shmq.spark.options import Options, SpecError
from shmq.spark.reader import BatchReader, OffsetRange, RangeGroup, StreamReader, group, share, split
from shmq.spark.schema import SOURCE_FIELDS
from tests.spark._session import run_in_session
from tests.spark.jvm_harness import skip_without_jdk
from tests.spark.test_source import data, expected, fill, run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def twin(classes):
    """ask(requests) -> the JVM source's answers, one per request."""
    java = os.path.join(os.path.dirname(skip_without_jdk()), "java")

    def ask(requests):
        lines = "".join(json.dumps(r) + "\n" for r in requests)
        done = subprocess.run([java, "-cp", classes, "io.shmq.spark.PlanTwin"], input=lines, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        return [json.loads(line) for line in done.stdout.splitlines()]
    return ask


def _rows(ranges):
    return [[r.partition, r.start, r.end] for r in ranges]


def test_planning_is_the_python_sources_on_random_inputs(twin):
    rng = random.Random(32)
    asks, want = [], []
    for _ in range(300):
        backlog = {p: rng.choice([0, 1, 2, rng.randrange(5000)]) for p in range(rng.randrange(1, 9))}
        budget = rng.randrange(1, 3000)
        asks.append({"op": "share", "backlog": {str(p): n for p, n in backlog.items()}, "budget": budget})
        want.append({str(p): n for p, n in share(backlog, budget).items()})
    for _ in range(300):
        ranges = [OffsetRange(p, s, s + rng.randrange(1, 400)) for p in range(rng.randrange(1, 7))
                  for s in [rng.randrange(100)]]
        n = rng.choice([None, 1, 2, 3, 5, 8, 13])
        asks.append({"op": "split", "ranges": _rows(ranges), "n": n})
        want.append(_rows(split(ranges, n)))
        asks.append({"op": "group", "ranges": _rows(ranges), "n": n})
        want.append([_rows(g.ranges if isinstance(g, RangeGroup) else [g]) for g in group(ranges, n)])
    offsets = '{"0": 5, "1": 6, "10": 0}'  # as the Python source's json.dumps writes them
    asks.append({"op": "json", "offsets": offsets})
    want.append(offsets)
    assert twin(asks) == want


# (options, part): each must give the same error, or none, on both sources
OPTION_CASES = [
    ({}, "stream"),
    ({"stream": "e", "queue": "q"}, "stream"),
    ({"stream": "e", "subscribe": "e"}, "stream"),
    ({"subscribe": "a,b"}, "stream"),
    ({"stream": "e", "url": "http://x"}, "stream"),
    ({"stream": "e", "url": "tcp://h:1", "namespace": "n"}, "stream"),
    ({"stream": "e", "stageMaxBytes": "5"}, "stream"),
    ({"stream": "e", "maxRecordsPerTrigger": "5", "maxOffsetsPerTrigger": "5"}, "stream"),
    ({"stream": "e", "maxRecordsPerTrigger": "0"}, "stream"),
    ({"stream": "e", "maxOffsetsPerTrigger": "x"}, "stream"),
    ({"stream": "e", "maxRecordsPerTrigger": "10", "minOffsetsPerTrigger": "20"}, "stream"),
    ({"stream": "e", "maxTriggerDelay": "soon"}, "stream"),
    ({"stream": "e", "failOnDataLoss": "maybe"}, "stream"),
    ({"stream": "e", "includeHeaders": "perhaps"}, "stream"),
    ({"stream": "e", "startingOffsets": "yesterday"}, "stream"),
    ({"stream": "e", "startingOffsets": '{"0": -3}'}, "stream"),
    ({"stream": "e", "maxPartitions": "0"}, "stream"),
    ({"stream": "e", "minPartitions": "-1"}, "batch"),
    ({"stream": "e", "queueStageMaxBytes": "10"}, "stream"),
    ({"stream": "e", "maxrecordspertriger": "10"}, "stream"),
    ({"stream": "e", "endingOffsets": "latest"}, "stream"),
    ({"stream": "e", "maxOffsetsPerTrigger": "5"}, "batch"),
    ({"stream": "e", "sinkStagingMaxBytes": "5", "bogus": "1"}, "batch"),
    ({"stream": "e", "startingOffsets": "latest"}, "batch"),
    ({"stream": "e", "endingOffsets": '{"0": -2}'}, "batch"),
    ({"stream": "e", "maxRecordsPerTrigger": "7"}, "stream"),
    ({"stream": "e", "minRecordsPerTrigger": "7", "maxTriggerDelay": "2s"}, "stream"),
    ({"stream": "e"}, "stream"),
    ({"stream": "e", "startingOffsets": '{"e": {"0": 3}}', "endingOffsets": '{"1": -1}'}, "batch"),
]


def _python_answer(options, part):
    cls = BatchReader if part == "batch" else StreamReader
    try:
        reader = cls(Options({k.lower(): v for k, v in options.items()}), None)
    except SpecError as e:
        return {"error": str(e)}
    if part == "batch":
        return {"ok": True}
    limit = reader.getDefaultReadLimit()
    return {"limit": "max %d" % limit.max_rows if isinstance(limit, ReadMaxRows)
            else "min %d" % limit.min_rows if isinstance(limit, ReadMinRows) else "all"}


def test_option_checks_give_the_python_sources_messages(twin):
    asks = [{"op": "options", "part": part, "options": {k.lower(): v for k, v in options.items()}}
            for options, part in OPTION_CASES]
    got = twin(asks)
    for (options, part), answer in zip(OPTION_CASES, got):
        want = _python_answer(options, part)
        assert answer == want, (options, part)
    assert sum("error" in a for a in got) == 25  # all but the last four are refused


def test_the_columns_are_schema_pys():
    text = open(os.path.join(SOURCES, "src", "io", "shmq", "spark", "Schema.java")).read()
    fields = "".join(re.findall(r'"([^"]*)"', text.split("FIELDS =", 1)[1].split(";", 1)[0]))
    assert fields == SOURCE_FIELDS


# ---------------------------------------------------------------- the jar

def _tiny_sources(root):
    """A connector-shaped tree of one class and one service file: quick to compile."""
    os.makedirs(root / "src" / "x")
    (root / "src" / "x" / "A.java").write_text("package x;\npublic final class A {}\n")
    os.makedirs(root / "resources" / "META-INF" / "services")
    (root / "resources" / "META-INF" / "services" / "x.Service").write_text("x.A\n")


def test_jar_builds_once_and_again_when_a_source_changes(tmp_path, monkeypatch):
    skip_without_jdk()
    monkeypatch.setenv("SHMQ_HOME", str(tmp_path / "home"))
    src = tmp_path / "jvm"
    _tiny_sources(src)
    first = build(str(src))
    assert first is not None and re.fullmatch(r"shmq-spark-4\.\d+\.\d+-[0-9a-f]{16}\.jar", os.path.basename(first))
    assert os.path.dirname(first) == str(tmp_path / "home" / "spark")
    assert os.stat(first).st_mode & 0o777 == 0o600
    import zipfile
    with zipfile.ZipFile(first) as z:
        assert sorted(z.namelist()) == ["META-INF/MANIFEST.MF", "META-INF/services/x.Service",
                                        "io/shmq/spark/defaults.properties", "x/A.class"]  # (options.py's defaults)
    stamp = os.stat(first).st_mtime_ns
    assert build(str(src)) == first and os.stat(first).st_mtime_ns == stamp  # cached: not built again
    (src / "src" / "x" / "A.java").write_text("package x;\npublic final class A { int changed; }\n")
    second = build(str(src))
    assert second != first and os.path.exists(second)
    assert sorted(n for n in os.listdir(tmp_path / "home" / "spark") if n.endswith(".jar")) == [
        os.path.basename(second)]  # the older sources' jar pruned, no half-built files left about


def test_concurrent_builds_make_one_jar(tmp_path):
    """Sessions starting together (here, three processes) build once, under the lock, and
    all get the same whole jar; nothing half-built is left."""
    skip_without_jdk()
    src = tmp_path / "jvm"
    _tiny_sources(src)
    code = ("import sys; from shmq.spark.jar import build; sys.stdin.readline(); print(build(sys.argv[1]))")
    env = {**os.environ, "SHMQ_HOME": str(tmp_path / "home"), "PYTHONPATH": ROOT}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(src)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env) for _ in range(3)]
    for p in procs:  # released together: the first builds, the others wait on its lock, then find the jar
        p.stdin.write("go\n")
        p.stdin.flush()
    paths = [p.communicate(timeout=240)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert len(set(paths)) == 1 and os.path.exists(paths[0])
    assert sorted(os.listdir(tmp_path / "home" / "spark")) == sorted([os.path.basename(paths[0]), "jar.lock"])


def test_jar_is_none_with_one_line_why_without_a_jdk_or_with_broken_sources(tmp_path, monkeypatch, caplog):
    skip_without_jdk()
    monkeypatch.setenv("SHMQ_HOME", str(tmp_path / "home"))
    src = tmp_path / "jvm"
    _tiny_sources(src)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))  # JAVA_HOME names where javac is, and it is not
    with caplog.at_level(logging.WARNING, logger="shmq.spark"):
        assert build(str(src)) is None
    assert [r.getMessage() for r in caplog.records] == [
        "shmq.spark: the JVM source is off, format('shmq') is the Python source: there is no JDK (javac): install "
        "openjdk-17-jdk-headless or set JAVA_HOME to a JDK"]
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))  # nor on PATH
    assert build(str(src)) is None
    monkeypatch.undo()
    monkeypatch.setenv("SHMQ_HOME", str(tmp_path / "home"))
    (src / "src" / "x" / "A.java").write_text("package x;\npublic final class A { nonsense }\n")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="shmq.spark"):
        assert build(str(src)) is None
    assert len(caplog.records) == 1 and "javac failed on the connector's sources: " in caplog.records[0].getMessage()
    assert not [n for n in os.listdir(tmp_path / "home" / "spark") if n.endswith(".jar")]


# ---------------------------------------------------------------- a checkpoint handed between the sources

def _logged(ck, batch):
    """The source's offsets JSON as Spark logged it for ``batch``."""
    return open(os.path.join(ck, "offsets", str(batch))).read().splitlines()[2]


@pytest.mark.slow
def test_a_checkpoint_passes_from_the_python_source_to_the_jvm_source_and_back(spark, broker, tmp_path, jvm):
    s = broker.create_stream("events", partitions=3, max_bytes=2**16)
    fill(s, [10, 4, 0])
    ck = tmp_path / "ck"
    first = run(spark, broker, ck, source="shmq_python", startingOffsets="earliest", maxRecordsPerTrigger=8)
    assert [len(b) for b in data(first)] == [8, 6]
    fill(s, [3, 0, 5])
    second = run(spark, broker, ck, source=jvm, maxRecordsPerTrigger=8)  # on from the Python source's offsets
    assert data(second) == [expected(s, {0: (10, 13), 2: (0, 5)})]
    fill(s, [0, 2, 1])
    third = run(spark, broker, ck, source="shmq_python")
    assert data(third) == [expected(s, {1: (4, 6), 2: (5, 6)})]
    # one offsets JSON, whichever source wrote it
    assert [_logged(ck, b) for b in range(4)] == ['{"0": 6, "1": 2, "2": 0}', '{"0": 10, "1": 4, "2": 0}',
                                                  '{"0": 13, "1": 4, "2": 5}', '{"0": 13, "1": 6, "2": 6}']


# ---------------------------------------------------------------- which source serves "shmq"

def _scan(df) -> str:
    """The scan line of a DataFrame's physical plan."""
    plan = df._jdf.queryExecution().executedPlan().toString()
    return next(line.strip(" +-|") for line in plan.splitlines() if "BatchScan" in line)


def test_with_the_jar_shmq_is_the_jvm_source_and_hands_queues_and_sinks_to_shmq_python(spark, broker, jvm):
    s = broker.create_stream("events", partitions=2, max_bytes=2**16)
    fill(s, [3, 2])
    broker.create_queue("orders").put(b"o1")

    def load(name, **options):
        reader = spark.read.format(name).option("namespace", broker.namespace)
        for k, v in options.items():
            reader = reader.option(k, v)
        return reader.load()

    assert _scan(load(jvm, stream="events")).endswith("shmq stream 'events' RuntimeFilters: []")  # columnar, JVM
    assert "(Python)" in _scan(load("shmq_python", stream="events"))
    queued = load(jvm, queue="orders")
    assert "(Python)" in _scan(queued) and [r.value for r in queued.collect()] == [b"o1"]
    broker.create_stream("logged", durability="wal")  # its older records may be only in its logs on disk
    assert "(Python)" in _scan(load(jvm, stream="logged"))
    out = broker.create_stream("out", partitions=1)
    load(jvm, stream="events").select("key", "value").write.format(jvm).option("stream", "out") \
        .option("namespace", broker.namespace).mode("append").save()  # the Python sink, through "shmq"
    assert sorted(r.value for r in out.read(0, 0, max_records=10)) == sorted(
        v for _, _, _, v in expected(s, {0: (0, 3), 1: (0, 2)}))


@pytest.mark.slow
def test_without_the_jar_shmq_is_the_python_source(broker, tmp_path):
    """A session without the jar (no JDK, or ``jvm_source=False``): "shmq" is the Python
    source, as before the JVM one existed, and "shmq_python" the same."""
    s = broker.create_stream("events", partitions=1)
    fill(s, [3])
    code = (
        "from shmq.spark import local_session\n"
        f"spark = local_session('no-jar', {str(tmp_path / 'scratch')!r}, master='local[1]', jvm_source=False)\n"
        "print(spark.sparkContext.getConf().get('spark.jars', ''))\n"
        "for name in ('shmq', 'shmq_python'):\n"
        f"    df = spark.read.format(name).option('stream', 'events').option('namespace', {broker.namespace!r}).load()\n"
        "    plan = df._jdf.queryExecution().executedPlan().toString()\n"
        "    print(name, '(Python)' in plan, sorted(r.value.decode() for r in df.collect()))\n"
        "spark.stop()\n"
    )
    p, out, err = run_in_session([sys.executable, "-c", code], timeout=240, cwd=ROOT,
                                 env={**os.environ, "PYTHONPATH": ROOT})
    assert p.returncode == 0, err[-3000:]
    assert out.splitlines()[-3:] == ["", "shmq True ['0:k0:0', '0:k1:1', '0:k2:2']",
                                     "shmq_python True ['0:k0:0', '0:k1:1', '0:k2:2']"]
