"""Throughput and ping-pong latency per durability mode: ``python -m bench.durability``.

For each mode (memory, snapshot, wal with ``--fsync batch:2``, wal with ``--fsync
always``) a ``shmq server --data-dir`` (snapshots every second) runs, as in production;
through the harness a producer process puts 64 B messages one at a time while a consumer
process gets and acks them, and a pinger and a ponger measure the round trip, all by
local attach. Figures are medians of ``--runs`` runs; ratios are against memory mode.
"""

from __future__ import annotations

import argparse
import sys

from bench import harness, report
from bench.adapters.shmq_durable import ShmqDurable
from bench.plan import DURABILITY_COUNTS, pin_cpus, plan_durability


def run_modes(ctx, count, trips, runs, run_timeout, cpus):
    """One row per mode, each with a server of its own; returns (rows, notes)."""
    modes = plan_durability(count, trips, runs, run_timeout, cpus)
    progress = harness.Progress(sum(len(jobs) for *_, jobs in modes))
    rows, notes = [], []
    for index, (label, durability, fsync, jobs) in enumerate(modes):
        try:
            adapter = ShmqDurable(durability, fsync, index)
        except Exception as exc:  # reported in the table, not fatal
            rows.append({"mode": label, "error": repr(exc)})
            continue
        try:
            results = harness.run_jobs(jobs, {"shmq": adapter}, ctx, run_timeout, progress)
        finally:
            notes += harness.close_adapters({f"shmq ({label})": adapter})
        rows.append(report.durability_row(label, results, runs, jobs[0].n))
    progress.finish()
    return rows, notes


@harness.leaves_no_processes
def main(argv=None):
    full_count, full_trips, full_runs = DURABILITY_COUNTS["full"]
    ap = argparse.ArgumentParser(prog="python -m bench.durability", description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=full_runs)
    ap.add_argument("--count", type=int, default=full_count, help="messages per run (wal always: 1/40 of it)")
    ap.add_argument("--trips", type=int, default=full_trips, help="round trips per run")
    ap.add_argument("--quick", action="store_true", help="1 run, count / 10, trips / 10")
    ap.add_argument("--run-timeout", type=float, default=60.0, help="seconds allowed per run")
    ap.add_argument("--no-pin", dest="pin", action="store_false", help="let the OS place the two processes")
    args = ap.parse_args(argv)
    runs, count, trips = (1, args.count // 10, args.trips // 10) if args.quick else (args.runs, args.count, args.trips)
    rows, notes = run_modes(harness.context(), count, trips, runs, args.run_timeout, pin_cpus(args.pin))
    report.print_durability(rows)
    for note in notes:
        print(f"note: {note}")
    return 0 if not any("error" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
