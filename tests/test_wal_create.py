"""A ``wal`` queue or stream created locally while a server with a data dir runs takes its
first put or append at once: the create rings the server's log bell and returns once
its logs are open (shmq/engine/shm/logbell.py), as a create over TCP does. With no such
server, nothing is waited for and a put says why it cannot log."""

import time

import pytest

import shmq
from shmq.engine.shm.names import log_bell
from shmq.engine.shm.segment import namespace_entries
from shmq.errors import ShmqError


def test_the_first_put_and_append_after_a_local_create_are_logged(broker, servers, tmp_path):
    srv = servers(broker.namespace, "--data-dir", str(tmp_path), "--snapshot-interval", "30")
    assert log_bell(broker.namespace).lstrip("/") in {e.removeprefix("sem.") for e in namespace_entries(broker.namespace)}
    for i in range(10):  # a round every 30 s would open none of them in time
        q = broker.create_queue(f"q{i}", durability="wal", lanes=1 + i % 3)
        q.put_nowait(b"first")
        assert q.get_nowait().body == b"first"
        s = broker.create_stream(f"s{i}", partitions=2, durability="wal")
        s.append(b"first", partition=1)
    assert any(p.name.startswith("q9") and ".wal." in p.name for p in tmp_path.iterdir())
    assert srv.stop() == 0
    assert log_bell(broker.namespace).lstrip("/") not in {e.removeprefix("sem.") for e in namespace_entries(broker.namespace)}


@pytest.mark.parametrize("server_args", [None, ("--no-persist",)])
def test_with_no_server_that_logs_the_create_does_not_wait_and_a_put_says_why(broker, servers, server_args):
    srv = servers(broker.namespace, *server_args) if server_args is not None else None
    started = time.monotonic()
    q = broker.create_queue("q", durability="wal")
    assert time.monotonic() - started < 1.0
    with pytest.raises(ShmqError, match="no shmq server with a --data-dir has opened its write-ahead log"):
        q.put(b"x")
    if srv is not None:
        assert srv.stop() == 0
