"""Throughput against the number of workers: ``python -m bench.scale``.

Aggregate msgs/s of one queue as workers are added: P producers -> P consumers
(``pairs``), one producer -> P consumers (``fan-out``) and P producers -> one consumer
(``fan-in``), per message and batched (64), 64 B by default, for P = 1, 2, 4, ... up to
the machine's CPUs (``--pairs``). Systems: shmq acking every message, shmq settling as
taken (``shmq-noack``), shmq on a queue of P lanes (``shmq-lanes``, skipped, saying why,
where shmq has no lanes; ``--lanes K`` fixes K) and the local peers (faster-fifo, pyzmq
PUSH/PULL, posix_ipc MessageQueue, multiprocessing.Queue). The 1 -> 1 case is the P = 1
point of every shape. Prints a table per shape and mode (each figure the median of
``--runs`` runs, with its ratio to the system's own 1 -> 1), writes the raw runs as JSON
and draws throughput against P, one line per system, a panel per shape and mode.
``--quick`` is a smoke test; ``--report JSON`` prints a saved run again and redraws it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import replace

from bench import harness, plot, report, scaling
from bench.adapters import SYSTEMS
from bench.machine import machine_info
from bench.plan import BATCH, START_TIMEOUT, Job, csv, parse_size, pin_cpus

SCALE_SYSTEMS = ("shmq", "shmq-noack", "shmq-lanes", "faster-fifo", "zmq", "posix-mq", "mpqueue")
SHAPES = {"pairs": "P->P", "fan-out": "1->P", "fan-in": "P->1"}  # the command line's names
MODES = ("msg", "batch")
COUNT = 60_000  # messages per run and per P, per message; batched runs move BATCHED_FACTOR times as many
BATCHED_FACTOR = 4
QUICK_SCALE = 20  # --quick: counts / 20, one run


def default_pairs():
    """1, 2, 4, ... up to the CPUs this process may use."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    pairs = [1]
    while pairs[-1] * 2 <= usable:
        pairs.append(pairs[-1] * 2)
    return pairs


def messages(count, mode, producers, pairs=1):
    """Messages per run: ``count`` per worker pair (P x count: a system that scales runs each
    case about as long, never for a few milliseconds that a process's wake-up would
    blur), batched x BATCHED_FACTOR, a whole share per producer."""
    n = count * pairs * (BATCHED_FACTOR if mode == "batch" else 1)
    return max(BATCH * producers, n // producers * producers)


def plan_scale(systems, sizes, pairs, shapes, modes, runs, count, run_timeout, cpus):
    """Every case; P = 1 once (shape P->P), as the first point of every shape; systems interleaved."""
    jobs = []
    for p in sorted(set(pairs)):
        for shape in (("P->P",) if p == 1 else shapes):
            for size in sizes:
                for mode in modes:
                    for system in systems:
                        job = Job(system, "tput", size, mode, 0, runs, pairs=p, shape=shape,
                                  cpus=cpus if p == 1 else (), wait=START_TIMEOUT + run_timeout)
                        jobs.append(replace(job, n=messages(count, mode, job.producers, p)))
    return jobs


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.splitlines()[0])
    p.add_argument("--systems", type=lambda t: csv(t, SYSTEMS), default=list(SCALE_SYSTEMS),
                   help=f"comma list (default {','.join(SCALE_SYSTEMS)})")
    p.add_argument("--pairs", type=lambda t: [int(x) for x in csv(t)], default=None,
                   help="the P to measure (default 1,2,4,... up to the usable CPUs)")
    p.add_argument("--shapes", type=lambda t: [SHAPES[x] for x in csv(t, SHAPES)], default=list(SHAPES.values()),
                   help="pairs (P -> P), fan-out (1 -> P), fan-in (P -> 1); default all three")
    p.add_argument("--modes", type=lambda t: csv(t, MODES), default=list(MODES), help="msg, batch (default both)")
    p.add_argument("--sizes", type=lambda t: [parse_size(x) for x in csv(t)], default=[64],
                   help="message sizes (default 64)")
    p.add_argument("--runs", type=int, default=None, help="runs per case (default 3; 1 with --quick)")
    p.add_argument("--count", type=int, default=COUNT,
                   help=f"messages per run, times P (default {COUNT}; batched x{BATCHED_FACTOR})")
    p.add_argument("--lanes", type=int, default=None, help="shmq-lanes: K lanes in every case (default K = P)")
    p.add_argument("--quick", action="store_true", help=f"counts / {QUICK_SCALE}, one run: a smoke test")
    p.add_argument("--run-timeout", type=float, default=60.0, help="seconds allowed per run (default 60)")
    p.add_argument("--no-pin", dest="pin", action="store_false",
                   help="let the OS place the 1 -> 1 case's two processes (default: two distinct CPUs)")
    p.add_argument("--json", metavar="PATH", default="bench/results/scale.json")
    p.add_argument("--plot", metavar="PATH", default="bench/results/scale.png")
    p.add_argument("--report", metavar="JSON", help="run nothing: print a saved run and redraw its plot (to --plot)")
    args = p.parse_args(argv)
    args.pairs = args.pairs or default_pairs()
    args.runs = args.runs or (1 if args.quick else 3)
    if args.quick:
        args.count = max(BATCH, args.count // QUICK_SCALE)
    if min([args.runs, args.count, *args.pairs, *args.sizes]) < 1 or (args.lanes is not None and args.lanes < 1):
        p.error("--runs, --count, --pairs, --sizes and --lanes must be positive")
    return args


def run_scale(args, ctx):
    """Run every case; returns (skipped, [(result, summary)], notes)."""

    def jobs(opened):
        if args.lanes and "shmq-lanes" in opened:
            opened["shmq-lanes"].lanes = args.lanes
        return plan_scale(list(opened), args.sizes, args.pairs, args.shapes, args.modes, args.runs, args.count,
                          args.run_timeout, args.cpus)

    return harness.run_systems(args.systems, jobs, ctx, args.run_timeout)


def _title(info, settings):
    return (f"shmq scale bench, median of {settings.runs} run(s){' (--quick)' if settings.quick else ''}: "
            f"{info['cpu']}, {info['usable_cpus'] or info['logical_cpus']} CPUs, Python {info['python']}")


def publish(info, settings, skipped, results, notes, plot_path):
    scaling.print_scale(info, settings, skipped, results, notes)
    if plot_path:
        print(plot.draw_scale(plot_path, results, _title(info, settings)))


@harness.leaves_no_processes
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.report:
        info, settings, skipped, results, notes, _doc = report.read_json(args.report)
        publish(info, settings, skipped, results, notes, args.plot)
    else:
        args.command = shlex.join(["python", "-m", "bench.scale", *argv])
        args.cpus = pin_cpus(args.pin)
        load = os.getloadavg()[0]
        skipped, results, notes = run_scale(args, harness.context())
        info = dict(machine_info(), load=(load, os.getloadavg()[0]))
        if args.json:
            report.write_json(args.json, "queues", info, args, skipped, results, notes)
        publish(info, args, skipped, results, notes, args.plot)
        if args.json:
            print(f"wrote {args.json}")
    return 0 if all(r.status in ("ok", "skipped") for r, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
