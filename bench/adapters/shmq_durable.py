"""shmq in one durability mode: a ``shmq server --data-dir`` (snapshots every second, the
mode's ``--fsync``) runs as in production; its queues are used by local attach."""

from __future__ import annotations

import shutil
import tempfile

from bench.adapters.shmq_tcp import ShmqTcp


class ShmqDurable(ShmqTcp):
    """Queues of one durability ("memory", "snapshot", "wal"), created through the server
    so that it opens a wal queue's log before the case starts."""

    name = "shmq"

    def __init__(self, durability, fsync, index=0):
        self.durability = durability
        self.part = f"dur{index}"
        self.data_dir = tempfile.mkdtemp(prefix="bench-dur-")
        try:
            super().__init__("--data-dir", self.data_dir, "--fsync", fsync)
        except BaseException:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            raise

    def create(self, broker, name, size, max_bytes):
        broker.create_queue(name, durability=self.durability)

    def spec(self, name):
        return (self.namespace, name)

    def close(self):
        try:
            return super().close()
        finally:
            shutil.rmtree(self.data_dir, ignore_errors=True)
