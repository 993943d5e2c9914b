"""What a run measures: the cases (Job), their sizes, counts and topologies, and the command line.

Strategy: every front end (``python -m bench``, ``bench.local``, ``bench.tcp``,
``bench.durability``, ``bench.streams``) turns its options into a list of Jobs here; the
harness runs any Job against any adapter, so a front end is only a choice of systems and
cases. A StreamJob names the module its processes run (bench.stream_roles: P appenders,
one reader) instead of bench.roles, a ProduceJob bench.produce_roles (P producers, no
consumer).
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from typing import ClassVar

from bench.adapters import SYSTEMS

BASELINE = "mpqueue"
OWN = tuple(s for s in SYSTEMS if s.startswith("shmq"))  # shmq's own variants; every other system is a peer
DEFAULT_SIZES = (64, 1024, 65536, 2**20)
QUICK_SIZES = (64, 65536)
TOPOLOGIES = (1, 4)  # producers = consumers per case
BATCH = 64
RTT_SIZE = 64
RTT_TRIPS = 10_000
WARMUP = 200
QUEUE_BYTES = 64 * 2**20
RECORD_SLACK = 64  # bytes of room per message above its body (shmq's record header, faster-fifo's framing)
MAX_MESSAGE_BYTES = 2**20
START_TIMEOUT = 30.0
N_ANCHORS = ((64, 200_000), (1024, 100_000), (65536, 20_000))
QUICK_SCALE = 20  # --quick: N / 20
QUICK_MULTI = ("shmq", "mpqueue", "faster-fifo", "zmq")  # the systems run 4 -> 4 with --quick (shared queue and mesh)
# a server per message (a round trip, or a Python event loop's turn): fewer messages, per message / batched,
# so that a run lasts seconds, not minutes
FEWER = {"shmq-tcp": (20, 1), "redis": (10, 1), "rabbitmq": (20, 20), "nats-core": (4, 1)}

DURABILITY_SIZE = 64
# (label, durability of the queues, the server's --fsync)
DURABILITY_MODES = (("memory", "memory", "batch:2"), ("snapshot", "snapshot", "batch:2"),
                    ("wal batch:2", "wal", "batch:2"), ("wal always", "wal", "always"))
DURABILITY_COUNTS = {"full": (200_000, 2_000, 3), "quick": (2_000, 100, 1)}  # messages, round trips, runs
# a mode bound by one fsync per put gets fewer messages, so that every mode's run lasts
# seconds, not milliseconds
DURABILITY_FEWER = {"wal always": 40}


@dataclass(frozen=True)
class Job:
    """One benchmark case, as handed to each of its processes."""

    system: str
    kind: str  # "tput" or "rtt"
    size: int
    mode: str  # "msg" or "batch"
    n: int
    runs: int
    warmup: int = WARMUP
    wait: float = START_TIMEOUT + 30.0  # children's own bound on a barrier wait
    cpus: tuple = ()  # one CPU per role when pinning, else empty
    pairs: int = 1  # P of the shape (tput only)
    mesh: bool = False  # several consumers without a shared queue (set by the harness from the adapter)
    variant: str = ""  # what the system runs as, in progress lines (a durability mode)
    shape: str = "P->P"  # P producers -> P consumers, or one of them fanning out / in ("1->P", "P->1")
    queue_bytes: int = 0  # capacity of a bounded queue; 0: plan.queue_bytes(size)
    roles_module: ClassVar[str] = "bench.roles"  # what its processes run (open_ends, ROLES, WARMUPS)

    @property
    def producers(self):
        return 1 if self.shape == "1->P" else self.pairs

    @property
    def consumers(self):
        return 1 if self.shape == "P->1" else self.pairs

    @property
    def label(self):
        system = f"{self.system} ({self.variant})" if self.variant else self.system
        if self.kind == "rtt":
            return f"{system} rtt {self.size}B"
        return f"{system} tput {self.size}B {self.mode} {self.producers}->{self.consumers}"

    @property
    def roles(self):
        if self.kind == "rtt":
            return ("pinger", "ponger")
        if self.producers == self.consumers == 1:
            return ("producer", "consumer")
        return (tuple(f"producer{i}" for i in range(self.producers))
                + tuple(f"consumer{i}" for i in range(self.consumers)))

    @property
    def share(self):
        """Messages per producer."""
        return self.n // self.producers

    @property
    def channels(self):
        """Queues of the case: two for a ping-pong (there and back), else one."""
        return 2 if self.roles == ("pinger", "ponger") else 1

    def before_run(self, end, specs, runs):
        """Set the channel up for the next run, in the parent (``runs``: the merged results
        so far); a contention case fills or empties its queue, other cases need nothing."""


def queue_bytes(size):
    """Capacity of the bounded queues (shmq, faster-fifo): 64 MiB, or two batches if larger."""
    return max(QUEUE_BYTES, 2 * BATCH * size)


def messages_for(size):
    """Messages per throughput run: anchors at 64 B / 1 KiB / 64 KiB, log-interpolated."""
    (s0, n0), *_, (s_last, n_last) = N_ANCHORS
    if size <= s0:
        return n0
    if size >= s_last:
        return max(1000, int(n_last * s_last / size))
    for (a, na), (b, nb) in zip(N_ANCHORS, N_ANCHORS[1:]):
        if a <= size <= b:
            t = math.log(size / a) / math.log(b / a)
            return int(round(math.exp(math.log(na) + t * math.log(nb / na))))
    raise AssertionError(size)


def pin_cpus(enabled):
    """Two distinct CPUs for a case's two processes, or () if not pinning / not possible."""
    if not enabled or not hasattr(os, "sched_getaffinity"):
        return ()
    usable = sorted(os.sched_getaffinity(0))
    return tuple(usable[-2:]) if len(usable) >= 2 else ()


def plan(systems, sizes, runs, quick, run_timeout, cpus, topologies=TOPOLOGIES):
    """The matrix: every job, interleaving systems so drift hits them alike."""
    scale = QUICK_SCALE if quick else 1
    common = dict(wait=START_TIMEOUT + run_timeout)
    jobs = []
    for pairs in topologies:
        for size in sizes[:1] if quick and pairs > 1 else sizes:
            for mode in ("msg", "batch"):
                for system in systems:
                    if quick and pairs > 1 and system not in QUICK_MULTI:
                        continue
                    slow = FEWER.get(system, (1, 1))[mode == "batch"]
                    n = max(BATCH, messages_for(size) // scale // slow) // pairs * pairs
                    jobs.append(Job(system, "tput", size, mode, n, runs, pairs=pairs,
                                    cpus=cpus if pairs == 1 else (), **common))
    common["cpus"] = cpus
    for system in systems:
        jobs.append(Job(system, "rtt", RTT_SIZE, "msg", RTT_TRIPS // scale, runs, **common))
    return jobs


@dataclass(frozen=True)
class ProduceJob(Job):
    """P producers (``pairs``) and no consumer: each puts its share of ``n``, one blocking
    send per message (``mode`` "msg") or pipelined ("pipe": sent without waiting for each
    confirmation, then flushed). ``kind`` "tput" times the run until every producer has
    flushed; "rtt" (one producer) times each send. Before each run the parent takes out
    what the last one put, so every run puts into an empty queue (bench.produce_roles)."""

    shape: str = "P->0"
    roles_module: ClassVar[str] = "bench.produce_roles"

    @property
    def consumers(self):
        return 0

    @property
    def label(self):
        what = "one put" if self.kind == "rtt" else f"put {self.mode}"
        return f"{self.system} {what} {self.size}B {self.producers}->0"

    @property
    def roles(self):
        return tuple(f"worker{i}" for i in range(self.producers))

    def before_run(self, end, specs, runs):
        from bench.produce_roles import empty

        empty(self, end, specs, runs)


# ---------------------------------------------------------------- over TCP (python -m bench.tcp)

# bench.tcp's cases, by their command-line names
TCP_CASES = {
    "pingpong": "a round trip over two queues: put, get + ack there, put, get + ack back (64 B)",
    "put": "one blocking put, its latency (64 B)",
    "msg": "P producers -> P consumers, one message per call, each acked",
    "batch": "P producers -> P consumers, 64 per call, acked together",
    "pipe": "P producers alone, pipelined: sent without waiting for each confirmation, flushed at the end",
}
TCP_SIZES = (64, 1024)
TCP_COUNT = 20_000  # messages per run, per message; batched and pipelined runs move TCP_MORE x as many
TCP_MORE = 5
TCP_TRIPS = RTT_TRIPS  # round trips (ping-pong) and puts (one put) per run
TCP_QUICK_SCALE = 20  # --quick: counts / 20


def _fit(n, pairs):
    """``n`` rounded down to whole batches per producer (one batch each at least)."""
    return max(1, n // pairs // BATCH) * BATCH * pairs


def plan_tcp(systems, cases=tuple(TCP_CASES), sizes=TCP_SIZES, pairs=TOPOLOGIES, count=TCP_COUNT,
             trips=TCP_TRIPS, runs=3, run_timeout=60.0, cpus=()):
    """bench.tcp's cases in the order of TCP_CASES, systems interleaved in each: the 64 B
    ping-pong and one put (``trips`` each), then per message (``count`` messages), batched
    and pipelined (TCP_MORE x count) at every size and P. A shmq queue holds all a run
    puts (Redis's lists are unbounded: neither side waits for room). A 1 -> 1 case (and
    a lone producer) is pinned to ``cpus``."""
    common = dict(runs=runs, wait=START_TIMEOUT + run_timeout)
    jobs = []
    for case in TCP_CASES:
        if case not in cases:
            continue
        if case in ("pingpong", "put"):
            kind = Job if case == "pingpong" else ProduceJob
            jobs += [kind(system, "rtt", RTT_SIZE, "msg", trips, cpus=cpus, **common) for system in systems]
            continue
        for size in sizes:
            for p in pairs:
                n = _fit(count if case == "msg" else TCP_MORE * count, p)
                room = max(queue_bytes(size), (n + (WARMUP + 1) * p) * (size + RECORD_SLACK))
                kind = ProduceJob if case == "pipe" else Job
                jobs += [kind(system, "tput", size, case, n, pairs=p, cpus=cpus if p == 1 else (), queue_bytes=room,
                              **common) for system in systems]
    return jobs


def durability_messages(label, count):
    """Messages per run for a durability mode (see DURABILITY_FEWER)."""
    return max(100, count // DURABILITY_FEWER.get(label, 1))


def plan_durability(count, trips, runs, run_timeout, cpus):
    """[(label, durability, fsync, [throughput job, ping-pong job])], one per mode, local attach to shmq."""
    out = []
    for label, durability, fsync in DURABILITY_MODES:
        common = dict(runs=runs, cpus=cpus, variant=label, wait=START_TIMEOUT + run_timeout)
        jobs = [Job("shmq", "tput", DURABILITY_SIZE, "msg", durability_messages(label, count), **common),
                Job("shmq", "rtt", DURABILITY_SIZE, "msg", trips, **common)]
        out.append((label, durability, fsync, jobs))
    return out


# ---------------------------------------------------------------- sizes and the command line


def size_label(size):
    """65536 -> '64 KiB'."""
    if size % 2**20 == 0:
        return f"{size // 2**20} MiB"
    if size % 1024 == 0:
        return f"{size // 1024} KiB"
    return f"{size} B"


def parse_size(text):
    """'64k' -> 65536 ('1m', '1MiB', '64' accepted)."""
    text = text.strip().lower().removesuffix("b").removesuffix("i")
    mult = {"k": 1024, "m": 2**20}.get(text[-1:], 1)
    return int(text[:-1] if mult > 1 else text) * mult


def csv(text, allowed=None):
    """A comma list, each item checked against ``allowed``."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if allowed is not None:
        bad = [x for x in items if x not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(bad)}; choose from {', '.join(allowed)}")
    return items


def parse_args(argv=None, prog="python -m bench", description="", **defaults):
    """The matrix's options; a front end changes their ``defaults`` (bench.local: no JSON, plot or durability)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--quick", action="store_true", help="small matrix, 1 run, N / 20: under a minute")
    p.add_argument("--runs", type=int, default=None, help="runs per case (default 5; 1 with --quick)")
    p.add_argument("--json", metavar="PATH", default="bench/results/bench.json")
    p.add_argument("--plot", metavar="PATH", default="bench/results/bench.png")
    p.add_argument("--systems", type=lambda t: csv(t, SYSTEMS), default=list(SYSTEMS),
                   help=f"comma list from {','.join(SYSTEMS)}")
    p.add_argument("--sizes", type=lambda t: [parse_size(x) for x in csv(t)], default=None,
                   help="message sizes (64,1k,64k,1m); default all four, 64 and 64k with --quick")
    p.add_argument("--pairs", type=lambda t: [int(x) for x in csv(t)], default=list(TOPOLOGIES),
                   help="P for the P producers -> P consumers cases (default 1,4)")
    p.add_argument("--no-rtt", action="store_true", help="skip the ping-pong latency cases")
    p.add_argument("--run-timeout", type=float, default=None,
                   help="seconds allowed per run before the case is a timeout (default 60; 10 with --quick)")
    p.add_argument("--no-durability", dest="durability", action="store_false")
    p.add_argument("--no-streams", dest="streams", action="store_false",
                   help="skip the streams (python -m bench.streams: 64 B and 1 KiB; 64 B with --quick)")
    p.add_argument("--no-pin", dest="pin", action="store_false",
                   help="let the OS place a case's two processes (default: pin them to two distinct CPUs)")
    p.add_argument("--report", metavar="JSON",
                   help="run nothing: print the tables of a saved run and draw its plot (to --plot)")
    p.set_defaults(**defaults)
    args = p.parse_args(argv)
    args.runs = args.runs or (1 if args.quick else 5)
    args.sizes = args.sizes or list(QUICK_SIZES if args.quick else DEFAULT_SIZES)
    args.run_timeout = args.run_timeout or (10.0 if args.quick else 60.0)
    if args.runs < 1 or any(s < 1 for s in args.sizes) or any(n < 1 for n in args.pairs):
        p.error("--runs, --sizes and --pairs must be positive")
    return args


# ---------------------------------------------------------------- streams (python -m bench.streams)

STREAM_SIZES = (64, 1024)
STREAM_QUICK_SIZES = (64,)
STREAM_PRODUCERS = (1, 4)  # P producers -> 1 consumer
STREAM_READS = ("group", "offset")  # through a consumer group (poll + commit) / plain reads by offset
# records per run of shmq's local stream, per record / batched (a run lasts ~1 s here)
STREAM_N = {64: (30_000, 200_000), 1024: (24_000, 100_000)}
# the servers answer a request per call: fewer records (per record / batched), so a run lasts ~1-2 s too
STREAM_FEWER = {"shmq-stream-tcp": (12, 8), "redis-streams": (12, 8), "nats-js": (12, 8)}
STREAM_QUICK_SCALE = 20
KAFKA_REFERENCE = {  # a published figure, not measured here
    "records_per_s": 821_557, "size": 100,
    "what": "Kafka 0.8.1, 1 producer thread, no replication, 100 B records, 6 partitions, 3 brokers on other "
            "machines (6-core Xeon, 1 GbE), producing only",
    "source": "J. Kreps, \"Benchmarking Apache Kafka: 2 Million Writes Per Second (On Three Cheap Machines)\", "
              "LinkedIn Engineering, 2014",
}


@dataclass(frozen=True)
class StreamJob(Job):
    """A stream case: ``pairs`` producers append, one consumer reads every record, through
    a consumer group (``read`` "group") or by offset ("offset"); ``kind`` is ``read``."""

    partitions: int = 1  # of shmq's stream: one per producer
    shape: str = "P->1"
    roles_module: ClassVar[str] = "bench.stream_roles"

    @property
    def read(self):
        return self.kind

    @property
    def label(self):
        return f"{self.system} {size_label(self.size)} {self.mode} {self.pairs}->1 {self.kind}"

    @property
    def roles(self):
        producers = ("producer",) if self.pairs == 1 else tuple(f"producer{i}" for i in range(self.pairs))
        return producers + ("consumer",)


def stream_records(system, size, mode, scale=1):
    """Records per run of a stream case (a multiple of 4 x 64, so every producer's share is whole batches)."""
    batched = mode == "batch"
    anchor = STREAM_N[size][batched] if size in STREAM_N else max(1000, STREAM_N[1024][batched] * 1024 // size)
    fewer = STREAM_FEWER.get(system, (1, 1))[batched]
    unit = max(STREAM_PRODUCERS) * BATCH
    return max(unit, anchor // scale // fewer // unit * unit)


def plan_streams(systems, sizes, runs, quick, run_timeout, cpus, producers=STREAM_PRODUCERS, reads=STREAM_READS):
    """The stream matrix, interleaving systems so drift hits them alike (--quick: N / 20)."""
    scale = STREAM_QUICK_SCALE if quick else 1
    jobs = []
    for p in producers:
        for size in sizes:
            for mode in ("msg", "batch"):
                for read in reads:
                    for system in systems:
                        jobs.append(StreamJob(system, read, size, mode, stream_records(system, size, mode, scale),
                                              runs, pairs=p, partitions=p, cpus=cpus if p == 1 else (),
                                              wait=START_TIMEOUT + run_timeout))
    return jobs


# ---------------------------------------------------------------- contention (python -m bench.contention)

# (system, kind, mode): its row's name, in the table's order (the five first)
CONTENTION_OPS = {
    ("shmq", "put", "msg"): "shmq put, per message",
    ("shmq", "take", "msg"): "shmq get + ack, per message",
    ("shmq", "take", "batch"): "shmq get_many(64) + ack_many",
    ("faster-fifo", "take", "msg"): "faster-fifo get, per message",
    ("faster-fifo", "take", "batch"): "faster-fifo get_many(64)",
    ("shmq", "put", "batch"): "shmq put_many(64)",
    ("faster-fifo", "put", "msg"): "faster-fifo put, per message",
    ("faster-fifo", "put", "batch"): "faster-fifo put_many(64)",
    ("shmq-noack", "take", "msg"): "shmq get(ack=False), per message",
    ("shmq-noack", "take", "batch"): "shmq get_many(64, ack=False)",
}
CONTENTION_SYSTEMS = ("shmq", "faster-fifo")
CONTENTION_SECONDS = 0.5  # each worker's run
CONTENTION_FILL = 2**21  # messages a take run starts with (and a put run has room for)


@dataclass(frozen=True)
class ContentionJob(Job):
    """N (``pairs``) workers that only put into one queue (``kind`` "put": it starts empty)
    or only take from it ("take": it starts with ``n`` messages), each for ``seconds`` or
    until it has done its share of ``n``; one message per call or 64 (``mode``)."""

    seconds: float = CONTENTION_SECONDS
    shape: str = "N"
    roles_module: ClassVar[str] = "bench.contention_roles"

    @property
    def label(self):
        return f"{CONTENTION_OPS.get((self.system, self.kind, self.mode), self.system)}, N = {self.pairs}"

    @property
    def roles(self):
        return tuple(f"worker{i}" for i in range(self.pairs))

    @property
    def share(self):
        """The most messages one worker puts or takes in a run."""
        return self.n // self.pairs

    def before_run(self, end, specs, runs):
        from bench.contention_roles import prepare

        prepare(self, end, specs, runs)


def plan_contention(ops, workers, size, runs, seconds, fill, run_timeout):
    """A case per (system, kind, mode) in ``ops`` and N in ``workers``; ops interleaved per N."""
    common = dict(seconds=seconds, wait=START_TIMEOUT + run_timeout, queue_bytes=fill * (size + RECORD_SLACK))
    return [ContentionJob(system, kind, size, mode, fill, runs, pairs=n, **common)
            for n in workers for system, kind, mode in ops]
