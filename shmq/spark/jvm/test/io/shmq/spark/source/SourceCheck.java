package io.shmq.spark.source;

import java.util.HexFormat;
import java.util.Objects;

/** Assertions for the main-based tests of this package (no JUnit here): a failure throws, and the JVM exits 1. */
final class SourceCheck {
    private SourceCheck() {
    }

    static void equal(Object want, Object got, String what) {
        if (!Objects.equals(want, got)) {
            throw new AssertionError(what + ": expected <" + want + "> but got <" + got + ">");
        }
    }

    static void check(boolean ok, String what) {
        if (!ok) {
            throw new AssertionError(what);
        }
    }

    interface Body {
        void run() throws Exception;
    }

    /** Runs {@code body}, which must throw a {@code type} whose message contains {@code text}; returns it. */
    static <T extends Throwable> T raises(Class<T> type, String text, Body body) {
        try {
            body.run();
        } catch (Throwable t) {
            if (type.isInstance(t) && String.valueOf(t.getMessage()).contains(text)) {
                return type.cast(t);
            }
            throw new AssertionError("expected " + type.getSimpleName() + " saying '" + text + "', got " + t, t);
        }
        throw new AssertionError("expected " + type.getSimpleName() + " saying '" + text + "', nothing was thrown");
    }

    /** Bytes [start, start + len) of {@code data} in hex, "-" for len -1 (null). */
    static String hex(byte[] data, int start, int len) {
        return len < 0 ? "-" : HexFormat.of().formatHex(data, start, start + len);
    }
}
