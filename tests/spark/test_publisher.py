"""The JVM sink's publisher (``python -m shmq.spark.publisher``) as its driver runs it, without
Spark: spools written as the JVM sink's tasks write them (Arrow IPC files), requests and
replies as JSON lines. What it keeps between requests: the target's handle (attached again
when the stream was deleted and made again; closed once deleted), and the next batch's room
made ready after each publish is answered."""

import json
import os
import subprocess
import sys
import uuid

import pytest

pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'shmq[spark]')")

from tests._wait import wait_for  # noqa: E402

ROWS = 20_000  # a task's spool: 20,000 rows of 100 B values, about 3 MB in a partition's ring


class Publisher:
    """A real publisher process, talked to as io.shmq.spark.sink.Publisher does."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "shmq.spark.publisher"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)
        self.next = 0

    def call(self, **req) -> dict:
        self.next += 1
        self.proc.stdin.write((json.dumps({"id": self.next, **req}) + "\n").encode())
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        assert reply["id"] == self.next
        return reply

    def maps(self) -> str:
        with open(f"/proc/{self.proc.pid}/maps") as fh:
            return fh.read()

    def close(self):
        self.proc.stdin.close()  # (it ends at EOF)
        try:
            assert self.proc.wait(30) == 0
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def publisher():
    p = Publisher()
    yield p
    p.close()


def spool(tmp_path, batch: int, task: int, first: int) -> dict:
    """A task's spool of ROWS rows, values numbered from ``first``, no keys."""
    path = str(tmp_path / f"spool.{batch}.{task}")
    values = pa.array([b"%08d" % (first + i) + b"v" * 92 for i in range(ROWS)], pa.binary())
    batch_ = pa.RecordBatch.from_arrays([pa.nulls(ROWS, pa.binary()), values], names=["key", "value"])
    with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, batch_.schema) as w:
        w.write_batch(batch_)
    return {"path": path, "task": task}


def publish(publisher, broker, tmp_path, txn, batch, stream="out"):
    spools = [spool(tmp_path, batch, t, (2 * batch + t) * ROWS) for t in range(2)]
    reply = publisher.call(op="publish", options={"stream": stream, "namespace": broker.namespace}, txn=txn,
                           batch=batch, spools=spools)
    assert reply == {"id": publisher.next, "ok": True, "rows": 2 * ROWS}
    assert not any(os.path.exists(s["path"]) for s in spools)  # deleted once published


def numbers(broker, stream="out") -> list[int]:
    s = broker.stream(stream)
    out = [int(r.value[:8]) for p in range(s.partitions) for r in s.read(p, 0, 10 * ROWS)]
    s.close()
    return sorted(out)


def test_each_batch_lands_once_and_the_next_batchs_room_is_made_ready(publisher, broker, tmp_path):
    s = broker.create_stream("out", partitions=2, max_bytes=64 * 2**20)
    txn = str(uuid.uuid4())
    publish(publisher, broker, tmp_path, txn, 0)
    # a partition got one task's rows: about 3 MB; the publisher then readies as much again past them
    wait_for(lambda: all(p["bytes_held"] >= 2 * p["bytes"] for p in s.stats()["partitions"]), 10,
             "the next batch's room allocated")
    publish(publisher, broker, tmp_path, txn, 1)
    publish(publisher, broker, tmp_path, txn, 1)  # (a replayed commit: in already)
    assert numbers(broker) == list(range(4 * ROWS))
    assert s.offsets(0) == (0, 2 * ROWS) and s.offsets(1) == (0, 2 * ROWS)


def test_a_target_deleted_and_made_again_gets_the_next_batch_and_the_old_one_is_let_go(publisher, broker, tmp_path):
    txn = str(uuid.uuid4())
    broker.create_stream("out", partitions=2)
    publish(publisher, broker, tmp_path, txn, 0)
    assert ".s.out#" in publisher.maps()
    broker.delete_stream("out")
    # closed within the publisher's idle second (its mapping would hold the deleted stream's memory)
    wait_for(lambda: ".s.out#" not in publisher.maps(), 10, "the deleted stream's mapping closed")
    broker.create_stream("out", partitions=2)
    publish(publisher, broker, tmp_path, txn, 0)
    assert numbers(broker) == list(range(2 * ROWS))
    broker.delete_stream("out")
    reply = publisher.call(op="publish", options={"stream": "out", "namespace": broker.namespace}, txn=txn, batch=1,
                           spools=[spool(tmp_path, 1, 0, 0)])
    assert reply["kind"] == "shmq" and "out" in reply["error"]
