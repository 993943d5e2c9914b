"""What appends see while a compacted stream is compacted: ``python -m bench.compaction``.

One appender process appends keyed records (``--keys`` keys, ``--size`` B values, one
per call or ``--batch`` per ``append_many``) to partition 0 for ``--seconds``, timing
every call, in three cases on one stream each:

- ``delete``: a stream that is not compacted (retention drops the oldest records for
  room): the appender alone, the baseline;
- ``housekeeping``: a compacted stream with a real ``shmq server`` of the run's namespace
  doing its housekeeping (every 0.25 s, a run where the dirty ratio reaches 0.5);
- ``continuous``: a compacted stream with a second process compacting it again and again
  (``Stream.compact_now``), the most compaction can take from appends.

Per case, the median over ``--runs`` runs of: appends/s, its ratio to ``delete``, the
p50, p99 and longest append call, and the compaction runs and bytes taken back during
the run (the partition's counters). On 2 CPUs the ``continuous`` compactor takes the
second CPU, so its ratio includes CPU sharing, not only the lock.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time

from bench import harness, provenance
from bench.adapters import run_namespace
from bench.machine import machine_info
from bench.servers import ShmqServer

PROG = "python -m bench.compaction"
CASES = ("delete", "housekeeping", "continuous")


def _append(ns, name, keys, size, batch, seconds, out):
    """The appender: (calls, records, sorted call times in ns) into ``out``."""
    import array

    import shmq

    with shmq.connect(namespace=ns) as b:
        s = b.stream(name)
        value = b"v" * size
        times = array.array("q")
        records = i = 0
        clock = time.perf_counter_ns
        end = clock() + int(seconds * 1e9)
        if batch == 1:
            while True:
                t0 = clock()
                s.append(value, key=b"k%d" % (i % keys), partition=0)
                t1 = clock()
                times.append(t1 - t0)
                i += 1
                if t1 >= end:
                    break
            records = i
        else:
            values = [value] * batch
            while True:
                ks = [b"k%d" % ((i + j) % keys) for j in range(batch)]
                t0 = clock()
                s.append_many(values, keys=ks, partition=0)
                t1 = clock()
                times.append(t1 - t0)
                i += batch
                if t1 >= end:
                    break
            records = i
        s.close()
    out.put((len(times), records, sorted(times)))


def _compact_forever(ns, name, stop):
    import shmq

    with shmq.connect(namespace=ns) as b:
        s = b.stream(name)
        while not stop.is_set():
            s.compact_now()
        s.close()


def _percentile(sorted_ns, q):
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1000


def one_run(ctx, case, args, batch, run):
    """One run of ``case``: its figures."""
    import shmq
    from shmq.engine.shm.segment import destroy_namespace

    ns = run_namespace(f"cmp{run}{case[0]}{batch}")
    b = shmq.connect(namespace=ns)
    server = compactor = stop = None
    try:
        b.create_namespace()
        s = b.create_stream("c", partitions=1, max_bytes=args.max_bytes, durability="memory",
                            compact=case != "delete")
        if case == "housekeeping":
            server = ShmqServer(ns, "--no-persist", "--no-auth")
        elif case == "continuous":
            stop = ctx.Event()
            compactor = ctx.Process(target=_compact_forever, args=(ns, "c", stop))
            compactor.start()
        out = ctx.Queue()
        appender = ctx.Process(target=_append, args=(ns, "c", args.keys, args.size, batch, args.seconds, out))
        appender.start()
        calls, records, times = out.get(timeout=args.seconds + 120)
        appender.join(30)
        st = s.stats()["partitions"][0]
        s.close()
        return {"case": case, "batch": batch, "records_per_s": records / args.seconds, "calls": calls,
                "p50_us": _percentile(times, 0.50), "p99_us": _percentile(times, 0.99), "max_us": times[-1] / 1000,
                "compactions": st["compactions_total"], "compacted_bytes": st["compacted_bytes_total"],
                "dropped": st["dropped_total"]}
    finally:
        if stop is not None:
            stop.set()
            compactor.join(30)
        if server is not None:
            server.close()
        b.close()
        destroy_namespace(ns)


def summarize(runs):
    """The median run of each (case, batch): its figures, with min and max of the rate."""
    out = []
    for case in CASES:
        for batch in sorted({r["batch"] for r in runs}):
            mine = [r for r in runs if r["case"] == case and r["batch"] == batch]
            if not mine:
                continue
            row = {k: statistics.median(r[k] for r in mine) for k in mine[0] if k not in ("case", "batch")}
            rates = [r["records_per_s"] for r in mine]
            out.append({"case": case, "batch": batch, **row, "min": min(rates), "max": max(rates)})
    base = {r["batch"]: r["records_per_s"] for r in out if r["case"] == "delete"}
    for r in out:
        r["ratio"] = r["records_per_s"] / base[r["batch"]] if base.get(r["batch"]) else None
    return out


def print_table(rows, args):
    print(f"{args.keys} keys, {args.size} B values, {args.seconds} s per run, median of {args.runs}")
    print(f"{'case':13} {'batch':>5} {'records/s':>11} {'ratio':>6} {'p50 µs':>8} {'p99 µs':>8} {'max µs':>9} "
          f"{'runs':>6} {'MiB back':>9}")
    for r in rows:
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] else "-"
        print(f"{r['case']:13} {r['batch']:>5} {r['records_per_s']:>11,.0f} {ratio:>6} {r['p50_us']:>8.1f} "
              f"{r['p99_us']:>8.1f} {r['max_us']:>9.0f} {r['compactions']:>6.0f} {r['compacted_bytes'] / 2**20:>9.1f}")


@harness.leaves_no_processes
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=10_000, help="distinct keys (default 10000)")
    p.add_argument("--size", type=int, default=100, help="bytes per value (default 100)")
    p.add_argument("--batches", default="1,64", help="records per call, a comma list (default 1,64)")
    p.add_argument("--seconds", type=float, default=3.0, help="seconds per run (default 3)")
    p.add_argument("--runs", type=int, default=3, help="runs per case (default 3)")
    p.add_argument("--max-bytes", type=int, default=64 * 2**20, help="the partition's ring (default 64 MiB)")
    p.add_argument("--json", default=None, help="write the runs here")
    args = p.parse_args(argv)
    batches = [int(x) for x in args.batches.split(",")]
    ctx = harness.context()
    load = os.getloadavg()[0]
    runs = []
    for run in range(args.runs):  # the cases alternate, so a change in the machine's load hits them alike
        for batch in batches:
            for case in CASES:
                r = one_run(ctx, case, args, batch, run)
                runs.append(r)
                print(f"run {run + 1} {case} x{batch}: {r['records_per_s']:,.0f}/s", file=sys.stderr)
    rows = summarize(runs)
    print_table(rows, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**provenance.run_header("compaction", shlex.join([*PROG.split(), *argv])),
                       "machine": dict(machine_info(), load=(load, os.getloadavg()[0])), "keys": args.keys,
                       "size": args.size, "seconds": args.seconds, "runs": args.runs, "max_bytes": args.max_bytes,
                       "rows": rows, "raw": runs}, f, indent=1)
            f.write("\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
