"""Appends that may wait: one thread per stream with ``retention="block"``.

Strategy: an append to a "block" stream waits while the slowest group has not
committed enough (the engine sleeps in short slices, holding no lock), and the engine
has no append that gives up at once, so the loop must not make it. Such a stream's
APPENDs and APPEND_BATCHes go, in the order they arrived, to a daemon thread of its
own (``Appender``), which hands each result back to the loop; meanwhile the loop serves
everyone else, the commits that will make room included. Appends to "drop" streams
never wait and stay on the loop.
"""

import logging
import queue
import threading

__all__ = ["Appender"]

log = logging.getLogger("shmq.server")


class Appender:
    """Runs ``run()`` jobs one after another in a daemon thread; ``done(result or
    exception)`` is called on ``loop`` for each."""

    def __init__(self, loop, name: str):
        self.loop = loop
        self._jobs = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=f"shmq-appender-{name}", daemon=True)
        self._thread.start()

    def submit(self, run, done) -> None:
        self._jobs.put((run, done))

    def close(self) -> None:
        """No more jobs: the thread ends after those it has (daemon: a process exit does
        not wait for an append that waits for ever)."""
        self._jobs.put(None)

    def _work(self):
        while (job := self._jobs.get()) is not None:
            run, done = job
            try:
                result = run()
            except Exception as e:  # the request's answer, as on the loop
                result = e
            try:
                self.loop.call_soon_threadsafe(done, result)
            except RuntimeError:  # the loop is closed: the server has stopped
                return
