"""The engine: queues in shared memory, and nothing of sockets or files.

Module map (docs/DESIGN.md tours it): ``layout`` (segment and record layout, the only
byte offsets), ``ring`` (record walks, placement, the lease check), ``segment``
(/dev/shm names, create/attach/unlink), ``mutex``, ``registry``, ``process``,
``headers``, ``waits``, ``housekeeping``, ``deadletter``, ``wal``, ``delivery``,
``queue`` (the queue operations), ``broker`` (a namespace: create, list, delete).
"""
