"""Test helpers that reach into the engine: its monotonic and wall clocks, moved by hand."""

from shmq.engine.queues import consume, housekeeping, lanes, produce, queue, settle

CLOCK_MODULES = (queue, produce, consume, settle, lanes)  # every engine module that reads deadlines' clock
WALL_MODULES = (queue, produce, consume, housekeeping)  # every one that reads the wall clock (TTL, due times)


def _set(modules, attr, fn):
    saved = [(m, getattr(m, attr)) for m in modules]
    for m in modules:
        setattr(m, attr, fn)

    def restore():
        for m, f in saved:
            setattr(m, attr, f)

    return restore


def set_clock(fn):
    """Make ``fn`` the engine's monotonic clock; returns the function that restores it."""
    return _set(CLOCK_MODULES, "_mono", fn)


def set_wall_clock(fn):
    """Make ``fn`` the engine's wall clock (ns since the epoch); returns the restorer."""
    return _set(WALL_MODULES, "_wall", fn)
