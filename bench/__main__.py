"""The whole benchmark matrix in one run: ``python -m bench``.

Runs the matrix (shmq local and over TCP, multiprocessing Queue and SimpleQueue,
faster-fifo, pyzmq, posix_ipc.MessageQueue, Redis; 1 -> 1 and 4 -> 4; per-message and
batched; ping-pong RTT), then the durability modes (bench/durability.py); prints the
tables, writes JSON and draws a PNG. ``--quick`` is a smoke test of under a minute.
``--report JSON`` runs nothing and prints a saved run again.
"""

from __future__ import annotations

import multiprocessing as mp
import sys

from bench import durability, harness, plot, report
from bench.machine import machine_info
from bench.plan import DURABILITY_COUNTS, parse_args, pin_cpus, plan


def run_matrix(args, ctx):
    """Run every planned case; return (info, skipped systems, [(result, summary)], notes)."""
    skipped = {}
    opened = harness.open_adapters(args.systems, skipped)
    args.cpus = pin_cpus(args.pin)
    jobs = [j for j in plan(list(opened), args.sizes, args.runs, args.quick, args.run_timeout, args.cpus)
            if not (args.no_rtt and j.kind == "rtt")]
    progress = harness.Progress(len(jobs))
    try:
        results = harness.run_jobs(jobs, opened, ctx, args.run_timeout, progress)
    finally:
        notes = harness.close_adapters(opened)
        progress.finish()
    return machine_info(), skipped, results, notes


def publish(info, settings, skipped, results, notes, dur, plot_path):
    """Print every table, then draw the plot (unless plot_path is None)."""
    report.report(info, settings, skipped, results, notes)
    if dur:
        report.print_durability(dur)
    if plot_path is None:
        return
    title = (f"shmq bench, median of {settings.runs} run(s){' (--quick)' if settings.quick else ''}: "
             f"{info['cpu']}, {info['logical_cpus']} CPUs, Python {info['python']}")
    print(plot.draw(plot_path, results, dur, title))


def main(argv=None, prog="python -m bench", **defaults):
    args = parse_args(argv, prog, __doc__.splitlines()[0], **defaults)
    if args.report:
        info, settings, skipped, results, notes, doc = report.read_json(args.report)
        dur = doc.get("durability", [])
        publish(info, settings, skipped, results, notes, dur, args.plot)
    else:
        ctx = mp.get_context("spawn")
        info, skipped, results, notes = run_matrix(args, ctx)
        dur = []
        if args.durability:
            count, trips, runs = DURABILITY_COUNTS["quick" if args.quick else "full"]
            dur, more = durability.run_modes(ctx, count, trips, runs, args.run_timeout, args.cpus)
            notes += more
        if args.json:
            report.write_json(args.json, info, args, skipped, results, notes, dur if args.durability else None)
        publish(info, args, skipped, results, notes, dur, args.plot)
        if args.json:
            print(f"wrote {args.json}")
    ok = all(r.status in ("ok", "skipped") for r, _ in results) and not any("error" in d for d in dur)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
