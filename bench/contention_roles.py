"""What each process of a contention case does, and how the parent sets its queue up.

Strategy: as in bench/roles.py a worker sees only its Ends and the Job (a
plan.ContentionJob), so one body of code measures every system. N workers do one
operation only, all on one queue: put into it (it starts empty and has room for all a
run can put) or take from it (it starts with ``job.n`` messages, so a take never waits
for a producer). Each worker times itself from the barrier's release for
``job.seconds``, or until it has done its share of ``job.n`` (then the run was short:
the queue held too little for that rate); the harness adds their counts. Between
runs the parent refills what a take run took, or drains what a put run put, through
Ends of its own, before the next release (``prepare``).
"""

from __future__ import annotations

import time

from bench.plan import BATCH

CHECK_EVERY = 32  # per-message calls between two looks at the clock


def open_ends(role, job, end, specs):
    """[sender, receiver] on the case's queue: a worker warms up with both, then uses one."""
    return [end(specs[0], "send"), end(specs[0], "recv")]


def _bodies(job):
    return [bytes([i]) * job.size for i in range(BATCH)]


def work(job, ends):
    """Put or take (``job.kind``) for ``job.seconds`` or ``job.share`` messages, whichever
    comes first; returns the time, the count and which of the two ended it."""
    tx, rx = ends
    cap, batched = job.share, job.mode == "batch"
    full = _bodies(job)
    body = full[0]
    clock = time.perf_counter
    count = 0
    t0 = clock()
    deadline = t0 + job.seconds
    while count < cap:
        if job.kind == "put":
            if batched:
                k = min(BATCH, cap - count)
                tx.send_batch(full if k == BATCH else full[:k])
            else:
                k = min(CHECK_EVERY, cap - count)
                for _ in range(k):
                    tx.send(body)
        elif batched:
            k = len(rx.recv_batch(min(BATCH, cap - count)))
        else:
            k = min(CHECK_EVERY, cap - count)
            for _ in range(k):
                rx.recv()
        count += k
        if clock() >= deadline:
            break
    seconds = clock() - t0
    return {"seconds": seconds, "got": count, "until": "cap" if count >= cap and seconds < job.seconds else "time"}


def warm(job, ends, total):
    """Before the first run: put job.warmup messages, then take as many (any worker's)."""
    tx, rx = ends
    body = _bodies(job)[0]
    for _ in range(job.warmup):
        tx.send(body)
    tx.flush()
    for _ in range(job.warmup):
        rx.recv()


def fill(job, end, specs, n):
    """Put ``n`` messages into the case's queue, 64 per call, from this (the parent) process."""
    tx = end(specs[0], "send")
    try:
        full = _bodies(job)
        for start in range(0, n, BATCH):
            k = min(BATCH, n - start)
            tx.send_batch(full if k == BATCH else full[:k])
        tx.flush()
    finally:
        tx.close()


def drain(job, end, specs, n):
    """Take ``n`` messages out of the case's queue, up to 64 per call."""
    rx = end(specs[0], "recv")
    try:
        got = 0
        while got < n:
            got += len(rx.recv_batch(min(BATCH, n - got)))
    finally:
        rx.close()


def prepare(job, end, specs, runs):
    """Before each run, in the parent: a take case's queue holds job.n messages, a put
    case's is empty. Before the first, the whole queue is written once (put cases: then
    drained), so that no run is the first to touch its memory."""
    if not runs:
        fill(job, end, specs, job.n)
        if job.kind == "put":
            drain(job, end, specs, job.n)
        return
    (fill if job.kind == "take" else drain)(job, end, specs, runs[-1]["n"])


ROLES = {"worker": work}
WARMUPS = {"worker": warm}
