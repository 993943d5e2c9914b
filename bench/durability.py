"""Put throughput and ping-pong latency per durability mode, in one run:
``python -m bench.durability``.

A ``shmq server --data-dir`` (snapshots every second) runs for the whole run, as in
production; for each mode (memory, snapshot, wal with ``--fsync batch:2``, wal with
``--fsync always``) a local producer process puts 64 B messages one at a time while a
consumer process gets and acks them, and a ping-pong measures the round trip. Figures
are medians of ``--runs`` runs; ratios are against memory mode.
"""

import argparse
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import shmq
from bench.local import percentile

WARMUP = 200  # round trips before the measured ones
PERCENTILES = (("rtt_p50_us", 0.50), ("rtt_p99_us", 0.99), ("rtt_p999_us", 0.999))
# messages per run for a mode, as a divisor of the count: a mode bound by one fsync per
# put gets fewer, so that every mode's run lasts seconds, not milliseconds
FEWER = {"wal always": 40}
MODES = (("memory", "memory", "batch:2"), ("snapshot", "snapshot", "batch:2"),
         ("wal batch:2", "wal", "batch:2"), ("wal always", "wal", "always"))


def messages(label, count):
    """Messages per run for a mode (see FEWER)."""
    return max(100, count // FEWER.get(label, 1))


def _producer(ns, name, n, barrier):
    q = shmq.connect(namespace=ns).queue(name)
    body = b"x" * 64
    barrier.wait(60)
    for _ in range(n):
        q.put(body)


def _consumer(ns, name, n, barrier, out):
    q = shmq.connect(namespace=ns).queue(name)
    barrier.wait(60)
    t0 = time.perf_counter()
    for _ in range(n):
        q.get(timeout=60).ack()
    out.put(n / (time.perf_counter() - t0))


def _echo(ns, a, b, n):
    broker = shmq.connect(namespace=ns)
    qa, qb = broker.queue(a), broker.queue(b)
    for _ in range(n):
        d = qa.get(timeout=60)
        d.ack()
        qb.put(d.body)


def _server(ns, data_dir, fsync):
    proc = subprocess.Popen([sys.executable, "-m", "shmq.cli", "server", "--namespace", ns, "--port", "0",
                             "--data-dir", data_dir, "--fsync", fsync], stderr=subprocess.PIPE, text=True)
    while "serving namespace" not in proc.stderr.readline():
        if proc.poll() is not None:
            raise RuntimeError("shmq server did not start")
    return proc


def run_mode(ctx, label, durability, fsync, n, trips, runs):
    ns = "bd" + uuid.uuid4().hex[:8]
    data_dir = tempfile.mkdtemp(prefix="bench-dur-")
    server = _server(ns, data_dir, fsync)
    broker = shmq.connect(namespace=ns)
    try:
        rates, rtts = [], []
        for r in range(runs):
            print(f"  {label}: run {r + 1}/{runs}", file=sys.stderr, flush=True)
            name = f"tput{r}"
            broker.create_queue(name, durability=durability)
            _open_log(broker, name, durability)
            barrier, out = ctx.Barrier(2), ctx.Queue()
            ps = [ctx.Process(target=_producer, args=(ns, name, n, barrier)),
                  ctx.Process(target=_consumer, args=(ns, name, n, barrier, out))]
            for p in ps:
                p.start()
            rates.append(out.get(timeout=300))
            for p in ps:
                p.join(60)
            a, b = f"ping{r}", f"pong{r}"
            qa = broker.create_queue(a, durability=durability)
            qb = broker.create_queue(b, durability=durability)
            _open_log(broker, a, durability)
            _open_log(broker, b, durability)
            echo = ctx.Process(target=_echo, args=(ns, a, b, WARMUP + trips))
            echo.start()
            samples = []
            for i in range(WARMUP + trips):  # the first trips wait for the echo process to start
                t0 = time.perf_counter_ns()
                qa.put(b"x" * 64)
                qb.get(timeout=60).ack()
                if i >= WARMUP:
                    samples.append(time.perf_counter_ns() - t0)
            echo.join(60)
            samples.sort()
            rtts.append({key: percentile(samples, q) / 1000 for key, q in PERCENTILES})
        row = {"mode": label, "msgs_per_s": statistics.median(rates), "min": min(rates), "max": max(rates)}
        row.update({key: statistics.median(r[key] for r in rtts) for key, _ in PERCENTILES})
        return row
    finally:
        broker.close()
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        shmq.destroy_namespace(ns)
        for entry in os.listdir(data_dir):
            os.unlink(os.path.join(data_dir, entry))
        os.rmdir(data_dir)


def _open_log(broker, name, durability):
    """The server opens new wal queues' logs within a snapshot interval; do not wait."""
    if durability == "wal":
        q = broker.queue(name)
        deadline = time.monotonic() + 5
        while not q.wal_config()[0] and time.monotonic() < deadline:
            time.sleep(0.01)
        q.close()


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.durability", description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--count", type=int, default=200_000, help="messages per run (wal always: 1/40 of it)")
    ap.add_argument("--trips", type=int, default=2_000)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    runs, n, trips = (1, args.count // 10, args.trips // 10) if args.quick else (args.runs, args.count, args.trips)
    ctx = mp.get_context("spawn")
    print(f"shmq durability modes: 64 B, 1 producer -> 1 consumer (put / get + ack), median of {runs} runs")
    results = [run_mode(ctx, label, durability, fsync, messages(label, n), trips, runs)
               for label, durability, fsync in MODES]
    base = results[0]["msgs_per_s"]
    print(f"\n{'mode':12s} {'msgs/s':>10s}  {'(min .. max)':>22s}  {'vs memory':>9s}  "
          f"{'RTT p50 us':>10s}  {'p99':>8s}  {'p99.9':>8s}")
    for r in results:
        print(f"{r['mode']:12s} {r['msgs_per_s']:10,.0f}  ({r['min']:>9,.0f} .. {r['max']:>9,.0f})  "
              f"{r['msgs_per_s'] / base:8.2f}x  {r['rtt_p50_us']:10.1f}  {r['rtt_p99_us']:8.1f}  {r['rtt_p999_us']:8.1f}")


if __name__ == "__main__":
    main()
