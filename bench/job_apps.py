"""The job apps ``python -m bench.jobs`` runs under the real ``dramatiq`` and ``celery worker`` commands.

Strategy: one module for both tools, configured by the environment the bench sets
(``BENCH_JOBS_BROKER``: ``shmq`` (local attach, the namespace in ``$SHMQ_NAMESPACE``),
``shmq-tcp`` or ``redis``, with ``BENCH_JOBS_URL``; ``BENCH_JOBS_DONE``: a file every
finished job appends one byte to, which the bench watches; ``BENCH_JOBS_FAIL_EVERY``: a
job whose number is a multiple of it raises on its first try and is retried;
``BENCH_JOBS_CHORD``: Celery with a result backend of the broker's kind, the jobs sent as
chords whose body marks the done file). A job is a no-op but for that byte: the figure is
the broker's and the tool's cost per job.
"""

from __future__ import annotations

import os

BROKER = os.environ.get("BENCH_JOBS_BROKER", "shmq")
URL = os.environ.get("BENCH_JOBS_URL", "")
FAIL_EVERY = int(os.environ.get("BENCH_JOBS_FAIL_EVERY", "0"))
CHORD = int(os.environ.get("BENCH_JOBS_CHORD", "0"))  # parts per chord (0: no chords, no results)
QUEUE = "bench-jobs"
_done_fd = None


def _done(n: int = 1):
    """``n`` bytes on the done file in one write (opened once per worker process, O_APPEND: atomic)."""
    global _done_fd
    if _done_fd is None:
        _done_fd = os.open(os.environ["BENCH_JOBS_DONE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(_done_fd, b"." * n)


def _fails(n: int, retries: int) -> bool:
    return FAIL_EVERY > 0 and n % FAIL_EVERY == 0 and retries == 0


def dramatiq_broker():
    if BROKER == "redis":
        from dramatiq.brokers.redis import RedisBroker
        return RedisBroker(url=URL)
    from shmq.dramatiq import ShmqBroker
    return ShmqBroker(url=URL) if BROKER == "shmq-tcp" else ShmqBroker()


def celery_app():
    from celery import Celery
    if BROKER == "redis":
        broker = URL
    else:
        import shmq.kombu  # noqa: F401  registers the "shmq" transport
        broker = "shmq://" + URL.removeprefix("tcp://") if BROKER == "shmq-tcp" else "shmq://"
    backend = (URL if BROKER == "redis" else broker) if CHORD else None  # the results where the broker is
    app = Celery("bench_jobs", broker=broker, backend=backend)
    app.conf.update(task_default_queue=QUEUE, task_ignore_result=not CHORD, worker_hijack_root_logger=False,
                    worker_send_task_events=False, broker_connection_retry_on_startup=True)
    return app


if os.environ.get("BENCH_JOBS_TOOL") == "dramatiq":
    import dramatiq
    from dramatiq.middleware import CurrentMessage

    _broker = dramatiq_broker()
    _broker.add_middleware(CurrentMessage())
    dramatiq.set_broker(_broker)

    @dramatiq.actor(queue_name=QUEUE, max_retries=3, min_backoff=1, max_backoff=10)
    def job(n: int) -> None:
        message = CurrentMessage.get_current_message()
        if _fails(n, message.options.get("retries", 0) if message else 0):
            raise RuntimeError(f"job {n} fails once")
        _done()

    app = None
elif os.environ.get("BENCH_JOBS_TOOL") == "celery":
    app = celery_app()

    @app.task(name="bench.job", bind=True, max_retries=3)
    def job(self, n: int) -> None:
        if _fails(n, self.request.retries):
            raise self.retry(countdown=0.001)
        _done()

    @app.task(name="bench.part")
    def part(n: int) -> int:
        return n

    @app.task(name="bench.chord_done")
    def chord_done(values) -> None:
        _done(len(values))  # one mark per part

