"""Message bodies on standard input and output, for ``produce`` and ``consume``: one per
line (the default), NUL-terminated (``-0``), or one body as it is (``--raw``).

Strategy: produce puts what it reads as it arrives (a line never waits for EOF), yet in
batches, one put_many each. ``Batches`` reads the file descriptor with select and
os.read, and hands a batch out when it holds BATCH_BYTES of bodies or BATCH_MESSAGES
bodies, or BATCH_LINGER_S after its first body was read, whichever comes first, and at
the end.
"""

import os
import select
import time

__all__ = ["Batches", "TERMINATORS", "BATCH_BYTES", "BATCH_MESSAGES", "BATCH_LINGER_S"]

BATCH_BYTES = 64 * 2**10  # a batch is put once its bodies hold this many bytes,
BATCH_MESSAGES = 1024     # or it has this many bodies,
BATCH_LINGER_S = 0.05     # or this long after its first body was read
READ_BYTES = 64 * 2**10   # the most one read takes
STOP_SLICE_S = 0.25       # a stop signal is seen within this, when nothing is read

TERMINATORS = {"lines": b"\n", "nul": b"\0", "raw": b""}  # what follows each body on stdout


class Batches:
    """The records of file descriptor ``fd`` as lists (batches), in order. Records end with
    the byte ``sep`` (not part of them); bytes after the last ``sep`` are one more record
    at EOF. Ends at EOF, or at the first look after ``stopped()`` turns true: then the
    complete records read so far are still handed out, and an unterminated one is left
    out (``unterminated`` says how many bytes it had)."""

    def __init__(self, fd: int, sep: bytes, stopped=lambda: False):
        self.fd, self.sep, self.stopped = fd, sep, stopped
        self.unterminated = 0

    def __iter__(self):
        rest = []  # the pieces of the record being read
        batch, size, due = [], 0, None
        while not self.stopped():
            wait = STOP_SLICE_S if due is None else min(STOP_SLICE_S, max(0.0, due - time.monotonic()))
            if select.select([self.fd], [], [], wait)[0]:
                chunk = os.read(self.fd, READ_BYTES)
                if not chunk:
                    break  # EOF
                *ended, tail = chunk.split(self.sep)
                for i, record in enumerate(ended):
                    if i == 0 and rest:
                        record = b"".join(rest) + record
                        rest = []
                    if not batch:
                        due = time.monotonic() + BATCH_LINGER_S
                    batch.append(record)
                    size += len(record)
                    if size >= BATCH_BYTES or len(batch) >= BATCH_MESSAGES:
                        yield batch
                        batch, size, due = [], 0, None
                if tail:
                    rest.append(tail)
            if batch and time.monotonic() >= due:
                yield batch
                batch, size, due = [], 0, None
        else:  # stopped
            self.unterminated = sum(map(len, rest))
            rest = []
        if rest:
            batch.append(b"".join(rest))
        if batch:
            yield batch
