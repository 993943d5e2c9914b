package io.shmq.spark.tcp;

import io.shmq.spark.source.DataLossException;
import io.shmq.spark.source.RecordBlock;
import io.shmq.spark.source.TcpStream;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;

/**
 * A stream read over TCP by {@link TcpStream}, printed for tests/spark/test_jvm_tcp.py. Arguments: URL TOKEN ("-":
 * none) STREAM, then either nothing (every partition's offsets and records, read in blocks of 3 records), or
 * "read P FROM UNTIL MAX" (one read), or "pause P" (partition P's
 * latest offset, then again after a line on stdin), or "rate P N" (N records of partition P read in blocks of 10 000: the read
 * rate). An error prints "error" and its class and message, and exits 3. $MAX_OUTAGE_S: how long it rides
 * out an outage of the server (none: 0, one try again at once).
 */
public final class TcpStreamDump {
    public static void main(String[] args) throws Exception {
        String timeout = System.getenv("MAX_OUTAGE_S");  // how long to ride out an outage (none: 0)
        Reconnect reconnect = new Reconnect(timeout == null ? 0 : Double.parseDouble(timeout), 0.1, 2.0);
        try (TcpStream s = TcpStream.connect(args[0], args[1].equals("-") ? null : args[1], args[2], reconnect,
                "test")) {
            RecordBlock b = new RecordBlock();
            if (args.length == 3) {
                System.out.println("partitions " + s.partitions());
                for (int p = 0; p < s.partitions(); p++) {
                    long from = s.earliest(p), until = s.latest(p);
                    System.out.println("offsets " + p + " " + from + " " + until);
                    while (from < until && s.read(p, from, until, 3, b) > 0) {
                        for (int i = 0; i < b.count; i++) {
                            System.out.println("record " + p + " " + TcpCheck.line(b, i));
                        }
                        from = b.offset[b.count - 1] + 1;
                    }
                }
            } else if (args[3].equals("read")) {
                int p = Integer.parseInt(args[4]);
                int n = s.read(p, Long.parseLong(args[5]), Long.parseLong(args[6]), Integer.parseInt(args[7]), b);
                System.out.println("read " + n);
                for (int i = 0; i < b.count; i++) {
                    System.out.println("record " + p + " " + TcpCheck.line(b, i));
                }
            } else if (args[3].equals("pause")) {
                int p = Integer.parseInt(args[4]);
                System.out.println("latest " + p + " " + s.latest(p));
                System.out.flush();
                new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
                System.out.println("latest " + p + " " + s.latest(p));
            } else {
                int p = Integer.parseInt(args[4]);
                long n = Long.parseLong(args[5]), from = s.earliest(p), until = from + n;
                long start = System.nanoTime();
                while (from < until) {
                    if (s.read(p, from, until, 10_000, b) == 0) {
                        throw new AssertionError("partition " + p + " ends at " + from);
                    }
                    from = b.offset[b.count - 1] + 1;
                }
                double seconds = (System.nanoTime() - start) / 1e9;
                System.out.printf("rate %d records in %.3f s: %.0f records/s%n", n, seconds, n / seconds);
            }
        } catch (DataLossException e) {
            System.out.println("error DataLossException " + e.firstAvailable() + ": " + e.getMessage());
            System.exit(3);
        } catch (Exception e) {
            System.out.println("error " + e.getClass().getSimpleName() + ": " + e.getMessage());
            System.exit(3);
        }
    }
}
