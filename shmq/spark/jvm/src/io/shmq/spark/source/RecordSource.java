package io.shmq.spark.source;

import java.io.Closeable;
import java.io.IOException;

/** Where a stream's records come from: shared memory ({@link ShmStream}) or a shmq server over TCP (TcpStream). */
public interface RecordSource extends Closeable {
    /** Number of partitions of the stream. */
    int partitions() throws IOException;

    /** The oldest offset still retained in {@code partition}. */
    long earliest(int partition) throws IOException;

    /** The next offset to be written in {@code partition} (committed records only). */
    long latest(int partition) throws IOException;

    /**
     * Whole, committed records of offsets [from, until), at most {@code maxRecords}, appended to {@code out}
     * (cleared first). Offsets below earliest() (dropped by retention) throw {@link DataLossException}.
     * Returns the number of records read.
     */
    int read(int partition, long from, long until, int maxRecords, RecordBlock out) throws IOException;
}
