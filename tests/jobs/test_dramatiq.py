"""Dramatiq on shmq (shmq.dramatiq): the real ``dramatiq`` command in subprocesses running
tests/jobs/dramatiq_app.py, with exact accounting of job ids from the app's log; and
the broker, its consumer and the results backend in this process with Dramatiq's own
Worker."""

import contextlib
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import dramatiq
import psutil
import pytest
from dramatiq.common import current_millis
from dramatiq.errors import QueueJoinTimeout
from dramatiq.message import Message
from dramatiq.results import ResultFailure, ResultMissing, Results

import shmq
from shmq.dramatiq import ShmqBroker, ShmqResultBackend
from shmq.dramatiq.results import STORE
from tests._wait import wait_for

ROOT = str(Path(__file__).resolve().parents[2])

REPO = Path(__file__).resolve().parents[2]
QUEUE = "jobs"


# -- helpers --

def send(broker, actor, *args, delay=None, **options):
    return broker.enqueue(Message(queue_name=QUEUE, actor_name=actor, args=args, kwargs={}, options=options),
                          delay=delay)


def events(log: Path, event: str) -> list[tuple[str, int, float]]:
    """(job id, pid, wall time) of each ``event`` line of the app's log."""
    if not log.exists():
        return []
    rows = (line.split() for line in log.read_text().splitlines())
    return [(j, int(p), float(t)) for e, j, p, t in rows if e == event]


def count(log: Path, event: str) -> Counter:
    return Counter(j for j, _, _ in events(log, event))


class Workers:
    """A ``dramatiq`` command running the test app; ``stop()``: SIGTERM, bounded wait."""

    def __init__(self, tmp_path, env, processes, threads):
        self.err = tmp_path / f"dramatiq-{len(list(tmp_path.glob('dramatiq-*')))}.err"
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dramatiq", "tests.jobs.dramatiq_app",
                 "--processes", str(processes), "--threads", str(threads)],
                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err)

    def children(self) -> list[int]:
        return [p.pid for p in psutil.Process(self.proc.pid).children()]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"dramatiq did not stop within 60s: {self.err.read_text()[-2000:]}")


@pytest.fixture
def workers(tmp_path):
    started = []

    def start(env, processes=1, threads=2):
        w = Workers(tmp_path, env, processes, threads)
        started.append(w)
        return w

    yield start
    for w in started:
        if w.proc.poll() is None:
            for pid in w.children():
                with contextlib.suppress(psutil.NoSuchProcess):
                    psutil.Process(pid).kill()
            w.proc.kill()
            w.proc.wait(30)


def app_env(log, namespace=None, url=None, vt=30.0):
    env = {**os.environ, "JOBS_LOG": str(log), "JOBS_VT": str(vt), "PYTHONPATH": str(REPO)}
    if url:
        env["JOBS_URL"] = url
    else:
        env["SHMQ_NAMESPACE"] = namespace
    return env


@pytest.fixture
def producer(request, namespace):
    """The test's broker on its namespace; its visibility timeout (the workers' too) by
    indirect parametrization, 30 s else."""
    b = ShmqBroker(namespace=namespace, visibility_timeout=getattr(request, "param", 30.0))
    yield b
    b.close()


# -- the dramatiq command --

@pytest.mark.slow
def test_every_job_runs_once_under_processes_and_threads(namespace, tmp_path, workers, producer):
    log = tmp_path / "jobs.log"
    ids = [f"j{i}" for i in range(200)]
    for i in ids:
        send(producer, "work", i)
    w = workers(app_env(log, namespace), processes=2, threads=4)
    wait_for(lambda: len(count(log, "done")) == len(ids), timeout=120, what="every job done")
    children = set(w.children())
    assert w.stop() == 0
    assert count(log, "done") == Counter(ids) and count(log, "start") == Counter(ids)
    assert {pid for _, pid, _ in events(log, "done")} <= children
    s = producer.client.queue(QUEUE).stats()
    assert (s.ready, s.delayed, s.in_flight, s.acked_total, s.redelivered_total) == (0, 0, 0, 200, 0)


@pytest.mark.slow
@pytest.mark.parametrize("producer", [2.0], indirect=True)
def test_a_sigkilled_worker_process_jobs_run_again_elsewhere(namespace, tmp_path, workers, producer):
    log = tmp_path / "jobs.log"
    ids = [f"k{i}" for i in range(8)]
    for i in ids:
        send(producer, "work", i, 2.0)
    env = app_env(log, namespace, vt=2.0)
    doomed = workers(env, processes=2, threads=2)
    wait_for(lambda: len(doomed.children()) == 2, timeout=30, what="two worker processes")
    victims = set(doomed.children())

    def busy_victim():
        started, done = events(log, "start"), count(log, "done")
        return next((pid for j, pid, _ in started if pid in victims and not done[j]), None)

    victim = wait_for(busy_victim, timeout=60, what="a job started in a worker process of the first command")
    doomed_process = psutil.Process(victim)  # one handle: its parent may reap it the moment it dies
    doomed_process.kill()
    doomed_process.wait(10)
    held = {j for j, pid, _ in events(log, "start") if pid == victim} - set(count(log, "done"))
    assert held, "the killed process held a job"
    other = workers(env, processes=1, threads=2)
    wait_for(lambda: len(count(log, "done")) == len(ids), timeout=90, what="every job done")
    assert doomed.proc.wait(60) != 0  # dramatiq stops its other processes when one dies
    assert other.stop() == 0
    assert count(log, "done") == Counter(ids)  # each once: the killed process finished none
    starts = count(log, "start")
    for j in held:
        assert starts[j] == 2 and victim not in {pid for k, pid, _ in events(log, "done") if k == j}
    s = producer.client.queue(QUEUE).stats()
    assert (s.ready, s.delayed, s.in_flight, s.acked_total) == (0, 0, 0, 8)


@pytest.mark.slow
def test_retries_end_in_the_dead_letter_queue_and_redrive_runs_them_again(namespace, tmp_path, workers, producer):
    log = tmp_path / "jobs.log"
    ids = ["f1", "f2", "f3"]
    for i in ids:
        send(producer, "flaky", i)
    w = workers(app_env(log, namespace))
    dlq = producer.client.queue(QUEUE + ".dlq")
    wait_for(lambda: dlq.stats().ready == 3, timeout=60, what="three dead letters")
    assert count(log, "try") == Counter({i: 3 for i in ids})  # the first try and max_retries=2 more
    dead = [Message.decode(m.body) for m in dlq.peek(10)]
    # as delivered the last time: enqueued by the second retry
    assert sorted(m.args[0] for m in dead) == ids and {m.options["retries"] for m in dead} == {2}
    out = subprocess.run([sys.executable, "-m", "shmq.cli", "redrive", QUEUE + ".dlq", "--namespace", namespace],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"redrove 3 message(s) from {QUEUE}.dlq"
    wait_for(lambda: count(log, "try") == Counter({i: 4 for i in ids}) and dlq.stats().ready == 3, timeout=60,
             what="the redriven jobs tried once more, dead-lettered again (their retries are spent)")
    assert w.stop() == 0
    dlq.close()


@pytest.mark.slow
@pytest.mark.parametrize("producer", [1.0], indirect=True)
def test_eta_jobs_held_past_the_visibility_timeout_run_once_when_due(namespace, tmp_path, workers, producer):
    log = tmp_path / "jobs.log"
    w = workers(app_env(log, namespace, vt=1.0))
    wait_for(lambda: len(w.children()) == 1, timeout=30, what="the worker process")
    sent = {}
    for i in range(3):  # delay=: shmq's delayed messages
        sent[f"d{i}"] = send(producer, "work", f"d{i}", delay=3000).message_timestamp + 3000
    for i in range(2):  # an ``eta`` option: held in the worker's memory, under a renewed lease
        eta = current_millis() + 3000
        sent[f"e{i}"] = send(producer, "work", f"e{i}", eta=eta).options["eta"]
    wait_for(lambda: len(count(log, "done")) == 5, timeout=60, what="every job done")
    assert w.stop() == 0
    assert count(log, "start") == Counter(list(sent)) and count(log, "done") == Counter(list(sent))
    for j, _, t in events(log, "start"):
        assert t * 1000 >= sent[j] - 50  # not before it was due (the same host's clock)
    q = producer.client.queue(QUEUE)
    assert q.settings()["visibility_timeout"] == 1.0
    s = q.stats()
    assert (s.redelivered_total, s.in_flight, s.ready, s.delayed) == (0, 0, 0, 0)
    q.close()


@pytest.mark.slow
def test_a_long_job_over_tcp_outlives_a_short_lease_and_idle_timeout(namespace, tmp_path, workers, servers):
    srv = servers(namespace, "--idle-timeout", "0.5")
    log = tmp_path / "jobs.log"
    b = ShmqBroker(srv.url, visibility_timeout=1.0, confirm_delivery=False)  # a pipelined put
    try:
        send(b, "work", "long", 4.0)  # four visibility timeouts: a 10-minute job, shortened
        w = workers(app_env(log, url=srv.url, vt=1.0))
        wait_for(lambda: count(log, "done") == Counter(["long"]), timeout=60, what="the long job done")
        assert w.stop() == 0
        assert count(log, "start") == Counter(["long"])
        with shmq.connect(srv.url) as c:  # (b's connection may be closing, idle past 0.5 s)
            s = c.queue(QUEUE).stats()
        assert (s.redelivered_total, s.acked_total, s.in_flight) == (0, 1, 0)
    finally:
        b.close()
        srv.stop()


# -- the broker in this process --

def run_worker(broker, threads=2):
    w = dramatiq.Worker(broker, worker_threads=threads, worker_timeout=50)
    w.start()
    return w


def test_the_dead_letter_queue_gets_what_max_age_and_time_limits_fail(namespace, producer):
    ran = []  # AgeLimit and TimeLimit are default middleware; TimeLimit's timer starts at process boot
    producer.emit_after("process_boot")
    dramatiq.actor(lambda: ran.append("old"), broker=producer, actor_name="old", queue_name=QUEUE,
                   max_age=1000, max_retries=0)

    def slow():
        for _ in range(1000):
            __import__("time").sleep(0.01)  # interrupted by the time limit
        ran.append("slow")

    dramatiq.actor(slow, broker=producer, actor_name="slow", queue_name=QUEUE, time_limit=200, max_retries=0)
    producer.enqueue(Message(queue_name=QUEUE, actor_name="old", args=(), kwargs={}, options={},
                             message_timestamp=current_millis() - 5000))
    send(producer, "slow")
    w = run_worker(producer)
    try:
        dlq = producer.client.queue(QUEUE + ".dlq")
        wait_for(lambda: dlq.stats().ready == 2, timeout=30, what="two dead letters")
    finally:
        w.stop()
    assert ran == []
    assert sorted(Message.decode(m.body).actor_name for m in dlq.peek(10)) == ["old", "slow"]
    dlq.close()


@pytest.fixture(params=["local", "tcp"])
def urls(request, namespace):
    """(broker url, namespace) of either transport."""
    if request.param == "local":
        yield None, namespace
        return
    from tests.conftest import ThreadedServer

    with shmq.connect(namespace=namespace) as b:
        b.create_namespace()
    srv = ThreadedServer(namespace)
    try:
        yield srv.url, None
    finally:
        srv.stop()


def test_results_are_read_from_any_process_and_expire(urls):
    url, ns = urls
    broker = ShmqBroker(url, namespace=ns)
    backend = ShmqResultBackend(url, namespace=ns)
    broker.add_middleware(Results(backend=backend, store_results=True))
    add = dramatiq.actor(lambda x, y: x + y, broker=broker, actor_name="add", queue_name=QUEUE)

    def fail():
        raise ValueError("no")

    dramatiq.actor(fail, broker=broker, actor_name="fail", queue_name=QUEUE, max_retries=0)
    brief = dramatiq.actor(lambda: 7, broker=broker, actor_name="brief", queue_name=QUEUE, result_ttl=300)
    w = run_worker(broker)
    try:
        m = add.send(2, 3)
        assert m.get_result(backend=backend, block=True, timeout=20000) == 5
        assert m.get_result(backend=backend) == 5  # asked again: the same
        late = add.message(20, 22)
        # another process, which did not send it, waits for the result: it wakes as it is stored
        reader = subprocess.Popen([sys.executable, "-c", (
            "import sys; from dramatiq.message import Message; from shmq.dramatiq import ShmqResultBackend; "
            "b = ShmqResultBackend(sys.argv[1] or None, namespace=sys.argv[2] or None); "
            "print(Message.decode(sys.argv[3].encode()).get_result(backend=b, block=True, timeout=60000))"),
            url or "", ns or "", late.encode().decode()], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        broker.enqueue(late)
        assert reader.communicate(timeout=90)[0].strip() == "42" and reader.returncode == 0
        pipe = dramatiq.pipeline([add.message(1, 2), add.message(10)], broker=broker)
        pipe.run()
        assert pipe.get_result(block=True, timeout=20000) == 13  # (the broker's backend)
        with pytest.raises(ResultFailure, match="actor raised ValueError: no"):
            broker.enqueue(Message(queue_name=QUEUE, actor_name="fail", args=(), kwargs={}, options={})) \
                .get_result(backend=backend, block=True, timeout=20000)
        short = brief.send()
        assert short.get_result(backend=backend, block=True, timeout=20000) == 7
        wait_for(lambda: _missing(short, backend), timeout=10, what="the result expired (result_ttl 300 ms)")
        with pytest.raises(ResultMissing):
            add.message(0, 0).get_result(backend=backend)  # never sent
    finally:
        w.stop()
        backend.close()
        client = broker.client
        for name in client.list_queues():
            client.delete_queue(name)
        client.delete_store(STORE)
        broker.close()


def _missing(message, backend) -> bool:
    try:
        message.get_result(backend=backend)
    except ResultMissing:
        return True
    return False


def test_broker_priority_picks_the_shmq_level(namespace):
    b = ShmqBroker(namespace=namespace, priorities=3)
    b.declare_queue(QUEUE)
    try:
        for level in (0, 2, 1):
            send(b, "work", f"p{level}", broker_priority=level)
        c = b.consume(QUEUE, prefetch=3, timeout=1000)
        got = [next(c) for _ in range(3)]
        assert [m.args[0] for m in got] == ["p2", "p1", "p0"]
        for m in got:
            c.ack(m)
        assert next(c) is None
        c.close()
        with pytest.raises(ValueError, match="priority must be in 0..2"):
            send(b, "work", "p3", broker_priority=3)
    finally:
        b.close()


def test_consumer_prefetch_requeue_and_bad_bodies(namespace, producer):
    producer.declare_queue(QUEUE)
    producer.flush(QUEUE)  # declares it
    q = producer.client.queue(QUEUE)
    q.put(b"not a dramatiq message")
    for i in range(3):
        send(producer, "work", f"r{i}")
    c = producer.consume(QUEUE, prefetch=2, timeout=200)
    first, second = next(c), next(c)  # the bad body went to the DLQ on the way
    assert [first.args[0], second.args[0]] == ["r0", "r1"]
    assert next(c) is None  # two held: the prefetch is full
    assert q.stats().in_flight == 2
    c.requeue([second])
    third = next(c)
    assert third.args[0] in ("r1", "r2")
    c.nack(first)
    c.close()  # gives back what it still holds
    s = q.stats()
    assert (s.ready, s.in_flight, s.dead_letter_depth) == (2, 0, 2)
    q.close()


def test_join_of_an_unknown_queue_raises_and_creates_nothing(namespace, producer):
    with pytest.raises(dramatiq.errors.QueueNotFound):
        producer.join("nowhere", timeout=100)
    producer.declare_queue(QUEUE)
    producer.join(QUEUE, timeout=100)  # declared, never used: empty
    with shmq.connect(namespace=namespace) as b:
        assert b.list_queues() == []  # neither NAME nor NAME.dlq made


def test_flush_drops_ready_and_delayed_messages_and_dead_letters_not_those_in_flight(namespace, producer):
    producer.declare_queue(QUEUE)
    send(producer, "work", "dead")
    send(producer, "work", "held")
    send(producer, "work", "later", delay=3_600_000)
    c = producer.consume(QUEUE, prefetch=1, timeout=1000)
    dead = next(c)
    c.nack(dead)  # into jobs.dlq
    held = next(c)
    send(producer, "work", "ready")
    q = producer.client.queue(QUEUE)
    s = q.stats()
    assert (s.ready, s.delayed, s.in_flight, s.dead_letter_depth) == (1, 1, 1, 1)
    producer.flush_all()
    s = q.stats()
    assert (s.ready, s.delayed, s.in_flight, s.dead_letter_depth) == (0, 0, 1, 0)
    c.ack(held)
    producer.join(QUEUE, timeout=1000)
    c.close()
    q.close()


def test_flush_join_and_bad_arguments(namespace, producer):
    producer.declare_queue(QUEUE)
    send(producer, "work", "x")
    with pytest.raises(QueueJoinTimeout):
        producer.join(QUEUE, interval=10, timeout=50)
    producer.flush_all()
    producer.join(QUEUE, timeout=1000)
    with pytest.raises(ValueError, match="namespace is for a local attach"):
        ShmqBroker("tcp://127.0.0.1:1", namespace="x")
    with pytest.raises(dramatiq.errors.QueueNotFound):
        producer.consume("undeclared")
