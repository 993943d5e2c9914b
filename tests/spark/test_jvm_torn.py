"""The JVM reader without the lock (docs/FORMAT.md, "Reading a partition without the lock"): a
Python process appends to a small ring with retention drop as fast as it can while a Java reader
(TornReader) reads it; every record checks itself (its offset, key, headers and a CRC), so a record
copied while it was being overwritten, or an older record at a newer offset, is caught. Appends go
through both writers, Python's (append_many) and C's (append_columns)."""

import os
import subprocess
import sys

import pytest

from tests._wait import wait_for
from tests.spark.jvm_harness import java_command

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
APPENDED_WHILE_READING = 60000  # records appended after the reader started: the ring laps hundreds of times

WRITER = r"""
import array, os, select, sys, zlib
import shmq
from shmq.model.headers import encode_headers

ns, name, compacting = sys.argv[1], sys.argv[2], sys.argv[3:] == ["compact"]
broker = shmq.connect(namespace=ns)
s = broker.stream(name)
off = s.offsets(0)[1]
turn = 0
if compacting:
    from shmq.engine.shm import layout
while not select.select([sys.stdin], [], [], 0)[0]:  # until the test says stop (a line, or EOF)
    n = 1 + turn % 29
    keys, hdrs, values = [], [], []
    for o in range(off, off + n):
        key, hraw = str(o).encode(), encode_headers({"o": o})
        filler = os.urandom((o * 37) % 301)
        crc = zlib.crc32(o.to_bytes(8, "little") + key + hraw + filler)
        keys.append(key); hdrs.append(hraw)
        values.append(o.to_bytes(8, "little") + crc.to_bytes(4, "little") + filler)
    if turn % 2:  # the C writer: Arrow-like buffers
        def offsets(items):
            out, at = array.array("i", [0]), 0
            for x in items:
                at += len(x); out.append(at)
            return out
        first = s.append_columns((n, offsets(values), b"".join(values), offsets(keys), b"".join(keys), None,
                                  offsets(hdrs), b"".join(hdrs)), 0)
    else:
        first = s.append_many(values, keys=keys, headers=[{"o": o} for o in range(off, off + n)],
                              partition=0)[0].offset
    assert first == off, (first, off)
    # compaction under the reader: every third record flagged aborted, the oldest trimmed (the live
    # set stays under a quarter of the ring, so a run always finds room past the tail), and every
    # fourth batch a run, which takes the aborted records back and writes what stays past the tail
    # (engine/streams/compaction.py). The writer runs them itself: nothing else moves the head, so
    # every run completes, however busy the machine
    if compacting:
        s.hide(0, [(o, o + 1) for o in range(off, off + n) if o % 3 == 0], layout.FLAG_ABORTED)
        if turn % 4 == 3:
            if off + n - s.offsets(0)[0] > 800:
                s.delete_records({0: off + n - 600})
            s.compact_now()
    off += n
    turn += 1
s.append(b"END", partition=0)
s.close()
broker.close()
"""


# memory given back under the reader (docs/FORMAT.md, "Memory given back"): retention by bytes drops
# records behind the reader and their chunks are punched at once (no grace), so the reader's copies
# read holes; its check after the copy (the head moved past what it read) must throw every one away
HOUSEKEEPER = r"""
import select, sys
import shmq
from shmq.engine.shm import layout

layout.GIVE_BACK_GRACE_NS = 0
s = shmq.connect(namespace=sys.argv[1]).stream(sys.argv[2])
given = 0
while not select.select([sys.stdin], [], [], 0.001)[0]:
    given += s.housekeep()[1]
print(given)
s.close()
"""


@pytest.mark.parametrize("jvm_flags,keeping", [([], None), (["-Xint"], None), ([], "give-back"), ([], "compact")],
                         ids=["compiled", "interpreted", "memory-given-back", "compacted"])
def test_no_torn_or_stale_record_while_appends_overwrite(classes, broker, jvm_flags, keeping):
    """Compiled, the JIT's code with its own load ordering; interpreted, a reader slow enough that
    appends land in the middle of its copies (a reader that skips the check after the copy fails
    here); with memory given back under the reader as retention drops records, in a ring of
    several chunks; with compaction runs rewriting the ring under the reader."""
    if keeping == "give-back":
        s = broker.create_stream("torn", partitions=1, max_bytes=6 * 65536, retention_bytes=65536,
                                 durability="memory")
    elif keeping == "compact":
        s = broker.create_stream("torn", partitions=1, max_bytes=6 * 65536, durability="memory", compact=True)
    else:
        s = broker.create_stream("torn", partitions=1, max_bytes=16384, retention="drop", durability="memory")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, broker.namespace, "torn"]
                              + (["compact"] if keeping == "compact" else []), cwd=ROOT, stdin=subprocess.PIPE, text=True)
    keeper = None
    if keeping == "give-back":
        keeper = subprocess.Popen([sys.executable, "-c", HOUSEKEEPER, broker.namespace, "torn"], cwd=ROOT,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    reader = None
    try:
        wait_for(lambda: s.offsets(0)[0] > 0, 60, "the writer lapping the ring")
        cmd = java_command(classes, "io.shmq.spark.source.TornReader", broker.namespace, "torn", 300, flags=jvm_flags)
        reader = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert reader.stdout.readline() == "reading\n"
        start, compacted = s.offsets(0)[1], s.stats()["partitions"][0]["compacted_bytes_total"]
        wait_for(lambda: s.offsets(0)[1] >= start + APPENDED_WHILE_READING, 120, "the writer appending")
        writer.stdin.close()  # stop: it appends END, which ends the reader
        assert writer.wait(60) == 0
        if keeper is not None:
            given = int(keeper.communicate("stop\n", timeout=60)[0])
            assert keeper.returncode == 0 and given > 0  # (memory given back meanwhile)
        if keeping == "compact":  # runs took records under the reader
            assert s.stats()["partitions"][0]["compacted_bytes_total"] > compacted
        out, err = reader.communicate(timeout=120)
        assert reader.returncode == 0, f"the reader found bad records:\n{out}{err}"
        f = out.split()
        counts = dict(zip(f[0::2], f[1::2]))
        assert (counts["torn"], counts["stale"], counts["end"]) == ("0", "0", "true"), out
        assert int(counts["verified"]) > 0 and int(counts["moved"]) > 0, out
        # appends overwrote records under the reader: copies made again, or offsets found dropped
        assert int(counts["retries"]) + int(counts["losses"]) > 0, out
    finally:
        for proc in (writer, reader, keeper):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
        s.close()
