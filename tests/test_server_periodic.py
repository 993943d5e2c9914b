"""The server's periodic work (``server/periodic.py``, ``server/housekeeper.py``): a run
that says it has nothing to do for a while is not woken before then, so an idle server's
housekeeping thread wakes for its rounds only (4 a second), not every compaction tick
(20 a second), unless a compacted stream asks for those."""

import threading
import time

from shmq.server.housekeeper import ROUND_S, Housekeeper
from shmq.server.periodic import Periodic
from tests._wait import wait_for


def test_a_run_that_says_when_it_is_next_due_is_not_run_before():
    began = []
    lock = threading.Lock()

    def work():
        with lock:
            began.append(time.monotonic())
        return 0.3 if len(began) == 1 else None  # the first says "nothing for 0.3 s"; the others nothing

    p = Periodic(0.01, work, "test").start()
    try:
        wait_for(lambda: len(began) >= 3, 10, "three runs")
    finally:
        p.stop()
        p.join()
    with lock:
        first, second, third = began[:3]
    assert second - first >= 0.3  # not the period's 0.01
    assert third - second < 0.3  # (back to the period: here within the bound a loaded host allows)


def test_an_idle_housekeeper_waits_for_its_next_round_and_a_compacted_stream_for_its_ticks(broker):
    broker.create_queue("q").close()
    s = broker.create_stream("s", partitions=1)
    keeper = Housekeeper(broker)
    try:
        wait = keeper.tick()  # a round: it attaches both
        assert wait is not None and 0 < wait <= ROUND_S
        assert keeper.tick() <= wait  # between rounds: no compacted stream, no tick
        broker.create_stream("c", partitions=1, compact=True).close()
        keeper._round_due = 0.0  # (the next round now, not in up to ROUND_S)
        assert keeper.tick() is None  # a compacted stream attached: the next tick is due
        assert keeper.tick() is None
    finally:
        for h in [*keeper._queues.values(), *keeper._streams.values()]:
            h.close()
        s.close()
        broker.delete_stream("s")
        broker.delete_stream("c")
        broker.delete_queue("q")
