"""The bytes shmq keeps on disk, below the engine (which writes its logs with them) and
persistence (which writes snapshots and reads both back): ``dmsq`` (the .dmsq snapshot
format, the log entries, a snapshot stream's high-water slots, the exchanges file) and
``logfiles`` (the logs' file names, the data dir's reserve, high-water files, a partition's
records read back from its logs). They know files and bytes, nothing of shared memory,
queues or streams. docs/FORMAT.md.
"""
