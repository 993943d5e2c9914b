"""The shmq.mp tests' shared fixture: every test's mp queues are destroyed and its
reaper stopped on teardown, and nothing of them may stay in /dev/shm."""

import pytest

from shmq.engine.shm.segment import namespace_entries
from shmq.mp.lifetime import owner


@pytest.fixture(autouse=True)
def mp_cleanup():
    yield
    made = list(owner._mine)
    owner.cleanup()
    assert [e for ns in made for e in namespace_entries(ns)] == []
