"""A call as a generator of steps, sans-IO: what it yields is a step its transport
answers (a request of the TCP clients' ``core``, or a ``Pause``), and ``Run`` is how a
transport drives it. Here too is the one policy of a put refused for a full queue that
both TCP clients and the local asyncio face (``engine.aio``) follow:
``retry_while_full``.
"""

import functools
from dataclasses import dataclass

from ..errors import QueueFull
from .checks import seconds_ns

__all__ = ["Pause", "Run", "PUT_RETRY_S", "deadline", "retry_while_full"]

PUT_RETRY_S = (0.0005, 0.05)  # backoff between retries of a put refused as full: first, most


@dataclass(frozen=True, slots=True)
class Pause:
    """A call's step: sleep this many seconds, then go on."""

    seconds: float


class Run:
    """A call as its transport runs it: iterate for its steps and answer each one, with
    ``send(reply)`` or ``throw(error)``; when the iteration ends, ``result`` holds what
    the call returned (an error of the call itself is raised from the iteration)."""

    def __init__(self, call):
        self._call = call
        self._resume = functools.partial(call.send, None)
        self.result = None

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return self._resume()
        except StopIteration as done:
            self.result = done.value
            raise StopIteration from None

    def send(self, reply) -> None:
        self._resume = functools.partial(self._call.send, reply)

    def throw(self, error: BaseException) -> None:
        self._resume = functools.partial(self._call.throw, error)


def deadline(timeout, clock):
    """When a call given ``timeout`` seconds gives up, on ``clock`` (None: it never does)."""
    return None if timeout is None else clock() + seconds_ns(timeout, "timeout") / 1e9


def retry_while_full(request, timeout, clock):
    """Send ``request`` until it is not refused with QueueFull (a server answers QUEUE_FULL
    at once, never waits for room; so does a local non-blocking call), pausing PUT_RETRY_S[0] seconds, doubling up to
    PUT_RETRY_S[1]; QueueFull once the next pause would end past ``timeout``."""
    until = deadline(timeout, clock)
    pause = PUT_RETRY_S[0]
    while True:
        try:
            return (yield request)
        except QueueFull:
            if until is not None and clock() + pause > until:
                raise
            yield Pause(pause)
            pause = min(pause * 2, PUT_RETRY_S[1])
