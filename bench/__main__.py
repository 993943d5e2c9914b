"""The whole benchmark matrix in one run: ``python -m bench``.

Runs bench/local.py's matrix (shmq local and over TCP, multiprocessing Queue and
SimpleQueue, faster-fifo, pyzmq, posix_ipc.MessageQueue, Redis; 1 -> 1 and 4 -> 4;
per-message and batched; ping-pong RTT), then bench/durability.py's modes; prints the
tables, writes JSON and draws a PNG. ``--quick`` is a smoke test of under a minute.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys

from bench import durability, local

DURABILITY = {"full": (200_000, 2_000, 3), "quick": (2_000, 100, 1)}  # n (wal always: 1/40), trips, runs


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small matrix, 1 run, N / 20: under a minute")
    p.add_argument("--runs", type=int, default=None, help="runs per case (default 5; 1 with --quick)")
    p.add_argument("--json", metavar="PATH", default="bench/results/bench.json")
    p.add_argument("--plot", metavar="PATH", default="bench/results/bench.png")
    p.add_argument("--systems", type=lambda t: local._csv(t, local.SYSTEMS), default=list(local.SYSTEMS),
                   help=f"comma list from {','.join(local.SYSTEMS)}")
    p.add_argument("--sizes", type=lambda t: [local._parse_size(x) for x in local._csv(t)], default=None,
                   help="message sizes (64,1k,64k,1m); default all four, 64 and 64k with --quick")
    p.add_argument("--no-durability", dest="durability", action="store_false")
    p.add_argument("--no-pin", dest="pin", action="store_false")
    p.add_argument("--report", metavar="JSON",
                   help="run nothing: print the tables of a saved run and draw its plot (to --plot)")
    args = p.parse_args(argv)
    args.runs = args.runs or (1 if args.quick else 5)
    args.sizes = args.sizes or ([64, 65536] if args.quick else list(local.DEFAULT_SIZES))
    args.run_timeout = 10.0 if args.quick else 60.0
    args.no_rtt = False
    if args.runs < 1 or any(s < 1 for s in args.sizes):
        p.error("--runs and --sizes must be positive")
    return args


def run_durability(ctx, quick):
    """One row per durability mode (bench/durability.py), or the error that stopped a mode."""
    n, trips, runs = DURABILITY["quick" if quick else "full"]
    rows = []
    for label, mode, fsync in durability.MODES:
        try:
            count = durability.messages(label, n)
            rows.append(dict(durability.run_mode(ctx, label, mode, fsync, count, trips, runs), runs=runs, n=count))
        except Exception as exc:  # reported in the table, not fatal
            rows.append({"mode": label, "error": repr(exc)})
    return rows


def print_durability(rows, out=sys.stdout):
    print("Durability modes, 64 B, 1 producer -> 1 consumer (put / get + ack), local attach; "
          f"median of {rows[0].get('runs', '?')} runs", file=out)
    head = (f"{'mode':<12}  {'msgs/s':>10}  {'(min .. max)':<22}  {'vs memory':>9}  {'RTT p50 us':>10}  "
            f"{'p99 us':>8}  {'p99.9 us':>8}")
    print(head, file=out)
    print("-" * len(head), file=out)
    base = rows[0].get("msgs_per_s")
    for r in rows:
        if "error" in r:
            print(f"{r['mode']:<12}  error: {r['error']}", file=out)
            continue
        spread = f"({local._si(r['min'])} .. {local._si(r['max'])})"
        print(f"{r['mode']:<12}  {r['msgs_per_s']:>10,.0f}  {spread:<22}  {local._ratio(r['msgs_per_s'], base):>9}  "
              f"{r['rtt_p50_us']:>10.1f}  {r['rtt_p99_us']:>8.1f}  {r['rtt_p999_us']:>8.1f}", file=out)
    print(file=out)


def write_json(path, info, args, skipped, results, notes, dur):
    """local.py's document plus the durability rows."""
    local.write_json(path, info, args, skipped, results, notes)
    with open(path) as fh:
        doc = json.load(fh)
    doc["durability"] = dur
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=2)
        fh.write("\n")


def publish(info, settings, skipped, results, notes, dur, plot_path):
    """Print every table, then draw the plot."""
    local.report(info, settings, skipped, results, notes)
    if dur:
        print_durability(dur)
    from bench import plot

    title = (f"shmq bench, median of {settings.runs} run(s){' (--quick)' if settings.quick else ''}: "
             f"{info['cpu']}, {info['logical_cpus']} CPUs, Python {info['python']}")
    print(plot.draw(plot_path, results, dur, title))


def main(argv=None):
    args = parse_args(argv)
    if args.report:
        info, settings, skipped, results, notes, doc = local.read_json(args.report)
        dur = doc.get("durability", [])
        publish(info, settings, skipped, results, notes, dur, args.plot)
    else:
        ctx = mp.get_context("spawn")
        info, skipped, results, notes = local.run_matrix(args, ctx)
        dur = run_durability(ctx, args.quick) if args.durability else []
        write_json(args.json, info, args, skipped, results, notes, dur)
        publish(info, args, skipped, results, notes, dur, args.plot)
        print(f"wrote {args.json}")
    ok = all(r.status in ("ok", "skipped") for r, _ in results) and not any("error" in d for d in dur)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
