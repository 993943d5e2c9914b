"""Job runners on shmq against the same on Redis, in one run: ``python -m bench.jobs``.

For each tool (Dramatiq, Celery) and each broker (``shmq``: local attach; ``shmq-tcp``: a
``shmq server --no-persist`` of the run's own; ``redis``: a ``redis-server`` of the run's
own), the real worker command (``dramatiq bench.job_apps``, ``celery -A bench.job_apps
worker``) runs a pool of the same size; this process, the one producer, enqueues
``--jobs`` no-op jobs (from a process of its own), and the figure is jobs/s from the
first enqueue to the last job's done mark (bench/job_apps.py). Modes: ``plain``, ``retry`` (one job in ten
raises on its first try and is retried) and, for Celery, ``chord`` (the jobs as chords of 10 parts, the
results in a backend of the broker's kind: shmq's keyed store, or Redis; a chord's body marks its 10
parts done). Every figure is the median of ``--runs`` runs,
shown beside Redis's as shmq / Redis (issue 29's target: at least 2x, local attach).
``--json`` writes every run. A broker or tool that cannot run here is skipped, saying why.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from bench import harness, provenance
from bench.machine import dist_versions, machine_info
from bench.servers import RedisServer, ShmqServer

PROG = "python -m bench.jobs"
TOOLS = ("dramatiq", "celery")
BROKERS = ("shmq", "shmq-tcp", "redis")
MODES = ("plain", "retry", "chord")
CHORD_PARTS = 10
TARGET = 2.0  # shmq (local attach) / Redis, jobs per second
READY = {"dramatiq": b"is ready for action", "celery": b"ready."}
START_TIMEOUT = 60.0


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--tools", default=",".join(TOOLS), help="comma list of dramatiq,celery")
    p.add_argument("--brokers", default=",".join(BROKERS), help="comma list of shmq,shmq-tcp,redis")
    p.add_argument("--modes", default=",".join(MODES), help="comma list of plain,retry")
    p.add_argument("--jobs", type=int, default=None, help="jobs per run (default 5000; 300 with --quick)")
    p.add_argument("--runs", type=int, default=None, help="runs per case (default 3; 1 with --quick)")
    p.add_argument("--processes", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--threads", type=int, default=4, help="threads per Dramatiq worker process (default 4)")
    p.add_argument("--run-timeout", type=float, default=300.0, help="seconds allowed per run (default 300)")
    p.add_argument("--quick", action="store_true", help="a smoke test: few jobs, one run")
    p.add_argument("--json", metavar="PATH", default=None, help="write every run here")
    args = p.parse_args(argv)
    for name, allowed in (("tools", TOOLS), ("brokers", BROKERS), ("modes", MODES)):
        chosen = [x for x in getattr(args, name).split(",") if x]
        bad = [x for x in chosen if x not in allowed]
        if bad or not chosen:
            p.error(f"--{name}: {', '.join(bad) or 'nothing'} not in {', '.join(allowed)}")
        setattr(args, name, chosen)
    args.jobs = args.jobs or (300 if args.quick else 5000)
    args.runs = args.runs or (1 if args.quick else 3)
    if min(args.jobs, args.runs, args.processes, args.threads) < 1 or args.run_timeout <= 0:
        p.error("--jobs, --runs, --processes, --threads and --run-timeout must be positive")
    return args


def missing(tool, broker):
    """Why (tool, broker) cannot run here, or None."""
    for module in (tool, *(("redis",) if broker == "redis" else ())):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed"
    return None


class Workers:
    """The tool's real worker command, started and read until it says it is ready."""

    def __init__(self, tool, env, args):
        if tool == "dramatiq":
            argv = [sys.executable, "-m", "dramatiq", "bench.job_apps", "--processes", str(args.processes),
                    "--threads", str(args.threads)]
        else:
            argv = [sys.executable, "-m", "celery", "-A", "bench.job_apps", "worker", "-P", "prefork",
                    "-c", str(args.processes), "--without-gossip", "--without-mingle", "--without-heartbeat",
                    "-l", "info"]
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready(READY[tool], args.processes if tool == "dramatiq" else 1)

    def _output(self) -> bytes:
        self.log.seek(0)
        return self.log.read()

    def _wait_ready(self, mark, count):
        deadline = time.monotonic() + START_TIMEOUT
        while self._output().count(mark) < count:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self._output().decode(errors="replace")[-2000:]
                self.close()
                raise RuntimeError(f"the workers did not start: {tail}")
            time.sleep(0.05)

    def close(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def produce(tool, env, count, started):
    """The one producer, in a process of its own (forked from the bench's process server: nothing of the harness's state,
    the run's environment only): imports bench.job_apps, sends ``count`` jobs, closes."""
    os.environ.update(env)
    import bench.job_apps as apps
    started.put(time.monotonic())
    if apps.CHORD:
        from celery import chord

        for first in range(0, count, apps.CHORD):
            chord(apps.part.s(n) for n in range(first, min(first + apps.CHORD, count)))(apps.chord_done.s())
    else:
        send = apps.job.send if tool == "dramatiq" else apps.job.delay
        for n in range(count):
            send(n)
    if tool == "dramatiq":
        apps.job.broker.close()
    else:
        apps.app.close()


def one_run(tool, broker, mode, url, args):
    """One run: workers up, N jobs sent, time to the last done mark; returns jobs/s."""
    ns = "bj" + uuid.uuid4().hex[:10]
    done = tempfile.NamedTemporaryFile(prefix="bench-jobs-", delete=False)
    done.close()
    env = dict(os.environ, BENCH_JOBS_TOOL=tool, BENCH_JOBS_BROKER=broker, BENCH_JOBS_URL=url or "",
               BENCH_JOBS_DONE=done.name, BENCH_JOBS_FAIL_EVERY="10" if mode == "retry" else "0",
               BENCH_JOBS_CHORD=str(CHORD_PARTS) if mode == "chord" else "0",
               SHMQ_NAMESPACE=ns if broker == "shmq" else os.environ.get("SHMQ_NAMESPACE", ns))
    workers = Workers(tool, env, args)
    ctx = harness.context()
    started = ctx.Queue()
    producer = ctx.Process(target=produce, args=(tool, env, args.jobs, started), daemon=True)
    try:
        producer.start()
        t0 = started.get(timeout=START_TIMEOUT)
        deadline = time.monotonic() + args.run_timeout
        while os.path.getsize(done.name) < args.jobs:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{os.path.getsize(done.name)} of {args.jobs} jobs done in {args.run_timeout}s")
            if workers.proc.poll() is not None:
                raise RuntimeError("the workers exited")
            if producer.exitcode not in (None, 0):
                raise RuntimeError(f"the producer exited with code {producer.exitcode}")
            time.sleep(0.002)
        elapsed = time.monotonic() - t0
        producer.join(START_TIMEOUT)
        return args.jobs / elapsed
    finally:
        if producer.is_alive():
            producer.kill()
            producer.join()
        workers.close()
        os.unlink(done.name)
        if broker == "shmq":
            from shmq.engine.shm.segment import destroy_namespace
            destroy_namespace(ns)


@harness.leaves_no_processes
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    info = dict(machine_info(), **dist_versions("celery", "kombu", "dramatiq"), load=(os.getloadavg()[0], None))
    rows, skipped = [], {}
    servers = {}
    try:
        for broker in args.brokers:
            try:
                if broker == "shmq-tcp":
                    ns = "bjs" + uuid.uuid4().hex[:8]
                    servers[broker] = (ShmqServer(ns), ns)
                elif broker == "redis":
                    servers[broker] = (RedisServer(), None)
            except (OSError, RuntimeError) as exc:
                skipped[broker] = f"cannot start its server: {exc}"
        for tool in args.tools:
            for broker in args.brokers:
                why = skipped.get(broker) or missing(tool, broker)
                if why:
                    skipped[f"{tool}/{broker}"] = why
                    continue
                url = None
                if broker == "shmq-tcp":
                    url = servers[broker][0].url
                elif broker == "redis":
                    url = f"redis://127.0.0.1:{servers[broker][0].port}/0"
                for mode in args.modes:
                    if mode == "chord" and tool != "celery":
                        continue  # (Dramatiq has no chords)
                    rates, error = [], None
                    for _ in range(args.runs):
                        try:
                            rates.append(one_run(tool, broker, mode, url, args))
                        except RuntimeError as exc:
                            error = str(exc)
                            break
                    rows.append({"tool": tool, "broker": broker, "mode": mode, "runs": rates,
                                 "median": statistics.median(rates) if rates and not error else None,
                                 "error": error})
                    print(f"{tool:9s} {broker:9s} {mode:6s} "
                          + (f"{rows[-1]['median']:10,.0f} jobs/s" if rows[-1]["median"] else f"failed: {error}"),
                          flush=True)
    finally:
        for server, ns in servers.values():
            server.close()
            if ns is not None:
                from shmq.engine.shm.segment import destroy_namespace
                destroy_namespace(ns)
    print_table(info, args, rows, skipped)
    info["load"] = (info["load"][0], os.getloadavg()[0])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**provenance.run_header("jobs", shlex.join([*PROG.split(), *argv])), "machine": info, "jobs": args.jobs, "runs": args.runs,
                       "processes": args.processes, "threads": args.threads, "rows": rows, "skipped": skipped},
                      f, indent=1)
        print(f"wrote {args.json}")
    return 0 if all(r["error"] is None for r in rows) else 1


def print_table(info, args, rows, skipped):
    print(f"\n{PROG}: {args.jobs} no-op jobs per run, median of {args.runs}; {args.processes} worker processes"
          f" ({args.threads} threads each for Dramatiq, prefork for Celery); {info['cpu']}, "
          f"{info['logical_cpus']} CPUs\n")
    print(f"| tool | mode | {' | '.join(args.brokers)} | shmq / Redis | target |")
    print("|---|---|" + "---|" * len(args.brokers) + "---|---|")
    by = {(r["tool"], r["broker"], r["mode"]): r["median"] for r in rows}
    for tool in args.tools:
        for mode in args.modes:
            if (tool, "shmq", mode) not in by and all((tool, b, mode) not in by for b in args.brokers):
                continue
            figures = [by.get((tool, b, mode)) for b in args.brokers]
            shmq, redis = by.get((tool, "shmq", mode)), by.get((tool, "redis", mode))
            ratio = f"{shmq / redis:.2f}x" if shmq and redis else "-"
            verdict = ("met" if shmq / redis >= TARGET else "missed") if shmq and redis and mode != "chord" else "-"
            cells = " | ".join(f"{f:,.0f}/s" if f else "-" for f in figures)
            print(f"| {tool} | {mode} | {cells} | {ratio} | {f'>= {TARGET:g}x: {verdict}' if verdict != '-' else '-'} |")
    for what, why in skipped.items():
        print(f"skipped {what}: {why}")


if __name__ == "__main__":
    sys.exit(main())
