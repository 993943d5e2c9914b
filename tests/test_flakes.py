"""tests/flakes.py: the suite (or a part) N times beside CPU-bound processes, each test
that failed at least once listed with its count, exit 1 then; 0 when none failed."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_it_lists_each_test_that_failed_with_its_count(tmp_path):
    (tmp_path / "test_toy.py").write_text(
        "import os\n"
        "def test_fine():\n    pass\n"
        "def test_broken():\n    assert False\n"
        "def test_every_other_run():\n"
        "    marker = os.path.join(os.path.dirname(__file__), 'ran')\n"
        "    first = not os.path.exists(marker)\n"
        "    open(marker, 'a').close()\n"
        "    assert not first\n")
    r = subprocess.run([sys.executable, "-m", "tests.flakes", "--runs", "2", "--burners", "1",
                        str(tmp_path / "test_toy.py"), "-p", "no:randomly"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 1, r.stdout + r.stderr
    last = r.stdout.splitlines()[-2:]  # (the ids are as pytest's report names them, from its root)
    assert [line.split("  ")[0] for line in last] == ["2 of 2", "1 of 2"], r.stdout
    assert last[0].endswith("test_toy.py::test_broken") and last[1].endswith("test_toy.py::test_every_other_run")
    assert "run 1 of 2: exit 1, 2 failed" in r.stdout and "run 2 of 2: exit 1, 1 failed" in r.stdout


def test_none_failed_is_exit_0(tmp_path):
    (tmp_path / "test_toy.py").write_text("def test_fine():\n    pass\n")
    r = subprocess.run([sys.executable, "-m", "tests.flakes", "--runs", "1", "--burners", "1",
                        str(tmp_path / "test_toy.py")], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "tests.flakes: no test failed", r.stdout


def test_costs_lists_the_tests_that_spent_cpu_and_those_that_waited(tmp_path):
    """tests/costs.py: each test's wall and CPU time, and the CPUs' busy share, over a run."""
    (tmp_path / "test_toy.py").write_text(
        "import threading, time\n"
        "def test_busy():\n"
        "    end = time.process_time() + 0.3\n"
        "    while time.process_time() < end:\n        pass\n"
        "def test_waits():\n    threading.Event().wait(1.0)  # (what is measured: a second spent waiting)\n"
        "def test_nothing():\n    pass\n")
    r = subprocess.run([sys.executable, "-m", "tests.costs", "--top", "1", str(tmp_path / "test_toy.py"),
                        "-p", "no:cacheprovider"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()[-8:]
    assert lines[0].startswith("tests.costs: 3 tests in ") and "% busy (" in lines[0], lines
    assert lines[2].startswith("most CPU, by file:") and lines[3].endswith("test_toy.py"), lines
    assert lines[4].startswith("most CPU, by test:") and lines[5].endswith("test_toy.py::test_busy"), lines
    assert float(lines[5].split()[0]) >= 0.3, lines
    assert lines[6].startswith("most waiting") and lines[7].endswith("test_toy.py::test_waits"), lines
    assert float(lines[7].split()[0]) >= 0.9, lines
    assert not any(" worker " in line for line in r.stdout.splitlines())
    r = subprocess.run([sys.executable, "-m", "tests.costs", "--top", "1", str(tmp_path / "test_toy.py"), "-n", "2",
                        "-p", "no:cacheprovider"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stdout + r.stderr
    workers = [line.split() for line in r.stdout.splitlines() if line.startswith("tests.costs: worker gw")]
    assert [w[2] for w in workers] == ["gw0:", "gw1:"] and sum(int(w[3]) for w in workers) == 3, workers
