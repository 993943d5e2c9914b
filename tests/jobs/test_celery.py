"""Celery on shmq (shmq/kombu/): the real ``celery worker`` command in subprocesses.

Every test runs its workers on its own namespace (or a ``shmq server`` of it) and counts
what the tasks did in an append-only log (tests/jobs/celery_app.py): every job done at
least once, each acked job done once unless its worker died holding it.
"""

import collections
import json
import os
import signal
import subprocess
import sys
import uuid

import pytest

import shmq
from shmq.auth import default_token_file, read_token
from tests._wait import wait_for
from tests.jobs.celery_app import events

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
APP = "tests.jobs.celery_app"


class Jobs:
    """The environment of one test's workers and producers: its broker url, its log."""

    def __init__(self, namespace, tmp_path, broker_url=None, **env):
        self.namespace = namespace
        self.log = str(tmp_path / "jobs.log")
        self.tmp = tmp_path
        self.env = {**os.environ, "PYTHONPATH": ROOT, "JOBS_LOG": self.log, "SHMQ_NAMESPACE": namespace,
                    "JOBS_BROKER": broker_url or f"shmq:///{namespace}", **env}
        self.workers = []
        os.environ["JOBS_LOG"] = self.log  # for the tasks' module imported here

    def app(self):
        """A Celery app of this environment in the test process (a producer, no results)."""
        from celery import Celery

        import shmq.kombu  # noqa: F401

        from tests.jobs import celery_app

        app = Celery("jobs", set_as_current=False)
        app.conf.update(celery_app.app.conf.changes)
        app.conf.update(broker_url=self.env["JOBS_BROKER"], result_backend=None,
                        broker_transport_options={"visibility_timeout": float(self.env.get("JOBS_VT", "30"))})
        return app

    def worker(self, *args, pool="prefork", concurrency=2, name=None):
        out = open(self.tmp / f"worker{len(self.workers)}.out", "w")
        p = subprocess.Popen([sys.executable, "-m", "celery", "-A", APP, "worker", "-l", "warning",
                              "-P", pool, "-c", str(concurrency), "-n", name or f"w{len(self.workers)}@%h",
                              "--without-gossip", "--without-mingle", "--without-heartbeat", *args],
                             cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        self.workers.append(p)
        return p

    def celery(self, *args):
        return subprocess.run([sys.executable, "-m", "celery", "-A", APP, *args], cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=120)

    @staticmethod
    def stop(p, sig=signal.SIGTERM):
        """Stop a worker: SIGTERM to its main process (a warm shutdown: it stops its pool);
        SIGKILL to its whole process group (the pool dies with it)."""
        if p.poll() is None:
            if sig == signal.SIGKILL:
                os.killpg(p.pid, sig)
            else:
                p.send_signal(sig)
        p.wait(60)

    def close(self):
        for p in self.workers:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)
            else:
                try:
                    os.killpg(p.pid, signal.SIGKILL)  # a prefork child left behind
                except ProcessLookupError:
                    pass

    def events(self, kind=None):
        return [e for e in events(self.log) if kind is None or e[0] == kind]

    def count(self, kind):
        return collections.Counter(e[1] for e in self.events(kind))

    def output(self, i=0):
        return (self.tmp / f"worker{i}.out").read_text()


@pytest.fixture
def make_jobs(broker, tmp_path):
    """``make(broker_url=None, **env)``: a ``Jobs`` of the test's broker, closed (its
    workers killed) at the end."""
    made = []

    def make(**options):
        made.append(Jobs(broker.namespace, tmp_path, **options))
        return made[-1]

    yield make
    for j in made:
        j.close()


@pytest.fixture
def jobs(make_jobs):
    return make_jobs()


def ids(n, prefix="j"):
    return [f"{prefix}{i}" for i in range(n)]


def settled(broker, acked, name="celery"):
    """Every job of ``name`` acked as counted and none held: what a test waits for before it
    stops a worker (a warm shutdown that finds a job's result unread may requeue it: at
    least once, so the counts would differ)."""
    s = broker.queue(name).stats()
    return s.acked_total == acked and s.in_flight == 0


def queue_ready(broker, name):
    """Ready and delayed messages of queue ``name`` (0 while it does not exist: a dead-letter
    queue is made at its first dead letter)."""
    if name not in broker.list_queues():
        return 0
    s = broker.queue(name).stats()
    return s.ready + s.delayed


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_every_job_done_exactly_once(broker, jobs, pool):
    app = jobs.app()
    for job in ids(40):
        app.send_task("tests.jobs.celery_app.record", (job,))
    w = jobs.worker(pool=pool, concurrency=3)
    wait_for(lambda: len(jobs.count("done")) == 40 and settled(broker, 40), 60, "every job done and acked")
    jobs.stop(w)
    assert w.returncode == 0, jobs.output()
    assert jobs.count("done") == {job: 1 for job in ids(40)}
    assert len({e[2] for e in jobs.events("done")}) >= 1
    s = broker.queue("celery").stats()
    assert (s.ready, s.in_flight, s.redelivered_total, s.acked_total) == (0, 0, 0, 40)
    # the worker's pidbox queue went with it, and no dead letter made a dead-letter queue
    assert broker.list_queues() == ["celery"]
    app.close()


@pytest.mark.slow
def test_worker_sigkilled_holding_jobs_loses_none(broker, jobs):
    app = jobs.app()
    gate = str(jobs.tmp / "gate")
    for job in ids(6):
        app.send_task("tests.jobs.celery_app.gated", (job, gate))
    first = jobs.worker(concurrency=2)
    wait_for(lambda: len(jobs.count("start")) == 2, 60, "the first worker holding two jobs")
    held = set(jobs.count("start"))
    jobs.stop(first, signal.SIGKILL)
    open(gate, "w").close()
    second = jobs.worker(concurrency=2)
    wait_for(lambda: len(jobs.count("done")) == 6 and settled(broker, 6), 60, "every job done by the second worker")
    jobs.stop(second)
    assert jobs.count("done") == {job: 1 for job in ids(6)}
    assert jobs.count("start") == {job: 2 if job in held else 1 for job in ids(6)}
    s = broker.queue("celery").stats()
    assert (s.ready, s.in_flight, s.acked_total) == (0, 0, 6)
    assert s.redelivered_total >= 2  # the killed worker's jobs, handed out again
    app.close()


@pytest.mark.slow
def test_prefork_child_sigkilled_task_runs_again(broker, jobs):
    """acks_late + task_reject_on_worker_lost: the job whose pool process died is requeued."""
    app = jobs.app()
    app.send_task("tests.jobs.celery_app.dies_once", ("k1",))
    w = jobs.worker(concurrency=1)
    wait_for(lambda: jobs.count("done") == {"k1": 1} and settled(broker, 1), 60, "the job done on its second run")
    jobs.stop(w)
    starts = jobs.events("start")
    assert [e[1] for e in starts] == ["k1", "k1"]
    assert starts[0][2] != starts[1][2]  # the second run in a new pool process
    s = broker.queue("celery").stats()
    assert (s.ready, s.in_flight, s.acked_total, s.redelivered_total) == (0, 0, 1, 1)
    app.close()


@pytest.mark.slow
def test_retries_with_countdown_then_the_dead_letter_queue(broker, jobs):
    app = jobs.app()
    ok = app.send_task("tests.jobs.celery_app.flaky", ("ok", 2))  # fails twice, then done
    bad = app.send_task("tests.jobs.celery_app.flaky", ("bad", 5))  # fails past max_retries=2
    w = jobs.worker(concurrency=2)
    wait_for(lambda: jobs.count("done") == {"ok": 1} and jobs.count("start")["bad"] == 3
             and queue_ready(broker, "celery.dlq") == 1, 60, "the retries run out")
    jobs.stop(w)
    assert jobs.count("start") == {"ok": 3, "bad": 3}
    times = [float(e[3]) for e in jobs.events("start") if e[1] == "ok"]
    assert all(b - a >= 0.25 for a, b in zip(times, times[1:]))  # each retry after its countdown (0.3 s; the timer rounds)
    dlq = broker.queue("celery.dlq")
    d = dlq.get(timeout=0)
    assert json.loads(d.body)["headers"]["id"] == bad.id
    d.ack()
    assert ok.id != bad.id
    s = broker.queue("celery").stats()
    assert (s.ready, s.in_flight, s.dead_lettered_total) == (0, 0, 1)
    app.close()


@pytest.mark.slow
def test_eta_task_held_past_the_visibility_timeout_runs_once(broker, make_jobs):
    jobs = make_jobs(JOBS_VT="1")
    app = jobs.app()
    import time

    sent = time.time()
    app.send_task("tests.jobs.celery_app.record", ("eta",), countdown=4)
    w = jobs.worker(concurrency=1)
    wait_for(lambda: jobs.count("done") == {"eta": 1} and settled(broker, 1), 60, "the ETA job done")
    jobs.stop(w)
    assert float(jobs.events("done")[0][3]) >= sent + 4
    s = broker.queue("celery").stats()
    # held by the worker for 4 s under a 1 s lease, renewed: never handed out again
    assert (s.ready, s.in_flight, s.acked_total, s.redelivered_total) == (0, 0, 1, 0)
    app.close()


@pytest.mark.slow
def test_long_job_over_tcp_with_a_short_idle_timeout(broker, servers, make_jobs):
    """A job far longer than the lease and the server's idle timeout (shortened: 1 s lease,
    0.5 s idle, a 4 s job), through ``shmq://:TOKEN@HOST:PORT``: done once, never redelivered."""
    srv = servers(broker.namespace, "--idle-timeout", "0.5", "--no-persist")
    try:
        url = f"shmq://:{read_token(default_token_file())}@127.0.0.1:{srv.port}"
        jobs = make_jobs(broker_url=url, JOBS_VT="1")
        app = jobs.app()
        app.send_task("tests.jobs.celery_app.slow", ("long", 4))
        w = jobs.worker(concurrency=1)
        wait_for(lambda: jobs.count("done") == {"long": 1} and settled(broker, 1), 60, "the long job done")
        jobs.stop(w)
        assert jobs.count("start") == {"long": 1}
        s = broker.queue("celery").stats()
        assert (s.ready, s.in_flight, s.acked_total, s.redelivered_total) == (0, 0, 1, 0)
        app.close()
    finally:
        srv.stop()


@pytest.mark.slow
def test_priorities_higher_first(broker, jobs):
    app = jobs.app()
    for i in range(5):
        app.send_task("tests.jobs.celery_app.record", (f"low{i}",), priority=1)
    for i in range(5):
        app.send_task("tests.jobs.celery_app.record", (f"high{i}",), priority=8)
    w = jobs.worker(concurrency=1)
    wait_for(lambda: len(jobs.count("done")) == 10, 60, "every job done")
    jobs.stop(w)
    order = [e[1] for e in jobs.events("done")]
    assert order == [f"high{i}" for i in range(5)] + [f"low{i}" for i in range(5)]
    assert broker.queue("celery").settings()["priorities"] == 10
    app.close()


@pytest.mark.slow
def test_rpc_results_routing_to_two_queues_inspect_and_purge(broker, make_jobs):
    jobs = make_jobs(JOBS_BACKEND="rpc://")
    app = jobs.app()
    for job in ids(3, "a"):
        app.send_task("tests.jobs.celery_app.alpha", (job,))
    for job in ids(3, "b"):
        app.send_task("tests.jobs.celery_app.beta", (job,))
    for job in ids(4, "p"):  # to purge: no worker consumes "celery" here
        app.send_task("tests.jobs.celery_app.record", (job,))
    w = jobs.worker("-Q", "alpha,beta", concurrency=2)
    client = subprocess.run(  # rpc:// results, in a process of its own whose reply queue goes with it
        [sys.executable, "-c", "from tests.jobs.celery_app import add; "
         "print(add.apply_async((2, 3), queue='alpha').get(timeout=60))"],
        cwd=ROOT, env=jobs.env, capture_output=True, text=True, timeout=120)
    assert client.stdout == "5\n", client.stderr
    wait_for(lambda: len(jobs.count("done")) == 6, 60, "the routed jobs done")
    assert sorted((e[1], e[4]) for e in jobs.events("done")) == \
        [(f"a{i}", "alpha") for i in range(3)] + [(f"b{i}", "beta") for i in range(3)]
    ping = jobs.celery("inspect", "ping", "-t", "10")
    assert ping.returncode == 0 and "pong" in ping.stdout, ping.stdout + ping.stderr
    assert queue_ready(broker, "celery") == 4
    purge = jobs.celery("purge", "-f")
    assert purge.returncode == 0, purge.stderr
    assert "Purged 4 messages" in purge.stdout, purge.stdout
    assert queue_ready(broker, "celery") == 0
    app.close()
    jobs.stop(w)
    assert w.returncode == 0, jobs.output()
    # reply queues (rpc://, inspect's) and the worker's pidbox queue are gone
    assert broker.list_queues() == ["alpha", "beta", "celery"]


def test_urls_and_the_dotted_path(broker):
    """``shmq:///NS`` attaches to NS; the transport's dotted path works as its alias does."""
    from kombu import Connection

    import shmq.kombu

    with Connection(f"shmq:///{broker.namespace}") as c:
        assert c.transport.broker.namespace == broker.namespace
        c.SimpleQueue("plain").put({"x": 1})
    with Connection(transport="shmq.kombu:Transport", virtual_host=broker.namespace) as c:  # broker_transport=
        assert type(c.transport) is shmq.kombu.Transport
        with c.SimpleQueue("plain") as q:
            m = q.get(timeout=5)
            assert m.payload == {"x": 1}
            m.ack()
    assert shmq.kombu.shmq_name("celery@host.celery.pidbox").startswith("celery_host.celery.pidbox-")
    assert broker.queue("plain").stats().acked_total == 1


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["local", "tcp"])
def test_rolling_restart_two_workers_of_one_name(broker, make_jobs, tcp_server, transport):
    """Two workers named alike share their pidbox queue (an auto-delete queue): stopping
    one leaves it to the other, which goes on answering ``celery inspect ping`` and
    running tasks (the queue goes with its last consumer, not with any one of them)."""
    url = f"shmq://127.0.0.1:{tcp_server.port}" if transport == "tcp" else None
    jobs = make_jobs(broker_url=url)
    app = jobs.app()
    first, second = (jobs.worker(concurrency=1, name="same@%h") for _ in range(2))
    wait_for(lambda: len(pidbox := [q for q in broker.list_queues() if ".pidbox" in q]) == 1
             and broker.queue(pidbox[0]).stats().consumers == 2, 60, "both workers consuming the pidbox queue")
    jobs.stop(first)
    assert first.returncode == 0, jobs.output(0)
    ping = jobs.celery("inspect", "ping", "-t", "10")
    assert ping.returncode == 0 and "pong" in ping.stdout, ping.stdout + ping.stderr + jobs.output(1)
    app.send_task("tests.jobs.celery_app.record", ("after",))
    wait_for(lambda: jobs.count("done") == {"after": 1} and settled(broker, 1), 60, "a task run by the other worker")
    assert second.poll() is None, jobs.output(1)
    assert "Unrecoverable" not in jobs.output(1)
    pidbox = [q for q in broker.list_queues() if ".pidbox" in q]
    assert len(pidbox) == 1 and broker.queue(pidbox[0]).stats().consumers == 1
    jobs.stop(second)
    assert second.returncode == 0, jobs.output(1)
    # the pidbox queue went with its last consumer; inspect's reply queue with its own
    wait_for(lambda: broker.list_queues() == ["celery"], 30, "the pidbox queue gone")
    app.close()


@pytest.mark.slow
def test_a_task_rejected_with_requeue_runs_again_as_redelivered(broker, jobs):
    """Celery's ``test_reject_with_requeue_redelivers_and_succeeds``: the task reads
    ``delivery_info["redelivered"]`` (as ``worker_deduplicate_successful_tasks`` does)."""
    app = jobs.app()
    app.send_task("tests.jobs.celery_app.reject_then_succeed", ("r",))
    w = jobs.worker(concurrency=1)
    wait_for(lambda: jobs.count("done") == {"r": 1} and settled(broker, 1), 60, "the task done on its second delivery")
    jobs.stop(w)
    assert [(e[1], e[4]) for e in jobs.events("start")] == [("r", "False"), ("r", "True")]
    s = broker.queue("celery").stats()
    assert (s.ready, s.in_flight, s.acked_total, s.redelivered_total) == (0, 0, 1, 1)
    app.close()
