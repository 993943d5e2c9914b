"""Fault injection for the Spark tests: the "shmq" data source with SIGKILLs of the
whole driver session at chosen points. Spark's workers import this module (the driver's
PYTHONPATH reaches them), so it must stay importable without pytest."""

import json
import os
import signal

import psutil

from shmq.spark.datasource import ShmqDataSource
from shmq.spark.options import Options
from shmq.spark.reader import StreamReader
from shmq.spark.writer import StreamWriter


def kill_session() -> None:
    """SIGKILL every process of this session (the driver, its JVM, Spark's Python
    daemons, which leave the process group but not the session), this one last."""
    sid, me = os.getsid(0), os.getpid()
    for p in psutil.process_iter():
        try:
            if p.pid != me and os.getsid(p.pid) == sid:
                p.kill()
        except (OSError, psutil.Error):
            pass
    os.kill(me, signal.SIGKILL)


def _fault(opts, point):
    """The batch (or call count) at which ``point`` ("plan", "write", "commit") kills, or None."""
    spec = opts.get("fault") or ""
    name, _, n = spec.partition(":")
    return int(n) if name == point else None


class FaultyReader(StreamReader):
    """Logs each plan (start, end) as a JSON line to option "plans"; with fault
    "plan:N", kills the session inside the N-th ``partitions`` call of this process."""

    KNOWN = StreamReader.KNOWN + ("plans", "fault")
    calls = 0

    def partitions(self, start, end):
        FaultyReader.calls += 1
        with open(self.opts.get("plans"), "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "start": start, "end": end}) + "\n")
        if _fault(self.opts, "plan") == FaultyReader.calls:
            kill_session()
        return super().partitions(start, end)


class FaultyWriter(StreamWriter):
    """Fault "write:N": kills the session once a task of batch N staged its rows;
    "commit:N": once the sink published batch N, before Spark's commit log."""

    KNOWN = StreamWriter.KNOWN + ("fault",)

    def write(self, iterator):
        from pyspark import TaskContext

        staged = super().write(iterator)
        batch = int(TaskContext.get().getLocalProperty("streaming.sql.batchId"))
        if _fault(self.opts, "write") == batch:
            kill_session()
        return staged

    def commit(self, messages, batchId):
        super().commit(messages, batchId)
        if _fault(self.opts, "commit") == batchId:
            kill_session()


class FaultyShmq(ShmqDataSource):
    @classmethod
    def name(cls):
        return "shmq_faulty"

    def streamReader(self, schema):
        return FaultyReader(Options(self.options), schema)

    def streamWriter(self, schema, overwrite):
        return FaultyWriter(Options(self.options), schema, overwrite)
