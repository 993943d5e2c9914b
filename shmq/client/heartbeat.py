"""A connection's heartbeat, sans-IO: ``Beat`` decides, at each look (every ``heartbeat``
seconds, ``options.ConnectOptions``), whether to PING and whether the server is dead.

Strategy: a look costs no request while the connection is busy both ways. It PINGs
when nothing came in since the last look (is the server there?) or nothing went out
(the server's ``--idle-timeout`` must see a request). A look that finds nothing come in
since a PING it sent takes the server for dead, so a server that stops answering is
noticed at most 3 x heartbeat after the last frame it sent (the look after it may find
the connection busy both ways; the next PINGs; the one after finds no answer). The
HEARTBEATs a server pushes, asked for in HELLO, count as frames. ``remote`` (a thread per broker) and
``aio`` (a task per connection) do the looking and the writing.
"""

__all__ = ["Beat", "PING", "DEAD"]

PING = "ping"
DEAD = "dead"


class Beat:
    """The heartbeat of the connection whose state is ``core`` (a ``ClientCore``)."""

    __slots__ = ("core", "reads", "sent", "pinged")

    def __init__(self, core):
        self.core = core
        self.reads = core.reads
        self.sent = core._last_id
        self.pinged = False

    def look(self) -> str | None:
        """PING (then ``posted``), DEAD, or None: nothing to do."""
        core = self.core
        heard, self.reads = core.reads != self.reads, core.reads
        if self.pinged and not heard:
            return DEAD
        self.pinged = not heard or core._last_id == self.sent
        self.sent = core._last_id
        return PING if self.pinged else None

    def posted(self) -> None:
        """The PING ``look`` asked for was sent."""
        self.sent = self.core._last_id
