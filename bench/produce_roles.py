"""What the processes of a producers-only case do (a plan.ProduceJob), and how the parent
empties its queue between runs.

Strategy: as in bench/roles.py a worker sees only its Ends and the Job, so one body of
code measures every system. Each of P workers puts its share of ``job.n``: one blocking
``send`` per message (``mode`` "msg"), or ``send_pipelined`` ("pipe": the system
confirms later; ``flush`` returns once every one is confirmed). A "tput" case times the
run from the barrier's release until the flush; an "rtt" case (one worker) times each
send on its own. No consumer runs, so the parent takes out what a run put before the
next (``empty``): every run puts into an empty queue, as the first did.
"""

from __future__ import annotations

import time

from bench.contention_roles import drain
from bench.roles import latency_summary


def open_ends(role, job, end, specs):
    """[sender] on the case's queue."""
    return [end(specs[0], "send")]


def _put(job, tx, count):
    """``count`` bodies of ``job.size`` bytes, as ``job.mode`` says, then a flush."""
    body = b"x" * job.size
    send = tx.send_pipelined if job.mode == "pipe" else tx.send
    for _ in range(count):
        send(body)
    tx.flush()


def work(job, ends):
    """Put this worker's share: the time until it is confirmed ("tput"), or each send's ("rtt")."""
    tx = ends[0]
    if job.kind == "rtt":
        body = b"x" * job.size
        clock = time.perf_counter_ns
        samples = []
        for _ in range(job.share):
            t0 = clock()
            tx.send(body)
            samples.append(clock() - t0)
        return latency_summary(samples)
    t0 = time.perf_counter()
    _put(job, tx, job.share)
    return {"seconds": time.perf_counter() - t0, "got": job.share}


def warm(job, ends, total):
    """Before the first run: connect and put job.warmup messages the same way (taken out by ``empty``)."""
    _put(job, ends[0], job.warmup)


def empty(job, end, specs, runs):
    """Before each run, in the parent: take out what was put since the last one (the
    workers' warm-up before the first run, job.n after each)."""
    drain(job, end, specs, job.n if runs else job.warmup * job.producers)


ROLES = {"worker": work}
WARMUPS = {"worker": warm}
