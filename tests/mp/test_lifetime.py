"""shmq.mp's queues live as long as the process that made them: removed at its exit, or
by the reaper when it dies (SIGKILL included), and never while its children use them."""

import multiprocessing
import os
import signal

import psutil

from shmq import mp
from shmq.engine.shm import reaper
from shmq.engine.shm.segment import SHM_DIR, namespace_entries
from tests._wait import wait_for
from tests.mp import _workers as workers

SPAWN = multiprocessing.get_context("spawn")
BIG = 200_000  # over mp.INLINE_MAX: an object in a segment of its own


def _gone(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_reaper_and_the_segment_module_agree_on_a_namespace_s_names():
    q = mp.JoinableQueue(2)
    q.put(bytearray(BIG))  # a segment of its own
    mine = namespace_entries(q._ns)
    assert reaper.entries(q._ns, os.listdir(SHM_DIR)) == mine
    assert {e.removeprefix("sem.").split(".")[2] for e in mine} >= {"registry", "q", "slots", "unfinished", "idle", "b"}
    names = [f"shmq.{q._ns}", f"shmq.{q._ns}x.q.q", f"sem.shmq.{q._ns}x.q.q.ne", "shmq.other.q.q"]
    assert reaper.entries(q._ns, names) == [f"shmq.{q._ns}"]


def test_a_creator_killed_with_sigkill_leaves_nothing():
    here, there = SPAWN.Pipe()
    p = SPAWN.Process(target=workers.create_and_wait, args=(there,))
    p.start()
    try:
        assert here.poll(30)
        namespaces, reaper_pid, child_pid = here.recv()
        assert all(namespace_entries(ns) for ns in namespaces)
        try:
            os.kill(p.pid, signal.SIGKILL)
            # its fork child lives on, attached, and holds no copy of the reaper's pipe
            wait_for(lambda: not any(namespace_entries(ns) for ns in namespaces), what="/dev/shm to be cleaned")
            wait_for(lambda: _gone(reaper_pid), what="the reaper to exit")
            assert not _gone(child_pid)
        finally:
            os.kill(child_pid, signal.SIGKILL)
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)  # (only once the child is gone too: it holds a copy of the sentinel's pipe)
    assert p.exitcode == -signal.SIGKILL
    wait_for(lambda: _gone(child_pid), what="the orphaned child to go")


def test_a_killed_reaper_is_replaced_by_one_that_knows_every_namespace():
    here, there = SPAWN.Pipe()
    p = SPAWN.Process(target=workers.create_kill_reaper_create, args=(there,))
    p.start()
    try:
        assert here.poll(30)
        namespaces, reaper_pid = here.recv()
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
    wait_for(lambda: not any(namespace_entries(ns) for ns in namespaces), what="/dev/shm to be cleaned")
    wait_for(lambda: _gone(reaper_pid), what="the new reaper to exit")


def test_a_creator_that_exits_leaves_nothing_once_its_children_are_done():
    here, there = SPAWN.Pipe()
    p = SPAWN.Process(target=workers.create_and_exit, args=(there,))
    p.start()
    assert here.poll(30)
    ns, reaper_pid = here.recv()
    assert here.poll(30) and here.recv() == "hello"  # its spawn child attached after it returned
    p.join(30)
    assert p.exitcode == 0
    assert namespace_entries(ns) == []
    assert _gone(reaper_pid)
