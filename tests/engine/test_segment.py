"""Shared-memory segments: permissions, names, lifetime, and the resource tracker."""

import multiprocessing as mp
import os
import stat
import subprocess
import sys
import textwrap

import shmq
from shmq.engine.shm.segment import destroy_namespace, namespace_entries
from tests import _workers as w


def test_segments_are_owner_only_and_carry_the_namespace(broker):
    broker.create_queue("orders")
    entries = namespace_entries(broker.namespace)
    ns = broker.namespace
    assert sorted(entries) == sorted([
        f"shmq.{ns}.registry", f"shmq.{ns}.q.orders", f"sem.shmq.{ns}.q.orders.ne", f"sem.shmq.{ns}.q.orders.nf",
    ])
    for e in entries:
        mode = stat.S_IMODE(os.stat(f"/dev/shm/{e}").st_mode)
        assert mode == 0o600, f"{e} has mode {oct(mode)}"


def test_delete_queue_leaves_nothing(broker):
    for i in range(3):
        broker.create_queue(f"q{i}")
    for i in range(3):
        broker.delete_queue(f"q{i}")
    assert namespace_entries(broker.namespace) == [f"shmq.{broker.namespace}.registry"]
    assert broker.list_queues() == []


def test_namespaces_are_independent(namespace):
    other = namespace + "x"
    with shmq.connect(namespace=namespace) as a, shmq.connect(namespace=other) as b:
        assert (a.namespace, b.namespace) == (namespace, other)
        a.create_queue("same").put(b"in a")
        b.create_queue("same").put(b"in b")
        assert a.queue("same").get_nowait().body == b"in a"
        assert b.queue("same").get_nowait().body == b"in b"
        assert a.list_queues() == b.list_queues() == ["same"]
    destroy_namespace(other)
    assert namespace_entries(other) == []


def test_default_namespace_comes_from_the_environment(monkeypatch, namespace):
    monkeypatch.setenv("SHMQ_NAMESPACE", namespace)
    with shmq.connect() as b:
        assert b.namespace == namespace
    monkeypatch.delenv("SHMQ_NAMESPACE")
    assert shmq.default_namespace() == "shmq"


def test_segment_survives_an_attachers_exit_spawn(broker):
    """CPython issue 82300: the resource tracker must not unlink what a child attached."""
    q = broker.create_queue("q")
    ctx = mp.get_context("spawn")
    for i in range(3):
        p = ctx.Process(target=w.attach_and_exit, args=(broker.namespace, "q", b"from child %d" % i))
        p.start()
        p.join(30)
        assert p.exitcode == 0
    assert f"shmq.{broker.namespace}.q.q" in namespace_entries(broker.namespace)
    assert [q.get_nowait().body for _ in range(3)] == [b"from child %d" % i for i in range(3)]


def test_segment_survives_an_independent_python_that_attached(broker):
    """A separate interpreter (its own resource tracker) attaches, creates a queue and exits."""
    broker.create_queue("q")
    code = textwrap.dedent(f"""
        import shmq
        from multiprocessing import resource_tracker
        b = shmq.connect(namespace={broker.namespace!r})
        b.queue("q").put(b"x")
        b.create_queue("made-by-child").put(b"y")
        resource_tracker.ensure_running()  # a tracker is running, and must not unlink our segments
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60,
                   env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert broker.list_queues() == ["made-by-child", "q"]
    assert broker.queue("q").get_nowait().body == b"x"
    assert broker.queue("made-by-child").get_nowait().body == b"y"


def test_destroy_namespace_removes_everything(namespace):
    with shmq.connect(namespace=namespace) as b:
        b.create_queue("a")
        b.create_queue("b")
    assert destroy_namespace(namespace) == 7  # registry + 2 x (segment + 2 semaphores)
    assert namespace_entries(namespace) == []

