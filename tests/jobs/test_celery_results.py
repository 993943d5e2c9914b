"""Celery's results in shmq (``shmq.celery.results``): real ``celery worker`` processes,
results read from other processes, groups and chords, expiry, and a worker killed in
the middle of a chord."""

import subprocess
import sys

import pytest

from shmq.celery.results import STORE
from tests._wait import wait_for
from tests.jobs.test_celery import ROOT, make_jobs  # noqa: F401  (the fixture: Jobs of real workers)

pytestmark = pytest.mark.slow


def _url(broker, request, where):
    if where == "local":
        return f"shmq:///{broker.namespace}"
    return "shmq://" + request.getfixturevalue("tcp_server").url.removeprefix("tcp://")


def _app(jobs, backend):
    app = jobs.app()
    app.conf.update(result_backend=backend)
    return app


@pytest.fixture
def results(broker):
    """The test's namespace's Celery store, deleted at the end."""
    yield
    broker.delete_store(STORE)


@pytest.mark.parametrize("where", ["local", "tcp"])
def test_any_process_reads_any_result_groups_and_chords(broker, request, make_jobs, results, where):
    url = _url(broker, request, where)
    jobs = make_jobs(broker_url=url, JOBS_BACKEND=url)
    jobs.worker()
    app = _app(jobs, url)
    from celery import chord, group

    r = app.send_task("tests.jobs.celery_app.add", (2, 3))
    assert r.get(timeout=60) == 5
    # another process reads the same task's result by its id
    read = subprocess.run([sys.executable, "-c", (
        "import sys; from celery import Celery; "
        "app = Celery(backend=sys.argv[1]); print(app.AsyncResult(sys.argv[2]).get(timeout=30))"), url, r.id],
        cwd=ROOT, env=jobs.env, capture_output=True, text=True, timeout=120)
    assert read.returncode == 0, read.stderr
    assert read.stdout.strip() == "5"
    sig = lambda name, *args: app.signature(f"tests.jobs.celery_app.{name}", args)  # noqa: E731
    g = group(sig("add", i, i) for i in range(10)).apply_async()
    assert g.get(timeout=60) == [2 * i for i in range(10)]
    c = chord((sig("part", i) for i in range(8)), sig("total")).apply_async()
    assert c.get(timeout=60) == sum(i * i for i in range(8))
    assert jobs.count("chord") == {str(sum(i * i for i in range(8))): 1}


def test_results_expire(broker, make_jobs, results):
    url = f"shmq:///{broker.namespace}"
    jobs = make_jobs(broker_url=url, JOBS_BACKEND=url, JOBS_RESULT_EXPIRES="1")
    jobs.worker()
    app = _app(jobs, url)
    r = app.send_task("tests.jobs.celery_app.add", (1, 1))
    assert r.get(timeout=60) == 2
    store = broker.store(STORE)
    key = f"celery-task-meta-{r.id}"
    wait_for(lambda: store.get(key) is not None, timeout=10, what="the result stored")
    wait_for(lambda: store.get(key) is None, timeout=30, what="the result expired")
    store.close()


def test_a_failed_part_raises_its_own_error_at_the_chords_get(broker, make_jobs, results):
    """As with Redis's backend: the chord's ``get()`` raises the failed part's exception
    (its parent's), not the ChordError stored as the body's result; the body never runs."""
    url = f"shmq:///{broker.namespace}"
    jobs = make_jobs(broker_url=url, JOBS_BACKEND=url)
    jobs.worker()
    app = _app(jobs, url)
    from celery import chord
    from celery.exceptions import ChordError

    c = chord((app.signature("tests.jobs.celery_app.part", (1,)), app.signature("tests.jobs.celery_app.boom", (2,))),
              app.signature("tests.jobs.celery_app.total")).apply_async()
    with pytest.raises(ValueError, match="part 2 failed"):
        c.get(timeout=60)
    assert isinstance(app.AsyncResult(c.id).get(timeout=10, propagate=False), ChordError)  # the body's own result
    assert jobs.count("chord") == {}


def test_a_chord_part_whose_process_is_killed_runs_again_and_the_chord_fires_once(broker, make_jobs, results):
    url = f"shmq:///{broker.namespace}"
    jobs = make_jobs(broker_url=url, JOBS_BACKEND=url, JOBS_KILL_PART="3")
    jobs.worker(concurrency=2)
    app = _app(jobs, url)
    from celery import chord

    c = chord((app.signature("tests.jobs.celery_app.part", (i,)) for i in range(6)),
              app.signature("tests.jobs.celery_app.total")).apply_async()
    assert c.get(timeout=120) == sum(i * i for i in range(6))
    parts = jobs.count("part")
    assert set(parts) == {str(i) for i in range(6)} and parts["3"] == 2  # killed once, run again
    assert jobs.count("chord") == {str(sum(i * i for i in range(6))): 1}


def test_a_part_counted_twice_counts_once(broker, make_jobs, results):
    """A part whose return is reported twice (run again after its worker was lost once it
    had counted, as Celery before 5.7 did) must not fire the chord before the others."""
    from types import SimpleNamespace

    from celery import states

    url = f"shmq:///{broker.namespace}"
    app = _app(make_jobs(broker_url=url), url)
    backend = app.backend
    parts = [app.AsyncResult(f"p{i}") for i in range(3)]
    group = app.GroupResult("g1", parts)
    group.save(backend=backend)
    for r in parts:
        backend.store_result(r.id, 1, states.SUCCESS)
    body = app.signature("tests.jobs.celery_app.total").freeze()
    chord_of = dict(app.signature("tests.jobs.celery_app.total", options={"task_id": body.id}), chord_size=3)

    def sent():
        return broker.queue("celery").stats().ready if "celery" in broker.list_queues() else 0

    def returned(part_id):
        backend.on_chord_part_return(SimpleNamespace(id=part_id, group="g1", chord=chord_of), states.SUCCESS, 1)

    returned("p0")
    returned("p0")
    returned("p1")
    assert sent() == 0  # two distinct parts of three: not yet
    returned("p2")
    assert sent() == 1  # the body, sent once
    broker.delete_queue("celery")
