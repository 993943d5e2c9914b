"""What each work-queue option costs per message: ``python -m bench.options``.

One process, 64 B bodies, put + get + ack per message (microseconds, median of 5 runs),
for a plain queue and for each option, at two depths: a queue that holds one message
at a time (put, get, ack, repeat) and one filled with ``DEPTH`` messages before they are
taken (the general take walks the ring, so its cost grows with the depth: this shows
by how much). The plain queue runs the C hot paths when they are built; every option
runs the general take (docs/DESIGN.md, "Work-queue options").
"""

import statistics
import time
import uuid

import shmq
from shmq.engine.shm import cpaths

N = 5_000
DEPTH = 1_000
RUNS = 5
BODY = b"x" * 64

# (name, create_queue options, put options as a function of the message's index)
CASES = [
    ("plain", {}, lambda i: {}),
    ("priority (3 levels)", {"priorities": 3}, lambda i: {"priority": i % 3}),
    ("ttl", {}, lambda i: {"ttl": 3600.0}),
    ("queue message_ttl", {"message_ttl": 3600.0}, lambda i: {}),
    ("group (8 groups)", {}, lambda i: {"group": "g%d" % (i % 8)}),
    ("dedup_id", {}, lambda i: {"dedup_id": "id%d" % i}),
    ("prefetch 100 (handle)", {"_prefetch": 100}, lambda i: {}),
]


def _one_at_a_time(q, opts):
    t = time.perf_counter()
    for i in range(N):
        q.put(BODY, **opts(i))
        q.get(timeout=0).ack()
    return (time.perf_counter() - t) / N * 1e6


def _batched(q, opts, groups):
    # DEPTH messages put, then taken one get at a time (each get walks what is left)
    t = time.perf_counter()
    done = 0
    while done < N:
        for i in range(done, done + DEPTH):
            q.put(BODY, **opts(i))
        for _ in range(DEPTH):
            q.get(timeout=0).ack()
        done += DEPTH
    return (time.perf_counter() - t) / N * 1e6


def run_case(create, opts, batched):
    ns = "bo" + uuid.uuid4().hex[:8]
    broker = shmq.connect(namespace=ns)
    try:
        create = dict(create)
        prefetch = create.pop("_prefetch", None)
        broker.create_queue("q", max_bytes=64 << 20, **create)
        q = broker.queue("q", prefetch=prefetch)
        groups = 8 if "group" in opts(0) else 0
        runs = []
        for r in range(RUNS):
            offset = r * 10 * N  # dedup ids new in every run
            shifted = (lambda i, o=offset: opts(i + o))
            runs.append(_batched(q, shifted, groups) if batched else _one_at_a_time(q, shifted))
        q.close()
        return statistics.median(runs)
    finally:
        broker.close()
        shmq.destroy_namespace(ns)


def main():
    print(f"shmq work-queue options, one process, 64 B, put + get + ack, {N} messages, "
          f"median of {RUNS} runs (microseconds per message; C hot paths: {cpaths.FAST})")
    print(f"{'option':24} {'depth 1':>9} {'x plain':>8} {'depth %d' % DEPTH:>11} {'x plain':>8}")
    base = None
    for name, create, opts in CASES:
        one = run_case(create, opts, False)
        deep = run_case(create, opts, True)
        if base is None:
            base = (one, deep)
        print(f"{name:24} {one:9.2f} {one / base[0]:7.1f}x {deep:11.2f} {deep / base[1]:7.1f}x")


if __name__ == "__main__":
    main()
