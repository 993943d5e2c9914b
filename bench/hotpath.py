"""The engine's hot paths in one process, C against pure Python: ``python -m bench.hotpath``.

Prints microseconds per message (median of 5 runs) for ``put``, ``get`` + ``ack``, and
the three together, with the C hot paths (shmq/_fast.c) and with the Python ones the
engine falls back to. One process, no contention: this is the cost of the code itself;
bench/local.py measures producers and consumers in separate processes.
"""

import statistics
import time
import uuid

import shmq
from shmq.engine import cpaths

N = 100_000
RUNS = 5
def _measure(q, body):
    """(put, get + ack) in microseconds per message, one run."""
    t0 = time.perf_counter()
    for _ in range(N):
        q.put(body)
    t1 = time.perf_counter()
    for _ in range(N):
        q.get().ack()
    t2 = time.perf_counter()
    return (t1 - t0) / N * 1e6, (t2 - t1) / N * 1e6


def run(pure, size=64):
    cpaths.set_enabled(not pure)
    ns = "hp" + uuid.uuid4().hex[:8]
    broker = shmq.connect(namespace=ns)
    try:
        q = broker.create_queue("q", max_bytes=64 << 20)
        q.put(b"warm-up")
        q.get().ack()
        runs = [_measure(q, b"x" * size) for _ in range(RUNS)]
        q.close()
    finally:
        broker.close()
        shmq.destroy_namespace(ns)
        cpaths.set_enabled(True)
    put = statistics.median(r[0] for r in runs)
    take = statistics.median(r[1] for r in runs)
    return put, take


def main():
    print(f"shmq hot paths, one process, 64 B, {N} messages, median of {RUNS} runs (microseconds per message)")
    print(f"{'paths':<12} {'put':>7} {'get+ack':>8} {'all':>7}")
    rows = [("pure Python", run(pure=True))]
    if cpaths.FAST:
        rows.append(("C", run(pure=False)))
    else:
        print("(the C hot paths are not built here: pip install -e . with gcc and the Python headers)")
    for label, (put, take) in rows:
        print(f"{label:<12} {put:7.2f} {take:8.2f} {put + take:7.2f}")
    if len(rows) == 2:
        print(f"C / Python: {sum(rows[0][1]) / sum(rows[1][1]):.2f}x faster")


if __name__ == "__main__":
    main()
