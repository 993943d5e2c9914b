"""The blocking client's own conventions: handles pickle by url and name, and work in a
child process (which connects again)."""

import pickle

import shmq
from tests import _workers as w
from tests._processes import WORKERS


def test_remote_handles_pickle_as_their_url_and_name(tcp_server):
    with shmq.connect(tcp_server.url) as b:
        q = b.create_queue("q")
        copy = pickle.loads(pickle.dumps(q))
        try:
            assert (repr(copy), copy._broker is not b) == (f"<shmq.RemoteQueue {tcp_server.url}/q>", True)
            copy.put(b"from the copy")
            assert q.get(timeout=5).body == b"from the copy"
        finally:
            copy._broker.close()
        b2 = pickle.loads(pickle.dumps(b))
        with b2:
            assert (repr(b2), b2.list_queues()) == (f"<shmq.RemoteBroker {tcp_server.url}>", ["q"])


def test_a_remote_stream_pickles_as_its_url_and_name(tcp_server):
    with shmq.connect(tcp_server.url) as b:
        s = b.create_stream("events", partitions=2, max_bytes=1 << 16)
        copy = pickle.loads(pickle.dumps(s))
        try:
            assert (repr(copy), copy.partitions, copy._broker is not b) == (
                f"<shmq.RemoteStream {tcp_server.url}/events partitions=2>", 2, True)
            m = copy.append(b"from the copy")
            assert s.read(m.partition, m.offset)[0].value == b"from the copy"
        finally:
            copy._broker.close()
        b.delete_stream("events")


def test_a_remote_handle_works_in_a_child_process(tcp_server):
    with shmq.connect(tcp_server.url) as b:
        q = b.create_queue("q")
        ctx = WORKERS
        out = ctx.Queue()
        p = ctx.Process(target=w.get_one_from_handle, args=(q, out))
        p.start()
        q.put(b"hello child")
        assert out.get(timeout=30) == b"hello child"
        p.join(30)
        assert p.exitcode == 0
        out.close()
        out.join_thread()
        assert q.stats().acked_total == 1
