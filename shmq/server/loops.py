"""Which event loop ``shmq server`` runs on: uvloop where it is installed, else asyncio's
own (``--loop`` / ``$SHMQ_LOOP``: ``auto``, ``asyncio`` or ``uvloop``).

Strategy: the server is written against asyncio's protocols and transports only, so the
loop is a choice made once, at start (``run``); uvloop's transports move the same bytes
with less work per read and write. ``loop_name`` tells the startup log which one runs.
"""

import asyncio
import importlib.util

__all__ = ["LOOPS", "DEFAULT_LOOP", "resolve", "run", "loop_name"]

LOOPS = ("auto", "asyncio", "uvloop")
DEFAULT_LOOP = "auto"  # uvloop if importable, else asyncio


def resolve(choice: str = DEFAULT_LOOP) -> str:
    """``asyncio`` or ``uvloop`` for ``choice``; ValueError for an unknown choice, or for
    ``uvloop`` when it is not installed."""
    if choice not in LOOPS:
        raise ValueError(f"the event loop must be one of {', '.join(LOOPS)}, not {choice!r}")
    have_uvloop = importlib.util.find_spec("uvloop") is not None
    if choice == "uvloop" and not have_uvloop:
        raise ValueError("the uvloop event loop was asked for, but uvloop is not installed "
                         "(pip install uvloop, or --loop asyncio)")
    if choice == "auto":
        return "uvloop" if have_uvloop else "asyncio"
    return choice


def run(main, choice: str = DEFAULT_LOOP):
    """Run the coroutine ``main`` to its end on the loop ``choice`` names (``resolve``)."""
    factory = None
    if resolve(choice) == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def loop_name(loop) -> str:
    """``uvloop`` or ``asyncio``: what ``loop`` is, for the startup log."""
    return "uvloop" if type(loop).__module__.split(".")[0] == "uvloop" else "asyncio"
