"""What a handler returns instead of a payload when the request is not answered at
once — a ``Wait`` (nothing there yet), an ``OffLoop`` (a long request, in a thread), an
``OnLoop`` (a coroutine's end), a ``BlockingAppend`` (an append that may wait for room) —
and the helpers the waiting handlers share."""

from dataclasses import dataclass
from typing import Callable

from ..waiters import NOTHING


RECORD_OVERHEAD = 128  # bytes a message or record adds to a reply besides its bytes and headers
REPLY_RESERVE = 1024  # bytes of a frame kept for a reply's header and fields besides its items


@dataclass(frozen=True, slots=True)
class Wait:
    """A request found nothing there yet and may wait ``wait_ms``: the connection puts it
    in ``line`` (or refuses it past its limit), where ``take(args)`` is tried again (None:
    nothing yet), and answers it later with ``reply(conn, args, what it got)``. ``take``
    and ``reply`` are the handlers' module functions, the same for every request of a type,
    so a waiting request costs its ``args`` tuple, not closures of its own."""

    line: object
    take: Callable
    reply: Callable
    args: tuple
    wait_ms: int


@dataclass(frozen=True, slots=True)
class OffLoop:
    """A request that takes long (a BACKUP): the connection runs ``run`` in a thread of
    the loop's executor and answers ``reply(what it returned)`` when it is done; the loop
    serves everyone meanwhile."""

    run: Callable
    reply: Callable


@dataclass(frozen=True, slots=True)
class OnLoop:
    """A request answered once a coroutine on the loop is done (a transaction's end, whose
    markers may wait for room): the connection runs ``coro`` as a task and answers
    ``reply(what it returned)``; the loop serves everyone meanwhile."""

    coro: object
    reply: Callable


@dataclass(frozen=True, slots=True)
class BlockingAppend:
    """An append to a stream with retention="block", which may wait for room: the
    connection hands ``run`` to the stream's appender thread (``appenders``) and answers
    ``reply(what it returned)`` when it is done."""

    stream: object
    run: Callable
    reply: Callable


def wait_or_answer(conn, f, line_of, handle, take, reply, args, wait_take=None):
    """``reply(conn, args, take(args))`` if it got something, else a Wait in the line
    ``line_of(handle)`` (with ``wait_ms``, not while stopping; tried there with
    ``wait_take``, else ``take``), else ``reply(conn, args, NOTHING)``. The line is looked
    up only for a request that waits."""
    got = take(args)
    if got is None:
        if f["wait_ms"] and not conn.server.stopping:
            return Wait(line_of(handle), wait_take or take, reply, args, f["wait_ms"])
        got = NOTHING
    return reply(conn, args, got)


def reply_budget(server, most) -> int:
    """The bytes of bodies and headers a reply of ``most`` items may carry within a frame."""
    return max(server.max_frame_bytes - REPLY_RESERVE - most * RECORD_OVERHEAD, 0)


# --- the C plain requests' copy (server/_plain.c sizes its CONSUME replies as reply_budget does)


def c_header() -> str:
    """The text of ``_reply_budget.h``: reply_budget's terms, from this module, for ``_plain.c``.
    (``python -m shmq.mirrors`` writes it, under its banner; a test fails while it is stale)."""
    return "\n".join([
        "#ifndef SHMQ_REPLY_BUDGET_H", "#define SHMQ_REPLY_BUDGET_H", "",
        f"#define RECORD_OVERHEAD {RECORD_OVERHEAD}", f"#define REPLY_RESERVE {REPLY_RESERVE}",
        "", "#endif", ""])
