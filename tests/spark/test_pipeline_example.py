"""examples/pipeline.py, as the README runs it (smaller): producers -> queue -> Spark ->
stream -> consumer group, every order counted once, nothing left in /dev/shm."""

import os
import sys

from shmq.engine.shm.segment import namespace_entries
from tests.spark._session import run_in_session

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_pipeline_example_counts_every_order_once(tmp_path):
    # 601 orders in 2 producers: one puts one more (the README's 20,000 in 3 are all put)
    p, out, err = run_in_session([sys.executable, "examples/pipeline.py", "--orders", "601", "--producers", "2",
                                  "--master", "local[2]"], 300, cwd=ROOT)
    assert p.returncode == 0, err[-3000:]
    assert "601 orders in" in out and "(the producers put 601 orders" in out, out
    assert namespace_entries(f"pipeline{p.pid}") == []

