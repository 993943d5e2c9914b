"""The whole benchmark matrix in one run: ``python -m bench``.

Runs the matrix (shmq local and over TCP, multiprocessing Queue and SimpleQueue,
faster-fifo, pyzmq, posix_ipc.MessageQueue, iceoryx2, Redis lists, RabbitMQ, core NATS;
1 -> 1 and 4 -> 4; per-message and batched; ping-pong RTT), then the durability modes
(bench/durability.py), then the streams (bench/streams.py: shmq's streams, Redis
Streams, NATS JetStream); prints the tables, writes JSON and draws a PNG. ``--quick``
is a smoke test of about a minute. ``--report JSON`` runs nothing and prints a saved
run again.
"""

from __future__ import annotations

import shlex
import sys

from bench import durability, harness, plot, report, streams
from bench.adapters import STREAM_SYSTEMS
from bench.machine import machine_info
from bench.plan import DURABILITY_COUNTS, STREAM_QUICK_SIZES, STREAM_SIZES, parse_args, pin_cpus, plan


def run_matrix(args, ctx):
    """Run every planned case; return (info, skipped systems, [(result, summary)], notes)."""
    args.cpus = pin_cpus(args.pin)

    def jobs(opened):
        return [j for j in plan(list(opened), args.sizes, args.runs, args.quick, args.run_timeout, args.cpus,
                                topologies=args.pairs)
                if not (args.no_rtt and j.kind == "rtt")]

    skipped, results, notes = harness.run_systems(args.systems, jobs, ctx, args.run_timeout)
    return machine_info(), skipped, results, notes


def publish(info, settings, skipped, results, notes, dur, plot_path, stream_part=None):
    """Print every table, then draw the plot (unless plot_path is None)."""
    report.report(info, settings, skipped, results, notes)
    if dur:
        report.print_durability(dur)
    if stream_part is not None:
        report.print_streams(info, settings, *stream_part, header=False)
    if plot_path is None:
        return
    title = (f"shmq bench, median of {settings.runs} run(s){' (--quick)' if settings.quick else ''}: "
             f"{info['cpu']}, {info['logical_cpus']} CPUs, Python {info['python']}")
    print(plot.draw(plot_path, results, dur, title))


@harness.leaves_no_processes
def main(argv=None, prog="python -m bench", **defaults):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv, prog, __doc__.splitlines()[0], **defaults)
    args.command = shlex.join([*prog.split(), *argv])
    stream_part = None
    if args.report:
        info, settings, skipped, results, notes, doc = report.read_json(args.report)
        dur = doc.get("durability", [])
        if "streams" in doc:
            stream_part = report.read_stream_doc(doc["streams"])
        publish(info, settings, skipped, results, notes, dur, args.plot, stream_part)
    else:
        ctx = harness.context()
        info, skipped, results, notes = run_matrix(args, ctx)
        dur = []
        if args.durability:
            count, trips, runs = DURABILITY_COUNTS["quick" if args.quick else "full"]
            dur, more = durability.run_modes(ctx, count, trips, runs, args.run_timeout, args.cpus)
            notes += more
        extra = {}
        if args.streams:
            sizes = list(STREAM_QUICK_SIZES if args.quick else STREAM_SIZES)
            stream_part = streams.run_streams(ctx, list(STREAM_SYSTEMS), sizes, args.runs, args.quick,
                                              args.run_timeout, args.cpus)
            extra["streams"] = report.stream_doc(*stream_part)
        if args.json:
            report.write_json(args.json, "matrix", info, args, skipped, results, notes, dur if args.durability else None,
                              extra)
        publish(info, args, skipped, results, notes, dur, args.plot, stream_part)
        if args.json:
            print(f"wrote {args.json}")
    stream_results = stream_part[1] if stream_part else []
    ok = all(r.status in ("ok", "skipped") for r, _ in results + stream_results)
    return 0 if ok and not any("error" in d for d in dur) else 1


if __name__ == "__main__":
    sys.exit(main())
