"""Keepalive: its home is ``shmq.model.keepalive`` (it knows no transport); the engine's
old name for it. Any other attribute is looked up there, its state too (``_live``,
``_renewer``, rebound as it changes)."""

from ..model import keepalive as _home
from ..model.keepalive import Keepalive, in_task, in_thread, settling

__all__ = ["Keepalive", "settling", "in_thread", "in_task"]


def __getattr__(name):
    return getattr(_home, name)
