"""Exactly once from a shmq stream through Spark into a shmq stream, with the driver
SIGKILLed at three points: while it plans a batch, while a batch's tasks run (rows
staged, nothing published), and after the sink published a batch but before Spark wrote
its commit log; with the Python source and sink, and with the JVM source and the JVM sink
(whose runs the sink alone kills: io.shmq.spark.sink.Faults). Each driver runs in its own
process session; every process of that session is gone before the test goes on. (The JVM
source into the Python sink, a third pairing, adds nothing the two do not hold: the
source's replay is the JVM pairing's, the sink's faults the Python one's; it cost a
minute of the suite.)"""

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

from shmq.engine.shm.segment import namespace_entries
from shmq.spark.staging import staged_by_writer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEYS, PER_KEY = 12, 250


def _session_procs(sid):
    out = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                out.append(p)
        except (OSError, psutil.Error):
            pass
    return out


def run_driver(cfg, timeout=300):
    """Run tests.spark.driver in a new session; kill whatever of the session is left."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.Popen([sys.executable, "-m", "tests.spark.driver", json.dumps(cfg)], cwd=ROOT, env=env,
                         start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=timeout)
    finally:
        left = _session_procs(p.pid)
        for q in left:
            q.kill()
        p.kill()
        p.wait(30)
        gone, alive = psutil.wait_procs(left, timeout=30)
        assert not alive, f"processes of the driver's session outlived it: {alive}"
    return p.returncode, out, err


def _offsets(ck):
    """{batch: the source's end offsets} from the checkpoint's offset log, and the batches committed."""
    logged = {}
    for f in os.listdir(os.path.join(ck, "offsets")):
        if f.isdigit():
            lines = open(os.path.join(ck, "offsets", f)).read().splitlines()
            logged[int(f)] = {int(k): v for k, v in json.loads(lines[2]).items()}
    commits = os.path.join(ck, "commits")
    return logged, {int(f) for f in os.listdir(commits) if f.isdigit()} if os.path.isdir(commits) else set()


def _plans(path):
    if not os.path.exists(path):
        return []
    return [{k: {int(p): o for p, o in json.loads(line)[k].items()} for k in ("start", "end")}
            for line in open(path).read().splitlines()]


# the Python source kills the driver while it plans batch 2 as well; the JVM source has no
# fault hook, so its runs are killed by the sink alone (batch 3's tasks, batch 4's commit)
FAULTS = {"shmq_faulty": ["plan:2", "write:3", "commit:4", ""], "shmq": ["write:3", "commit:4", ""]}


@pytest.mark.slow
@pytest.mark.parametrize("source, sink", [("shmq_faulty", "shmq_faulty"), ("shmq", "shmq")],
                         ids=["python", "jvm-source-and-sink"])
def test_sigkill_of_the_driver_at_three_points_replays_the_same_ranges_and_sinks_each_record_once(
        broker, tmp_path, source, sink):
    if source == "shmq":
        from shmq.spark.jar import javac

        if javac() is None:
            pytest.skip("no JDK (javac): the JVM source is off")
    src = broker.create_stream("in", partitions=4)
    out = broker.create_stream("out", partitions=3)
    for seq in range(PER_KEY):  # each key's records in order: key k, values k:0, k:1, ...
        src.append_many([f"k{k}:{seq}".encode() for k in range(KEYS)], keys=[f"k{k}".encode() for k in range(KEYS)])
    segments = set(namespace_entries(broker.namespace))
    ck = str(tmp_path / "checkpoint")
    base = {"namespace": broker.namespace, "source": "in", "sink": "out", "checkpoint": ck,
            "scratch": str(tmp_path / "scratch"), "max_records": 500, "timeout": 240, "source_format": source,
            "sink_format": sink}
    # batches of 500 of 3000 records: 0..5; kill while planning batch 2, while batch 3's tasks
    # run, after batch 4 was published; the last run finishes
    faults = FAULTS[source]
    for run, fault in enumerate(faults):
        logged, committed = _offsets(ck) if os.path.isdir(ck) else ({}, set())
        pending = max(logged) if logged and max(logged) not in committed else None
        plans = str(tmp_path / f"plans-{run}.jsonl")
        code, stdout, stderr = run_driver({**base, "fault": fault, "plans": plans})
        if fault:
            assert code == -signal.SIGKILL, f"run {run} ({fault}) was not killed: {code}\n{stderr[-3000:]}"
        else:
            assert code == 0, stderr[-3000:]
        if pending is not None and source == "shmq_faulty":  # the interrupted batch, replanned, reads the same range
            first = _plans(plans)[0]
            assert first == {"start": logged[pending - 1], "end": logged[pending]}, (run, pending)
        if run > 0:
            assert pending is not None, f"run {run - 1} ({faults[run - 1]}) left no batch to replay"
    logged, committed = _offsets(ck)
    assert sorted(committed) == sorted(logged) and max(logged) >= 5
    got = {}
    for p in range(out.partitions):
        for r in out.read(p, 0, max_records=100_000):
            key, seq = r.value.decode().split(":")
            assert r.key == key.encode()
            got.setdefault(key, []).append(int(seq))
    assert got == {f"k{k}": list(range(PER_KEY)) for k in range(KEYS)}  # each record once, per key in order
    assert segments <= set(namespace_entries(broker.namespace))  # no worker's exit unlinked one
    assert staged_by_writer(broker, "out", broker.list_streams()) == {}  # nothing left staged, no staging stream
    assert broker.list_streams() == ["in", "out"]
