"""engine/walwatch.py: a watch of a file rings after a write to it, by any process, and
only then; where there is nothing to watch it is None."""

import os
import time

from shmq.engine import walwatch


def test_a_write_rings_and_nothing_else_does(tmp_path):
    path = tmp_path / "x-wal"
    path.write_bytes(b"")
    bell = walwatch.watch(str(path))
    assert bell is not None
    try:
        assert bell.wait(0.01) is False
        os.utime(path)  # attributes only: no ring
        assert bell.wait(0.01) is False
        pid = os.fork()
        if pid == 0:  # another process writes
            with open(path, "ab") as f:
                f.write(b"frame")
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        t0 = time.monotonic()
        assert bell.wait(10) is True and time.monotonic() - t0 < 5
        assert bell.wait(0) is False  # drained
        with open(path, "r+b") as f:
            f.truncate(0)  # a checkpoint's TRUNCATE rings too
        assert bell.wait(10) is True
    finally:
        bell.close()
    assert bell.fd == -1


def test_nothing_to_watch(tmp_path):
    assert walwatch.watch(str(tmp_path / "missing-wal")) is None


def test_close_does_not_wait(tmp_path):
    path = tmp_path / "y-wal"
    path.write_bytes(b"")
    bells = [walwatch.watch(str(path)) for _ in range(20)]
    t0 = time.monotonic()
    for b in bells:
        b.close()
    assert time.monotonic() - t0 < 0.05  # the kernel's grace periods are the closer thread's
