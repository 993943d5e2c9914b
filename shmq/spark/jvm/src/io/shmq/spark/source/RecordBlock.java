package io.shmq.spark.source;

import java.util.Arrays;

/** A batch of records as flat arrays (no object per record). Keys, values and raw headers live in one arena. */
public final class RecordBlock {
    public int count;
    /** Where to read on: after the last record looked at (a transaction's marker, an aborted one's records passed over). */
    public long next;
    /** Bytes of {@link #data} in use. */
    public int dataLen;
    public long[] offset = new long[0];
    /** Epoch nanoseconds: the stream's record timestamp. */
    public long[] timestampNs = new long[0];
    public byte[] data = new byte[0];
    /** keyLen -1 = null key. */
    public int[] keyStart = new int[0], keyLen = new int[0];
    /** valueLen -1 = null value. */
    public int[] valueStart = new int[0], valueLen = new int[0];
    /** The record's headers as the stream stores them (msgpack map); len 0 = none. */
    public int[] headersStart = new int[0], headersLen = new int[0];

    /** Empties the block; capacity is kept. */
    public void clear() {
        count = 0;
        dataLen = 0;
    }

    /** Grows the arrays to hold at least {@code records} records and {@code dataBytes} arena bytes; never shrinks. */
    public void ensure(int records, int dataBytes) {
        if (records > offset.length) {
            int n = grow(offset.length, records);
            offset = Arrays.copyOf(offset, n);
            timestampNs = Arrays.copyOf(timestampNs, n);
            keyStart = Arrays.copyOf(keyStart, n);
            keyLen = Arrays.copyOf(keyLen, n);
            valueStart = Arrays.copyOf(valueStart, n);
            valueLen = Arrays.copyOf(valueLen, n);
            headersStart = Arrays.copyOf(headersStart, n);
            headersLen = Arrays.copyOf(headersLen, n);
        }
        if (dataBytes > data.length) {
            data = Arrays.copyOf(data, grow(data.length, dataBytes));
        }
    }

    private static int grow(int have, int need) {
        long n = Math.max(16L, have);
        while (n < need) {
            n *= 2;
        }
        return (int) Math.min(n, Integer.MAX_VALUE - 8);
    }
}
