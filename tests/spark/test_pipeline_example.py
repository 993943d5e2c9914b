"""examples/pipeline.py, as the README runs it (smaller): producers -> queue -> Spark ->
stream -> consumer group, every order counted once, nothing left in /dev/shm."""

import os
import subprocess
import sys

import psutil

from shmq.engine.segment import namespace_entries

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_pipeline_example_counts_every_order_once(tmp_path):
    p = subprocess.Popen([sys.executable, "examples/pipeline.py", "--orders", "600", "--producers", "2",
                          "--master", "local[2]"], cwd=ROOT, start_new_session=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=300)
    finally:
        left = [q for q in psutil.process_iter() if _sid(q.pid) == p.pid]
        for q in left:
            q.kill()
        psutil.wait_procs(left, timeout=30)
    assert p.returncode == 0, err[-3000:]
    assert "600 orders in" in out and "(the producers put 600 orders" in out, out
    assert namespace_entries(f"pipeline{p.pid}") == []


def _sid(pid):
    try:
        return os.getsid(pid)
    except OSError:
        return None
