package io.shmq.spark.source;

/**
 * What a reader sees of a stream partition the Python engine wrote with transactions in it: args
 * namespace, stream, partition, records per read[, the offset to read from[, "unbounded"]]. Prints "latest L"
 * (the last stable offset), then the offset and value (hex) of each record read from the earliest (or that
 * offset) on, by reads that go on from {@code RecordBlock.next} (past markers and aborted records), then
 * "next N" where the reads ended: at L, or with "unbounded" (reads up to Long.MAX_VALUE) where a read found
 * nothing more.
 */
public final class VisibleDump {
    public static void main(String[] args) throws Exception {
        String ns = args[0], name = args[1];
        int p = Integer.parseInt(args[2]), batch = Integer.parseInt(args[3]);
        try (ShmStream s = ShmStream.open(ns, name)) {
            RecordBlock out = new RecordBlock();
            long from = args.length > 4 ? Long.parseLong(args[4]) : s.earliest(p), end = s.latest(p);
            boolean unbounded = args.length > 5 && args[5].equals("unbounded");
            System.out.println("latest " + end);
            while (unbounded || from < end) {
                int got = s.read(p, from, unbounded ? Long.MAX_VALUE : end, batch, out);
                if (got == 0 && out.next <= from) {
                    if (unbounded) {
                        break;
                    }
                    throw new IllegalStateException("no progress at " + from);
                }
                for (int i = 0; i < got; i++) {
                    System.out.println(out.offset[i] + " " + SourceCheck.hex(out.data, out.valueStart[i], out.valueLen[i]));
                }
                from = out.next;
            }
            System.out.println("next " + from);
        }
    }
}
