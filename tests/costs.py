"""Where the suite's time goes: ``python -m tests.costs [--top N] [PYTEST ARGS...]`` runs
the suite (or the part PYTEST ARGS name; ``-n 3 -m 'not timing'`` unless they say
otherwise) with this module as a pytest plugin, which records each test's wall time and
CPU time (its process's, and its children's that it reaped), and reads how busy the
host's CPUs were over the run; then prints the run's length, that share, and the files
and tests that cost the most CPU and the most waiting (wall minus CPU). Exit: pytest's.

Strategy: on a host of few cores the suite's length is its CPU over the cores whenever
they are busy all along (a wait in one worker is filled by the others'), so the CPU
share says which column to read. A process a test started but did not reap (a JVM of
Spark's, a server's child) is not in any test's CPU; what it cost shows only as the gap
between the tests' CPU and the CPUs' busy seconds.
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

DEFAULT_ARGS = ["-n", "3", "-m", "not timing"]
ENV = "SHMQ_TEST_COSTS"  # the file the plugin appends each test's costs to (nothing is recorded without it)


# ---------------------------------------------------------------- the plugin (pytest -p tests.costs)
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = os.environ.get(ENV)
    if not path:
        yield
        return
    wall, before = time.monotonic(), os.times()
    yield
    after = os.times()
    cpu = sum(getattr(after, f) - getattr(before, f) for f in ("user", "system", "children_user", "children_system"))
    line = json.dumps([item.nodeid, round(time.monotonic() - wall, 3), round(cpu, 3),
                       getattr(item.config, "workerinput", {}).get("workerid", ""), round(time.time(), 3)]) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)  # one write per line: workers interleave whole lines
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


# ---------------------------------------------------------------- the run and its report
def _cpu_ticks() -> tuple[int, int]:
    """(busy, all) jiffies of every CPU since boot (/proc/stat's first line)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def report(rows, seconds, busy_share, top=15, workers=()) -> list[str]:
    """The report's lines for ``rows`` of (test id, wall, cpu), a run of ``seconds`` with the
    CPUs busy ``busy_share`` (0..1) of it; ``workers``: (xdist worker, tests, their wall
    summed, when its last test ended in seconds of the run), under xdist."""
    cores = os.cpu_count() or 1
    out = [f"tests.costs: {len(rows)} tests in {seconds:.0f} s; the CPUs {busy_share:.0%} busy "
           f"({cores} CPUs: {busy_share * seconds * cores:.0f} CPU-seconds)",
           f"tests.costs: the tests' own CPU {sum(c for _t, _w, c in rows):.0f} s (theirs and their reaped "
           f"children's); their wall time summed {sum(w for _t, w, _c in rows):.0f} s"]
    for worker, n, wall, last in workers:  # (one ending long before the others: the run's tail was one worker's)
        out.append(f"tests.costs: worker {worker}: {n} tests, {wall:.0f} s of them, its last ended at {last:.0f} s")
    files = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for test, wall, cpu in rows:
        f = files[test.split("::")[0]]
        f[0] += 1
        f[1] += wall
        f[2] += cpu
    out.append("most CPU, by file:          CPU s   wall s  tests")
    for name, (n, wall, cpu) in sorted(files.items(), key=lambda kv: -kv[1][2])[:top]:
        out.append(f"  {cpu:8.1f} {wall:8.1f} {n:6}  {name}")
    out.append("most CPU, by test:          CPU s   wall s")
    for test, wall, cpu in sorted(rows, key=lambda r: -r[2])[:top]:
        out.append(f"  {cpu:8.1f} {wall:8.1f}  {test}")
    out.append("most waiting (wall - CPU):  wait s   wall s")
    for test, wall, cpu in sorted(rows, key=lambda r: r[2] - r[1])[:top]:
        out.append(f"  {wall - cpu:8.1f} {wall:8.1f}  {test}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.costs", description=__doc__.splitlines()[0])
    p.add_argument("--top", type=int, default=15, help="rows in each list (default 15)")
    args, pytest_args = p.parse_known_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "costs.jsonl")
        busy0, all0 = _cpu_ticks()
        started, began = time.monotonic(), time.time()
        rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "tests.costs",
                              *(pytest_args or DEFAULT_ARGS)], env={**os.environ, ENV: path})
        seconds = time.monotonic() - started
        busy1, all1 = _cpu_ticks()
        lines = []
        if os.path.exists(path):
            with open(path) as f:
                lines = [json.loads(line) for line in f]
    rows = [tuple(line[:3]) for line in lines]
    workers = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for _test, wall, _cpu, worker, ended in lines:
        if worker:
            w = workers[worker]
            w[0] += 1
            w[1] += wall
            w[2] = max(w[2], ended - began)
    print("\n".join(report(rows, seconds, (busy1 - busy0) / max(all1 - all0, 1), args.top,
                           [(name, *w) for name, w in sorted(workers.items())])))
    return rc


if __name__ == "__main__":
    sys.exit(main())
