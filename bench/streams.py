"""Streams against Redis Streams and NATS JetStream, side by side in one run: ``python -m bench.streams``.

The matrix's harness with stream adapters: shmq's streams by local attach and over TCP,
Redis Streams on a ``redis-server`` and NATS JetStream on a ``nats-server -js``, each
server started by the harness on a free loopback port with a temporary directory and
stopped at the end (a server not on the PATH, or a client package not installed, is
skipped, saying why). Cases: 64 B and 1 KiB records; 1 producer -> 1 consumer and
4 producers -> 1 consumer (shmq: one partition per producer); one record per call on
both sides, or 64; the consumer reads through a consumer group (shmq ``poll`` +
``commit``, Redis XREADGROUP + XACK, a NATS durable pull consumer + ack) or by offset
(shmq ``read``, Redis XREAD, a NATS ephemeral pull consumer without acks). Every figure
is the median of ``--runs`` runs, with min .. max, and its ratio to the best peer; Kafka's
published single-producer figure is printed as a reference line (not measured here).
``--quick`` is a smoke test of ~15 s; ``--report JSON`` prints a saved run again.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from bench import harness, report
from bench.adapters import STREAM_SYSTEMS
from bench.machine import machine_info
from bench.plan import STREAM_QUICK_SIZES, STREAM_SIZES, csv, parse_size, pin_cpus, plan_streams


def run_streams(ctx, systems, sizes, runs, quick, run_timeout, cpus):
    """Run the stream matrix; returns (skipped systems, [(result, summary)], notes)."""
    return harness.run_systems(systems, lambda opened: plan_streams(list(opened), sizes, runs, quick, run_timeout,
                                                                    cpus), ctx, run_timeout)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.streams", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="64 B only, 1 run, N / 20: ~15 s")
    p.add_argument("--runs", type=int, default=None, help="runs per case (default 3; 1 with --quick)")
    p.add_argument("--systems", type=lambda t: csv(t, STREAM_SYSTEMS), default=list(STREAM_SYSTEMS),
                   help=f"comma list from {','.join(STREAM_SYSTEMS)}")
    p.add_argument("--sizes", type=lambda t: [parse_size(x) for x in csv(t)], default=None,
                   help="record sizes (default 64,1k; 64 with --quick)")
    p.add_argument("--run-timeout", type=float, default=None,
                   help="seconds allowed per run before the case is a timeout (default 60; 20 with --quick)")
    p.add_argument("--no-pin", dest="pin", action="store_false",
                   help="let the OS place a 1 -> 1 case's two processes (default: two distinct CPUs)")
    p.add_argument("--json", metavar="PATH", default="bench/results/streams.json")
    p.add_argument("--report", metavar="JSON", help="run nothing: print the tables of a saved run")
    args = p.parse_args(argv)
    args.runs = args.runs or (1 if args.quick else 3)
    args.sizes = args.sizes or list(STREAM_QUICK_SIZES if args.quick else STREAM_SIZES)
    args.run_timeout = args.run_timeout or (20.0 if args.quick else 60.0)
    if args.runs < 1 or any(s < 1 for s in args.sizes):
        p.error("--runs and --sizes must be positive")
    return args


@harness.leaves_no_processes
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    args.command = shlex.join(["python", "-m", "bench.streams", *argv])
    if args.report:
        info, settings, _skipped, _results, _notes, doc = report.read_json(args.report)
        skipped, results, notes = report.read_stream_doc(doc["streams"])
        report.print_streams(info, settings, skipped, results, notes)
    else:
        args.cpus = pin_cpus(args.pin)
        load = os.getloadavg()[0]
        skipped, results, notes = run_streams(harness.context(), args.systems, args.sizes, args.runs,
                                              args.quick, args.run_timeout, args.cpus)
        info = dict(machine_info(), load=(load, os.getloadavg()[0]))
        if args.json:
            report.write_json(args.json, "streams", info, args, {}, [], [],
                              extra={"streams": report.stream_doc(skipped, results, notes)})
        report.print_streams(info, args, skipped, results, notes)
        if args.json:
            print(f"wrote {args.json}")
    return 0 if all(r.status in ("ok", "skipped") for r, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
