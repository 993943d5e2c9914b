package io.shmq.spark.tcp;

import io.shmq.spark.source.RecordBlock;
import java.net.ProtocolException;
import java.nio.charset.StandardCharsets;

/**
 * The requests a stream reader sends (HELLO, STREAM_INFO, OFFSETS, READ) and what their replies hold, as bytes
 * in and values out: no socket here. Field order follows the Python client's, so a request is its bytes exactly.
 * A READ reply's records go straight into a {@link RecordBlock}: values and keys copied into its arena, the
 * headers as the msgpack map they travel as (the server packs the stored map again: the same bytes), the
 * timestamp (float seconds on the wire) back to the nearest nanosecond.
 */
public final class StreamMessages {
    /** READ's largest {@code max} (docs/PROTOCOL.md, field rules). */
    public static final int MAX_READ = 100_000;

    private static final byte[][] REPLY_KEYS = utf8("records", "error", "earliest", "end", "partitions",
            "max_frame_bytes", "stable");
    private static final int K_RECORDS = 0, K_ERROR = 1, K_EARLIEST = 2, K_END = 3, K_PARTITIONS = 4, K_MAX_FRAME = 5,
            K_STABLE = 6;
    private static final byte[][] RECORD_KEYS = utf8("offset", "value", "key", "headers", "timestamp");
    private static final int R_OFFSET = 0, R_VALUE = 1, R_KEY = 2, R_HEADERS = 3, R_TIMESTAMP = 4;

    private StreamMessages() {
    }

    public static MsgpackWriter hello(String client, String token) {
        MsgpackWriter w = new MsgpackWriter().map(token == null ? 1 : 2).str("client").str(client);
        return token == null ? w : w.str("token").str(token);
    }

    public static MsgpackWriter streamInfo(String stream) {
        return new MsgpackWriter().map(1).str("stream").str(stream);
    }

    public static MsgpackWriter offsets(String stream, int partition) {
        return new MsgpackWriter().map(2).str("stream").str(stream).str("partition").integer(partition);
    }

    /** READ without waiting: up to {@code max} records (1..MAX_READ) from {@code offset}. */
    public static MsgpackWriter read(String stream, int partition, long offset, int max) {
        if (max < 1 || max > MAX_READ) {
            throw new IllegalArgumentException("a READ takes 1.." + MAX_READ + " records, not " + max);
        }
        return new MsgpackWriter().map(5).str("stream").str(stream).str("partition").integer(partition)
                .str("offset").integer(offset).str("max").integer(max).str("wait_ms").integer(0);
    }

    /** The error a non-OK reply carries (its {@code error} text; OFFSET_OUT_OF_RANGE's earliest and end). */
    public static ServerException error(Frame f, String endpoint) throws ProtocolException {
        String message = "(no message)";
        long earliest = -1, end = -1;
        MsgpackReader r = f.reader();
        for (int i = r.atEnd() ? 0 : r.mapHeader(); i > 0; i--) {
            int k = r.key(REPLY_KEYS);
            if (k == K_ERROR) {
                message = r.str();
            } else if (k == K_EARLIEST) {
                earliest = r.integer();
            } else if (k == K_END) {
                end = r.integer();
            } else {
                r.skip();
            }
        }
        return new ServerException(endpoint, f.status, message, earliest, end);
    }

    /** The HELLO reply's max_frame_bytes (the default when a server leaves it out). */
    public static int maxFrameBytes(Frame f) throws ProtocolException {
        long v = intField(f, K_MAX_FRAME, Wire.DEFAULT_MAX_FRAME_BYTES);
        return (int) Math.min(Math.max(v, 0), Integer.MAX_VALUE);
    }

    /** A STREAM_INFO reply's partition count. */
    public static int partitions(Frame f) throws ProtocolException {
        long n = intField(f, K_PARTITIONS, -1);
        if (n < 1 || n > 256) {
            throw new ProtocolException("STREAM_INFO reply without a valid 'partitions' (" + n + ")");
        }
        return (int) n;
    }

    /** An OFFSETS reply: {earliest, end}. */
    public static long[] offsets(Frame f) throws ProtocolException {
        long earliest = intField(f, K_EARLIEST, -1), end = intField(f, K_END, -1);
        if (earliest < 0 || end < earliest) {
            throw new ProtocolException("OFFSETS reply without valid 'earliest' and 'end' (" + earliest + ", " + end + ")");
        }
        long stable = intField(f, K_STABLE, end); // (an older server has no transactions: the end)
        return new long[] {earliest, Math.min(stable, end)};
    }

    /**
     * Appends a READ reply's records of offsets below {@code until} to {@code out}, at most {@code max};
     * returns how many it appended.
     */
    public static int records(Frame f, long until, int max, RecordBlock out) throws ProtocolException {
        MsgpackReader r = f.reader();
        int taken = 0;
        for (int i = r.atEnd() ? 0 : r.mapHeader(); i > 0; i--) {
            if (r.key(REPLY_KEYS) != K_RECORDS) {
                r.skip();
                continue;
            }
            int n = r.arrayHeader();
            // the reply's bytes bound the arena bytes its records need
            out.ensure(out.count + Math.min(n, max), out.dataLen + f.payload.length);
            for (int j = 0; j < n; j++) {
                if (taken >= max) {
                    r.skip();
                } else if (record(r, f.payload, out, until)) {
                    taken++;
                }
            }
        }
        return taken;
    }

    /** One record map into slot out.count; false (the slot not taken) when its offset is at or past {@code until}. */
    private static boolean record(MsgpackReader r, byte[] src, RecordBlock out, long until) throws ProtocolException {
        int i = out.count;
        long offset = -1;
        double ts = Double.NaN;
        int keyLen = -1, valueLen = -2, headersLen = 0;
        int keyAt = 0, valueAt = 0, headersAt = 0;
        int dataLen = out.dataLen;
        byte[] data = out.data;
        for (int fields = r.mapHeader(); fields > 0; fields--) {
            switch (r.key(RECORD_KEYS)) {
                case R_OFFSET:
                    offset = r.integer();
                    break;
                case R_TIMESTAMP:
                    ts = r.number();
                    break;
                case R_VALUE:
                    if (r.nil()) {
                        valueLen = -1; // a tombstone
                        break;
                    }
                    valueLen = r.bin();
                    valueAt = dataLen;
                    System.arraycopy(src, r.binStart(), data, dataLen, valueLen);
                    dataLen += valueLen;
                    break;
                case R_KEY:
                    if (!r.nil()) {
                        keyLen = r.bin();
                        keyAt = dataLen;
                        System.arraycopy(src, r.binStart(), data, dataLen, keyLen);
                        dataLen += keyLen;
                    }
                    break;
                case R_HEADERS: {
                    int start = r.position();
                    r.skip();
                    headersLen = r.position() - start;
                    if (headersLen == 1 && ((src[start] & 0xFF) == 0x80 || (src[start] & 0xFF) == 0xC0)) {
                        headersLen = 0; // an empty map (or nil) is stored as no headers
                    } else {
                        headersAt = dataLen;
                        System.arraycopy(src, start, data, dataLen, headersLen);
                        dataLen += headersLen;
                    }
                    break;
                }
                default:
                    r.skip();
            }
        }
        if (offset < 0 || valueLen == -2 || Double.isNaN(ts)) {
            throw new ProtocolException("a READ reply's record lacks 'offset', 'value' or 'timestamp'");
        }
        if (offset >= until) {
            return false;
        }
        out.offset[i] = offset;
        out.timestampNs[i] = nanos(ts);
        out.keyStart[i] = keyAt;
        out.keyLen[i] = keyLen;
        out.valueStart[i] = valueAt;
        out.valueLen[i] = valueLen;
        out.headersStart[i] = headersAt;
        out.headersLen[i] = headersLen;
        out.dataLen = dataLen;
        out.count = i + 1;
        return true;
    }

    /** Float epoch seconds (the wire's) to the nearest epoch nanosecond: whole seconds and fraction apart, so the
     *  double's exact value is rounded once (the engine's own ns is within a quarter microsecond of it). */
    public static long nanos(double seconds) {
        double whole = Math.floor(seconds);
        return (long) whole * 1_000_000_000L + Math.round((seconds - whole) * 1e9);
    }

    private static long intField(Frame f, int key, long missing) throws ProtocolException {
        MsgpackReader r = f.reader();
        long v = missing;
        for (int i = r.atEnd() ? 0 : r.mapHeader(); i > 0; i--) {
            if (r.key(REPLY_KEYS) == key) {
                v = r.integer();
            } else {
                r.skip();
            }
        }
        return v;
    }

    private static byte[][] utf8(String... keys) {
        byte[][] out = new byte[keys.length][];
        for (int i = 0; i < keys.length; i++) {
            out[i] = keys[i].getBytes(StandardCharsets.UTF_8);
        }
        return out;
    }
}
