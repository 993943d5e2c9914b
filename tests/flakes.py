"""Find the tests that fail under load: ``python -m tests.flakes [--runs N] [--burners K]
[PYTEST ARGS...]`` runs the suite (or the part PYTEST ARGS name: files, ``-k``, ``-m``)
N times beside K CPU-bound processes and lists each test that failed at least once, with
how many times. Exit 0 when none failed.

Strategy: a race shows up as a test that passes alone and fails when its processes are
not scheduled at once, which two busy processes on a 2-core host make likely. Each run is
a plain pytest run (``-n 3 -m 'not timing'`` unless PYTEST ARGS say otherwise) writing a
JUnit report; the failures are read from the reports, not from pytest's text. What a run
finds is fixed in the product or in the test's wait on its real condition, never by a
retry or a longer sleep (README, "Run the tests").
"""

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

DEFAULT_ARGS = ["-n", "3", "-m", "not timing"]


def _burn():  # a CPU-bound neighbour: the load the suite runs beside
    x = 0
    while True:
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def failed_tests(report: str) -> list[str]:
    """The ids (``file::name``) of the tests a JUnit report says failed or errored."""
    try:
        root = ET.parse(report).getroot()
    except (OSError, ET.ParseError):
        return ["<no report: the run did not finish>"]
    out = []
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            path = case.get("classname", "").replace(".", "/")
            out.append(f"{path}.py::{case.get('name')}" if path else case.get("name"))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.flakes", description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="runs of the suite (default 3)")
    p.add_argument("--burners", type=int, default=2, help="CPU-bound processes beside it (default 2)")
    args, pytest_args = p.parse_known_args(argv)
    pytest_args = pytest_args or DEFAULT_ARGS
    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(args.burners)]
    for b in burners:
        b.start()
    counts, durations = {}, []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for run in range(args.runs):
                report = os.path.join(tmp, f"run{run}.xml")
                started = time.monotonic()
                rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                      f"--junitxml={report}", *pytest_args])
                durations.append(time.monotonic() - started)
                failed = failed_tests(report) if rc else []
                for test in failed:
                    counts[test] = counts.get(test, 0) + 1
                print(f"tests.flakes: run {run + 1} of {args.runs}: exit {rc}, {len(failed)} failed, "
                      f"{durations[-1]:.0f} s", flush=True)
    finally:
        for b in burners:
            b.kill()
            b.join()
    print(f"tests.flakes: {args.runs} run(s) beside {args.burners} CPU-bound process(es), "
          f"{sum(durations) / max(len(durations), 1):.0f} s each on average")
    if not counts:
        print("tests.flakes: no test failed")
        return 0
    for test, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"{n} of {args.runs}  {test}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
