package io.shmq.spark.source;

import io.shmq.spark.shm.OnDiskException;

import static io.shmq.spark.source.SourceCheck.*;

/**
 * A "wal" stream whose oldest offsets are only in its logs on disk (args namespace, stream): earliest
 * is the disk's, reads below shared memory throw OnDiskException (not a data loss), reads from
 * memoryEarliest on work. Prints "earliest E memory M end N".
 */
public final class OnDiskTest {
    public static void main(String[] args) throws Exception {
        try (ShmStream s = ShmStream.open(args[0], args[1])) {
            long earliest = s.earliest(0), memory = s.memoryEarliest(0), end = s.latest(0);
            check(earliest < memory && memory < end, "the oldest offsets are on disk only");
            RecordBlock out = new RecordBlock();
            OnDiskException e = raises(OnDiskException.class, "offset " + earliest
                    + " is only in the logs on disk (shared memory holds " + memory + " on)",
                    () -> s.read(0, earliest, end, 10, out));
            equal(memory, e.memoryEarliest(), "OnDiskException.memoryEarliest()");
            raises(OnDiskException.class, "offset " + (memory - 1) + " is only in the logs on disk",
                    () -> s.read(0, memory - 1, end, 10, out));
            equal((int) (end - memory), s.read(0, memory, end, Integer.MAX_VALUE, out), "memory's records");
            equal(memory, out.offset[0], "the first record in memory");
            System.out.println("earliest " + earliest + " memory " + memory + " end " + end);
        }
    }
}
