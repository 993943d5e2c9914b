"""Exit codes that tell the truth about what was printed: a file that is not a whole
snapshot, a queue whose shared memory is gone while the registry lists it -- each one
line on stderr and exit 1, never a table that looks fine and exit 0."""

import os

from shmq.engine.shm.names import queue_segment
from shmq.engine.shm.segment import SHM_DIR
from tests.test_cli import shmq_cli


def _one_error_line(r, *parts):
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("shmq: error: "), r.stderr
    for p in parts:
        assert p in r.stderr, r.stderr


def test_inspect_of_a_file_that_is_not_a_snapshot_is_one_line_and_exit_1(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("hello\n")
    r = shmq_cli("inspect", str(f))
    _one_error_line(r, "bad magic", "not a .dmsq snapshot")
    assert r.stdout == ""


def test_inspect_of_a_cut_snapshot_shows_what_it_read_and_exits_1(broker, tmp_path):
    q = broker.create_queue("orders")
    q.put_many([b"x" * 100] * 20)
    assert shmq_cli("snapshot", "orders", "--namespace", broker.namespace, "--data-dir", str(tmp_path)).returncode == 0
    path = tmp_path / "orders.dmsq"
    assert shmq_cli("inspect", str(path)).returncode == 0
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 50])
    r = shmq_cli("inspect", str(path))
    _one_error_line(r)
    assert "complete           False" in r.stdout and "queue              orders" in r.stdout


def test_stats_of_a_half_removed_queue_is_one_line_and_exit_1(broker):
    broker.create_queue("gone").put(b"x")
    broker.create_queue("laned", lanes=3).put(b"y")
    broker.create_queue("fine").put(b"z")
    os.unlink(os.path.join(SHM_DIR, queue_segment(broker.namespace, "gone").lstrip("/")))
    os.unlink(os.path.join(SHM_DIR, queue_segment(broker.namespace, "laned", 2).lstrip("/")))
    ns = ("--namespace", broker.namespace)
    _one_error_line(shmq_cli("stats", "gone", *ns), "queue 'gone' is listed but cannot be read", "shmq doctor")
    _one_error_line(shmq_cli("stats", "laned", *ns), "queue 'laned'")
    r = shmq_cli("stats", *ns)  # the ones that can be read, and the error
    _one_error_line(r, "queue 'gone'", "and 1 more")
    assert "fine" in r.stdout
    assert shmq_cli("stats", "fine", *ns).returncode == 0


def test_stats_of_no_such_queue_is_one_line_and_exit_1(broker):
    _one_error_line(shmq_cli("stats", "nosuch", "--namespace", broker.namespace), "no queue or stream 'nosuch'")
