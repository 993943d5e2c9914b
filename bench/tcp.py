"""shmq over TCP against Redis lists over loopback, in one run: ``python -m bench.tcp``.

The matrix's harness and adapters (shmq-tcp, redis) on 1 KiB messages: producers and
consumers in separate processes, each with its own connection, released together by a
barrier; consumers time from the release until they have received (and acked) every
message. Modes:

- ``msg``: one message per request (shmq put / get + ack; Redis LPUSH / BRPOP);
- ``batch``: 64 per request (shmq put_many / get_many(64) + ack_many; Redis LPUSH of
  64 values / BLMPOP COUNT 64).

``conns`` is the number of client connections: 2 = one producer and one consumer,
8 = four of each. Redis runs only where ``redis-server`` is on the PATH (the harness
starts its own on a free loopback port and stops it) and redis-py is installed;
otherwise it is reported as skipped. Every figure is the median of ``--runs`` runs.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shlex
import sys

from bench import harness, report
from bench.machine import machine_info
from bench.plan import pin_cpus, plan_tcp

SYSTEMS = ("shmq-tcp", "redis")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.tcp", description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--count", type=int, default=40_000, help="messages per case (msg mode; batch mode x4)")
    ap.add_argument("--quick", action="store_true", help="count / 10, 2 runs")
    ap.add_argument("--run-timeout", type=float, default=60.0, help="seconds allowed per run")
    ap.add_argument("--no-pin", dest="pin", action="store_false", help="let the OS place a 1 -> 1 case's processes")
    ap.add_argument("--json", default=None, help="write the raw runs here (the format of python -m bench)")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = ap.parse_args(argv)
    args.command = shlex.join(["python", "-m", "bench.tcp", *argv])
    args.runs, count = (2, args.count // 10) if args.quick else (args.runs, args.count)
    args.cpus = pin_cpus(args.pin)
    skipped, results, notes = harness.run_systems(
        SYSTEMS, lambda opened: plan_tcp(list(opened), count, args.runs, args.run_timeout, args.cpus),
        mp.get_context("spawn"), args.run_timeout)
    info = machine_info()
    report.print_tcp(info, skipped, results)
    for note in notes:
        print(f"note: {note}")
    if args.json:
        report.write_json(args.json, info, args, skipped, results, notes)
        print(f"wrote {args.json}")
    return 0 if all(r.status in ("ok", "skipped") for r, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
