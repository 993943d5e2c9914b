"""Spark Structured Streaming over shmq, against Spark's own sources: ``python -m bench.spark``.

One local SparkSession (``shmq.spark.local_session``, local[2]), started once and timed,
runs streaming queries with ``trigger(availableNow=True)`` over the same data:
``--records`` records (default 1,000,000) of 100 B values, pre-appended to a shmq stream
of 4 partitions ("events"), and the same rows (key, value, stream, partition, offset,
timestamp: read back from the stream) written once by pyarrow as 20 parquet files for
Spark's built-in file source. Sources: the shmq stream, read by the Python source
("shmq_python") and by the JVM source ("shmq" with the connector's jar, ``jvm``: issue
32); the parquet files; Spark's
``rate-micro-batch`` source (``rowsPerBatch``, the fair one for a fixed count: the
time-based ``rate`` source is not); and a shmq stream pre-appended the same way while a
spawned process keeps appending to it at records / 20 per second ("live", into noop, 10
batches only; the query must stop at the end offsets availableNow fixed at its start).
Sinks: ``noop``; the shmq exactly-once sink (a fresh target stream per run): the JVM sink
("shmq" with the jar: issue 46) and, beside it from the parquet files, the Python sink
("shmq_python", ``shmq-py``); ``parquet`` files. Each case runs as 1 batch (no read limit) and as 10 batches (``maxRecordsPerTrigger`` = records / 10; the file source:
``maxFilesPerTrigger`` = 2 of the 20 files; rate-micro-batch: ``rowsPerBatch`` =
records / 10 under a processing-time trigger, stopped after the 10th batch, because
under availableNow it runs one batch only).

Per run: the query's start-up (``start()`` -> its first trigger), first-batch latency
(``start()`` -> end of the first batch with rows, from the progress' trigger timestamp
and duration), steady rows/s (the median rows/s of the
batches after the first; a 1-batch run: its one batch), overall rows/s (rows / wall time
from ``start()`` to termination), peak memory (the sum of the RSS, every 0.2 s, and of
the PSS, every 2 s, of this driver process, the JVM and every Python worker under them).
Every run is checked: the rows the query reports and the source's end offsets; no batch
over maxRecordsPerTrigger; the shmq sink's target holds exactly the records (each record
index once, checksums equal); the parquet sink's files too.
Runs of all cases are interleaved (run 1 of every case, then run 2, ...) and each
figure is the median of ``--runs`` runs. ``--quick``: 100,000 records, 1 run.
``--report JSON`` prints a saved run again.
"""

from __future__ import annotations

import argparse
import glob
import importlib
import json
import multiprocessing as mp
import os
import random
import shlex
import shutil
import statistics
import sys
import tempfile
import threading
import time
import zlib
from datetime import datetime

from bench import provenance
from bench.machine import machine_info

PARTITIONS = 4
SIZE = 100  # bytes per value: an 8-byte record index, then pseudo-random bytes
FILES = 20  # parquet files of the file-source baseline
REC_COST = 48 + SIZE  # a record's header + value in a partition's ring (aligned to 8; no key, no headers)
SOURCE_BYTES = 128 * 2**20  # per partition of the source streams, at least
TARGET_BYTES = 256 * 2**20  # per partition of a shmq sink's target stream, at least
LIVE_SECONDS = 20  # the live producer appends --records records over this long (50,000/s for 1,000,000)
LIVE_CHUNK = 100  # records per append of the live producer
SEED = 20240611
SOURCES = ("shmq", "jvm", "parquet", "rate", "live")
SINKS = ("noop", "shmq", "shmq-py", "parquet")
CASES = (("shmq", "noop"), ("jvm", "noop"), ("shmq", "shmq"), ("jvm", "shmq"), ("shmq", "parquet"), ("parquet", "noop"),
         ("parquet", "shmq"), ("parquet", "shmq-py"),
         ("parquet", "parquet"), ("rate", "noop"), ("live", "noop"))
BATCHES = (1, 10)
LIVE_BATCHES = (10,)  # the live case runs with maxRecordsPerTrigger only (a streaming reader's usual setting)
# issue 22's targets (local[2], 1 M x 100 B, 10 micro-batches): the source at least 0.8x the file source
# overall and 1x in steady state; shmq -> shmq at most 1.5x the wall of shmq -> noop; the shmq sink's rows/s at
# least the parquet sink's
TARGETS = {"source_vs_file": 0.8, "source_steady": 1.0}
# issue 46's (the JVM sink): its rows/s from the parquet files at least 1.5x the parquet sink's in 10 micro-batches and
# 1x in one; shmq -> shmq (the JVM source and sink) at most 1.2x the wall of shmq -> noop
SINK_TARGETS = {"sink_cost": 1.2, "sink_vs_parquet": {1: 1.0, 10: 1.5}}
# issue 32's: the JVM source into noop at least 1x the file source and 2x the Python source (overall rows/s),
# and a query's start within 0.2 s of the file source's
JVM_TARGETS = {"jvm_vs_file": 1.0, "jvm_vs_python": 2.0, "jvm_start_s": 0.2}
SOURCE_LABEL = {"shmq": "shmq stream", "jvm": "shmq stream (JVM)", "parquet": "parquet files",
                "rate": "rate-micro-batch", "live": "shmq + producer"}
JVM_TARGET_NAMES = ("jvm_vs_file", "jvm_vs_python", "jvm_start")
FORMAT = {"shmq": "shmq_python", "live": "shmq_python", "jvm": "shmq"}  # the format name of each shmq source


# ---------------------------------------------------------------- data


def make_values(first: int, count: int, rnd: random.Random) -> list[bytes]:
    """``count`` values of SIZE bytes: the record index (8 bytes, big-endian), then random bytes."""
    w = SIZE - 8
    blob = rnd.randbytes(w * count)
    return [(first + i).to_bytes(8, "big") + blob[i * w:(i + 1) * w] for i in range(count)]


def partition_bytes(records: int, at_least: int) -> int:
    """A ring for ``records`` records per partition with room to spare, and >= ``at_least``."""
    need = records * REC_COST * 5 // 4 + 2**20
    return max(at_least, -(-need // 2**20) * 2**20)


def fill_stream(stream, n: int, seed: int) -> int:
    """Append n records, partition p taking the indices [p*n/P, (p+1)*n/P); their checksum."""
    rnd, crc = random.Random(seed), 0
    for p in range(PARTITIONS):
        lo, hi = p * n // PARTITIONS, (p + 1) * n // PARTITIONS
        for at in range(lo, hi, 4096):
            values = make_values(at, min(4096, hi - at), rnd)
            stream.append_many(values, partition=p)
            crc += sum(map(zlib.crc32, values))
    return crc


def write_parquet(stream, directory: str) -> int:
    """The stream's records as FILES parquet files (FILES / P per partition), in the
    shmq source's schema and order; returns their total size in bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shmq.spark.arrow import records_to_batch

    os.makedirs(directory, exist_ok=True)
    per = FILES // PARTITIONS
    for p in range(PARTITIONS):
        earliest, end = stream.offsets(p)
        for f in range(per):
            lo, hi = earliest + (end - earliest) * f // per, earliest + (end - earliest) * (f + 1) // per
            batches, off = [], lo
            while off < hi:
                recs = stream.read(p, off, max_records=min(10_000, hi - off))
                batches.append(records_to_batch(recs, False))
                off = recs[-1].offset + 1
            pq.write_table(pa.Table.from_batches(batches), os.path.join(directory, f"events-{p}-{f:02d}.parquet"))
    return sum(os.path.getsize(f) for f in glob.glob(os.path.join(directory, "*.parquet")))


def check_values(values, n: int, crc: int) -> str | None:
    """None if ``values`` are the n records 0..n-1, each once, with checksum ``crc``; else what is wrong."""
    seen = bytearray(n)
    total = bad = 0
    for v in values:
        i = int.from_bytes(v[:8], "big")
        if len(v) != SIZE or not 0 <= i < n:
            bad += 1
            continue
        seen[i] += 1 if seen[i] < 255 else 0
        total += zlib.crc32(v)
    missing, dup = seen.count(0), sum(1 for c in seen if c > 1)
    problems = []
    if bad:
        problems.append(f"{bad} malformed")
    if missing or dup:
        problems.append(f"{missing} missing, {dup} duplicated")
    if not problems and total != crc:
        problems.append("checksum differs")
    return "; ".join(problems) or None


def stream_values(broker, name: str):
    with broker.stream(name) as s:
        for p in range(s.partitions):
            off, end = s.offsets(p)
            while off < end:
                recs = s.read(p, off, max_records=10_000)
                yield from (r.value for r in recs)
                off = recs[-1].offset + 1


def parquet_values(directory: str):
    import pyarrow.parquet as pq

    for f in sorted(glob.glob(os.path.join(directory, "part-*.parquet"))):
        yield from pq.read_table(f, columns=["value"]).column("value").to_pylist()


# ---------------------------------------------------------------- the live producer (a spawned process)


def produce(namespace: str, stream: str, first: int, cap: int, rate: float, ready, stop, out) -> None:
    """Append up to ``cap`` records from index ``first`` on, LIVE_CHUNK per append,
    round-robin over the partitions, at ``rate`` records/s, until ``stop``; send back
    (records, seconds)."""
    import shmq

    rnd = random.Random(SEED + 1)
    with shmq.connect(namespace=namespace) as broker, broker.stream(stream) as s:
        sent, p = 0, 0
        ready.set()
        t0 = time.perf_counter()
        while not stop.is_set() and sent < cap:
            delay = t0 + sent / rate - time.perf_counter()
            if delay > 0 and stop.wait(delay):
                break
            count = min(LIVE_CHUNK, cap - sent)
            s.append_many(make_values(first + sent, count, rnd), partition=p)
            sent, p = sent + count, (p + 1) % s.partitions
        out.put((sent, time.perf_counter() - t0))


# ---------------------------------------------------------------- memory


class MemorySampler(threading.Thread):
    """Peak sum of RSS (every ``interval`` s) and of PSS (every ``pss_every``-th sample: the
    kernel walks a process' page tables for it, ~25 ms for the JVM) over this process and
    its descendants (the JVM, Spark's Python daemons and workers); multiprocessing's
    children (the live producer, the resource tracker) are left out."""

    def __init__(self, interval: float = 0.2, pss_every: int = 10):
        super().__init__(daemon=True)
        import psutil

        self._psutil, self._me = psutil, psutil.Process()
        self._interval, self._halt, self._pss_every = interval, threading.Event(), pss_every
        self._skip: dict[int, bool] = {}
        self.peak_rss = self.peak_pss = self.peak_procs = 0
        self.samples, self.busy = 0, 0.0  # how many samples, and the CPU seconds they took
        self._procs = []
        self._cpu = {}  # pid -> [role, CPU seconds at its first sample, at its last]
        self._since = time.time()

    def _counted(self, proc) -> bool:
        if proc.pid not in self._skip:
            try:
                self._skip[proc.pid] = "multiprocessing" in " ".join(proc.cmdline())
            except self._psutil.Error:
                return False
        return not self._skip[proc.pid]

    def sample(self) -> None:
        t = time.thread_time()
        try:
            self._sample()
        finally:
            self.samples, self.busy = self.samples + 1, self.busy + time.thread_time() - t

    def _sample(self) -> None:
        ps = self._psutil
        full = self.samples % self._pss_every == 0 or self._halt.is_set()
        if full or self.samples % 5 == 0:  # the process tree, every second (a scan of /proc)
            try:
                self._procs = [self._me] + self._me.children(recursive=True)
            except ps.Error:
                return
        procs = self._procs
        rss = pss = n = 0
        for proc in procs:
            if not self._counted(proc):
                continue
            try:
                m = proc.memory_full_info() if full else proc.memory_info()
                t = proc.cpu_times()
            except ps.Error:
                continue
            cpu = t.user + t.system
            seen = self._cpu.get(proc.pid)
            if seen is None:  # a process started during the run counts from 0; one there before, from now
                born = self.samples and proc.create_time() >= self._since
                self._cpu[proc.pid] = [self._role(proc), 0.0 if born else cpu, cpu]
            else:
                seen[2] = cpu
            rss, n = rss + m.rss, n + 1
            pss += getattr(m, "pss", 0)
        self.peak_rss, self.peak_procs = max(self.peak_rss, rss), max(self.peak_procs, n)
        if full:
            self.peak_pss = max(self.peak_pss, pss)

    def _role(self, proc) -> str:
        """What a process is, for the CPU figures: this driver, the JVM, or the Python
        process Spark started (its module: worker, daemon, the query's source runner...)."""
        if proc.pid == self._me.pid:
            return "driver"
        try:
            cmd = proc.cmdline()
        except self._psutil.Error:
            return "other"
        if cmd and cmd[0].endswith("java"):
            return "jvm"
        args = cmd[cmd.index("-m") + 1:] if "-m" in cmd[:-1] else []
        if not args:
            return "other"
        if args[0] == "pyspark.daemon":  # the daemon and the workers it forks: a module of its own, or tasks
            return "python " + (args[1].rsplit(".", 1)[-1] if len(args) > 1 else "workers")
        return "python " + args[0].rsplit(".", 1)[-1]

    def cpu(self) -> dict:
        """CPU seconds (user + system) the processes used during the run, by role. A
        process that ended between samples loses its last 0.2 s at most."""
        out = {}
        for role, first, last in self._cpu.values():
            out[role] = out.get(role, 0.0) + max(0.0, last - first)
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def idle_pss(self) -> int:
        """The PSS sum now (before a query: the idle session's)."""
        total = 0
        for proc in [self._me] + self._me.children(recursive=True):
            try:
                total += proc.memory_full_info().pss if self._counted(proc) else 0
            except self._psutil.Error:
                pass
        return total

    def run(self):
        self.sample()
        while not self._halt.wait(self._interval):
            self.sample()

    def finish(self) -> dict:
        self._halt.set()
        self.join()
        self.sample()
        cpu = self.cpu()
        return {"peak_rss_mib": self.peak_rss / 2**20, "peak_pss_mib": self.peak_pss / 2**20,
                "peak_processes": self.peak_procs, "memory_samples": self.samples,
                "memory_sampling_cpu_s": self.busy, "cpu_s": sum(cpu.values()), "cpu_by_role_s": cpu}


# ---------------------------------------------------------------- one run of a case


class Bench:
    """The session, the namespace, the data and the temporary directory of one benchmark run."""

    def __init__(self, args):
        import shmq

        self.args = args
        self.n = args.records
        self.ns = f"bench{os.getpid()}"
        self.tmp = tempfile.mkdtemp(prefix="shmq-spark-bench-")
        self.broker = shmq.connect(namespace=self.ns)
        self.spark = None
        self.ctx = mp.get_context("spawn")
        self.setup = {}
        self.crc = 0
        self.parquet_dir = os.path.join(self.tmp, "events-parquet")
        self.source_bytes = partition_bytes(2 * self.n // PARTITIONS, SOURCE_BYTES)
        self.target_bytes = partition_bytes(self.n, TARGET_BYTES)
        self.seq = 0

    # ------------------------------------------------------------ set-up and tear-down

    def prepare(self) -> None:
        t = time.perf_counter()
        with self.broker.create_stream("events", partitions=PARTITIONS, max_bytes=self.source_bytes,
                                       durability="memory") as s:
            self.crc = fill_stream(s, self.n, SEED)
            self.setup["append_s"] = time.perf_counter() - t
            t = time.perf_counter()
            self.setup["parquet_bytes"] = write_parquet(s, self.parquet_dir)
            self.setup["parquet_write_s"] = time.perf_counter() - t
        self.setup.update(records=self.n, value_bytes=SIZE, partitions=PARTITIONS, parquet_files=FILES,
                          source_max_bytes=self.source_bytes, target_max_bytes=self.target_bytes)

    def start_session(self) -> None:
        t = time.perf_counter()
        importlib.import_module("pyspark.sql")  # the import is not the session's start
        import shmq.spark

        self.setup["import_s"] = time.perf_counter() - t
        t = time.perf_counter()
        self.spark = shmq.spark.local_session("shmq-bench", os.path.join(self.tmp, "spark"), master=self.args.master)
        self.setup["session_start_s"] = time.perf_counter() - t
        jars = self.spark.sparkContext.getConf().get("spark.jars", "")
        self.setup["jvm_source"] = next((j for j in jars.split(",") if "shmq-spark-" in j), None)
        jvm = self.spark.sparkContext._jvm.System
        self.setup["java"] = f"{jvm.getProperty('java.version')} ({jvm.getProperty('java.vm.name')})"

    def close(self) -> list[str]:
        """Stop the session, delete every stream of the namespace and the namespace, remove the files."""
        import shmq

        notes = []
        if self.spark is not None:
            for q in self.spark.streams.active:
                q.stop()
            gateway = self.spark.sparkContext._gateway
            self.spark.stop()
            gateway.shutdown()
            jvm = gateway.proc
            if jvm.stdin is not None:
                jvm.stdin.close()  # the JVM's gateway server exits on EOF of its stdin
            try:
                jvm.wait(60)
            except Exception:  # noqa: BLE001 - a report, not a failure
                notes.append(f"the JVM (pid {jvm.pid}) did not exit within 60 s of the session's stop: killed")
                jvm.kill()
                jvm.wait(10)
        try:
            names = self.broker.list_streams()
            for name in names:
                self.broker.delete_stream(name)
            self.broker.close()
        finally:
            shmq.destroy_namespace(self.ns)
            shutil.rmtree(self.tmp, ignore_errors=True)
        return notes

    # ------------------------------------------------------------ sources and sinks

    def _source(self, source: str, batches: int, stream: str):
        """(DataFrame, the options that set the batches)."""
        rs = self.spark.readStream
        if source == "jvm" and self.setup.get("jvm_source") is None:
            raise RuntimeError("no JVM source in this session: shmq.spark.jar() built no jar (no JDK?)")
        if source in FORMAT:
            df = (rs.format(FORMAT[source]).option("stream", stream).option("namespace", self.ns)
                  .option("startingOffsets", "earliest"))
            limit = {} if batches == 1 else {"maxRecordsPerTrigger": self.n // batches}
        elif source == "parquet":
            from shmq.spark.schema import SOURCE_FIELDS
            df = rs.schema(SOURCE_FIELDS).format("parquet")
            limit = {} if batches == 1 else {"maxFilesPerTrigger": FILES // batches}
        else:
            df = rs.format("rate-micro-batch").option("numPartitions", PARTITIONS)
            limit = {"rowsPerBatch": self.n // batches}
        for k, v in limit.items():
            df = df.option(k, v)
        return (df.load(self.parquet_dir) if source == "parquet" else df.load()), limit

    def _sink(self, df, sink: str, name: str, ck: str, out: str):
        if sink in ("shmq", "shmq-py"):
            self.broker.create_stream(name, partitions=PARTITIONS, max_bytes=self.target_bytes,
                                      durability="memory").close()
            w = (df.select("key", "value").writeStream.format("shmq" if sink == "shmq" else "shmq_python")
                 .option("stream", name).option("namespace", self.ns))
        elif sink == "parquet":
            w = df.writeStream.format("parquet").option("path", out)
        else:
            w = df.writeStream.format("noop")
        return w.option("checkpointLocation", ck).queryName(name.replace("-", "_"))

    def _drop_streams(self, name: str) -> None:
        for s in self.broker.list_streams():
            if s == name or s.startswith(name + ":"):
                self.broker.delete_stream(s)

    # ------------------------------------------------------------ a run

    def run(self, source: str, sink: str, batches: int, n: int | None = None, stream: str = "events") -> dict:
        """One run of a case: the query, its figures, its check."""
        self.seq += 1
        tag = f"{source}-{sink}-{batches}-{self.seq}"
        ck, out = os.path.join(self.tmp, f"ck-{tag}"), os.path.join(self.tmp, f"out-{tag}")
        target = f"out-{tag}"
        n = self.n if n is None else n
        producer = None
        result = {"status": "ok"}
        try:
            if source == "live":
                stream = f"live-{tag}"
                with self.broker.create_stream(stream, partitions=PARTITIONS, max_bytes=self.source_bytes,
                                               durability="memory") as s:
                    fill_stream(s, n, SEED)
                producer = self._start_producer(stream, n)
            df, limit = self._source(source, batches, stream)
            writer = self._sink(df, sink, target, ck, out)
            if source == "rate" and batches > 1:
                writer = writer.trigger(processingTime="0 seconds")
            else:
                writer = writer.trigger(availableNow=True)
            before = self._ends(stream) if source == "live" else None
            load = os.getloadavg()[0]
            sampler = MemorySampler()
            result["base_pss_mib"] = sampler.idle_pss() / 2**20
            sampler.start()
            t0 = time.time()
            try:
                q = writer.start()
                ended = self._await(q, source, batches, n)
                wall = time.time() - t0
            finally:
                result.update(sampler.finish())
            after = self._ends(stream) if source == "live" else None
            if producer is not None:
                result["producer"] = self._stop_producer(producer)
                producer = None
            progress = [json.loads(p.json) for p in q.recentProgress]
            if ended is None:
                result.update(status="timeout", detail=f"not done after {self.args.run_timeout:.0f} s")
                return result
            if q.exception() is not None:
                result.update(status="error", detail=str(q.exception()).strip().splitlines()[0][:500])
                return result
            if source == "rate" and batches > 1:
                wall = ended - t0
            result.update(self._figures(progress, t0, wall, n if source != "live" else None))
            result["limit"] = limit
            result["load"] = load
            problem = self._check(source, sink, batches, n, result, progress, target, out, before, after)
            if problem:
                result.update(status="wrong", detail=problem)
            return result
        except Exception as e:  # noqa: BLE001 - the run failed: say so, run the next
            result.update(status="error", detail=f"{type(e).__name__}: {str(e).strip().splitlines()[0][:500]}")
            return result
        finally:
            if producer is not None:
                self._stop_producer(producer)
            for q in self.spark.streams.active:
                q.stop()
            self._drop_streams(target)
            if source == "live":
                self._drop_streams(stream)
            shutil.rmtree(ck, ignore_errors=True)
            shutil.rmtree(out, ignore_errors=True)

    def _await(self, q, source: str, batches: int, n: int):
        """Wait for the query's end: the time it ended (time.time()), None on timeout. A
        rate-micro-batch query of several batches is stopped once it has n rows: its end
        is the end of the batch that brought the n-th row."""
        deadline = time.time() + self.args.run_timeout
        if source == "rate" and batches > 1:
            while time.time() < deadline:
                rows, end = 0, None
                for p in q.recentProgress:
                    rows += p.numInputRows
                    if rows >= n:
                        end = _batch_end(json.loads(p.json))
                        break
                if end is not None or not q.isActive:
                    self.spark.sparkContext.setLogLevel("OFF")  # stopping aborts the next batch, loudly
                    q.stop()
                    time.sleep(0.5)
                    self.spark.sparkContext.setLogLevel("ERROR")
                    return end if end is not None else time.time()
                time.sleep(0.05)
            q.stop()
            return None
        if q.awaitTermination(self.args.run_timeout):
            return time.time()
        q.stop()
        return None

    def _figures(self, progress: list, t0: float, wall: float, n: int | None) -> dict:
        moved = [p for p in progress if p.get("numInputRows")]
        rows = sum(p["numInputRows"] for p in moved)
        if n is not None:
            rows_used, used = 0, []
            for p in moved:  # rate-micro-batch may have started a batch more
                if rows_used >= n:
                    break
                used.append(p)
                rows_used += p["numInputRows"]
            moved, rows = used, rows_used
        rates = [p["numInputRows"] / (p["durationMs"]["triggerExecution"] / 1000) for p in moved
                 if p["durationMs"].get("triggerExecution")]
        steady = rates[1:] or rates
        return {
            "rows": rows,
            "wall_s": wall,
            "first_batch_s": _batch_end(moved[0]) - t0 if moved else None,
            "start_s": _batch_start(progress[0]) - t0 if progress else None,
            "steady_rows_per_s": statistics.median(steady) if steady else None,
            "overall_rows_per_s": rows / wall if wall > 0 else None,
            "batches": len(moved),
            "batch_detail": [{"batch": p["batchId"], "rows": p["numInputRows"],
                              **{k: p["durationMs"].get(k) for k in ("triggerExecution", "latestOffset",
                                                                      "queryPlanning", "addBatch", "walCommit",
                                                                      "commitOffsets")}} for p in moved],
        }

    def _check(self, source, sink, batches, n, result, progress, target, out, before, after) -> str | None:
        """What is wrong with the run's output, or None."""
        rows = result["rows"]
        if source == "live":
            ends = _source_end(progress)
            if ends is None:
                return "no end offsets in the progress"
            low = [p for p in range(PARTITIONS) if not before[p] <= ends.get(p, 0) <= after[p]]
            if low:
                p = low[0]
                return f"partition {p}: the query ended at {ends.get(p)}, outside {before[p]}..{after[p]}"
            if rows != sum(ends.values()):
                return f"{rows} rows read, the end offsets add up to {sum(ends.values())}"
            result["target_reached"] = True
            result["read_beyond_prefill"] = rows - n
            result["appended_after_target"] = sum(after.values()) - sum(ends.values())
        elif source == "rate":
            if rows < n:
                return f"{rows} rows, expected {n}"
        elif rows != n:
            return f"{rows} rows, expected {n}"
        if source in ("shmq", "jvm"):
            ends = _source_end(progress)
            if ends is None or sum(ends.values()) != n:
                return f"the source's last end offsets {ends} do not add up to {n}"
        cap = result["limit"].get("maxRecordsPerTrigger")
        over = [b["rows"] for b in result["batch_detail"] if cap and b["rows"] > cap]
        if over:
            return f"a batch of {over[0]} rows, over maxRecordsPerTrigger {cap}"
        if batches > 1 and result["batches"] != batches and source != "live":
            result["note"] = f"{result['batches']} batches, not {batches}"
        if sink in ("shmq", "shmq-py"):
            problem = check_values(stream_values(self.broker, target), n, self.crc)
            return problem and f"shmq sink's target: {problem}"
        if sink == "parquet":
            problem = check_values(parquet_values(out), n, self.crc)
            return problem and f"parquet sink's files: {problem}"
        return None

    def _ends(self, stream: str) -> dict:
        with self.broker.stream(stream) as s:
            return {p: s.offsets(p)[1] for p in range(s.partitions)}

    def _start_producer(self, stream: str, first: int):
        ready, stop, out = self.ctx.Event(), self.ctx.Event(), self.ctx.Queue()
        proc = self.ctx.Process(target=produce, args=(self.ns, stream, first, self.n, self.args.live_rate,
                                                      ready, stop, out), daemon=True)
        proc.start()
        if not ready.wait(60):
            proc.kill()
            raise RuntimeError("the live producer did not start within 60 s")
        time.sleep(0.5)  # let it append a little before the query starts
        return proc, stop, out

    @staticmethod
    def _stop_producer(producer) -> dict:
        proc, stop, out = producer
        stop.set()
        try:
            sent, seconds = out.get(timeout=30)
        except Exception:  # noqa: BLE001
            sent, seconds = None, None
        proc.join(10)
        if proc.is_alive():
            proc.kill()
        return {"appended": sent, "seconds": seconds,
                "records_per_s": sent / seconds if sent and seconds else None}


def _batch_start(p: dict) -> float:
    """When a batch's trigger started (epoch seconds)."""
    return datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()


def _batch_end(p: dict) -> float:
    """When a batch ended (epoch seconds): its trigger's start plus its duration."""
    return _batch_start(p) + p["durationMs"].get("triggerExecution", 0) / 1000


def _source_end(progress: list) -> dict | None:
    """{partition: end offset} of the last batch of a shmq source, from its progress."""
    for p in reversed(progress):
        for src in p.get("sources", []):
            end = src.get("endOffset")
            if isinstance(end, str):
                end = json.loads(end)
            if isinstance(end, dict) and end:
                try:
                    return {int(k): int(v) for k, v in end.items()}
                except (TypeError, ValueError):
                    return None
    return None


# ---------------------------------------------------------------- the plan and the summary


def plan(args) -> list[tuple]:
    wanted = args.cases
    return [(src, sink, b) for src, sink in CASES for b in (LIVE_BATCHES if src == "live" else BATCHES)
            if wanted is None or f"{src}-{sink}" in wanted]


def summarize(runs: list) -> dict:
    ok = [r for r in runs if r["status"] == "ok"]
    out = {"ok_runs": len(ok), "runs": len(runs)}
    if not ok:
        return out
    for key in ("start_s", "first_batch_s", "steady_rows_per_s", "overall_rows_per_s", "wall_s", "peak_rss_mib",
                "peak_pss_mib", "rows", "batches", "cpu_s"):
        values = [r[key] for r in ok if r.get(key) is not None]
        if values:
            out[key] = statistics.median(values)
            out[key + "_min"], out[key + "_max"] = min(values), max(values)
    return out


def targets(cases: list) -> list[dict]:
    """The performance issue's targets, per batch count, from the cases' medians: the
    source against the file source (overall rows/s, and steady rows/s), the sink's cost
    (shmq -> shmq wall against shmq -> noop), and the sink against Spark's parquet sink
    (rows/s with the parquet files as the source of both)."""
    by = {(c["source"], c["sink"], c["batches"]): c["summary"] for c in cases}
    rows = []

    def ratio(a, b, key):
        return a[key] / b[key] if a.get(key) and b.get(key) else None

    def at_least(rows, target, b, mine, theirs, limit, what):
        """A row for "``mine`` / ``theirs`` overall rows/s at least ``limit``" (none without both)."""
        vs = ratio(mine, theirs, "overall_rows_per_s")
        if vs is not None:
            rows.append({"target": target, "batches": b, "ratio": vs,
                         "steady_ratio": ratio(mine, theirs, "steady_rows_per_s"), "met": vs >= limit,
                         "what": f"{what} overall rows/s; target >= {limit}"})

    for b in BATCHES:
        mine, file = by.get(("shmq", "noop", b), {}), by.get(("parquet", "noop", b), {})
        overall, steady = ratio(mine, file, "overall_rows_per_s"), ratio(mine, file, "steady_rows_per_s")
        if overall is not None:
            rows.append({"target": "source_vs_file", "batches": b, "ratio": overall, "steady_ratio": steady,
                         "met": overall >= TARGETS["source_vs_file"] and (steady or 0) >= TARGETS["source_steady"],
                         "what": f"(shmq stream -> noop) / (parquet files -> noop) rows/s: overall, target >= "
                                 f"{TARGETS['source_vs_file']}; steady, target >= {TARGETS['source_steady']}"})
        noop, sink = by.get(("jvm", "noop", b), {}), by.get(("jvm", "shmq", b), {})
        cost = ratio(sink, noop, "wall_s")
        if cost is not None:
            limit = SINK_TARGETS["sink_cost"]
            rows.append({"target": "sink_cost", "batches": b, "ratio": cost,
                         "steady_ratio": ratio(noop, sink, "steady_rows_per_s"), "met": cost <= limit,
                         "what": f"(shmq JVM source -> JVM sink wall) / (shmq JVM source -> noop wall); target <= "
                                 f"{limit}"})
        at_least(rows, "sink_vs_parquet", b, by.get(("parquet", "shmq", b), {}), by.get(("parquet", "parquet", b), {}),
                 SINK_TARGETS["sink_vs_parquet"].get(b, 1.0),
                 "(parquet files -> shmq JVM sink) / (parquet files -> parquet sink)")
        jvm, python = by.get(("jvm", "noop", b), {}), by.get(("shmq", "noop", b), {})
        at_least(rows, "jvm_vs_file", b, jvm, file, JVM_TARGETS["jvm_vs_file"],
                 "(shmq JVM source -> noop) / (parquet files -> noop)")
        at_least(rows, "jvm_vs_python", b, jvm, python, JVM_TARGETS["jvm_vs_python"],
                 "(shmq JVM source -> noop) / (shmq Python source -> noop)")
        if jvm.get("start_s") is not None and file.get("start_s") is not None:
            late = jvm["start_s"] - file["start_s"]
            rows.append({"target": "jvm_start", "batches": b, "ratio": late, "met": late <= JVM_TARGETS["jvm_start_s"],
                         "what": f"start s of (shmq JVM source -> noop) - start s of (parquet files -> noop); target "
                                 f"<= {JVM_TARGETS['jvm_start_s']}"})
    return rows


# ---------------------------------------------------------------- the report


def _si(x) -> str:
    if x is None:
        return "n/a"
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.2f}{unit}"
    return f"{x:.0f}"


def _f(x, fmt="{:.2f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def print_report(doc: dict, out=sys.stdout) -> None:
    m, st, setup = doc["machine"], doc["settings"], doc["setup"]
    print("shmq Spark benchmark (Structured Streaming, trigger availableNow)", file=out)
    print(f"machine : {m['cpu']}; {m['logical_cpus']} logical CPUs; {m['os']}", file=out)
    if m.get("load"):
        print(f"load    : 1-minute load average {m['load'][0]:.2f} before the run, {m['load'][1]:.2f} after it",
              file=out)
    print(f"versions: python {m['python']}, shmq {m['shmq']}, pyspark {m['pyspark']}, pyarrow {m['pyarrow']}, "
          f"java {setup.get('java', '?')}", file=out)
    print(f"settings: master {st['master']}, {setup['records']:,} records of {SIZE} B in {PARTITIONS} partitions "
          f"({setup['parquet_files']} parquet files, {setup['parquet_bytes'] / 2**20:.0f} MiB), runs={st['runs']}, "
          f"quick={st['quick']}, live producer {st['live_rate']:,} records/s", file=out)
    print(f"set-up  : pyspark import {setup['import_s']:.1f} s; session start {setup['session_start_s']:.1f} s; "
          f"append {setup['append_s']:.1f} s; parquet write {setup['parquet_write_s']:.1f} s", file=out)
    warm = doc.get("warmup") or {}
    if warm:
        print(f"cold    : the session's first query (shmq -> shmq sink, {warm.get('rows', 0):,} records): "
              f"{warm.get('status')}, first batch {_f(warm.get('first_batch_s'), '{:.1f}')} s, "
              f"wall {_f(warm.get('wall_s'), '{:.1f}')} s (not in the table)", file=out)
    print(file=out)
    print(f"Cases, median of {st['runs']} run(s) (min .. max of overall rows/s)", file=out)
    for line in ("start = start() -> the first trigger begins (the query's own start-up: a Python source starts a",
                 "  process of its own); first = start() -> the end of the first batch with rows;",
                 "steady = median rows/s of the batches after the first (1 batch: that batch);",
                 "overall = rows / (start() -> termination); wall = start() -> termination;",
                 "memory = peak sum over the driver, the JVM and the Python workers: RSS every 0.2 s (it counts",
                 "  shared memory once per process that maps it), PSS every 2 s (shared pages shared out)"):
        print("  " + line, file=out)
    head = (f"{'source':<17} {'sink':<7} {'batches':>7}  {'rows':>9}  {'start s':>7}  {'first s':>7}  "
            f"{'steady/s':>8}  {'overall/s':>9}  {'(min .. max)':<17}  {'wall s':>6}  {'RSS MiB':>7}  "
            f"{'PSS MiB':>7}  check")
    print(head, file=out)
    print("-" * len(head), file=out)
    for c in doc["cases"]:
        s = c["summary"]
        lead = f"{SOURCE_LABEL[c['source']]:<17} {c['sink']:<7} {c['batches']:>7}"
        if not s.get("ok_runs"):
            bad = next((r for r in c["runs"] if r["status"] != "ok"), {})
            print(f"{lead}  {bad.get('status', 'not run')}: {bad.get('detail', '')}", file=out)
            continue
        spread = f"({_si(s['overall_rows_per_s_min'])} .. {_si(s['overall_rows_per_s_max'])})"
        checks = [r["status"] for r in c["runs"]]
        check = "ok" if all(x == "ok" for x in checks) else f"{checks.count('ok')}/{len(checks)} ok"
        print(f"{lead}  {s['rows']:>9,.0f}  {_f(s.get('start_s'), '{:.1f}'):>7}  "
              f"{_f(s.get('first_batch_s'), '{:.1f}'):>7}  {_si(s.get('steady_rows_per_s')):>8}  "
              f"{_si(s['overall_rows_per_s']):>9}  {spread:<17}  "
              f"{s['wall_s']:>6.1f}  {s['peak_rss_mib']:>7.0f}  {s['peak_pss_mib']:>7.0f}  {check}", file=out)
    print("  limits: shmq maxRecordsPerTrigger = records / 10; parquet maxFilesPerTrigger = 2 (of 20 files);",
          file=out)
    print("  rate-micro-batch rowsPerBatch = records / batches (2 columns, timestamp and a long: no payload; its",
          file=out)
    print("  10-batch runs use a processing-time trigger, stopped after the 10th batch)", file=out)
    cpu = [(c, s) for c in doc["cases"] if (s := c["summary"]).get("cpu_s") is not None]
    if cpu:
        print("  CPU seconds of the run whose total is the median (the JVM, Spark's Python processes by module,",
              file=out)
        print("  this driver), against its wall: where the time goes, and what waits", file=out)
        for c, s in cpu:
            run = min((r for r in c["runs"] if r.get("cpu_s") is not None), key=lambda r: abs(r["cpu_s"] - s["cpu_s"]))
            parts = ", ".join(f"{role.replace('python ', '')} {v:.2f}" for role, v in run["cpu_by_role_s"].items()
                              if v >= 0.005)
            print(f"    {SOURCE_LABEL[c['source']]} -> {c['sink']}, {c['batches']}: {run['cpu_s']:.2f} s in "
                  f"{run['wall_s']:.2f} s wall ({parts})", file=out)
    runs = [r for c in doc["cases"] for r in c["runs"] if r.get("memory_samples")]
    if runs:
        busy, wall = sum(r["memory_sampling_cpu_s"] for r in runs), sum(r.get("wall_s", 0) for r in runs)
        procs = max(r.get("peak_processes", 0) for r in runs)
        print(f"  memory: up to {procs} processes counted; sampling them took {busy:.1f} s of CPU in the queries' "
              f"{wall:.0f} s ({100 * busy / wall if wall else 0:.1f}% of one CPU)", file=out)
        base = [r["base_pss_mib"] for r in runs if r.get("base_pss_mib")]
        if base:
            print(f"  the idle session before a query: PSS {min(base):.0f} .. {max(base):.0f} MiB (the JVM's heap "
                  f"grows over the session: later runs start higher)", file=out)
        loads = [r["load"] for r in runs if r.get("load") is not None]
        if loads:
            print(f"  1-minute load average at the runs' starts: {min(loads):.1f} .. {max(loads):.1f} "
                  f"(on {doc['machine']['logical_cpus']} CPUs; other work on the machine widens min .. max)",
                  file=out)
    live = [r for c in doc["cases"] if c["source"] == "live" for r in c["runs"] if r.get("producer")]
    if live:
        reached = sum(1 for r in live if r.get("target_reached"))
        rates = [r["producer"]["records_per_s"] for r in live if r["producer"].get("records_per_s")]
        beyond = [r.get("read_beyond_prefill", 0) for r in live]
        later = [r.get("appended_after_target", 0) for r in live]
        print(f"  live: a spawned process appended at {_si(min(rates) if rates else None)} .. "
              f"{_si(max(rates) if rates else None)} records/s ({LIVE_CHUNK} per append) while the queries ran; the",
              file=out)
        print(f"  availableNow target was reached in {reached} of {len(live)} runs: the query read the pre-appended "
              f"records and {min(beyond):,} .. {max(beyond):,}", file=out)
        print(f"  appended before its start; {min(later):,} .. {max(later):,} more were appended before it ended "
              f"(left for the next run)", file=out)
    print(file=out)
    print("Targets", file=out)
    for t in doc["targets"]:
        steady = f" (steady: {t['steady_ratio']:.2f})" if t.get("steady_ratio") else ""
        print(f"  {'met   ' if t['met'] else 'missed'}  {t['batches']:>2} batch{'es' if t['batches'] > 1 else '  '}: "
              f"{t['ratio']:.2f}{steady}  {t['what']}", file=out)
    if not doc["targets"]:
        print("  not measured (the cases they need did not run)", file=out)
    problems = [(c, r) for c in doc["cases"] for r in c["runs"] if r["status"] != "ok" or r.get("note")]
    if problems:
        print("\nProblems", file=out)
        for c, r in problems:
            print(f"- {c['source']} -> {c['sink']}, {c['batches']} batches: {r['status']} "
                  f"{r.get('detail') or r.get('note', '')}", file=out)
    for note in doc.get("notes", []):
        print(f"note: {note}", file=out)


# ---------------------------------------------------------------- the docs' table

MD_BEGIN = "<!-- python -m bench.spark --markdown docs/spark-bench.json: begin (generated, do not edit) -->"
MD_END = "<!-- python -m bench.spark --markdown docs/spark-bench.json: end -->"
CASE_LABEL = {"noop": "noop", "shmq": "shmq (exactly once, JVM sink)", "shmq-py": "shmq (exactly once, Python sink)",
              "parquet": "parquet files"}


def markdown(doc: dict) -> str:
    """docs/SPARK.md's performance figures from a saved run (the one owner of them): the
    run's machine, date and load, each case's medians, and the issue's targets."""
    m, st = doc["machine"], doc["settings"]
    for c in doc["cases"]:
        c["summary"] = summarize(c["runs"])
    loads = [r["load"] for c in doc["cases"] for r in c["runs"] if r.get("load") is not None]
    lines = [MD_BEGIN, "",
             f"{st.get('date', 'undated')}, {m['cpu']} ({m['logical_cpus']} CPUs), {st['master']}, pyspark "
             f"{m.get('pyspark')}, {st['records']:,} records of {st['value_bytes']} B in {st['partitions']} partitions, "
             f"median of {st['runs']} run(s)" + (f", 1-minute load {min(loads):.1f} .. {max(loads):.1f} at the runs' "
                                                 f"starts" if loads else "") + ":", "",
             "| source → sink | batches | overall rows/s | steady rows/s | start s | wall s | CPU s |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in doc["cases"]:
        s = c["summary"]
        if not s.get("ok_runs"):
            continue
        cpu = s.get("cpu_s")
        lines.append(f"| {SOURCE_LABEL[c['source']]} → {CASE_LABEL[c['sink']]} | {c['batches']} | "
                     f"{_si(s['overall_rows_per_s'])} | {_si(s.get('steady_rows_per_s'))} | "
                     f"{_f(s.get('start_s'), '{:.1f}')} | {s['wall_s']:.1f} | {_f(cpu, '{:.1f}')} |")
    short = {"source_vs_file": f"shmq source / file source, rows/s (overall >= {TARGETS['source_vs_file']}, "
                               f"steady >= {TARGETS['source_steady']})",
             "sink_cost": f"shmq -> shmq wall / shmq -> noop wall, JVM source and sink (<= {SINK_TARGETS['sink_cost']})",
             "sink_vs_parquet": "JVM sink / parquet sink, rows/s from the files (>= "
                                + ", ".join(f"{v} in {b}" for b, v in SINK_TARGETS["sink_vs_parquet"].items()) + ")",
             "jvm_vs_file": f"JVM source / file source, rows/s (>= {JVM_TARGETS['jvm_vs_file']})",
             "jvm_vs_python": f"JVM source / Python source, rows/s (>= {JVM_TARGETS['jvm_vs_python']})",
             "jvm_start": f"JVM source's start s - file source's (<= {JVM_TARGETS['jvm_start_s']})"}
    rows = targets(doc["cases"])
    issues = "issues 22, 32, 46" if any(t["target"] in JVM_TARGET_NAMES for t in rows) else "issues 22, 46"
    lines += ["", f"| target ({issues}) | batches | overall (steady) | |", "| --- | --- | --- | --- |"]
    for t in rows:
        steady = f" ({t['steady_ratio']:.2f})" if t.get("steady_ratio") else ""
        lines.append(f"| {short[t['target']]} | {t['batches']} | {t['ratio']:.2f}{steady} | "
                     f"{'met' if t['met'] else 'missed'} |")
    lines += ["", MD_END]
    return "\n".join(lines)


# ---------------------------------------------------------------- main


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.spark", description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=None, help="records (default 1,000,000; 100,000 with --quick)")
    p.add_argument("--quick", action="store_true", help="100,000 records, 1 run")
    p.add_argument("--runs", type=int, default=None, help="runs per case (default 3; 1 with --quick)")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--cases", type=lambda t: t.split(","), default=None,
                   help=f"comma list of source-sink from {','.join(f'{a}-{b}' for a, b in CASES)}")
    p.add_argument("--live-rate", type=int, default=None,
                   help=f"records/s of the live producer (default records / {LIVE_SECONDS}: 50,000 for 1,000,000)")
    p.add_argument("--run-timeout", type=float, default=300.0, help="seconds a query may take")
    p.add_argument("--json", metavar="PATH", default=None,
                   help="default docs/spark-bench.json; bench/results/spark-quick.json with --quick")
    p.add_argument("--report", metavar="JSON", help="run nothing: print a saved run")
    p.add_argument("--markdown", metavar="JSON", help="run nothing: docs/SPARK.md's table of a saved run")
    args = p.parse_args(argv)
    args.records = args.records or (100_000 if args.quick else 1_000_000)
    args.runs = args.runs or (1 if args.quick else 3)
    args.live_rate = args.live_rate or args.records // LIVE_SECONDS
    args.json = args.json or ("bench/results/spark-quick.json" if args.quick else "docs/spark-bench.json")
    if args.records < FILES * 10 or args.runs < 1:
        p.error(f"--records must be >= {FILES * 10}, --runs >= 1")
    return args


def _versions() -> dict:
    import importlib.metadata as md

    out = {}
    for name in ("pyspark", "pyarrow", "py4j", "psutil"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.markdown:
        with open(args.markdown) as fh:
            print(markdown(json.load(fh)))
        return 0
    if args.report:
        with open(args.report) as fh:
            doc = json.load(fh)
        for c in doc["cases"]:  # derived from the runs: as this version derives them
            c["summary"] = summarize(c["runs"])
        doc["targets"] = targets(doc["cases"])
        print_report(doc)
        return 0
    load = os.getloadavg()[0]
    jobs = plan(args)
    bench = Bench(args)
    cases = {(s, k, b): [] for s, k, b in jobs}
    notes, warmup = [], {}
    t_all = time.perf_counter()
    try:
        print(f"set-up: {args.records:,} records into stream 'events' and {FILES} parquet files ...",
              file=sys.stderr, flush=True)
        bench.prepare()
        bench.start_session()
        print(f"session started in {bench.setup['session_start_s']:.1f} s; warm-up query ...", file=sys.stderr,
              flush=True)
        warm_n = min(args.records, 20_000)
        with bench.broker.create_stream("warmup", partitions=PARTITIONS, max_bytes=bench.source_bytes,
                                        durability="memory") as s:
            fill_stream(s, warm_n, SEED)
        crc, bench.crc = bench.crc, sum(map(zlib.crc32, stream_values(bench.broker, "warmup")))
        warmup = bench.run("shmq", "shmq", 1, n=warm_n, stream="warmup")
        bench.crc = crc
        warmup.pop("batch_detail", None)
        total = len(jobs) * args.runs
        k = 0
        for run in range(args.runs):
            for src, sink, b in jobs:
                k += 1
                r = bench.run(src, sink, b)
                r["run"] = run + 1
                cases[(src, sink, b)].append(r)
                fig = (f"{r['wall_s']:.1f} s, {_si(r['overall_rows_per_s'])} rows/s" if r["status"] == "ok"
                       else f"{r['status']}: {r.get('detail', '')}")
                print(f"[{k}/{total}] {src} -> {sink}, {b} batch(es), run {run + 1}: {fig}  "
                      f"({time.perf_counter() - t_all:.0f} s so far)", file=sys.stderr, flush=True)
    finally:
        notes += bench.close()
    settings = {"date": datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"), "records": args.records,
                "runs": args.runs, "quick": args.quick, "master": args.master,
                "live_rate": args.live_rate, "live_chunk": LIVE_CHUNK, "run_timeout": args.run_timeout,
                "value_bytes": SIZE, "partitions": PARTITIONS, "parquet_files": FILES,
                "parquet_compression": "snappy (pyarrow's default)", "memory_interval_s": {"rss": 0.2, "pss": 2.0},
                "total_s": time.perf_counter() - t_all}
    out_cases = [{"source": s, "sink": k, "batches": b, "summary": summarize(runs), "runs": runs}
                 for (s, k, b), runs in cases.items()]
    doc = {**provenance.run_header("spark", shlex.join(["python", "-m", "bench.spark", *(sys.argv[1:] if argv is None else argv)])),
           "machine": dict(machine_info(), **_versions(), load=(load, os.getloadavg()[0])),
           "settings": settings, "setup": bench.setup, "warmup": warmup, "cases": out_cases,
           "targets": targets(out_cases), "notes": notes}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
    print_report(doc)
    if args.json:
        print(f"wrote {args.json}")
    return 0 if all(r["status"] == "ok" for runs in cases.values() for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
