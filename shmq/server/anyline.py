"""A request waiting in several lines at once: a POLL_MANY (one poll of a connection's
members on several streams) waits until data comes to any of their streams.

Strategy: ``AnyLine`` stands where a request's ``WaitingLine`` stands (``Wait.line``: the
connection calls ``add`` and, as it closes, ``drop``). It lines up a stand-in
``Waiter`` in each stream's own line, with the request's ``take``, so each stream's
doorbell and its loop's appends serve it as they serve a POLL; the stand-ins' answers
come back here (``answer``: the stand-ins' ``conn``, as a subscription is its waiter's),
the first one answers the request, and the others leave their lines. The request counts
once against the connection's limit of waiting requests.
"""

from .waiters import Answering, Waiter

__all__ = ["AnyLine"]


class AnyLine(Answering):
    """The lines ``lines`` (one per stream, each a ``StreamWaiters``) of one request."""

    __slots__ = ("loop", "lines", "waiter", "standins")

    def __init__(self, loop, lines):
        self.loop = loop
        self.lines = lines
        self.waiter = None
        self.standins = []

    def add(self, w, deadline):
        """Line ``w`` up in every line until ``deadline`` (loop time)."""
        self.waiter = w
        w.timer = self.loop.call_at(deadline, self.finish, w, ())
        for line in self.lines:
            standin = Waiter(self, line, w.msg_id, w.msg_type, w.take, None, w.args)
            self.standins.append(standin)
            line.add(standin, deadline + 1.0)  # the request's own timer ends it first

    def answer(self, standin, result):
        """A stand-in's answer: the request's. An error (its stream was deleted) is tried
        once more as the request's own take, which tells each member's fate apart."""
        w = self.waiter
        if isinstance(result, BaseException) and not w.done:
            try:
                again = w.take(w.args)
            except Exception as e:
                again = e
            result = result if again is None else again
        self.finish(w, result)

    def _ended(self, w) -> None:
        for standin, line in zip(self.standins, self.lines):
            line.drop(standin)
