"""Kafka clients through shmq's Kafka listener, against shmq's own TCP client and Redis
Streams, in one run: ``python -m bench.kafka``.

Each system moves ``--records`` records of 100 B through one single-partition stream (a
topic, a Redis stream) of the run's own, from one producer process to one consumer
process in a group, both on loopback:

- ``kafka``: confluent-kafka (librdkafka) producing with its default batching
  (``linger.ms`` 5) into ``shmq server --kafka-port``, and a confluent-kafka consumer
  that subscribes with a group, takes up to 500 records a call (``consume``) and commits
  each call's (asynchronously, as Kafka applications that commit per batch do);
- ``kafka-txn``: the same through Kafka's transactions: a transactional producer
  (``transactional.id``) committing every ``--txn-size`` records (100) as one transaction,
  and a read_committed consumer, which gets each transaction's records once it is
  committed; against ``kafka`` in the same run, what exactly-once costs;
- ``shmq-tcp``: shmq's own client over ``tcp://`` to the same server, batched: a
  producer that appends ``--batch`` records per ``append_many``, a group consumer that
  polls up to 500 and commits each poll;
- ``redis-streams``: redis-py against a ``redis-server`` of the run's own: XADD
  pipelined ``--batch`` per round trip, XREADGROUP COUNT 500 and XACK of each batch.

The three have the same shape: 100 B values, one partition, one producer process, one
group consumer that takes up to 500 records a call and acknowledges each call's. What
differs is each client's own batching on the way in (librdkafka's by time, ``--batch``
records per call for the other two), and that librdkafka fetches ahead in a thread of
its own while the others ask for each batch.

Every record carries its producer's clock (``time.monotonic_ns``, one clock for every
process of the host) in its first 8 bytes; the consumer takes the produce-to-consume
latency of each record, and the rate is records from the first produce to the last
consume: what goes through producer, server and consumer together, on a machine they
share. The consumer is in its group before the producer starts; the producer goes as
fast as it can, so where it outruns the consumer the latency includes the backlog (a
latency under full load, not at a set rate). Figures are medians of ``--runs`` runs,
with the issue's targets (issue 44): the Kafka path at least 0.8x shmq's own batched
TCP path, and at least 2x Redis Streams. ``--quick`` is a smoke test; ``--json PATH``
writes every run. A system that cannot run here is skipped, saying why.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import struct
import sys
import time

from bench import harness, provenance
from bench.machine import dist_versions, machine_info
from bench.servers import RedisServer, ShmqServer

PROG = "python -m bench.kafka"
SYSTEMS = ("kafka", "kafka-txn", "shmq-tcp", "redis-streams")
SIZE = 100  # bytes per record
CLOCK = struct.Struct(">q")
PAD = b"x" * (SIZE - CLOCK.size)
POLL = 500  # records per consumer call at most
TARGETS = (("kafka", "shmq-tcp", 0.8), ("kafka", "redis-streams", 2.0))  # (system, peer, at least x the peer's rate)
READY_TIMEOUT = 60.0


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma list of {','.join(SYSTEMS)}")
    p.add_argument("--records", type=int, default=None, help="records per run (default 100000; 3000 with --quick)")
    p.add_argument("--runs", type=int, default=None, help="runs per system (default 3; 1 with --quick)")
    p.add_argument("--batch", type=int, default=100, help="records per append_many / per Redis pipeline (default 100)")
    p.add_argument("--txn-size", type=int, default=100, help="records per transaction of kafka-txn (default 100)")
    p.add_argument("--run-timeout", type=float, default=120.0, help="seconds allowed per run (default 120)")
    p.add_argument("--quick", action="store_true", help="a smoke test: few records, one run")
    p.add_argument("--json", metavar="PATH", default=None, help="write every run here")
    args = p.parse_args(argv)
    args.systems = [x for x in args.systems.split(",") if x]
    bad = [x for x in args.systems if x not in SYSTEMS]
    if bad or not args.systems:
        p.error(f"--systems: {', '.join(bad) or 'nothing'} not in {', '.join(SYSTEMS)}")
    args.records = args.records or (3000 if args.quick else 100_000)
    args.runs = args.runs or (1 if args.quick else 3)
    if min(args.records, args.runs, args.batch, args.txn_size) < 1 or args.run_timeout <= 0:
        p.error("--records, --runs, --batch, --txn-size and --run-timeout must be positive")
    return args


def record() -> bytes:
    return CLOCK.pack(time.monotonic_ns()) + PAD


# ---------------------------------------------------------------------- producers (one process each)
def produce_kafka(where, topic, n, batch):
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": where["bootstrap"]})  # librdkafka's defaults: linger.ms 5, batching
    for _ in range(n):
        while True:
            try:
                p.produce(topic, record())
                break
            except BufferError:  # its queue is full: let it send
                p.poll(0.01)
        p.poll(0)
    if p.flush(60) != 0:
        raise RuntimeError("confluent-kafka: records not delivered within 60s")


def produce_kafka_txn(where, topic, n, batch):
    """A transaction of ``batch`` (``--txn-size``) records at a time, each committed."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": where["bootstrap"], "transactional.id": f"{topic}-txn"})
    p.init_transactions(60)
    for start in range(0, n, batch):
        p.begin_transaction()
        for _ in range(min(batch, n - start)):
            while True:
                try:
                    p.produce(topic, record())
                    break
                except BufferError:
                    p.poll(0.01)
            p.poll(0)
        p.commit_transaction(60)


def produce_shmq(where, topic, n, batch):
    import shmq

    with shmq.connect(where["url"]) as b:
        s = b.stream(topic)
        for start in range(0, n, batch):
            s.append_many([record() for _ in range(min(batch, n - start))])


def produce_redis(where, topic, n, batch):
    import redis

    r = redis.Redis(port=where["port"])
    for start in range(0, n, batch):
        pipe = r.pipeline(transaction=False)
        for _ in range(min(batch, n - start)):
            pipe.xadd(topic, {b"v": record()})
        pipe.execute()
    r.close()


# ---------------------------------------------------------------------- consumers (one process each)
def consume_kafka(where, topic, group, n, ready, isolation="read_uncommitted"):
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": where["bootstrap"], "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "isolation.level": isolation})
    c.subscribe([topic])
    while not c.assignment():
        c.poll(0.05)
    ready.set()

    def batches():
        while True:
            got = [m.value() for m in c.consume(num_messages=POLL, timeout=1.0) if m.error() is None]
            if got:
                c.commit(asynchronous=True)  # each call's, as the other two acknowledge theirs
            yield got

    try:
        return _take(batches(), n)
    finally:
        c.close()


def consume_shmq(where, topic, group, n, ready):
    import shmq

    with shmq.connect(where["url"]) as b:
        c = b.stream(topic).consumer(group)
        c.poll(max_records=1, timeout=0)  # in the group now
        ready.set()

        def batches():
            while True:
                got = c.poll(max_records=POLL, timeout=1.0)
                if got:
                    c.commit()
                yield [r.value for r in got]

        try:
            return _take(batches(), n)
        finally:
            c.close()


def consume_redis(where, topic, group, n, ready):
    import redis

    r = redis.Redis(port=where["port"])
    ready.set()  # the group was made with the stream, before the run

    def batches():
        while True:
            got = r.xreadgroup(group, "c", {topic: ">"}, count=POLL, block=1000)
            ids = [i for _s, entries in got for i, _f in entries]
            if ids:
                r.xack(topic, group, *ids)
            yield [fields[b"v"] for _s, entries in got for _i, fields in entries]

    try:
        return _take(batches(), n)
    finally:
        r.close()


def _take(batches, n):
    """Read ``n`` records from ``batches``: (rate, p50 latency in µs)."""
    latencies, first = [], None
    for values in batches:
        now = time.monotonic_ns()
        for v in values:
            sent = CLOCK.unpack_from(v)[0]
            first = sent if first is None else min(first, sent)
            latencies.append(now - sent)
        if len(latencies) >= n:
            break
    if len(latencies) != n:
        raise RuntimeError(f"read {len(latencies)} records, expected {n}")
    return n / ((now - first) / 1e9), statistics.median(latencies) / 1e3


def consume_kafka_txn(where, topic, group, n, ready):
    return consume_kafka(where, topic, group, n, ready, "read_committed")


PRODUCERS = {"kafka": produce_kafka, "kafka-txn": produce_kafka_txn, "shmq-tcp": produce_shmq,
             "redis-streams": produce_redis}
CONSUMERS = {"kafka": consume_kafka, "kafka-txn": consume_kafka_txn, "shmq-tcp": consume_shmq,
             "redis-streams": consume_redis}


def _consumer_main(system, where, topic, group, n, ready, out):
    try:
        out.put(("ok", CONSUMERS[system](where, topic, group, n, ready)))
    except BaseException as exc:  # noqa: BLE001 - said in the run's error
        out.put(("error", f"{type(exc).__name__}: {exc}"))


def _producer_main(system, where, topic, n, batch, out):
    try:
        PRODUCERS[system](where, topic, n, batch)
        out.put(("ok", None))
    except BaseException as exc:  # noqa: BLE001
        out.put(("error", f"{type(exc).__name__}: {exc}"))


# ---------------------------------------------------------------------- one run
def one_run(ctx, system, where, topic, args):
    """Consumer in its group first, then the producer; (records/s, p50 µs)."""
    group = f"{topic}-g"
    ready, out, pout = ctx.Event(), ctx.Queue(), ctx.Queue()
    consumer = ctx.Process(target=_consumer_main, args=(system, where, topic, group, args.records, ready, out))
    consumer.start()
    producer = None
    try:
        if not ready.wait(READY_TIMEOUT):
            raise RuntimeError(f"the consumer was not in its group within {READY_TIMEOUT:.0f}s")
        batch = args.txn_size if system == "kafka-txn" else args.batch
        producer = ctx.Process(target=_producer_main, args=(system, where, topic, args.records, batch, pout))
        producer.start()
        status, got = out.get(timeout=args.run_timeout)
        if status != "ok":
            raise RuntimeError(got)
        status, why = pout.get(timeout=args.run_timeout)
        if status != "ok":
            raise RuntimeError(why)
        return got
    finally:
        for proc in (producer, consumer):
            if proc is not None:
                proc.join(10)
                if proc.is_alive():
                    proc.kill()
                    proc.join()


class Systems:
    """The servers of the run (one ``shmq server`` with its Kafka listener, one
    ``redis-server``), and what each system's processes connect to."""

    def __init__(self, systems):
        self.shmq = self.redis = None
        self.skipped, self.where = {}, {}
        wanted = set(systems)
        for system, module in (("kafka", "confluent_kafka"), ("kafka-txn", "confluent_kafka"),
                               ("redis-streams", "redis")):
            if system in wanted:
                try:
                    __import__(module)
                except ImportError:
                    self.skipped[system] = f"{module} is not installed"
        if wanted & {"kafka", "kafka-txn", "shmq-tcp"} - set(self.skipped):
            try:
                self.shmq = ShmqServer(f"bench-{os.getpid()}-kafka", "--no-auth", "--kafka-port", "0")
                bootstrap = re.search(r"kafka listener on (\S+):(\d+)", self.shmq.output())
                bootstrap = {"bootstrap": f"{bootstrap.group(1)}:{bootstrap.group(2)}"}
                self.where["kafka"] = self.where["kafka-txn"] = bootstrap
                self.where["shmq-tcp"] = {"url": self.shmq.url}
            except (OSError, RuntimeError) as exc:
                for system in ("kafka", "kafka-txn", "shmq-tcp"):
                    self.skipped.setdefault(system, f"cannot start shmq server: {exc}")
        if "redis-streams" in wanted and "redis-streams" not in self.skipped:
            try:
                self.redis = RedisServer()
                self.where["redis-streams"] = {"port": self.redis.port}
            except (OSError, RuntimeError) as exc:
                self.skipped["redis-streams"] = f"cannot start redis-server: {exc}"

    def make(self, system, topic):
        """The run's stream: one partition, room for the whole run; a Redis stream with its group."""
        if system == "redis-streams":
            import redis
            r = redis.Redis(port=self.redis.port)
            r.xgroup_create(topic, f"{topic}-g", id="0", mkstream=True)
            r.close()
            return
        import shmq
        with shmq.connect(self.shmq.url) as b:
            b.create_stream(topic, partitions=1, max_bytes=256 * 2**20, durability="memory").close()

    def drop(self, system, topic):
        if system == "redis-streams":
            import redis
            r = redis.Redis(port=self.redis.port)
            r.delete(topic)
            r.close()
            return
        import shmq
        with shmq.connect(self.shmq.url) as b:
            b.delete_stream(topic)

    def close(self):
        for server in (self.shmq, self.redis):
            if server is not None:
                server.close()
        if self.shmq is not None:
            from shmq.engine.shm.segment import destroy_namespace
            destroy_namespace(f"bench-{os.getpid()}-kafka")


@harness.leaves_no_processes
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    info = dict(machine_info(), **dist_versions("confluent-kafka"), load=(os.getloadavg()[0], None))
    ctx = harness.context()
    rows = []
    systems = Systems(args.systems)
    try:
        for system in args.systems:
            if system in systems.skipped:
                continue
            runs, error = [], None
            for i in range(args.runs):
                topic = f"bench-{system}-{i}"
                try:
                    systems.make(system, topic)
                    try:
                        runs.append(one_run(ctx, system, systems.where[system], topic, args))
                    finally:
                        systems.drop(system, topic)
                except Exception as exc:  # noqa: BLE001 - a failed run is reported, the others go on
                    error = str(exc) or type(exc).__name__
                    break
            row = {"system": system, "runs": [{"records_per_s": r, "p50_us": l} for r, l in runs], "error": error,
                   "records_per_s": statistics.median(r for r, _ in runs) if runs and not error else None,
                   "p50_us": statistics.median(lat for _, lat in runs) if runs and not error else None}
            rows.append(row)
            print(f"{system:14s} " + (f"{row['records_per_s']:12,.0f} records/s  p50 {row['p50_us']:10,.0f} µs"
                                      if error is None else f"failed: {error}"), flush=True)
    finally:
        systems.close()
    info["load"] = (info["load"][0], os.getloadavg()[0])
    targets = print_table(info, args, rows, systems.skipped)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**provenance.run_header("kafka", shlex.join([*PROG.split(), *argv])), "machine": info,
                       "records": args.records, "size": SIZE, "batch": args.batch, "txn_size": args.txn_size,
                       "runs": args.runs, "rows": rows, "targets": targets, "skipped": systems.skipped}, f, indent=1)
        print(f"wrote {args.json}")
    return 0 if all(r["error"] is None for r in rows) else 1


def print_table(info, args, rows, skipped):
    """The table of the medians, then the issue's targets; returns the targets' rows."""
    print(f"\n{PROG}: {args.records} records of {SIZE} B per run, one partition, one producer and one group "
          f"consumer, median of {args.runs}; {info['cpu']}, {info['logical_cpus']} CPUs\n")
    by = {r["system"]: r for r in rows if r["error"] is None}
    print("| system | records/s | p50 produce-to-consume | kafka / system (records/s) |")
    print("|---|---|---|---|")
    kafka = by.get("kafka", {}).get("records_per_s")
    for r in rows:
        if r["error"] is not None:
            print(f"| {r['system']} | failed: {r['error']} | | |")
            continue
        ratio = f"{kafka / r['records_per_s']:.2f}x" if kafka and r["system"] != "kafka" else "-"
        print(f"| {r['system']} | {r['records_per_s']:,.0f} | {r['p50_us'] / 1000:,.2f} ms | {ratio} |")
    out = []
    txn = by.get("kafka-txn", {}).get("records_per_s")
    if kafka and txn:
        print(f"transactions of {args.txn_size}: kafka-txn / kafka = {txn / kafka:.2f}x in records/s")
    for system, peer, least in TARGETS:
        mine, theirs = by.get(system, {}).get("records_per_s"), by.get(peer, {}).get("records_per_s")
        ratio = mine / theirs if mine and theirs else None
        verdict = ("met" if ratio >= least else "missed") if ratio else "not measured"
        out.append({"system": system, "peer": peer, "at_least": least, "ratio": ratio, "verdict": verdict})
        print(f"target (issue 44): {system} >= {least:g}x {peer} in records/s: "
              + (f"{ratio:.2f}x, {verdict}" if ratio else verdict))
    for what, why in skipped.items():
        print(f"skipped {what}: {why}")
    return out


if __name__ == "__main__":
    sys.exit(main())
