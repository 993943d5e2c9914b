"""The engine: queues and streams in shared memory, and nothing of sockets; files only
as ``shmq.formats`` writes them (a queue's or partition's write-ahead log).

Module map (docs/DESIGN.md tours it), floor by floor: ``shm/`` (the shared-memory base:
``layout``, the only byte offsets; ``ring``, ``segment``, ``mutex``, ``waits``, ``wal``
(a log's writer), ``cpaths`` (the seam for C: the one default a handle's paths,
``queues/paths.py`` and ``streams/paths.py``, are chosen from when it attaches), ...);
the wings ``queues/`` (``queue`` and its operations) and ``streams/`` (``stream``,
``partition``, groups); and the faces here: ``broker`` (a namespace: create, list,
delete), ``aio`` (the asyncio face), ``doze`` (sleeping for a waiter elsewhere, and the
doorbells that do), ``maintenance``, ``store``, ``walwatch``; ``_fast.c``. Its import plan
has no circle, and it imports from the rest of shmq only the floors below it
(tests/test_layers.py).
"""
