package io.shmq.spark.source;

/**
 * How fast ShmStream copies: args namespace, stream, records per read, rounds. Reads partition 0
 * from earliest to latest each round; prints the best round's records per second and MB/s of values.
 */
public final class ReadBench {
    public static void main(String[] args) throws Exception {
        int batch = Integer.parseInt(args[2]), rounds = Integer.parseInt(args[3]);
        try (ShmStream s = ShmStream.open(args[0], args[1])) {
            RecordBlock out = new RecordBlock();
            double best = 0, bestBytes = 0;
            for (int r = 0; r < rounds; r++) {
                long from = s.earliest(0), end = s.latest(0), n = 0, bytes = 0;
                long t0 = System.nanoTime();
                while (from < end) {
                    int got = s.read(0, from, end, batch, out);
                    for (int i = 0; i < got; i++) {
                        bytes += out.valueLen[i];
                    }
                    n += got;
                    from += got;
                }
                double secs = (System.nanoTime() - t0) / 1e9;
                if (n / secs > best) {
                    best = n / secs;
                    bestBytes = bytes / secs;
                }
            }
            System.out.printf("records/s %.0f values MB/s %.0f retries %d%n", best, bestBytes / 1e6, s.retries());
        }
    }
}
