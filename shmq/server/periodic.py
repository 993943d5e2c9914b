"""Work the broker runs every so often, each in a thread of its own: housekeeping and
snapshots.

A thread that sleeps on an event between runs costs an idle broker one wakeup a run;
an asyncio task handing each run to the loop's executor cost the event loop's turns
and the executor's handoff as well, several times the run itself when there is nothing
to do (an idle broker stays under 1% of a core: tests/test_server_logsync.py).
"""

import logging
import threading
import time

__all__ = ["Periodic"]

log = logging.getLogger("shmq.server")


class Periodic:
    """Run ``work`` every ``seconds``, start to start (a run begins ``seconds`` after the
    previous one began, at once if that one took longer), so a power loss costs at most
    one interval plus one run; a ``work`` that returns a number of seconds is next run
    that long after it began, if that is later (nothing to do before). The first run is
    at once, or after one interval unless ``first``. A failure is logged and the runs go
    on: said once while the same one repeats (an OSError, out of descriptors say, in one
    line; another error with its traceback), and its end said too. ``stop()`` asks for the end;
    ``join()`` waits for it: the last run begins after the stop (a run the stop came
    during is followed by one more), so it sees every write answered before the stop."""

    def __init__(self, seconds: float, work, what: str, first: bool = True):
        self.seconds = seconds
        self.work = work
        self.what = what
        self._first = first
        self._failing = None  # the failure said last (its type and text), until a run succeeds
        self._repeats = 0  # runs that failed the same way since
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"shmq-{what}", daemon=True)

    def start(self) -> "Periodic":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def join(self) -> None:
        self._thread.join()

    def _run(self) -> None:
        due = time.monotonic()
        first = self._first
        while True:
            began, later = time.monotonic(), None
            if first or self._stop.is_set():
                last = self._stop.is_set()
                try:
                    later = self.work()
                except Exception as e:
                    self._failed(e)
                else:
                    self._worked()
                if last:
                    return
            first = True
            due = max(due + self.seconds, time.monotonic())
            if later is not None:
                due = max(due, began + later)
            self._stop.wait(due - time.monotonic())

    def _failed(self, e: Exception) -> None:
        """Say a failure once while it repeats the same: an OSError (a full disk, out of
        descriptors) in one line, another with its traceback (a bug)."""
        key = (type(e), str(e))
        if key == self._failing:
            self._repeats += 1
            return
        self._failing, self._repeats = key, 0
        if isinstance(e, OSError):
            log.error("%s failed: %s; trying again every %.2fs (said once while it fails so)", self.what, e,
                      self.seconds)
        else:
            log.exception("%s failed; trying again every %.2fs (said once while it fails so)", self.what,
                          self.seconds)

    def _worked(self) -> None:
        if self._failing is not None:
            log.info("%s works again (after %d more failed run(s))", self.what, self._repeats)
            self._failing, self._repeats = None, 0
