"""The write-ahead log's file names and its all-or-nothing append (the full-disk case on
a real small filesystem is in tests/test_storage_faults.py)."""

import errno
import os

import pytest

import shmq
from shmq import dmsq
from shmq.engine import wal
from shmq.persistence import Snapshotter


def test_log_names_are_made_and_read_in_one_place():
    assert wal.wal_path("/d", "orders.eu", 7) == "/d/orders.eu.wal.00000007"
    assert wal.parse_wal_name("orders.eu.wal.00000007") == ("orders.eu", 7)
    for other in ("orders.dmsq", "orders.wal.00000007.corrupt", "orders.wal.", ".wal.00000001", "x.wal.1a"):
        assert wal.parse_wal_name(other) is None


@pytest.fixture
def wal_queue(broker, tmp_path):
    q = broker.create_queue("q", durability="wal")
    Snapshotter(broker, str(tmp_path), wal_mode=0).open_wal(q)
    q.put(b"before")
    return q


def test_a_failed_append_is_cut_back_and_changes_nothing(wal_queue, monkeypatch):
    q = wal_queue
    path = q.wal.path(q.wal.config()[0])
    size = os.path.getsize(path)
    real_write = os.write

    def half_then_full(fd, data):  # what a filling disk does: a short write, then ENOSPC
        if fd == q.wal.fd[1]:
            monkeypatch.setattr(os, "write", full)
            return real_write(fd, bytes(data)[: len(data) // 2])
        return real_write(fd, data)

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(shmq.StorageError, match="No space left on device; nothing was changed"):
        q.put(b"x" * 6000)  # the Python path (the C one takes entries up to 4 KiB)
    monkeypatch.setattr(os, "write", real_write)
    assert os.path.getsize(path) == size and q.stats().ready == 1
    q.put(b"after")
    entries, error, _end = dmsq.read_log(path)
    assert error is None and [e.body for e in entries] == [b"before", b"after"]


def test_a_log_that_cannot_be_cut_back_is_left_for_the_next_generation(wal_queue, monkeypatch):
    q = wal_queue
    gen = q.wal.config()[0]
    monkeypatch.setattr(os, "write", lambda fd, data: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    monkeypatch.setattr(os, "ftruncate", lambda fd, size: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    monkeypatch.setattr(os, "fstat", lambda fd: os.stat_result((0,) * 6 + (10**9,) + (0,) * 3))
    with pytest.raises(shmq.StorageError, match="I/O error"):
        q.put(b"y" * 6000)
    monkeypatch.undo()
    assert q.wal.config()[0] == gen + 1  # no entry will land behind the damage
    q.put(b"next")
    entries, error, _end = dmsq.read_log(q.wal.path(gen + 1))
    assert error is None and [e.body for e in entries] == [b"next"]


def test_a_suspended_log_refuses_puts_until_it_is_configured_again(wal_queue, tmp_path):
    q = wal_queue
    q.wal.suspend()
    with pytest.raises(shmq.StorageError, match="is gone"):
        q.put(b"refused")
    assert q.stats().ready == 1
    q.wal.configure(str(tmp_path), 0, 0, generation=5)
    q.put(b"back")
    assert [e.body for e in dmsq.read_log(q.wal.path(5))[0]] == [b"back"]
