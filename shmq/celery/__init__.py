"""Celery on shmq: the broker is kombu's transport (``shmq.kombu``), the result backend
is here (``results.ShmqBackend``), registered as ``shmq://`` for ``Celery(backend=...)``."""

from .results import ShmqBackend

__all__ = ["ShmqBackend"]
