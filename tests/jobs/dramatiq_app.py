"""The Dramatiq app the tests' ``dramatiq`` worker commands run (tests/jobs/test_dramatiq.py).

Configured by the environment the test sets: ``SHMQ_NAMESPACE`` (local attach) or
``JOBS_URL`` (a shmq server), ``JOBS_VT`` (the queues' visibility timeout, seconds) and
``JOBS_LOG``: a file every job appends one line to per event (``EVENT JOB_ID PID
WALL_TIME``, one O_APPEND write: lines never interleave), which the test reads back.
"""

import os
import time

import dramatiq

from shmq.dramatiq import ShmqBroker

QUEUE = "jobs"

broker = ShmqBroker(os.environ.get("JOBS_URL") or None, visibility_timeout=float(os.environ.get("JOBS_VT", "30")))
dramatiq.set_broker(broker)


def note(event: str, job_id: str) -> None:
    fd = os.open(os.environ["JOBS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{event} {job_id} {os.getpid()} {time.time():.3f}\n".encode())
    finally:
        os.close(fd)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def work(job_id: str, seconds: float = 0.0) -> None:
    """Start, take ``seconds``, done: two lines."""
    note("start", job_id)
    time.sleep(seconds)  # the job's own work
    note("done", job_id)


@dramatiq.actor(queue_name=QUEUE, max_retries=2, min_backoff=100, max_backoff=200)
def flaky(job_id: str) -> None:
    """Fails every time: tried 1 + max_retries times, then dead-lettered."""
    note("try", job_id)
    raise RuntimeError(f"job {job_id} fails")
