"""N processes on one queue doing one thing only: ``python -m bench.contention``.

N = 1, 2, 4, ... (up to the machine's CPUs, ``--workers``) processes that only put into
one pre-sized queue, or only take from a pre-filled one (shmq: get + ack, or get_many(64)
+ ack_many; faster-fifo: get, get_many(64)), all released together by a barrier, each
timing only its own work for ``--seconds``. Nobody waits on anybody, so what slows N
processes down against one is the queue's own sharing: its lock and its cache lines.
Prints aggregate msgs/s per operation and N with the ratio to N = 1 (each figure the
median of ``--runs`` runs), and writes the raw runs as JSON. ``--quick`` is a smoke
test; ``--report JSON`` prints a saved run again.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from bench import harness, report, scaling
from bench.machine import machine_info
from bench.plan import (BATCH, CONTENTION_FILL, CONTENTION_OPS, CONTENTION_SECONDS, CONTENTION_SYSTEMS, csv,
                        parse_size, plan_contention)
from bench.scale import default_pairs

KINDS = ("put", "take")
MODES = ("msg", "batch")
QUICK = {"seconds": 0.1, "fill": 50_000}


def parse_args(argv):
    systems = list(dict.fromkeys(s for s, _, _ in CONTENTION_OPS))
    p = argparse.ArgumentParser(prog="python -m bench.contention", description=__doc__.splitlines()[0])
    p.add_argument("--systems", type=lambda t: csv(t, systems), default=list(CONTENTION_SYSTEMS),
                   help=f"comma list from {','.join(systems)} (default {','.join(CONTENTION_SYSTEMS)})")
    p.add_argument("--kinds", type=lambda t: csv(t, KINDS), default=list(KINDS), help="put, take (default both)")
    p.add_argument("--modes", type=lambda t: csv(t, MODES), default=list(MODES), help="msg, batch (default both)")
    p.add_argument("--workers", type=lambda t: [int(x) for x in csv(t)], default=None,
                   help="the N to measure (default 1,2,4,... up to the usable CPUs)")
    p.add_argument("--size", type=parse_size, default=64, help="message size (default 64)")
    p.add_argument("--seconds", type=float, default=None,
                   help=f"each worker's run (default {CONTENTION_SECONDS}; {QUICK['seconds']} with --quick)")
    p.add_argument("--fill", type=int, default=None,
                   help=f"messages a take run starts with, and a put run has room for (default {CONTENTION_FILL}; "
                        f"{QUICK['fill']} with --quick)")
    p.add_argument("--runs", type=int, default=None, help="runs per case (default 3; 1 with --quick)")
    p.add_argument("--quick", action="store_true", help="short runs on a small queue, one run: a smoke test")
    p.add_argument("--run-timeout", type=float, default=60.0, help="seconds allowed per run (default 60)")
    p.add_argument("--json", metavar="PATH", default="bench/results/contention.json")
    p.add_argument("--report", metavar="JSON", help="run nothing: print a saved run")
    args = p.parse_args(argv)
    args.workers = args.workers or default_pairs()
    args.runs = args.runs or (1 if args.quick else 3)
    args.seconds = args.seconds or (QUICK["seconds"] if args.quick else CONTENTION_SECONDS)
    args.fill = args.fill or (QUICK["fill"] if args.quick else CONTENTION_FILL)
    if min([args.runs, args.size, args.fill, *args.workers]) < 1 or args.seconds <= 0:
        p.error("--runs, --size, --fill, --workers and --seconds must be positive")
    if args.fill < BATCH * max(args.workers):
        p.error(f"--fill must be at least {BATCH} x the largest N")
    args.ops = [op for op in CONTENTION_OPS
                if op[0] in args.systems and op[1] in args.kinds and op[2] in args.modes]
    if not args.ops:
        p.error("no operation of those systems, kinds and modes")
    return args


def run_contention(args, ctx):
    """Run every case; returns (skipped, [(result, summary)], notes)."""

    def jobs(opened):
        return plan_contention([op for op in args.ops if op[0] in opened], sorted(set(args.workers)), args.size,
                               args.runs, args.seconds, args.fill, args.run_timeout)

    return harness.run_systems(list(dict.fromkeys(s for s, _, _ in args.ops)), jobs, ctx, args.run_timeout)


@harness.leaves_no_processes
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.report:
        info, settings, skipped, results, notes, doc = report.read_json(args.report)
        if "contention" not in doc:
            print(f"python -m bench.contention: error: {args.report} is not a run of python -m bench.contention",
                  file=sys.stderr)
            return 2
        scaling.print_contention(info, settings, skipped, results, notes, doc["contention"]["seconds"])
    else:
        args.command = shlex.join(["python", "-m", "bench.contention", *argv])
        args.cpus = ()
        load = os.getloadavg()[0]
        skipped, results, notes = run_contention(args, harness.context())
        info = dict(machine_info(), load=(load, os.getloadavg()[0]))
        if args.json:
            report.write_json(args.json, "queues", info, args, skipped, results, notes,
                              extra={"contention": {"seconds": args.seconds, "fill": args.fill}})
        scaling.print_contention(info, args, skipped, results, notes, args.seconds)
        if args.json:
            print(f"wrote {args.json}")
    return 0 if all(r.status in ("ok", "skipped") for r, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
