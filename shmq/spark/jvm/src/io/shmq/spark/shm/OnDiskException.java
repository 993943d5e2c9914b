package io.shmq.spark.shm;

import java.io.IOException;

/**
 * The offsets asked for are no longer in shared memory but still in a "wal" stream's logs on disk,
 * which this reader does not read: read them another way (a shmq server, or the Python source).
 */
public final class OnDiskException extends IOException {
    private static final long serialVersionUID = 1L;
    private final long memoryEarliest;

    public OnDiskException(String msg, long memoryEarliest) {
        super(msg);
        this.memoryEarliest = memoryEarliest;
    }

    /** The oldest offset shared memory holds: from there on, ShmStream reads. */
    public long memoryEarliest() {
        return memoryEarliest;
    }
}
