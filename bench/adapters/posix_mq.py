"""POSIX message queues (posix_ipc.MessageQueue), created O_CREX per case, unlinked after it."""

from __future__ import annotations

import posix_ipc

from bench.adapters import Adapter, End, run_namespace

MQ_SLACK = 64  # the queue's message size above the body size


def mq_limit(name, default):
    """A limit from /proc/sys/fs/mqueue (msgsize_max, msg_max)."""
    try:
        with open(f"/proc/sys/fs/mqueue/{name}") as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return default


class PosixMqEnd(End):
    """No batch API: a batch is single sends; receives one at a time."""

    def __init__(self, spec, role):
        self._q = posix_ipc.MessageQueue(spec)

    def send(self, body):
        self._q.send(body)

    def recv(self):
        return self._q.receive()[0]

    def close(self):
        self._q.close()


class PosixMq(Adapter):
    name = "posix-mq"
    End = PosixMqEnd

    def __init__(self):
        self.msgsize_max = mq_limit("msgsize_max", 8192)
        self._depth = mq_limit("msg_max", 10)
        self._count = 0

    def make(self, ctx, size):
        self._count += 1
        name = f"/shmq-{run_namespace('mq')}-{self._count}"
        q = posix_ipc.MessageQueue(name, posix_ipc.O_CREX, max_messages=self._depth,
                                   max_message_size=min(size + MQ_SLACK, self.msgsize_max))
        q.close()
        return name

    def drop(self, spec):
        try:
            posix_ipc.unlink_message_queue(spec)
        except posix_ipc.ExistentialError:
            pass

    def unsupported(self, job):
        if job.size + MQ_SLACK > self.msgsize_max:
            return f"msgsize_max: /proc/sys/fs/mqueue/msgsize_max is {self.msgsize_max} B"
        return None
