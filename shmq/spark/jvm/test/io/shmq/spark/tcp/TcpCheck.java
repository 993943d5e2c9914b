package io.shmq.spark.tcp;

import io.shmq.spark.source.RecordBlock;
import java.util.HexFormat;
import java.util.Objects;

/** Assertions for this package's main-based tests (no JUnit here): a failure throws, and the JVM exits 1. */
final class TcpCheck {
    private TcpCheck() {
    }

    static void equal(Object want, Object got, String what) {
        if (!Objects.equals(want, got)) {
            throw new AssertionError(what + ": expected <" + want + "> but got <" + got + ">");
        }
    }

    interface Body {
        void run() throws Exception;
    }

    /** Runs {@code body}, which must throw a {@code type} whose message contains {@code text}. */
    static void raises(Class<? extends Throwable> type, String text, Body body) {
        try {
            body.run();
        } catch (Throwable t) {
            if (type.isInstance(t) && String.valueOf(t.getMessage()).contains(text)) {
                return;
            }
            throw new AssertionError("expected " + type.getSimpleName() + " saying '" + text + "', got " + t, t);
        }
        throw new AssertionError("expected " + type.getSimpleName() + " saying '" + text + "', nothing was thrown");
    }

    /** Record {@code i} of {@code b} as one line: offset, timestamp ns, key, value and raw headers in hex ("-": null). */
    static String line(RecordBlock b, int i) {
        return b.offset[i] + " " + b.timestampNs[i] + " " + hex(b.data, b.keyStart[i], b.keyLen[i]) + " "
                + hex(b.data, b.valueStart[i], b.valueLen[i]) + " " + hex(b.data, b.headersStart[i], b.headersLen[i]);
    }

    private static String hex(byte[] data, int start, int len) {
        return len < 0 ? "-" : HexFormat.of().formatHex(data, start, start + len);
    }
}
