package io.shmq.spark.source;

import java.io.FileNotFoundException;
import java.io.IOException;

import static io.shmq.spark.source.SourceCheck.*;

/**
 * ShmStream on a real stream the Python engine made: args namespace, stream, records per read.
 * Checks the errors and bounds itself, then prints every partition's offsets and every record
 * ("P OFFSET TIMESTAMP_NS KEY HEADERS VALUE", bytes in hex, "-" for a null key) for the Python test
 * to compare with what it appended.
 */
public final class ShmStreamTest {
    public static void main(String[] args) throws Exception {
        String ns = args[0], name = args[1];
        int batch = Integer.parseInt(args[2]);
        raises(FileNotFoundException.class, "no stream 'nope' in namespace '" + ns + "' in shared memory on this host",
                () -> ShmStream.open(ns, "nope"));
        raises(IllegalArgumentException.class, "invalid namespace ../x", () -> ShmStream.open("../x", name));
        raises(IllegalArgumentException.class, "invalid stream name a/b", () -> ShmStream.open(ns, "a/b"));
        try (ShmStream s = ShmStream.open(ns, name)) {
            RecordBlock out = new RecordBlock();
            int n = s.partitions();
            raises(IllegalArgumentException.class, "has partitions 0.." + (n - 1) + ", not " + n,
                    () -> s.read(n, 0, 1, 1, out));
            long e0 = s.earliest(0), l0 = s.latest(0);
            check(l0 - e0 >= 3, "partition 0 holds at least 3 records");
            if (e0 > 0) { // retention dropped the first ones
                DataLossException lost = raises(DataLossException.class, "offsets 0.." + (e0 - 1)
                        + " were dropped by retention; the earliest is " + e0, () -> s.read(0, 0, l0, 10, out));
                equal(e0, lost.firstAvailable(), "DataLossException.firstAvailable()");
                equal(0, out.count, "a failed read leaves the block empty");
            }
            equal(0, s.read(0, l0, l0 + 10, 10, out), "reading at the end");
            equal(0, out.count, "reading at the end returns no records");
            raises(IOException.class, "offset " + (l0 + 1) + " is past the end (" + l0 + ")",
                    () -> s.read(0, l0 + 1, l0 + 2, 1, out));
            equal(3, s.read(0, e0, e0 + 3, 100, out), "until bounds the read");
            equal(e0 + 2, out.offset[2], "the third record's offset");
            equal(2, s.read(0, e0, l0, 2, out), "maxRecords bounds the read");
            equal(2, out.count, "the block is cleared before a read");
            equal(0, s.read(0, e0, e0, 5, out), "an empty range");
            System.out.println("partitions " + n);
            for (int p = 0; p < n; p++) {
                long from = s.earliest(p), end = s.latest(p);
                equal(from, s.memoryEarliest(p), "a memory stream's earliest is in memory");
                System.out.println("offsets " + p + " " + from + " " + end);
                while (from < end) {
                    int got = s.read(p, from, end, batch, out);
                    equal(Math.min(batch, (int) (end - from)), got, "records read from " + from);
                    for (int i = 0; i < got; i++) {
                        equal(from + i, out.offset[i], "offsets are dense");
                        System.out.println(p + " " + out.offset[i] + " " + out.timestampNs[i] + " "
                                + hex(out.data, out.keyStart[i], out.keyLen[i]) + " "
                                + hex(out.data, out.headersStart[i], out.headersLen[i]) + " "
                                + hex(out.data, out.valueStart[i], out.valueLen[i]));
                    }
                    from += got;
                }
            }
            equal(0L, s.retries(), "no copy was overwritten: nothing appends meanwhile");
        }
    }
}
