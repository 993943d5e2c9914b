"""What each process of a case does: produce, consume, ping, pong, and their warm-ups.

Strategy: a role sees only its Ends (bench/adapters) and the Job, so one body of code
measures every system. Several consumers (P -> P, 1 -> P) of a shared queue stop at a stop
message (an empty body): each producer sends its part of one stop per consumer after its
last message, so a stop is taken only once the messages put before it were (FIFO, or FIFO
per lane), and a consumer that took more than one puts the extras back; the consumers count
apart, with nothing shared per message (a counter locked per message would make the harness
the bottleneck it means to measure: one lock convoy across every consumer). A system whose
consumers take messages ahead of their receives (``End.takes_ahead``: a broker's prefetch)
breaks that order, so its consumers count in one shared total instead, and the one whose
message brings it to n stops the others (its few thousand messages a second pay nothing
for the lock). On a mesh (no
shared queue) a consumer stops when an idle poll finds the shared count complete, and its
time is that of its last message. A lone consumer (1 -> 1, P -> 1) receives exactly n.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import replace

from bench.plan import BATCH

POLL_SECONDS = 0.02  # a mesh consumer's idle poll, after which it checks the shared count


def open_ends(role, job, end, specs):
    """Open the Ends a role uses: [sender] / [receiver] / [sender, receiver] (pinger) / [receiver, sender]."""
    if job.mesh:
        kind = role.rstrip("0123456789")
        index = int(role[len(kind):])
        return [end(specs[0], "send" if kind == "producer" else "recv", index, job.producers)]
    if role.startswith("producer"):
        return [end(specs[0], "send")]
    if role.startswith("consumer"):
        return [end(specs[0], "recv")] + ([end(specs[0], "send")] if job.consumers > 1 else [])
    if role == "pinger":
        return [end(specs[0], "send"), end(specs[1], "recv")]
    return [end(specs[0], "recv"), end(specs[1], "send")]


def batches(n):
    """Sizes of the batches that make up n messages."""
    full, rest = divmod(n, BATCH)
    return [BATCH] * full + ([rest] if rest else [])


def stops_of(job, index) -> int:
    """How many stop messages producer ``index`` sends after its messages: one per consumer
    of a shared queue in all, shared out among the producers."""
    if job.consumers <= 1 or job.mesh:
        return 0
    return job.consumers // job.producers + (index < job.consumers % job.producers)


def produce(job, ends, index=0):
    """Send this producer's share of job.n messages, one per call or in batches of 64, then
    its stop messages."""
    tx = ends[0]
    if job.mode == "batch":
        # distinct objects: one pickle of 64 references to one bytes object would hold one body
        full = [bytes([i]) * job.size for i in range(BATCH)]
        for count in batches(job.share):
            tx.send_batch(full if count == BATCH else full[:count])
    else:
        body = b"x" * job.size
        for _ in range(job.share):
            tx.send(body)
    if not tx.takes_ahead:
        _stop(job, tx, stops_of(job, index))
    tx.flush()
    return {}


def _stop(job, tx, count):
    """Send ``count`` empty stop messages, one per call (a batch of one in batch mode)."""
    for _ in range(count):
        if job.mode == "batch":
            tx.send_batch([b""])
        else:
            tx.send(b"")


def _bodies(job, rx):
    """The next message(s) of a consumer, as a list (empty bytes = stop)."""
    if job.mode == "batch":
        return list(rx.recv_batch(BATCH))
    return [rx.recv()]


def consume_shared(job, ends, total):
    """One of several consumers of a shared queue: receive until a stop message (a consumer
    that took more than one puts the extras back, so each takes exactly one); its count is
    its own, summed by the harness. A consumer that takes ahead (``End.takes_ahead``) also
    counts in ``total``, and the one that brings it to n stops the others."""
    rx, tx = ends
    counted = rx.takes_ahead
    got = nbytes = 0
    t0 = time.perf_counter()
    while True:
        bodies = _bodies(job, rx)
        data = [b for b in bodies if b]
        stops = len(bodies) - len(data)
        got += len(data)
        nbytes += sum(map(len, data))
        if counted and data:
            with total.get_lock():
                before = total.value
                after = total.value = before + len(data)
            if before < job.n <= after:  # exactly one consumer crosses n (both ends read under the lock)
                rx.release()  # whatever was prefetched for it goes to the others, before the stops
                _stop(job, tx, job.consumers - 1)
                tx.flush()
                break
        if stops:
            rx.release()  # what its system prefetched for it goes to the others
            _stop(job, tx, stops - 1)
            tx.flush()
            break
    if nbytes != got * job.size:
        raise AssertionError(f"received {nbytes} B in {got} msgs of {job.size} B")
    return {"seconds": time.perf_counter() - t0, "got": got}


def consume_polled(job, ends, total):
    """One of several mesh consumers: receive until the shared total reaches n.

    Its time is that of its last message, so the idle poll that ends it is not counted.
    """
    rx = ends[0]
    got = nbytes = 0
    t0 = last = time.perf_counter()
    while True:
        bodies = rx.poll_batch(job.mode == "batch", POLL_SECONDS)
        if bodies:
            last = time.perf_counter()
            got += len(bodies)
            nbytes += sum(map(len, bodies))
            with total.get_lock():
                total.value += len(bodies)
        elif total.value >= job.n:  # every message has reached some consumer: none is in flight
            break
    if nbytes != got * job.size:
        raise AssertionError(f"received {nbytes} B in {got} msgs of {job.size} B")
    return {"seconds": last - t0, "got": got}


def consume(job, ends, total=None):
    """Receive exactly job.n messages; time from release until the last one."""
    if job.consumers > 1:
        return (consume_polled if job.mesh else consume_shared)(job, ends, total)
    rx = ends[0]
    got = nbytes = 0
    t0 = time.perf_counter()
    if job.mode == "batch":
        while got < job.n:
            bodies = rx.recv_batch(min(BATCH, job.n - got))
            got += len(bodies)
            nbytes += sum(map(len, bodies))
    else:
        while got < job.n:
            nbytes += len(rx.recv())
            got += 1
    seconds = time.perf_counter() - t0
    if got != job.n or nbytes != job.n * job.size:
        raise AssertionError(f"received {got} msgs / {nbytes} B, expected {job.n} / {job.n * job.size}")
    return {"seconds": seconds}


def percentile(ordered, q):
    """Nearest-rank percentile of an ascending list."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def ping(job, ends):
    """job.warmup + job.n round trips; summarize the last job.n in microseconds."""
    tx, rx = ends
    body = b"p" * job.size
    clock = time.perf_counter_ns
    samples = []
    for i in range(job.warmup + job.n):
        t0 = clock()
        tx.send(body)
        reply = rx.recv()
        t1 = clock()
        if len(reply) != job.size:
            raise AssertionError(f"reply of {len(reply)} B, expected {job.size}")
        if i >= job.warmup:
            samples.append(t1 - t0)
    return latency_summary(samples)


def latency_summary(samples):
    """Percentiles, mean and max of nanosecond samples, in microseconds (a run's result)."""
    samples = sorted(samples)
    return {
        "p50_us": percentile(samples, 0.50) / 1e3,
        "p99_us": percentile(samples, 0.99) / 1e3,
        "p999_us": percentile(samples, 0.999) / 1e3,
        "mean_us": statistics.fmean(samples) / 1e3,
        "max_us": samples[-1] / 1e3,
    }


def pong(job, ends):
    """Echo every message of a run back to the pinger."""
    rx, tx = ends
    for _ in range(job.warmup + job.n):
        tx.send(rx.recv())
    return {}


def warm_producer(job, ends, total, index=0):
    """Before the first run: connect and warm both sides up with job.warmup messages (and
    the stops that end the consumers' warm-up)."""
    for _ in range(job.warmup):
        ends[0].send(b"w" * job.size)
    if not ends[0].takes_ahead:
        _stop(replace(job, mode="msg"), ends[0], stops_of(job, index))
    ends[0].flush()


def warm_consumer(job, ends, total):
    """Drain the producers' warm-up messages, as a run of warmup x producers messages."""
    consume(replace(job, n=job.warmup * job.producers, mode="msg"), ends, total)


ROLES = {"producer": produce, "consumer": consume, "pinger": ping, "ponger": pong}
WARMUPS = {"producer": warm_producer, "consumer": warm_consumer}
