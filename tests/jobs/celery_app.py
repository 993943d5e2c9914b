"""The Celery app the tests of tests/jobs/test_celery.py run under the real ``celery worker``.

Set by the environment: ``JOBS_BROKER`` (a ``shmq://`` url), ``JOBS_BACKEND`` (e.g.
``rpc://``; none by default), ``JOBS_VT`` (the queues' visibility timeout, seconds) and
``JOBS_RESULT_EXPIRES`` (seconds), ``JOBS_LOG``: a file each task appends one line to per event (``EVENT JOB PID TIME QUEUE``),
written with O_APPEND in one write, so lines of concurrent processes never mix.
``JOBS_CLIENT_LOG=1``: the shmq client's INFO lines are logged too (the worker runs
with ``-l warning``).
"""

import logging
import os
import signal
import time

from celery import Celery

import shmq.kombu  # noqa: F401  registers the "shmq" transport

app = Celery("jobs", broker=os.environ.get("JOBS_BROKER", "shmq://"), backend=os.environ.get("JOBS_BACKEND") or None)
app.conf.update(
    broker_transport_options={"visibility_timeout": float(os.environ.get("JOBS_VT", "30"))},
    broker_connection_retry_on_startup=True,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    task_acks_on_failure_or_timeout=False,  # a task that fails for good is rejected: to the dead-letter queue
    task_queue_max_priority=9,
    task_default_priority=0,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    result_expires=int(os.environ.get("JOBS_RESULT_EXPIRES", 86400)),
    task_routes={"tests.jobs.celery_app.alpha": {"queue": "alpha"}, "tests.jobs.celery_app.beta": {"queue": "beta"}},
)

if os.environ.get("JOBS_CLIENT_LOG"):
    logging.getLogger("shmq.client").setLevel(logging.INFO)  # (through the worker's own handler)


def note(event: str, job: str, queue: str = "-") -> None:
    line = f"{event} {job} {os.getpid()} {time.time():.3f} {queue}\n".encode()
    fd = os.open(os.environ["JOBS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def events(path: str) -> list[list[str]]:
    """The log's lines, split: [event, job, pid, time, queue]."""
    try:
        with open(path) as f:
            return [line.split() for line in f]
    except FileNotFoundError:
        return []


@app.task(bind=True)
def record(self, job):
    note("done", job, self.request.delivery_info.get("routing_key", "-"))
    return job


@app.task(bind=True)
def alpha(self, job):
    note("done", job, self.request.delivery_info.get("routing_key", "-"))


@app.task(bind=True)
def beta(self, job):
    note("done", job, self.request.delivery_info.get("routing_key", "-"))


@app.task
def add(x, y):
    return x + y


@app.task
def slow(job, seconds):
    note("start", job)
    time.sleep(seconds)  # the job itself: a long one
    note("done", job)


@app.task
def gated(job, gate):
    """Starts, then waits for the file ``gate`` to exist before it is done."""
    note("start", job)
    while not os.path.exists(gate):
        time.sleep(0.02)
    note("done", job)


@app.task
def dies_once(job):
    """Its first run SIGKILLs the process running it; the next is done."""
    runs = sum(1 for e in events(os.environ["JOBS_LOG"]) if e[:2] == ["start", job])
    note("start", job)
    if runs == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    note("done", job)


@app.task(bind=True, max_retries=2, default_retry_delay=0.3)
def flaky(self, job, fail_times):
    """Fails its first ``fail_times`` runs, each retried after a countdown."""
    note("start", job)
    if self.request.retries < fail_times:
        raise self.retry(countdown=0.3)
    note("done", job)


@app.task(bind=True)
def reject_then_succeed(self, job):
    """Celery's integration task of that name: its first delivery rejects itself with
    requeue; the delivery that says redelivered is done."""
    redelivered = bool(self.request.delivery_info.get("redelivered"))
    note("start", job, str(redelivered))
    if not redelivered:
        from celery.exceptions import Reject

        raise Reject(requeue=True)
    note("done", job)


@app.task
def part(x):
    """A chord's part: ``x`` squared. Part ``$JOBS_KILL_PART`` SIGKILLs its process at its first run."""
    note("part", str(x))
    if str(x) == os.environ.get("JOBS_KILL_PART"):
        try:
            os.close(os.open(os.environ["JOBS_LOG"] + ".killed", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            return x * x
        os.kill(os.getpid(), signal.SIGKILL)
    return x * x


@app.task
def boom(x):
    """A chord's part that fails: ValueError naming ``x``."""
    raise ValueError(f"part {x} failed")


@app.task
def total(values):
    """A chord's body: the sum of its parts' results, each run noted."""
    note("chord", str(sum(values)))
    return sum(values)
