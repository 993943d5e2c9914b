"""What many tests need: waiting on a real condition with a bound, draining a queue,
polling a stream consumer for a number of records, a call in a thread, child processes
joined (or killed), an alarm whose handler raises."""

import contextlib
import signal
import threading
import time

import shmq

__all__ = ["wait_for", "drain", "polled", "in_thread", "exited", "Alarm", "alarm_in"]


def wait_for(cond, timeout=10.0, what="the condition"):
    """Poll ``cond`` (a real condition) until it is true, for ``timeout`` seconds at most;
    returns its value, or fails naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} never held within {timeout}s"
        time.sleep(0.005)  # polling a real condition, with a bound


def drain(q):
    """The bodies of every message ready in ``q``, taken and acked."""
    out = []
    while True:
        try:
            ds = q.get_many(100, timeout=0)
        except shmq.QueueEmpty:
            return out
        out += [d.body for d in ds]
        q.ack_many(ds)


def polled(consumer, want, timeout=15.0):
    """The records ``consumer`` polls until it has ``want`` of them (or more), within
    ``timeout`` seconds."""
    got = []
    wait_for(lambda: got.extend(consumer.poll(timeout=0.2)) or len(got) >= want, timeout, f"{want} records")
    return got


def in_thread(call):
    """Start ``call()`` in a thread; returns (the thread, a dict that gets "got": its
    result, or "error": what it raised, and "at": the monotonic time it ended)."""
    out = {}

    def run():
        try:
            out["got"] = call()
        except BaseException as e:  # noqa: BLE001 - the test looks at what it was
            out["error"] = e
        out["at"] = time.monotonic()

    t = threading.Thread(target=run)
    t.start()
    return t, out


@contextlib.contextmanager
def exited(procs, timeout=60):
    """A block after which ``procs`` (started in it, or before) must each end with exit
    code 0 within ``timeout`` seconds; whatever is still alive when the block raises or a
    join fails is killed and reaped, so no test leaves a child behind."""
    try:
        yield procs
        for p in procs:
            p.join(timeout)
            assert p.exitcode == 0, f"{p.name} ended with exit code {p.exitcode}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()


class Alarm(Exception):
    """What ``alarm_in``'s SIGALRM handler raises."""


@contextlib.contextmanager
def alarm_in(seconds):
    """SIGALRM after ``seconds``, its handler raising Alarm (as a signal-based timeout's or
    Celery's soft time limit's does); the old handler back after."""
    def ring(signum, frame):
        raise Alarm("the alarm rang")

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
