"""Shared fixtures: a fresh namespace per test, and leak checks on teardown.

Every test that uses ``broker`` gets its own namespace. On teardown the fixture
deletes the queues the test left, then fails the test if anything of the namespace is
still in /dev/shm (delete_queue must remove a queue's segment and semaphores), or if
the test left child processes running.
"""

import os
import uuid

import psutil
import pytest

import shmq
from shmq._segment import destroy_namespace, namespace_entries


@pytest.fixture
def namespace():
    ns = "t" + uuid.uuid4().hex[:12]
    yield ns
    destroy_namespace(ns)


@pytest.fixture
def broker(namespace):
    b = shmq.connect(namespace=namespace)
    yield b
    try:
        for name in b.list_queues():
            b.delete_queue(name)
        left = [e for e in namespace_entries(namespace) if e != f"shmq.{namespace}.registry"]
    finally:
        b.close()
        destroy_namespace(namespace)
    assert left == [], f"delete_queue left these in /dev/shm: {left}"
    assert namespace_entries(namespace) == []


@pytest.fixture(autouse=True)
def no_stray_children():
    yield
    me = psutil.Process(os.getpid())
    stray = [p for p in me.children(recursive=True) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
             and "resource_tracker" not in " ".join(p.cmdline())]
    for p in stray:
        p.kill()
    assert stray == [], f"test left processes running: {[p.pid for p in stray]}"
