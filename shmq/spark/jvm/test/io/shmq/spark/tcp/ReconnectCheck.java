package io.shmq.spark.tcp;

import java.io.IOException;
import java.net.ConnectException;
import java.util.ArrayList;
import java.util.List;

/**
 * {@link Reconnect} on a fake clock, printed for tests/spark/test_outage.py: each scenario's outcome, the pauses
 * it slept (ms) and the warnings it logged.
 */
public final class ReconnectCheck {
    private static final long[] NOW = {0};
    private static final List<Long> SLEPT = new ArrayList<>();

    public static void main(String[] args) throws Exception {
        Reconnect.nanos = () -> NOW[0];
        Reconnect.sleeper = ms -> {
            SLEPT.add(ms);
            NOW[0] += ms * 1_000_000L;
        };
        Reconnect.warn = line -> System.out.println("warn " + line);
        Endpoint server = Endpoint.parse("tcp://:s3cret@127.0.0.1:9");
        Reconnect r = new Reconnect(10, 0.1, 2.0);
        scenario("refused 6 times", r, server, 6, null);
        scenario("refused for ever", new Reconnect(3, 0.1, 2.0), server, Integer.MAX_VALUE, null);
        scenario("the same outage, refused twice more", r, server, 2, null);  // (no second warning)
        scenario("a new outage, refused twice", r, server, 2, null);
        scenario("an error reply", r, server, 1, new ServerException("127.0.0.1:9: no stream 'x'", 0x12, "no", -1,
                -1));
        scenario("maxOutage 0, refused twice", new Reconnect(0, 0.1, 2.0), server, 2, null);
        scenario("maxOutage 0, refused once", new Reconnect(0, 0.1, 2.0), server, 1, null);
        scenario("a stopping server, twice", r, server, 2, new ServerException("127.0.0.1:9", Wire.LIMIT_EXCEEDED,
                "the server is stopping", -1, -1));
    }

    private static void scenario(String name, Reconnect r, Endpoint server, int failures, IOException error) {
        SLEPT.clear();
        int[] left = {failures};
        int[] resets = {0};
        String out;
        try {
            out = r.call(server, "test", () -> {
                if (left[0]-- > 0) {
                    throw error != null ? error : new ConnectException("Connection refused");
                }
                return "ok";
            }, () -> resets[0]++);
        } catch (IOException e) {
            out = e.getClass().getSimpleName() + ": " + e.getMessage();
        }
        System.out.println(name + ": " + out + " resets " + resets[0] + " slept " + SLEPT);
    }
}
