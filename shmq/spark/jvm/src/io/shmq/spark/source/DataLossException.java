package io.shmq.spark.source;

import java.io.IOException;

/**
 * Offsets asked for are gone: dropped by retention, or lost (a gap); {@link #firstAvailable()} says
 * where to read on. The caller fails the task or skips to there, as failOnDataLoss says.
 */
public final class DataLossException extends IOException {
    private static final long serialVersionUID = 1L;
    private final long firstAvailable;

    public DataLossException(String msg, long firstAvailable) {
        super(msg);
        this.firstAvailable = firstAvailable;
    }

    /** Where to read on: the oldest offset still readable when the loss was seen. */
    public long firstAvailable() {
        return firstAvailable;
    }
}
