"""Celery's event loop on a local attach (shmq/kombu_loop.py, ``EventLoop``): kombu's own Hub,
real queues in shared memory, a producer in another process. (The real ``celery worker``
runs on it in tests/jobs/test_celery.py.)"""

import os
import select
import subprocess
import sys
import threading

import pytest
from kombu import Connection, Consumer, Queue
from kombu.asynchronous import Hub

import shmq.kombu
import shmq.kombu_loop
from tests._wait import wait_for
from tests.jobs.test_celery import Jobs, settled

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Loop:
    """A kombu Connection registered with a Hub of its own, and one consumer of queue
    "jobs" whose callback keeps every message (acked by the test, on the loop's thread)."""

    def __init__(self, namespace, prefetch=None):
        self.conn = Connection(f"shmq:///{namespace}")
        self.hub = Hub()
        self.conn.transport.register_with_event_loop(self.conn.connection, self.hub)
        self.events = self.conn.transport._loop
        self.channel = self.conn.channel()
        if prefetch is not None:
            self.channel.basic_qos(prefetch_count=prefetch)
        self.got = []
        self.consumer = Consumer(self.channel, [Queue("jobs")], callbacks=[self.on_message], auto_declare=True)
        self.consumer.consume()
        self.ack_at_once = False
        self._stop = False
        self.thread = None

    def on_message(self, body, message):
        self.got.append(message)
        if self.ack_at_once:
            message.ack()

    def payloads(self):
        return [m.payload for m in self.got]

    def run_in_thread(self):
        """Turn the loop in a thread of its own until ``close``."""
        def run():
            loop = self.hub.create_loop()
            while not self._stop:
                next(loop)

        self.ack_at_once = True
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def close(self):
        self._stop = True
        if self.thread is not None:
            self.events.wake()
            self.thread.join(30)
            assert not self.thread.is_alive()
        self.conn.close()
        self.hub.close()


@pytest.fixture
def make_loop(broker):
    made = []

    def make(**options):
        made.append(Loop(broker.namespace, **options))
        return made[-1]

    yield make
    for loop in made:
        loop.close()


@pytest.fixture
def jobs(broker, tmp_path):
    """The real ``celery worker``'s environment (tests/jobs/test_celery.py), its workers
    killed at the end."""
    j = Jobs(broker.namespace, tmp_path)
    yield j
    j.close()


def put(namespace, *payloads):
    """Publish ``payloads`` to queue "jobs" through kombu, from a process of its own."""
    subprocess.run([sys.executable, "-c", "import sys, shmq.kombu; from kombu import Connection\n"
                    f"with Connection('shmq:///{namespace}') as c:\n"
                    "    q = c.SimpleQueue('jobs')\n"
                    "    for p in sys.argv[1:]: q.put(p)\n", *payloads], cwd=ROOT, check=True, timeout=60)


def test_local_attach_runs_the_event_loop_tcp_the_synchronous_one(namespace):
    local = Connection(f"shmq:///{namespace}").transport
    tcp = Connection("shmq://127.0.0.1:7878").transport
    assert local.implements.asynchronous is True  # Celery's worker runs asynloop and AsynPool
    assert tcp.implements.asynchronous is False  # kombu's drain_events
    hub = Hub()
    try:
        tcp.register_with_event_loop(None, hub)
        assert tcp._loop is None and not hub.readers and not hub.on_tick
    finally:
        hub.close()


def test_each_turn_takes_as_far_as_the_prefetch_allows(broker, make_loop):
    loop = make_loop(prefetch=2)
    put(broker.namespace, *"abcde")
    loop.events.on_tick()
    assert loop.payloads() == ["a", "b"]
    loop.events.on_tick()
    assert loop.payloads() == ["a", "b"]  # the prefetch is full: nothing more taken
    loop.got[0].ack()
    loop.events.on_tick()
    assert loop.payloads() == ["a", "b", "c"]
    for m in loop.got[1:]:
        m.ack()
    loop.events.on_tick()
    assert loop.payloads() == list("abcde")
    s = broker.queue("jobs").stats()
    assert (s.ready, s.in_flight, s.acked_total) == (0, 2, 3)
    for m in loop.got[3:]:
        m.ack()
    assert broker.queue("jobs").stats().acked_total == 5


def test_a_turn_takes_at_most_its_budget_then_turns_again(broker, make_loop):
    budget = shmq.kombu_loop.EventLoop.BUDGET
    loop = make_loop()
    put(broker.namespace, *(str(i) for i in range(budget + 6)))
    loop.events.on_tick()
    assert loop.payloads() == [str(i) for i in range(budget)]
    assert select.select([loop.events._r], [], [], 0)[0]  # woken: the loop turns again at once
    loop.events.on_tick()
    assert loop.payloads() == [str(i) for i in range(budget + 6)]
    for m in loop.got:
        m.ack()
    s = broker.queue("jobs").stats()
    assert (s.ready, s.in_flight, s.acked_total) == (0, 0, budget + 6)


@pytest.mark.slow
def test_an_idle_loop_hears_puts_from_another_process(broker, make_loop):
    loop = make_loop()
    loop.run_in_thread()
    line = wait_for(lambda: next(iter(loop.events.watched.values()), None), 10, "the queue's line")
    wait_for(lambda: line.live, 10, "the empty queue's doorbell listening")
    put(broker.namespace, "one")
    wait_for(lambda: len(loop.got) == 1, 30, "the put delivered")
    wait_for(lambda: line.live, 10, "the doorbell listening again")
    put(broker.namespace, "two", "three")
    wait_for(lambda: len(loop.got) == 3, 30, "the puts delivered")
    loop.close()
    assert loop.payloads() == ["one", "two", "three"]
    s = broker.queue("jobs").stats()
    assert (s.ready, s.in_flight, s.acked_total, s.redelivered_total) == (0, 0, 3, 0)


@pytest.mark.slow
def test_cancel_and_close_stop_the_doorbells(broker, make_loop):
    loop = make_loop()
    line = wait_for(lambda: (loop.events.on_tick(), next(iter(loop.events.watched.values()), None))[1], 10,
                    "the queue's line")
    line.wait_from(shmq.engine.shm.doze.stamp(line.handle))  # listening, as after a quiet spell
    bells = lambda: [t for t in threading.enumerate() if t.name == "shmq-doorbell-jobs"]  # noqa: E731
    wait_for(bells, 10, "the doorbell's thread")
    loop.consumer.cancel()
    assert loop.events.watched == {}
    wait_for(lambda: not bells(), 10, "the doorbell's thread gone")
    events, hub, transport = loop.events, loop.hub, loop.conn.transport
    loop.conn.close()
    assert transport._loop is None
    assert events.on_tick not in hub.on_tick and events._r not in hub.readers
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(events._r)


@pytest.mark.slow
def test_worker_on_the_event_loop_retries_after_the_countdown(broker, jobs):
    """The real ``celery worker`` (local attach: asynloop, AsynPool): a job sent to it once
    idle is done, and one retried with a 0.3 s countdown runs again no earlier than that
    (the timer rounds: 0.25 s) and within a bound; every message acked once."""
    app = jobs.app()
    w = jobs.worker(concurrency=1)
    app.send_task("tests.jobs.celery_app.record", ("first",))
    wait_for(lambda: jobs.count("done") == {"first": 1}, 60, "the first job done")
    app.send_task("tests.jobs.celery_app.flaky", ("f", 1))  # fails once, retried after 0.3 s
    wait_for(lambda: jobs.count("done")["f"] == 1 and settled(broker, 3), 60, "the retried job done")
    jobs.stop(w)
    assert w.returncode == 0, jobs.output()
    assert jobs.count("start") == {"f": 2}
    first, second = (float(e[3]) for e in jobs.events("start"))
    assert 0.25 <= second - first < 10
    s = broker.queue("celery").stats()
    # the first job, the flaky one and its retry (a new message): each acked once
    assert (s.ready, s.in_flight, s.acked_total, s.redelivered_total) == (0, 0, 3, 0)
    app.close()


def test_the_workers_doorbell_sleeps_as_a_plain_consumer(broker, make_loop):
    """A server's own puts owe its doorbells no post (``waits.serving``): the worker's
    doorbell is not one of them, so it sleeps as a plain consumer, which every put wakes."""
    from shmq.engine.shm import layout as L

    loop = make_loop()
    loop.run_in_thread()
    line = wait_for(lambda: next(iter(loop.events.watched.values()), None), 10, "the queue's line")
    mq = line.handle._mq
    wait_for(lambda: line.live and mq[L.I_CWAIT] == 1, 10, "the empty queue's doorbell asleep")
    assert mq[L.I_BELLS] == 0
    put(broker.namespace, "one")
    wait_for(lambda: len(loop.got) == 1, 30, "the put delivered")
    loop.close()
