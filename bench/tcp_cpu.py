"""Where a message's CPU goes over TCP, shmq and Redis in one run: ``python -m bench.tcp_cpu``.

bench.tcp times each case; this says what each process spent on it: the user and the
system (kernel) CPU of the server and of each client process, per message, in three of
bench.tcp's shapes, through the same adapters and calls (``--cases``):

- ``pingpong``: per round trip: a put; the other side's get + ack and its put back; the
  get + ack here (Redis: LPUSH; BRPOP);
- ``msg``: one producer -> one consumer, one message per call, each acked (Redis: LPUSH /
  BRPOP); per message;
- ``batch``: the same, 64 per call (put_many / get_many + ack_many; Redis: LPUSH of 64
  values / BLMPOP COUNT 64); per message;
- ``fill``: batch's producer alone, into an empty queue; per message;
- ``drain``: batch's consumer alone, over a queue filled with all its messages before the
  start (by this process, outside the figures); per message.

``fill`` and ``drain`` bound ``batch`` from above: each is one side of it with the server
and a CPU of its own, the other side's requests and CPU away.

The two clients are pinned to two distinct CPUs and the server is not (bench.tcp's
placement). Each client reads its own CPU (``os.times``) around its loop, the server's
is read from /proc around the run (psutil): between the two, both clients connected and
waiting at a start signal. Each figure is the median of ``--runs`` runs, after a warm-up
run. User time includes a busy poll's spin (``--busy-poll-us 0``: shmq's server and
clients spin not at all). The system time is each side's system calls and the wake-ups
they make: the part of a message's cost that no user-space work lowers, which Redis
pays alike for the same exchanges.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import sys
import time

import psutil

from bench import adapters, harness
from bench.adapters.shmq_tcp import BUSY_POLL_ENV
from bench.machine import machine_info
from bench.plan import BATCH, csv, pin_cpus

PROG = "python -m bench.tcp_cpu"
CASES = ("pingpong", "msg", "batch", "fill", "drain")
SYSTEMS = ("shmq-tcp", "redis")
COUNTS = {"pingpong": 10_000, "msg": 20_000, "batch": 320_000, "fill": 320_000, "drain": 320_000}  # trips, messages
QUICK_SCALE = 20
QUICK_SCALE_ALONE = 5  # fill and drain, a client alone at 1-2 M msgs/s: a twentieth is under the CPU clock's tick
SIZE = 64
ROLES = {"pingpong": ("pinger", "ponger"), "msg": ("producer", "consumer"), "batch": ("producer", "consumer"),
         "fill": ("producer",), "drain": ("consumer",)}


def _loop(case, role, ends, n):
    """One client's part of a run: ``n`` round trips or messages."""
    body = b"x" * SIZE
    if case == "pingpong":
        if role == "pinger":
            tx, rx = ends
            for _ in range(n):
                tx.send(body)
                rx.recv()
        else:
            rx, tx = ends
            for _ in range(n):
                tx.send(rx.recv())
    elif role == "producer":
        if case == "msg":
            for _ in range(n):
                ends[0].send(body)
        else:
            bodies = [body] * BATCH
            for _ in range(n // BATCH):
                ends[0].send_batch(bodies)
    elif case == "msg":
        for _ in range(n):
            ends[0].recv()
    else:
        got = 0
        while got < n:
            got += len(ends[0].recv_batch(BATCH))


def _fill(system, spec, n):
    """Put ``n`` messages on ``spec``'s queue from this process, 64 a call (``drain``'s start)."""
    end = adapters.adapter_class(system).End(spec, "send")
    try:
        _loop("fill", "producer", [end], n)
    finally:
        end.close()


def _client(system, case, role, specs, n, cpu, ready, go, out):
    """A client process: open its ends, say so, wait for the start, run; report (role,
    seconds, user CPU seconds, system CPU seconds)."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    end = adapters.adapter_class(system).End
    if case == "pingpong":  # the pinger sends on the first spec and reads the second; the ponger the reverse
        ends = [end(specs[0], "send"), end(specs[1], "recv")] if role == "pinger" else \
            [end(specs[0], "recv"), end(specs[1], "send")]
    else:
        ends = [end(specs[0], "send" if role == "producer" else "recv")]
    try:
        ready.put(role)
        go.wait()
        t0, c0 = time.perf_counter(), os.times()
        _loop(case, role, ends, n)
        t1, c1 = time.perf_counter(), os.times()
    finally:
        for e in ends:
            e.close()
    out.put((role, t1 - t0, c1.user - c0.user, c1.system - c0.system))


def _server_cpu(proc):
    times = proc.cpu_times()
    return times.user + times.children_user, times.system + times.children_system


def run_case(ctx, system, adapter, server, case, n, cpus, timeout):
    """One run: {"seconds", "rate", and per process {"user_us", "system_us"} a message}."""
    specs = [adapter.make(ctx, SIZE) for _ in range(2 if case == "pingpong" else 1)]
    ready, go, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    if case == "drain":
        _fill(system, specs[0], n)
    procs = [ctx.Process(target=_client, args=(system, case, role, specs, n, cpus[i] if cpus else None,
                                               ready, go, out), daemon=True)
             for i, role in enumerate(ROLES[case])]
    try:
        for p in procs:
            p.start()
        try:
            for _ in procs:
                ready.get(timeout=timeout)
            s0 = _server_cpu(server)
            go.set()
            got = {}
            for _ in procs:
                role, seconds, user, sys_ = out.get(timeout=timeout)
                got[role] = (seconds, user, sys_)
        except queue.Empty:
            raise RuntimeError(f"{system} {case}: a client did not report within {timeout:g} s "
                               f"(exit codes {[p.exitcode for p in procs]})") from None
        s1 = _server_cpu(server)
        for p in procs:
            p.join(timeout)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        for spec in specs:
            adapter.drop(spec)
    seconds = max(v[0] for v in got.values())
    per = 1e6 / n
    result = {"seconds": seconds, "rate": n / seconds,
              "server": {"user_us": (s1[0] - s0[0]) * per, "system_us": (s1[1] - s0[1]) * per}}
    for role, (_, user, sys_) in got.items():
        result[role] = {"user_us": user * per, "system_us": sys_ * per}
    return result


def median_row(system, case, runs):
    """The median of each figure over ``runs``."""
    row = {"system": system, "case": case, "runs": len(runs),
           "rate": statistics.median(r["rate"] for r in runs)}
    for who in ("server", *ROLES[case]):
        row[who] = {k: statistics.median(r[who][k] for r in runs) for k in ("user_us", "system_us")}
    row["total_us"] = sum(row[who]["user_us"] + row[who]["system_us"] for who in ("server", *ROLES[case]))
    row["system_total_us"] = sum(row[who]["system_us"] for who in ("server", *ROLES[case]))
    return row


def _open(system, skipped):
    """(adapter, its server's psutil.Process) or None, with the reason in ``skipped``."""
    reason = adapters.probe(system)
    if reason:
        skipped[system] = reason
        return None
    before = {p.pid for p in psutil.Process().children()}
    adapter = adapters.adapter_class(system)()
    started = [p for p in psutil.Process().children() if p.pid not in before]
    if len(started) != 1:
        adapter.close()
        skipped[system] = f"its server is not one process of this run's ({len(started)} started)"
        return None
    return adapter, started[0]


def run(args, ctx):
    """Every case on every system that can run here: (rows, skipped)."""
    cpus = pin_cpus(True)
    if args.busy_poll_us is not None:
        os.environ[BUSY_POLL_ENV] = str(args.busy_poll_us)
    skipped, rows = {}, []
    for system in args.systems:
        opened = _open(system, skipped)
        if opened is None:
            continue
        adapter, server = opened
        try:
            for case in args.cases:
                scale = (QUICK_SCALE_ALONE if len(ROLES[case]) == 1 else QUICK_SCALE) if args.quick else 1
                n = max(BATCH, COUNTS[case] // scale) // BATCH * BATCH
                runs = []
                for i in range(args.runs + 1):  # the first is a warm-up
                    print(f"{system} {case}: run {i}/{args.runs}", file=sys.stderr, flush=True)
                    result = run_case(ctx, system, adapter, server, case, n if i else max(BATCH, n // 10), cpus,
                                      args.run_timeout)
                    if i:
                        runs.append(result)
                rows.append(dict(median_row(system, case, runs), n=n))
        finally:
            adapter.close()
    return rows, skipped


def format_report(info, rows, skipped, args):
    """The table: per case, each system's rate and CPU a message by process, then shmq over Redis."""
    lines = [f"Where a message's CPU goes over TCP ({PROG})",
             f"machine : {info['cpu']}; {info['logical_cpus']} logical CPUs",
             f"load    : {os.getloadavg()[0]:.2f}; clients pinned to CPUs {pin_cpus(True) or 'unpinned'}, "
             f"the server unpinned; median of {args.runs} run(s)"
             + ("" if args.busy_poll_us is None else f"; shmq busy_poll_us={args.busy_poll_us}"),
             "CPU in µs per round trip (pingpong) or message: user / system", ""]
    head = f"{'case':9} {'system':9} {'rate/s':>9}  {'server':>13}  {'client 1':>13}  {'client 2':>13}  " \
           f"{'total':>6}  {'of it system':>12}"
    lines += [head, "-" * len(head)]
    by = {(r["case"], r["system"]): r for r in rows}
    for case in args.cases:
        for system in args.systems:
            r = by.get((case, system))
            if r is None:
                continue
            cells = [f"{r[w]['user_us']:6.1f}/{r[w]['system_us']:<6.1f}" for w in ("server", *ROLES[case])]
            cells += ["-"] * (3 - len(cells))
            lines.append(f"{case:9} {system:9} {r['rate']:9,.0f}  {cells[0]:>13}  {cells[1]:>13}  {cells[2]:>13}  "
                         f"{r['total_us']:6.1f}  {r['system_total_us']:12.1f}")
        a, b = by.get((case, "shmq-tcp")), by.get((case, "redis"))
        if a and b:
            unit = "round trip" if case == "pingpong" else "message"
            lines.append(f"{'':9} shmq / Redis: rate {_ratio(a['rate'], b['rate'])}; CPU a {unit} "
                         f"{_ratio(a['total_us'], b['total_us'])} (server {_ratio(_total(a, 'server'), _total(b, 'server'))}, "
                         f"clients {_ratio(_clients(a), _clients(b))})")
    lines.append("")
    lines.append("client 1 / 2: pinger / ponger (pingpong), producer / consumer (msg, batch); "
                 "client 1 alone: the producer (fill), the consumer (drain).")
    for system, why in skipped.items():
        lines.append(f"skipped {system}: {why}")
    return "\n".join(lines)


def _ratio(a, b):
    """``a / b`` as a ratio, or "-" where ``b`` is none (a short run's CPU below the clock's tick)."""
    return f"{a / b:.2f}x" if b else "-"


def _total(row, who):
    return row[who]["user_us"] + row[who]["system_us"]


def _clients(row):
    return sum(_total(row, who) for who in ROLES[row["case"]])


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=lambda s: csv(s, CASES), default=list(CASES),
                   help=f"comma list from {','.join(CASES)} (default all)")
    p.add_argument("--systems", type=lambda s: csv(s, SYSTEMS), default=list(SYSTEMS),
                   help=f"comma list from {','.join(SYSTEMS)} (default both)")
    p.add_argument("--runs", type=int, default=3, help="runs per case and system (default 3)")
    p.add_argument("--quick", action="store_true",
                   help=f"counts / {QUICK_SCALE} (fill and drain / {QUICK_SCALE_ALONE}): a smoke test")
    p.add_argument("--busy-poll-us", type=int, default=None, metavar="N",
                   help="shmq's busy polling, the server's and the clients' (0: none; default: theirs)")
    p.add_argument("--run-timeout", type=float, default=120.0, help="seconds allowed per run (default 120)")
    p.add_argument("--json", metavar="PATH", default=None, help="write the rows here")
    args = p.parse_args(argv)
    if args.runs < 1 or args.run_timeout <= 0:
        p.error("--runs and --run-timeout must be positive")
    return args


@harness.leaves_no_processes
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    try:
        rows, skipped = run(args, harness.context())
    except RuntimeError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    info = machine_info()
    print(format_report(info, rows, skipped, args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join([PROG, *argv]), "machine": info, "rows": rows, "skipped": skipped},
                      f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
