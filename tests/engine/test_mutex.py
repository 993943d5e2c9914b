"""The queue lock against holders that stop without dying, and processes that do not
share one monotonic clock.

A process stopped with SIGSTOP (or held in a debugger) while it holds a queue's lock is
alive: the robust mutex never hands its lock on. Every call that takes a timeout must
still return by it, and every other call by ``LOCK_TIMEOUT_S``.
"""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import shmq
from shmq.engine.shm import mutex as _mutex
from tests import _workers as w
from tests._processes import WORKERS


@pytest.fixture
def stopped_holder(broker):
    """A queue whose lock is held by a SIGSTOPped process; killed afterwards."""
    q = broker.create_queue("q")
    q.put_many([b"a", b"b"])
    ctx = WORKERS
    ready = ctx.Event()
    p = ctx.Process(target=w.hold_lock, args=(broker.namespace, "q", ready, False))
    p.start()
    assert ready.wait(30)
    os.kill(p.pid, signal.SIGSTOP)
    yield q, p
    if p.is_alive():
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)


def _returns_within(seconds, call, *args, **kwargs):
    """Runs ``call``; returns (what it raised, how long it took)."""
    t0 = time.monotonic()
    with pytest.raises(shmq.ShmqError) as err:
        call(*args, **kwargs)
    took = time.monotonic() - t0
    assert took < seconds, f"{call.__name__} took {took:.2f}s"
    return err.value, took


def test_calls_with_a_timeout_honour_it_while_a_stopped_process_holds_the_lock(stopped_holder):
    q, holder = stopped_holder
    err, _ = _returns_within(2, q.put_nowait, b"x")
    assert isinstance(err, shmq.QueueFull) and f"thread {holder.pid}" in str(err) and "stopped" in str(err)
    err, _ = _returns_within(2, q.get_nowait)
    assert isinstance(err, shmq.QueueEmpty)
    err, took = _returns_within(3, q.get, timeout=0.5)
    assert isinstance(err, shmq.QueueEmpty) and took >= 0.5
    err, took = _returns_within(3, q.put, b"x", timeout=0.5)
    assert isinstance(err, shmq.QueueFull) and took >= 0.5
    _returns_within(3, q.put_many, [b"x", b"y"], timeout=0.3)
    _returns_within(3, q.get_many, 5, timeout=0.3)


def test_calls_without_a_timeout_give_up_after_the_lock_timeout(stopped_holder, monkeypatch):
    q, holder = stopped_holder
    monkeypatch.setattr(_mutex, "LOCK_TIMEOUT_S", 0.3)
    for call in (q.stats, q.purge, q._housekeep):
        err, took = _returns_within(3, call)
        assert isinstance(err, shmq.LockTimeout) and "queue 'q'" in str(err) and took >= 0.3


def test_the_lock_works_again_once_the_stopped_holder_is_killed(stopped_holder):
    q, holder = stopped_holder
    with pytest.raises(shmq.QueueFull):
        q.put_nowait(b"x")
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)
    assert q.put(b"c", timeout=5) == 3  # EOWNERDEAD: repaired, then the put goes in
    assert [d.body for d in q.get_many(5, timeout=0)] == [b"a", b"b", b"c"]


def test_the_server_stays_responsive_while_a_local_holder_is_stopped(stopped_holder, tcp_server):
    q, _holder = stopped_holder
    with shmq.connect(tcp_server.url) as remote:
        t0 = time.monotonic()
        with pytest.raises(shmq.LockTimeout, match="queue 'q': its lock stayed held"):
            remote.queue("q")  # (it asks for STATS, which waits for the lock a short while only)
        rq = remote.create_queue("q", exist_ok=True)  # attaches without the lock
        with pytest.raises(shmq.QueueFull):
            rq.put(b"x", timeout=0.5)  # the server answers QUEUE_FULL; the client retries till its timeout
        with pytest.raises(shmq.QueueEmpty):
            rq.get(timeout=0.5)
        assert time.monotonic() - t0 < 5
        remote.ping()


def test_a_queue_refuses_processes_of_another_time_namespace(broker):
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    probe = subprocess.run(["unshare", "-T", "--fork", "true"], capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"cannot make a time namespace here: {probe.stderr.strip()}")
    broker.create_queue("q").put(b"x")
    script = (f"import shmq\ntry:\n    shmq.connect(namespace={broker.namespace!r}).queue('q')\n"
              "except shmq.ShmqError as e:\n    print(e)\n")
    r = subprocess.run(["unshare", "-T", "--fork", "--monotonic", "1000", sys.executable, "-c", script],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert r.returncode == 0, r.stderr
    assert "created in another time namespace (its CLOCK_MONOTONIC is -1000.000s from ours)" in r.stdout
    same = subprocess.run(["unshare", "-T", "--fork", sys.executable, "-c", script.replace("print(e)", "raise")],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert same.returncode == 0 and same.stderr == ""  # a time namespace of the same clock is welcome


def test_a_stopped_holder_of_a_stream_partition_lock_hangs_no_one(broker, tcp_server, monkeypatch):
    s = broker.create_stream("s", partitions=1, max_bytes=1 << 16)
    s.append(b"before")
    ctx = WORKERS
    ready = ctx.Event()
    p = ctx.Process(target=w.hold_partition_lock, args=(broker.namespace, "s", ready))
    p.start()
    try:
        assert ready.wait(30)
        os.kill(p.pid, signal.SIGSTOP)
        monkeypatch.setattr(_mutex, "LOCK_TIMEOUT_S", 0.3)
        err, _took = _returns_within(3, s.append, b"x")
        assert isinstance(err, shmq.LockTimeout) and "stream 's' partition 0" in str(err)
        with shmq.connect(tcp_server.url) as remote:  # the server waits 0.25 s at most, then answers
            rs = remote.stream("s")
            t0 = time.monotonic()
            with pytest.raises(shmq.LockTimeout):
                rs.read(0, 0)
            assert time.monotonic() - t0 < 3
            remote.ping()
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
    assert [r.value for r in s.read(0, 0)] == [b"before"]  # repaired after the holder died
