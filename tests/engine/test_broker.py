"""The Broker and its namespace: connecting makes nothing, only a create makes the
namespace; ``create=False`` refuses one that does not exist."""


import pytest

import shmq
from shmq.engine.shm.segment import namespace_entries
from tests._processes import WORKERS


def _in_child(namespace, conn):
    """Another process makes the namespace by creating a queue."""
    with shmq.connect(namespace=namespace) as b:
        b.create_queue("made-there")
    conn.send("done")


def test_connecting_to_a_namespace_that_does_not_exist_makes_nothing(namespace):
    with shmq.connect(namespace=namespace) as b:
        assert namespace_entries(namespace) == []  # no /dev/shm/shmq.NS.registry for a typo
        assert (b.list_queues(), b.list_streams(), b.list_exchanges()) == ([], [], [])
        with pytest.raises(shmq.QueueNotFound):
            b.queue("q")
        with pytest.raises(shmq.StreamNotFound):
            b.stream("s")
        with pytest.raises(shmq.QueueNotFound, match=f"no queue 'q' in namespace '{namespace}'"):
            b.delete_queue("q")
        with pytest.raises(shmq.StreamNotFound):
            b.delete_stream("s")
        with pytest.raises(shmq.ExchangeNotFound):
            b.delete_exchange("x")
        with pytest.raises(shmq.ExchangeNotFound):
            b.unbind("x", "q")
        with pytest.raises(shmq.QueueNotFound):
            b.bind("x", "q")
        with pytest.raises(ValueError):  # a bad create makes nothing either
            b.create_queue("q", max_bytes=10)
        b.ping()
    assert namespace_entries(namespace) == []


@pytest.mark.parametrize("create", ["queue", "stream", "exchange"])
def test_the_first_create_makes_the_namespace(namespace, create):
    with shmq.connect(namespace=namespace) as b:
        if create == "queue":
            b.create_queue("q").close()
        elif create == "stream":
            b.create_stream("s", partitions=1, max_bytes=4096).close()
        else:
            b.create_exchange("x")
        assert f"shmq.{namespace}.registry" in namespace_entries(namespace)
        assert (b.list_queues(), b.list_streams(), b.list_exchanges()) == (
            ["q"] if create == "queue" else [], ["s"] if create == "stream" else [],
            ["x"] if create == "exchange" else [])
    with shmq.connect(namespace=namespace, create=False) as b:  # it exists now
        assert b.namespace == namespace


def test_create_false_refuses_a_namespace_that_does_not_exist(namespace):
    with pytest.raises(shmq.NamespaceNotFound, match=f"^no namespace '{namespace}' on this host"):
        shmq.connect(namespace=namespace, create=False)
    assert issubclass(shmq.NamespaceNotFound, FileNotFoundError)  # as Broker(create=False) raised before
    assert namespace_entries(namespace) == []


def test_a_handle_made_before_the_namespace_sees_it_once_another_process_makes_it(namespace):
    with shmq.connect(namespace=namespace) as b:
        assert b.list_queues() == []
        parent, child = WORKERS.Pipe()
        p = WORKERS.Process(target=_in_child, args=(namespace, child))
        p.start()
        try:
            assert parent.poll(60) and parent.recv() == "done"
        finally:
            p.join(30)
        assert p.exitcode == 0
        assert b.list_queues() == ["made-there"]
        b.delete_queue("made-there")
    shmq.destroy_namespace(namespace)


def test_a_closed_broker_says_so(namespace):
    b = shmq.connect(namespace=namespace)
    b.close()
    with pytest.raises(shmq.ShmqError, match="is closed"):
        b.ping()
    with pytest.raises(shmq.ShmqError, match="is closed"):
        b.create_queue("q")
    assert namespace_entries(namespace) == []
