package io.shmq.spark.source;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;

import static io.shmq.spark.source.SourceCheck.*;

/**
 * Threads reading one partition of one shared mapping at once (tasks of an executor, minPartitions' cuts): args
 * namespace, stream, threads, rounds. Every record's value is its offset as text; each thread reads the partition
 * whole, in reads of its own size, each round, and checks every record. Prints the records read.
 */
public final class ConcurrentReads {
    public static void main(String[] args) throws Exception {
        ShmStream s = ShmStream.shared(args[0], args[1]);
        int threads = Integer.parseInt(args[2]), rounds = Integer.parseInt(args[3]);
        long earliest = s.earliest(0), end = s.latest(0);
        AtomicLong total = new AtomicLong();
        List<Throwable> failed = new ArrayList<>();
        List<Thread> all = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            int batch = 7 + 13 * t;
            Thread th = new Thread(() -> {
                try {
                    RecordBlock out = new RecordBlock();
                    for (int r = 0; r < rounds; r++) {
                        for (long from = earliest; from < end; ) {
                            int got = s.read(0, from, end, batch, out);
                            equal(Math.min(batch, (int) (end - from)), got, "records read from " + from);
                            for (int i = 0; i < got; i++) {
                                equal(from + i, out.offset[i], "offsets are dense");
                                equal(Long.toString(from + i), new String(out.data, out.valueStart[i],
                                        out.valueLen[i], StandardCharsets.US_ASCII), "the value of " + (from + i));
                            }
                            from += got;
                            total.addAndGet(got);
                        }
                    }
                } catch (Throwable e) {
                    synchronized (failed) {
                        failed.add(e);
                    }
                }
            });
            all.add(th);
            th.start();
        }
        for (Thread th : all) {
            th.join();
        }
        if (!failed.isEmpty()) {
            throw new AssertionError(failed.size() + " reader(s) failed", failed.get(0));
        }
        System.out.println("records " + total.get() + " retries " + s.retries());
    }
}
