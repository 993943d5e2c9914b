"""shmq over TCP against Redis lists over loopback, in one run: ``python -m bench.tcp``.

A ``shmq server --no-persist`` and a ``redis-server --save '' --appendonly no`` of the
run's own, each on a free loopback port (redis-py is Redis's client); every case runs
against both, one after the other, in separate processes released together by a
barrier, each process with its own connection. The cases (``--cases``, plan.TCP_CASES):

- ``pingpong``: a 64 B round trip over two queues (put; the other side's blocking get +
  ack, its put back; get + ack): p50 / p99 / p99.9 (Redis: LPUSH / BRPOP);
- ``put``: one blocking put's latency, 64 B (Redis: LPUSH);
- ``msg``: P producers -> P consumers, one message per call, each acked (Redis: LPUSH /
  BRPOP);
- ``batch``: the same, 64 per call (put_many / get_many(64) + ack_many; Redis: LPUSH of
  64 values / BLMPOP COUNT 64);
- ``pipe``: P producers alone, pipelined: ``put(wait=False)`` then ``flush()`` (Redis: a
  pipeline of 64 LPUSHes, transaction=False), msgs/s until every put is confirmed;

the last three at each ``--sizes`` (64 B and 1 KiB) and each P of ``--pairs`` (1 and 4).
Every figure is the median of ``--runs`` runs, shown with shmq / Redis (for a latency
below 1x means shmq is faster, for a rate above 1x does) and issue 44's target where it
sets one. Prints the table, writes every run as JSON (``--json``) and draws the plot
beside it (``--plot``). ``--load N`` runs both systems beside N CPU-bound processes
(``bench.load``): issue 44's targets under load. ``--quick`` is a smoke test; ``--report
JSON`` prints a saved run again and redraws it. Redis is skipped, saying why, where
redis-server or redis-py is missing.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from bench import harness, plot, report, tcp_report
from bench.adapters.shmq_tcp import BUSY_POLL_ENV, TLS_ENV
from bench.load import hogs
from bench.machine import machine_info
from bench.plan import (TCP_CASES, TCP_COUNT, TCP_QUICK_SCALE, TCP_SIZES, TCP_TRIPS, TOPOLOGIES, csv, parse_size,
                        pin_cpus, plan_tcp)

PROG = "python -m bench.tcp"


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=lambda t: csv(t, tuple(TCP_CASES)), default=list(TCP_CASES),
                   help=f"comma list from {','.join(TCP_CASES)} (default all)")
    p.add_argument("--sizes", type=lambda t: [parse_size(x) for x in csv(t)], default=list(TCP_SIZES),
                   help="message sizes of msg, batch and pipe (default 64,1k; pingpong and put are 64 B)")
    p.add_argument("--pairs", type=lambda t: [int(x) for x in csv(t)], default=list(TOPOLOGIES),
                   help="P of msg, batch and pipe (default 1,4)")
    p.add_argument("--runs", type=int, default=None, help="runs per case (default 3; 1 with --quick)")
    p.add_argument("--count", type=int, default=None,
                   help=f"messages per run, per message (default {TCP_COUNT}); batch and pipe move 5 x as many")
    p.add_argument("--trips", type=int, default=None,
                   help=f"round trips (pingpong) and puts (put) per run (default {TCP_TRIPS})")
    p.add_argument("--quick", action="store_true", help=f"counts / {TCP_QUICK_SCALE}, one run: a smoke test")
    p.add_argument("--run-timeout", type=float, default=60.0, help="seconds allowed per run (default 60)")
    p.add_argument("--no-pin", dest="pin", action="store_false",
                   help="let the OS place a 1 -> 1 case's processes (default: pinned to two distinct CPUs)")
    p.add_argument("--tls", action="store_true",
                   help="shmq's server over TLS (tcps://, a certificate of the run's own): the cost of TLS, "
                        "beside Redis in plain TCP")
    p.add_argument("--busy-poll-us", type=int, default=None, metavar="N",
                   help="shmq's busy polling, the server's and the clients' (0: none; default: theirs, 100)")
    p.add_argument("--load", type=int, default=0, metavar="N",
                   help="N CPU-bound processes running beside every case of both systems (bench.load): "
                        "the figures under load (default 0)")
    p.add_argument("--json", metavar="PATH", default=None, help="write every run here")
    p.add_argument("--plot", metavar="PATH", default=None,
                   help="draw the plot here (default: beside --json, as .png; '' for none)")
    p.add_argument("--report", metavar="JSON", help="run nothing: print a saved run and draw its plot (to --plot)")
    args = p.parse_args(argv)
    scale = TCP_QUICK_SCALE if args.quick else 1
    args.runs = args.runs or (1 if args.quick else 3)
    args.count = args.count or max(1, TCP_COUNT // scale)
    args.trips = args.trips or max(1, TCP_TRIPS // scale)
    if min([args.runs, args.count, args.trips, *args.sizes, *args.pairs]) < 1 or args.run_timeout <= 0:
        p.error("--runs, --count, --trips, --sizes, --pairs and --run-timeout must be positive")
    if not 0 <= args.load <= 64:
        p.error("--load must be 0 to 64 processes")
    if args.plot is None:
        source = args.report or args.json
        args.plot = os.path.splitext(source)[0] + ".png" if source else ""
    return args


def run(args, ctx):
    """Run every case; returns (info, skipped, [(result, summary)], notes)."""
    args.cpus = pin_cpus(args.pin)
    if args.tls:
        os.environ[TLS_ENV] = "1"
    if args.busy_poll_us is not None:
        os.environ[BUSY_POLL_ENV] = str(args.busy_poll_us)
    load = os.getloadavg()[0]

    def jobs(opened):
        return plan_tcp(list(opened), args.cases, args.sizes, args.pairs, args.count, args.trips, args.runs,
                        args.run_timeout, args.cpus)

    with hogs(args.load):
        skipped, results, notes = harness.run_systems(tcp_report.SYSTEMS, jobs, ctx, args.run_timeout)
    return dict(machine_info(), load=(load, os.getloadavg()[0])), skipped, results, notes


def publish(info, settings, skipped, results, notes, plot_path):
    """Print the table, then draw the plot (unless ``plot_path`` is empty)."""
    tcp_report.print_tcp(info, settings, skipped, results, notes)
    if plot_path:
        title = (f"shmq over {'TLS' if getattr(settings, 'tls', False) else 'TCP'} vs Redis, median of {settings.runs} run(s){' (--quick)' if settings.quick else ''}: "
                 f"{info['cpu']}, {info['logical_cpus']} CPUs, Python {info['python']}")
        print(plot.draw_tcp(plot_path, tcp_report.rows(results), title))


@harness.leaves_no_processes
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.report:
        try:
            info, settings, skipped, results, notes, doc = report.read_json(args.report)
        except (OSError, ValueError, KeyError) as exc:
            print(f"{PROG}: error: cannot read {args.report}: {exc}", file=sys.stderr)
            return 2
        if "tcp" not in doc:
            print(f"{PROG}: error: {args.report} is not a run of {PROG}", file=sys.stderr)
            return 2
        publish(info, settings, skipped, results, notes, args.plot)
    else:
        args.command = shlex.join([*PROG.split(), *argv])
        info, skipped, results, notes = run(args, harness.context())
        if args.json:
            settings = {k: getattr(args, k) for k in ("cases", "sizes", "pairs", "count", "trips", "load")}
            targets = [{"case": row.case, "size": row.size, "flow": row.flow, "figure": row.figure,
                        "target": list(row.target), "ratio": row.ratio, "verdict": verdict}
                       for row, verdict in tcp_report.targets(tcp_report.rows(results))]
            report.write_json(args.json, "tcp", info, args, skipped, results, notes,
                              extra={"tcp": dict(settings, targets=targets)})
        publish(info, args, skipped, results, notes, args.plot)
        if args.json:
            print(f"wrote {args.json}")
    return 0 if all(r.status in ("ok", "skipped") for r, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
