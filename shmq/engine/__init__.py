"""The engine: queues and streams in shared memory, and nothing of sockets or files.

Module map (docs/DESIGN.md tours it): ``shm/`` (the shared-memory base: ``layout``, the
only byte offsets; ``ring``, ``segment``, ``mutex``, ``waits``, ``process``, ...),
``queues/`` (``queue`` and its operations), ``streams/`` (``stream``, ``partition``,
groups), ``broker`` (a namespace: create, list, delete), ``cpaths`` (the seam for C: the
one default a handle's paths, ``queues/paths.py`` and ``streams/paths.py``, are chosen
from when it attaches), ``maintenance``, ``_fast.c``. Its import plan has no circle, and
it imports from the rest of shmq only the layers below it (tests/test_layers.py).
"""
