"""The engine's hot paths in one process, C against pure Python: ``python -m bench.hotpath``.

Prints microseconds per message (median of 5 runs) for ``put``, ``get`` + ``ack``, and
the three together, with the C hot paths (shmq/_fast.c) and with the Python ones the
engine falls back to; the same for batches of 64 (``put_many``, ``get_many`` +
``ack_many``) and for an auto-ack ``get(ack=False)``; and GB/s of payload for 64 KiB and
1 MiB messages, copied twice (``put`` + ``get`` + ``ack``) and once (``reserve``, the
producer writing the body into the ring, + ``get(copy=False)`` + ``ack``). One process, no
contention: this is the cost of the code itself; bench/local.py measures producers and
consumers in separate processes.
"""

import statistics
import sys
import time
import uuid

import shmq
import shmq.engine.queues.queue  # (``import shmq`` loads the engine on first use; main() reads Queue's signature)
from shmq.engine.shm import cpaths

N = 100_000
RUNS = 5
BATCH = 64
LARGE = ((64 << 10, 4000), (1 << 20, 400))  # (body size, messages per run)


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


def _measure_batch(q, body):
    """(put_many, get_many + ack_many) of BATCH messages, in microseconds per message."""
    bodies = [body] * BATCH
    rounds = N // BATCH
    t0 = time.perf_counter()
    for _ in range(rounds):
        q.put_many(bodies)
    t1 = time.perf_counter()
    for _ in range(rounds):
        q.ack_many(q.get_many(BATCH))
    t2 = time.perf_counter()
    n = rounds * BATCH
    return (t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6


def _measure_autoack(q, body):
    """(put, get(ack=False)) in microseconds per message."""
    t0 = time.perf_counter()
    for _ in range(N):
        q.put(body)
    t1 = time.perf_counter()
    for _ in range(N):
        q.get(None, None, False)
    t2 = time.perf_counter()
    return (t1 - t0) / N * 1e6, (t2 - t1) / N * 1e6


def _measure_large(q, size, n, zero_copy):
    """GB/s of payload through put, get, ack (each message once, one at a time)."""
    body = b"x" * size
    t0 = time.perf_counter()
    for _ in range(n):
        if zero_copy:  # the body copied once, by the producer into the ring; read in place
            with q.reserve(size) as buf:
                buf[:] = body
            d = q.get(None, None, True, False)
            d.body[:8].tobytes()
        else:
            q.put(body)
            d = q.get()
            d.body[:8]
        d.ack()
    return size * n / (time.perf_counter() - t0) / 1e9


def _on_queue(pure, fn, max_bytes=64 << 20):
    cpaths.set_enabled(not pure)
    ns = "hp" + uuid.uuid4().hex[:8]
    broker = shmq.connect(namespace=ns)
    try:
        q = broker.create_queue("q", max_bytes=max_bytes, max_message_bytes=2 << 20)
        q.put(b"warm-up")
        q.get().ack()
        out = fn(q)
        q.close()
    finally:
        broker.close()
        shmq.destroy_namespace(ns)
        cpaths.set_enabled(True)
    return out


def run(pure, size=64, measure=_measure):
    runs = _on_queue(pure, lambda q: [measure(q, b"x" * size) for _ in range(RUNS)])
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def run_large(pure, size, n, zero_copy):
    return _on_queue(pure, lambda q: statistics.median(_measure_large(q, size, n, zero_copy) for _ in range(RUNS)))


def main():
    print(f"shmq hot paths, one process, 64 B, {N} messages, median of {RUNS} runs (microseconds per message)")
    print(f"{'paths':<12} {'put':>7} {'get+ack':>8} {'all':>7}   {'put_many':>8} {'get_many+ack_many':>17} "
          f"{'all':>6}   {'get(ack=False)':>14}")
    impls = [("pure Python", True)]
    if cpaths.FAST:
        impls.append(("C", False))
    else:
        print("(the C hot paths are not built here: pip install -e . with gcc and the Python headers)")
    autoack = "ack" in shmq.engine.queues.queue.Queue.get.__code__.co_varnames
    zero_copy = hasattr(shmq.engine.queues.queue.Queue, "reserve")
    totals = []
    for label, pure in impls:
        put, take = run(pure)
        bput, btake = run(pure, measure=_measure_batch)
        auto = f"{run(pure, measure=_measure_autoack)[1]:14.2f}" if autoack else f"{'-':>14}"
        totals.append(put + take)
        print(f"{label:<12} {put:7.2f} {take:8.2f} {put + take:7.2f}   {bput:8.2f} {btake:17.2f} {bput + btake:6.2f}"
              f"   {auto}")
    if len(totals) == 2:
        print(f"C / Python: {totals[0] / totals[1]:.2f}x faster")
    print("large messages, put + get + ack one at a time (GB/s of payload)")
    for label, pure in impls:
        cells = []
        for size, n in LARGE:
            cells.append(f"{size >> 10:>5} KiB copied {run_large(pure, size, n, False):6.2f}")
            if zero_copy:
                cells.append(f"zero-copy {run_large(pure, size, n, True):6.2f}")
        print(f"{label:<12} " + "   ".join(cells))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
