"""N producers x M consumers in real processes (tests._processes), with exact accounting."""

import multiprocessing as mp

import pytest

from tests import _workers as w
from tests._processes import WORKERS


def _run(procs):
    for p in procs:
        p.start()
    return procs


def _join_all(procs, timeout=120):
    for p in procs:
        p.join(timeout)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
        p.join()
    assert not alive, f"{len(alive)} worker(s) hung"
    assert [p.exitcode for p in procs] == [0] * len(procs)


@pytest.mark.parametrize("producers,consumers,batch", [(1, 1, 1), (3, 2, 1), (2, 3, 16), (4, 4, 64)])
def test_every_message_delivered_once(broker, tmp_path, producers, consumers, batch):
    per_producer = 3000
    q = broker.create_queue("work", max_bytes=256 * 1024)  # small: producers block and wrap often
    done = WORKERS.Event()
    cons = [WORKERS.Process(target=w.consumer, args=(broker.namespace, "work", str(tmp_path / f"c{i}"), batch, done))
            for i in range(consumers)]
    prods = [WORKERS.Process(target=w.producer, args=(broker.namespace, "work", f"p{i}", per_producer, batch))
             for i in range(producers)]
    _run(cons + prods)
    _join_all(prods)
    done.set()
    _join_all(cons)
    received = []
    for i in range(consumers):
        received += (tmp_path / f"c{i}").read_text().split()
    expected = {f"p{i}:{s}" for i in range(producers) for s in range(per_producer)}
    assert len(received) == len(expected), "lost or duplicated messages"
    assert set(received) == expected
    # FIFO per producer within each consumer's stream
    for i in range(consumers):
        seen = {}
        for line in (tmp_path / f"c{i}").read_text().split():
            tag, seq = line.split(":")
            assert int(seq) > seen.get(tag, -1)
            seen[tag] = int(seq)
    s = q.stats()
    assert (s.ready, s.in_flight, s.bytes_used) == (0, 0, 0)
    assert s.enqueued_total == s.acked_total == len(expected)
    assert s.redelivered_total == 0


def test_pickled_handle_works_in_spawn_and_fork_children(broker):
    q = broker.create_queue("q")
    for ctx in (mp.get_context("spawn"), mp.get_context("fork")):
        out = ctx.Queue()
        p = ctx.Process(target=w.get_one_from_handle, args=(q, out))
        p.start()
        q.put(b"hello " + ctx.get_start_method().encode())
        assert out.get(timeout=30) == b"hello " + ctx.get_start_method().encode()
        p.join(30)
        assert p.exitcode == 0
        out.close()
        out.join_thread()
    assert q.stats().acked_total == 2
