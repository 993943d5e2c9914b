"""What each process of a stream case does: P producers append, one consumer reads every record.

Strategy: as in bench/roles.py a role sees only its Ends and the Job (a plan.StreamJob),
so one body of code measures every stream system. A producer's End appends (``send``:
one record per call; ``send_batch``: 64 per call) and returns once the system has
confirmed the append; the consumer's End reads through a consumer group or by offset,
as its spec says (``recv_batch(limit)``: at least one and at most ``limit`` records,
committed or acknowledged before it returns in group reads). Per record the consumer
asks for one record per call, batched for 64. The consumer's time runs from the release
until it has read the run's last record; each producer times its own appends.
"""

from __future__ import annotations

import time

from bench.plan import BATCH
from bench.roles import batches


def open_ends(role, job, end, specs):
    """One End per process: a producer's appender ("send"), the consumer's reader ("recv")."""
    return [end(specs[0], "send" if role.startswith("producer") else "recv")]


def produce(job, ends, index=0):
    """Append this producer's share of job.n records, one per call or 64 per call; time it."""
    tx = ends[0]
    t0 = time.perf_counter()
    if job.mode == "batch":
        full = [bytes([i]) * job.size for i in range(BATCH)]
        for count in batches(job.share):
            tx.send_batch(full if count == BATCH else full[:count])
    else:
        body = b"x" * job.size
        for _ in range(job.share):
            tx.send(body)
    return {"seconds": time.perf_counter() - t0}


def consume(job, ends, total=None, n=None):
    """Read exactly ``n`` (job.n) records, one or up to 64 per call; time from release to the last."""
    n = job.n if n is None else n
    rx = ends[0]
    limit = BATCH if job.mode == "batch" else 1
    got = nbytes = 0
    t0 = time.perf_counter()
    while got < n:
        values = rx.recv_batch(min(limit, n - got))
        got += len(values)
        nbytes += sum(map(len, values))
    seconds = time.perf_counter() - t0
    if got != n or nbytes != n * job.size:
        raise AssertionError(f"read {got} records / {nbytes} B, expected {n} / {n * job.size}")
    return {"seconds": seconds}


def warm_producer(job, ends, total, index=0):
    """Before the first run: connect and append job.warmup records, one per call."""
    body = b"w" * job.size
    for _ in range(job.warmup):
        ends[0].send(body)


def warm_consumer(job, ends, total):
    """Read every producer's warm-up records, so each run starts with nothing left to read."""
    consume(job, ends, n=job.warmup * job.pairs)


ROLES = {"producer": produce, "consumer": consume}
WARMUPS = {"producer": warm_producer, "consumer": warm_consumer}
