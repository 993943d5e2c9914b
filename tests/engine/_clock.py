"""Test helpers that reach into the engine: its monotonic clock, moved by hand."""

from shmq.engine import consume, produce, queue, settle

CLOCK_MODULES = (queue, produce, consume, settle)  # every engine module that reads deadlines' clock


def set_clock(fn):
    """Make ``fn`` the engine's monotonic clock; returns the function that restores it."""
    saved = [(m, m._mono) for m in CLOCK_MODULES]
    for m in CLOCK_MODULES:
        m._mono = fn

    def restore():
        for m, f in saved:
            m._mono = f

    return restore
