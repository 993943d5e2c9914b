"""The shared-memory base of queues and streams: segments and semaphores (``segment``),
the byte layout (``layout``), records in a ring (``ring``), the robust mutex (``mutex``),
waiting and waking (``waits``), a log's writer (``wal``), the seam for C (``cpaths``),
process identity (``process``), the namespace's
registry (``registry``), layout versions (``versions``) and the reaper of dead
namespaces (``reaper``)."""
