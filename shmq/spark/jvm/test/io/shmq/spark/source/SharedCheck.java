package io.shmq.spark.source;

import java.io.BufferedReader;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;

import static io.shmq.spark.source.SourceCheck.*;

/**
 * ShmStream.shared over a stream's life: args namespace, stream, and how the test replaces it ("delete": the stream
 * is deleted, "destroy": its namespace is destroyed, which unlinks the files without the deleted flag). Prints each
 * mapping's partitions and values, and "ready" where it waits for a line on stdin (the Python test replaces the
 * stream, or removes it, meanwhile).
 */
public final class SharedCheck {
    public static void main(String[] args) throws Exception {
        String ns = args[0], name = args[1];
        boolean flagged = args[2].equals("delete");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        ShmStream first = ShmStream.shared(ns, name);
        check(first == ShmStream.shared(ns, name), "readers of one JVM share one mapping");
        System.out.println("first " + values(first));
        equal(1, ShmStream.sweep(), "a sweep keeps a mapping in use");
        step(in);  // deleted, and made again with other partitions and records
        if (flagged) {
            raises(IOException.class, "the stream was deleted", () -> first.read(0, 0, 1, 1, new RecordBlock()));
        }
        ShmStream again = ShmStream.shared(ns, name);
        check(again != first, "a replaced stream's old mapping is not handed out again");
        System.out.println("again " + values(again));
        equal(1, ShmStream.sweep(), "the sweep keeps the new mapping");
        step(in);  // removed
        equal(0, ShmStream.sweep(), "the sweep lets go of a removed stream's mapping");
        raises(FileNotFoundException.class, "no stream '" + name + "' in namespace '" + ns + "'",
                () -> ShmStream.shared(ns, name));
        System.out.println("done");
    }

    private static void step(BufferedReader in) throws IOException {
        System.out.println("ready");
        System.out.flush();
        equal("go", in.readLine(), "the test's answer");
    }

    /** "N: p/offset=value ..." over every partition, values as text. */
    private static String values(ShmStream s) throws IOException {
        StringBuilder out = new StringBuilder(String.valueOf(s.partitions())).append(':');
        RecordBlock block = new RecordBlock();
        for (int p = 0; p < s.partitions(); p++) {
            int n = s.read(p, s.earliest(p), s.latest(p), 1000, block);
            for (int i = 0; i < n; i++) {
                out.append(' ').append(p).append('/').append(block.offset[i]).append('=')
                        .append(new String(block.data, block.valueStart[i], block.valueLen[i], StandardCharsets.UTF_8));
            }
        }
        return out.toString();
    }
}
